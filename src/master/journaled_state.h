#pragma once

// What a job's journal holds: the master's memory of a job, changed only by applying journal
// records (journal_records.h). The live master applies each record as it writes it; a
// recovering master applies its predecessor's records in order. Both go through Apply, so the
// two cannot drift apart.
//
// Pure: no clock (callers pass `now`), no I/O, no threads.

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "backends/backend.h"
#include "common/clock.h"
#include "master/failure_policy.h"
#include "master/job_state.h"
#include "master/journal_records.h"
#include "master/shard_table.h"
#include "spec/job_spec.h"

namespace shoal::master {

// One failure as `shoal status` lists it.
struct FailureEntry {
  std::string role;
  uint32_t index = 0;
  uint32_t attempt = 0;
  std::string cause;
  std::string action;
  uint32_t restart = 0;
  int64_t unix_ms = 0;
};

// The last model version published by a task (model_published), as `shoal status` shows it.
struct PublicationEntry {
  ModelPublished record;
  int64_t unix_ms = 0;  // when the master journaled it
};

struct JournaledState {
  static constexpr size_t kFailuresKept = 100;

  // `spec` must outlive the state. A dataset in the spec gets a shard table.
  JournaledState(std::string job_id, const spec::JobSpec& spec);

  std::string job_id;
  const spec::JobSpec& spec;

  bool submitted = false;      // job_submitted was applied
  bool finished = false;       // job_finished was applied
  std::string master_address;  // where the latest master listened
  JobState tasks;
  JobPhase phase = JobPhase::kQueued;
  std::string phase_reason;
  std::optional<Outcome> pending_outcome;

  // Admission and rendezvous.
  std::vector<backends::NodeGrant> grants;
  std::set<std::string> granted_nodes;
  // Granted places whose agents come later, when the cluster has room (allocated's
  // `deferred`): the rendezvous does not wait for them.
  std::set<std::string> deferred_places;
  std::map<std::string, std::string> node_addresses;  // node -> address its agent reported
  std::map<std::string, std::vector<std::string>> node_gpus;  // node -> GPUs its agent sees
  bool rendezvous_done = false;
  uint32_t generation = 0;  // bumped by every group restart or rescale
  std::map<std::string, uint32_t> slot_ports;  // task key -> its port, fixed per job

  // Failure handling (docs/fault-tolerance.md).
  FailurePolicy policy;
  std::deque<FailureEntry> failures;  // newest last, at most kFailuresKept
  uint32_t failures_total = 0;
  bool group_restart_in_progress = false;
  std::chrono::milliseconds group_restart_delay{0};

  std::unique_ptr<ShardTable> shards;  // null without a dataset

  std::optional<PublicationEntry> last_publication;

  bool InGroup(const TaskRecord& task) const { return policy.InGroup(task.role); }
};

// Where a record comes from. Two pure cores decide live and keep their own memory of what they
// decided: FailurePolicy (budgets, parked elastic slots) and ShardTable (leases). Live, their
// records were already applied to them by the call that made them; on replay Apply feeds the
// records back into them. Everything else is the same for both.
enum class RecordSource { kLive, kReplay };

// Applies one record to `state`. `now` is when it is applied (a replayed parked slot or shard
// lease starts its wait afresh). DataLoss when the record does not fit the state (another job's
// journal, an unknown task, a shard record that does not fit the dataset): the state should then
// be discarded.
absl::Status Apply(const JournalEntry& entry, JournaledState& state, RecordSource source,
                   Clock::TimePoint now);

// Applies `lines` (a journal, oldest first) in order. DataLoss also when the first record of the
// job is missing.
absl::Status Replay(const std::vector<nlohmann::json>& lines, JournaledState& state,
                    Clock::TimePoint now);

// The record of moving `task` to `to` (what Apply then does); nullopt when JobState refuses the
// move: out of a terminal state, or backwards.
std::optional<TaskStateChanged> TransitionRecord(const TaskRecord& task, TaskState to,
                                                 const std::string& reason);
// The record of a finished task's next attempt (back to pending); nullopt if it is not finished.
std::optional<TaskStateChanged> RestartRecord(const TaskRecord& task);

// "worker:3" -> ("worker", 3).
std::pair<std::string, uint32_t> SplitTaskKey(const std::string& key);
std::optional<TaskState> TaskStateFromName(const std::string& name);
std::optional<JobPhase> JobPhaseFromName(const std::string& name);

}  // namespace shoal::master
