#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "nlohmann/json.hpp"
#include "spec/job_spec.h"

namespace shoal::master {

// One shard as handed to a task: a file, or the index range [start, end).
struct ShardInfo {
  uint32_t epoch = 0;
  uint64_t id = 0;
  std::string file;  // file datasets only
  uint64_t start = 0;  // index-range datasets only
  uint64_t end = 0;
};

// What Lease answers (the SDK's `lease` reply, see docs/sdk-protocol.md).
struct LeaseResult {
  enum class Kind {
    kShard,      // `shard` is now leased to the caller
    kRetry,      // nothing to hand out right now; ask again after `retry_after`
    kExhausted,  // nothing of `epoch` is left for the caller
  };
  Kind kind = Kind::kRetry;
  uint32_t epoch = 0;  // the epoch asked for
  ShardInfo shard;     // kShard only
  std::chrono::milliseconds retry_after{0};  // kRetry only

  // The reply body of the protocol: {"ok":true,"shard":{...}}, {"ok":true,"retry_ms":N} or
  // {"ok":true,"exhausted":true,"epoch":E}.
  nlohmann::json ToReply() const;
};

// A lease that went back to the todo list (ExpireLeases, ReleaseTask, BeginRollback).
struct ReturnedLease {
  uint32_t epoch = 0;
  uint64_t shard = 0;
  std::string task;
  uint32_t attempt = 0;
};

enum class ShardState { kTodo, kLeased, kDone };
const char* ShardStateName(ShardState state);

// One shard of one epoch as the table sees it (for tests and status pages).
struct ShardView {
  ShardState state = ShardState::kTodo;
  std::string task;      // kLeased: the holder
  uint32_t attempt = 0;  // kLeased: the holder's attempt
  Clock::TimePoint deadline{};  // kLeased
  int64_t step = 0;      // kDone: the step it was completed at
  // kTodo after a lease was lost: why (the clause of the Done error); empty otherwise.
  std::string returned_reason;
};

struct EpochCounts {
  uint64_t todo = 0;
  uint64_t leased = 0;
  uint64_t done = 0;
};

// The master's exactly-once shard lease table: every shard of every epoch of the job's dataset
// is completed by exactly one Done, and epochs are served in order.
//
// Pure: no clock (callers pass `now`), no I/O, no threads; it runs on the master's event loop
// like JobState. Every state change appends its journal record to `journal` (which may be
// null, then records are dropped); Replay rebuilds the table from those records.
//
// Journal records (every field always present unless marked optional; `task` is
// "<role>:<index>"):
//   {"type":"shard_leased",  "epoch":E,"shard":S,"task":T,"attempt":A[,"request":R]}
//       R (optional): the agent's number for the lease call, so that the call asked again gets
//       the same shard (Lease).
//   {"type":"shard_done",    "epoch":E,"shard":S,"task":T,"attempt":A,"step":N}
//   {"type":"shard_returned","epoch":E,"shard":S,"task":T,"attempt":A,"reason":R}
//       a lease went back to todo. R completes "the lease ... was lost: R", e.g.
//       "its lease expired" (ExpireLeases), "the group restarted" (BeginRollback), or the
//       caller's ReleaseTask reason.
//   {"type":"shards_frozen"}                       BeginRollback: leasing stops
//   {"type":"shards_reopened","resumed_step":N,"count":C,"epoch":E}
//       Resumed: C done shards (of any epoch) completed after step N are todo again; leasing
//       resumes at epoch E (the current epoch afterwards).
//   {"type":"epoch_complete","epoch":E}            the last shard of E was done (informative;
//                                                  replay only checks it)
// Lease deadlines are not journaled: a replayed lease gets a fresh one.
//
// Memory: a few words per shard of every epoch that has started (the done steps), plus one
// entry per lease and per returned-but-not-yet-re-leased shard. Lease, Done, Progress,
// ReleaseTask and ExpireLeases cost O(log n) per shard they touch; only Resumed scans epochs.
class ShardTable {
 public:
  // The delay suggested by a retry answer lies in [kRetryMin, kRetryMax]; it depends only on
  // the task key, which spreads polling tasks apart and keeps the table deterministic.
  static constexpr std::chrono::milliseconds kRetryMin{100};
  static constexpr std::chrono::milliseconds kRetryMax{200};
  static constexpr const char* kExpiredReason = "its lease expired";
  static constexpr const char* kGroupRestartReason = "the group restarted";

  explicit ShardTable(const spec::DatasetConfig& dataset);

  // Rebuilds a table from the records its predecessor journaled, in journal order. Records of
  // other types (the rest of the master's journal) are skipped. Leases restored get the deadline
  // now + lease_timeout. DataLoss when the records do not fit together (another dataset, a
  // record missing or reordered).
  static absl::StatusOr<ShardTable> Replay(const spec::DatasetConfig& dataset,
                                           const std::vector<nlohmann::json>& records,
                                           Clock::TimePoint now);
  // Applies one record of the types above; InvalidArgument for any other record, DataLoss for
  // one that does not fit the table (which should then be discarded).
  absl::Status Apply(const nlohmann::json& record, Clock::TimePoint now);
  static bool IsShardRecord(const nlohmann::json& record);

  // Hands `task` the lowest-numbered todo shard of `epoch`. Epochs go in order: while an
  // earlier epoch has shards not done, the answer is retry; an epoch whose shards are all done
  // answers exhausted. Within the current epoch, with nothing todo: `wait` false answers
  // exhausted, `wait` true answers retry while shards are leased (they may come back).
  // Between BeginRollback and Resumed every answer is retry. A task may hold several leases.
  // The caller checks that `attempt` is the task's current one.
  // `request` (non-zero) names the call, as the agent that relayed it numbered it: the same
  // call asked again (its agent sends it again to the master that replaced a dead one, which
  // may have leased the shard and journaled it without answering) gets the same shard while
  // that lease lives, and journals nothing.
  // Errors: FailedPrecondition when the dataset has no shards (no `dataset` section),
  // InvalidArgument for an epoch >= dataset.epochs.
  absl::StatusOr<LeaseResult> Lease(const std::string& task, uint32_t attempt, uint32_t epoch,
                                    bool wait, Clock::TimePoint now,
                                    std::vector<nlohmann::json>* journal, uint64_t request = 0);

  // Records that `shard` of `epoch` went into training up to `step`. Only the holder of a live
  // lease (same task, same attempt, deadline not passed) may complete it, and only once:
  // otherwise FailedPrecondition, naming the shard, the epoch and why ("the lease on shard 3 of
  // epoch 0 was lost: it is leased to worker:2 now"), and the table is unchanged.
  // InvalidArgument for an epoch, shard or step (negative) out of range. The holder's last
  // Done repeated (same attempt, shard and step: its agent sent it again to a new master, whose
  // predecessor took it without answering) succeeds again and journals nothing.
  absl::Status Done(const std::string& task, uint32_t attempt, uint32_t epoch, uint64_t shard,
                    int64_t step, Clock::TimePoint now, std::vector<nlohmann::json>* journal);

  // Moves the deadline of every live lease of `task` to now + lease_timeout. A lease already
  // past its deadline stays lost (ExpireLeases collects it). Returns how many were extended.
  // Journals nothing.
  size_t Progress(const std::string& task, Clock::TimePoint now);

  // Returns every lease of `task` (any attempt) to todo, because it failed, hung or was
  // restarted. `reason` completes "the lease ... was lost: <reason>".
  std::vector<ReturnedLease> ReleaseTask(const std::string& task, const std::string& reason,
                                         std::vector<nlohmann::json>* journal);

  // Returns every lease whose deadline is <= now to todo, in deadline order.
  std::vector<ReturnedLease> ExpireLeases(Clock::TimePoint now,
                                          std::vector<nlohmann::json>* journal);
  // The earliest lease deadline, for the master's one timer; nullopt without leases.
  std::optional<Clock::TimePoint> NextDeadline() const;

  // A group restart began: every lease returns to todo (the holders are gone) and leasing is
  // frozen until Resumed. Calling it again while frozen journals nothing new.
  void BeginRollback(std::vector<nlohmann::json>* journal);
  // The first task of the new generation loaded the checkpoint of `step`: every shard of every
  // epoch completed at a step > `step` becomes todo again (the checkpoint does not hold its
  // effect), any lease is dropped, leasing resumes from the earliest epoch with shards not done.
  // Returns how many shards were reopened. FailedPrecondition when no rollback is under way
  // (only the first `resumed` of a generation counts); InvalidArgument for a negative step.
  absl::StatusOr<uint64_t> Resumed(int64_t step, std::vector<nlohmann::json>* journal);

  // --- Summary ---
  const spec::DatasetConfig& dataset() const { return dataset_; }
  uint64_t num_shards() const { return num_shards_; }
  uint32_t num_epochs() const { return num_epochs_; }
  // The earliest epoch with shards not done; num_epochs() once all are complete.
  uint32_t current_epoch() const { return current_epoch_; }
  bool AllComplete() const { return current_epoch_ >= num_epochs_; }
  bool frozen() const { return frozen_; }
  size_t num_leases() const { return leases_.size(); }
  // REQUIRES: epoch < num_epochs().
  EpochCounts Counts(uint32_t epoch) const;
  // REQUIRES: epoch < num_epochs(), shard < num_shards().
  ShardView Inspect(uint32_t epoch, uint64_t shard) const;
  ShardInfo Describe(uint32_t epoch, uint64_t shard) const;
  // For status: {"shards":N,"epochs":E,"current_epoch":C,"complete":bool,"frozen":bool,
  // "epoch_counts":[{"epoch","todo","leased","done"}...],
  // "leases":[{"epoch","shard","task","attempt"}...]} (leases in (epoch, shard) order).
  nlohmann::json Snapshot() const;

 private:
  using Key = std::pair<uint32_t, uint64_t>;  // (epoch, shard)

  struct LeaseEntry {
    std::string task;
    uint32_t attempt = 0;
    Clock::TimePoint deadline{};
    uint64_t request = 0;  // the lease call's number; 0: none given
  };
  // The last shard a task completed, to tell its Done repeated from a late one.
  struct LastDone {
    uint32_t attempt = 0;
    uint32_t epoch = 0;
    uint64_t shard = 0;
    int64_t step = 0;
  };
  struct Returned {
    std::string task;
    uint32_t attempt = 0;
    std::string reason;
  };
  // Shards >= next_fresh have not been leased in this epoch (todo); each shard below it is in
  // exactly one of: returned (todo), leases_ (leased), done_step set (done).
  struct Epoch {
    uint64_t next_fresh = 0;
    std::map<uint64_t, Returned> returned;
    std::vector<int64_t> done_step;  // sized num_shards_ at the first Done; kNotDone if not
    uint64_t leased = 0;
    uint64_t done = 0;
    int64_t max_done_step = kNotDone;  // an upper bound, so Resumed can skip whole epochs
  };
  static constexpr int64_t kNotDone = INT64_MIN;

  bool IsDone(const Epoch& e, uint64_t shard) const {
    return !e.done_step.empty() && e.done_step[shard] != kNotDone;
  }
  // Done without the deadline check when `now` is nullopt (replay).
  absl::Status Complete(const std::string& task, uint32_t attempt, uint32_t epoch,
                        uint64_t shard, int64_t step, std::optional<Clock::TimePoint> now,
                        std::vector<nlohmann::json>* journal);
  void ReturnToTodo(const Key& key, const std::string& reason,
                    std::vector<nlohmann::json>* journal, std::vector<ReturnedLease>* out);
  void RecomputeCurrentEpoch();
  std::chrono::milliseconds RetryDelay(const std::string& task) const;

  spec::DatasetConfig dataset_;
  uint64_t num_shards_ = 0;
  uint32_t num_epochs_ = 0;
  uint32_t current_epoch_ = 0;
  bool frozen_ = false;
  std::vector<Epoch> epochs_;
  std::map<Key, LeaseEntry> leases_;
  std::map<std::string, std::set<Key>> leases_by_task_;
  std::map<std::string, LastDone> last_done_;  // by task
  std::set<std::pair<Clock::TimePoint, Key>> leases_by_deadline_;
};

}  // namespace shoal::master
