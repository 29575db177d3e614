#pragma once

// Every kind of record the master writes to a job's journal (events.jsonl), as a C++ type with
// its JSON form. The JSON form is the file format: a field renamed here is a journal that no
// longer loads, so names and meanings only ever grow (docs/design/0008-master-structure.md).
//
// Each line of the file is one record: {"type": <kType>, <fields>..., "ts": ms, "ts_us": us}.
// Readers are lenient: a missing field takes its default (below) and a record of a type not
// listed here is kept as OtherRecord and changes nothing, so a journal of an older or newer
// Shoal still loads.
//
// How records change the job's state is in journaled_state.h: one Apply for the live master
// and for a recovering one.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "nlohmann/json.hpp"

namespace shoal::master {

// ---- the job's life

// The first record of every journal.
struct JobSubmitted {
  static constexpr const char* kType = "job_submitted";
  std::string job_id;
  std::string name;
  uint64_t tasks = 0;
  std::string master;  // the address the agents dial
};
// The job's phase changed (queued, starting, running, stopping, succeeded, failed, killed).
struct JobStateChanged {
  static constexpr const char* kType = "job_state";
  std::string to;
  std::string reason;
};
// The job will end with `outcome`; its tasks are being stopped.
struct OutcomeDecided {
  static constexpr const char* kType = "outcome_decided";
  std::string outcome;
  std::string reason;
};
// Every task is over and the agents were released.
struct JobFinished {
  static constexpr const char* kType = "job_finished";
  std::string outcome;
  std::string reason;
};
struct KillRequested {
  static constexpr const char* kType = "kill_requested";
  std::string reason;
};
// A new master took the job over from this journal.
struct MasterRecovered {
  static constexpr const char* kType = "master_recovered";
  std::string master;
  int64_t pid = 0;
  uint32_t generation = 0;
  std::string phase;
};
// The files of a Parquet dataset, one shard each, as `shoal run` listed them (submit.json's
// "dataset_files"): written after job_submitted, and compared with submit.json on recovery.
struct DatasetListed {
  static constexpr const char* kType = "dataset_listed";
  std::string location;  // dataset.parquet
  std::vector<std::string> files;
};
struct SidecarStarted {
  static constexpr const char* kType = "sidecar_started";
  std::string name;
  std::string url;
};
struct SidecarFailed {
  static constexpr const char* kType = "sidecar_failed";
  std::string name;
  std::string reason;
};

// ---- admission

struct Queued {
  static constexpr const char* kType = "queued";
  std::string reason;
};
struct AdmissionRefused {
  static constexpr const char* kType = "admission_refused";
  std::string reason;
};
// The backend granted these places.
struct Admitted {
  static constexpr const char* kType = "admitted";
  std::string backend;
  std::vector<backends::NodeGrant> nodes;
};
// A batch scheduler started the job it had queued, or a backend with one place per task says
// which places wait for room in the cluster (`deferred`: elastic slots beyond min, whose agents
// come later; the job starts without them).
struct Allocated {
  static constexpr const char* kType = "allocated";
  std::string backend;
  std::vector<std::string> deferred;
};
struct CancelledOutside {
  static constexpr const char* kType = "cancelled_outside";
  std::string reason;
};

// ---- agents and places

struct AgentRegistered {
  static constexpr const char* kType = "agent_registered";
  std::string node;
  std::string hostname;
  std::string address;
  std::vector<std::string> gpus;
  uint64_t ports = 0;  // how many free ports it offered
};
struct AgentRefused {
  static constexpr const char* kType = "agent_refused";
  std::string node;
  std::string reason;
};
// A recovering master's agent came back, running `running` tasks.
struct AgentReattached {
  static constexpr const char* kType = "agent_reattached";
  std::string node;
  uint64_t running = 0;
};
struct ReattachFailed {
  static constexpr const char* kType = "reattach_failed";
  std::string reason;
};
struct AgentLeaving {
  static constexpr const char* kType = "agent_leaving";
  std::string node;
  std::string reason;
};
struct AgentDisconnected {
  static constexpr const char* kType = "agent_disconnected";
  std::string node;
};
struct AgentSilent {
  static constexpr const char* kType = "agent_silent";
  std::string node;
  double seconds = 0;
};
// Something an agent wants the user to know.
struct AgentNotice {
  static constexpr const char* kType = "notice";
  std::string node;
  std::string message;
};
struct PlaceLost {
  static constexpr const char* kType = "place_lost";
  std::string node;
  std::string reason;
};
struct PlaceReplacing {
  static constexpr const char* kType = "place_replacing";
  std::string node;
  bool ok = false;
  std::string reason;
};

// ---- rendezvous and tasks

struct RankAssignment {
  std::string task;  // "<role>:<index>"
  uint32_t rank = 0;
  std::string node;
  std::string address;
  uint32_t port = 0;
};
// A world was formed: generation, and every task's rank, place and port.
struct Rendezvous {
  static constexpr const char* kType = "rendezvous";
  uint32_t generation = 0;
  uint64_t world_size = 0;
  std::vector<RankAssignment> ranks;
};
// A task moved between states. Which optional fields are present depends on the move:
// job_submitted's initial "pending" has `rank` and no `from`; a restart ("-> pending") has
// `attempt` (the new one); every other move has `attempt`, terminal ones `exit_code` and
// `signal`, "-> running" `pid`, and `reason` when there is one.
struct TaskStateChanged {
  static constexpr const char* kType = "task_state";
  std::string task;
  std::optional<std::string> from;
  std::string to;
  std::optional<std::string> reason;
  std::optional<uint32_t> attempt;
  std::optional<int> pid;
  std::optional<int> exit_code;
  std::optional<int> signal;
  std::optional<uint32_t> rank;
};
// The SDK reported no progress for too long; the task is killed.
struct TaskHung {
  static constexpr const char* kType = "task_hung";
  std::string task;
  uint32_t attempt = 0;
  uint64_t last_step = 0;
  uint32_t silent_ms = 0;
};

// ---- failures, restarts, elastic membership

// The failure policy's decision for a task that ended: `action` is an ActionName
// (failure_policy.h). A clean exit restarted by `restart: always` has the cause
// kCleanExitCause. Written before the task's terminal task_state.
struct FailureHandled {
  static constexpr const char* kType = "failure_handled";
  static constexpr const char* kCleanExitCause = "exited with code 0";
  std::string task;
  uint32_t attempt = 0;
  std::string action;
  std::string cause;
  uint32_t restart = 0;
  int64_t delay_ms = 0;
};
// An elastic slot left the world / came back.
struct SlotLeft {
  static constexpr const char* kType = "slot_left";
  std::string task;
};
struct SlotRejoined {
  static constexpr const char* kType = "slot_rejoined";
  std::string task;
};
// The rendezvous left this elastic slot out: its place `node` was deferred and has no agent
// yet. The slot (already moved to a terminal state, never started) waits out of the world,
// parked and back at once, and joins through growth when its place's agent registers. Not a
// failure: it costs no restart.
struct SlotDeferred {
  static constexpr const char* kType = "slot_deferred";
  // The reason of the task's terminal task_state written just before.
  static constexpr const char* kReason =
      "waiting for room in the cluster; the job started without it";
  std::string task;
  std::string node;
};
// The group is being stopped to re-form as `generation`.
struct GroupRestartBegun {
  static constexpr const char* kType = "group_restart_begun";
  uint32_t generation = 0;
  std::string reason;
  uint32_t restarts = 0;
  int64_t delay_ms = 0;
};
struct GroupRestarted {
  static constexpr const char* kType = "group_restarted";
  uint32_t generation = 0;
  uint64_t world_size = 0;
};

// ---- the training SDK

struct CheckpointReported {
  static constexpr const char* kType = "checkpoint";
  std::string task;
  int64_t step = 0;
};
struct ResumedReported {
  static constexpr const char* kType = "resumed";
  std::string task;
  uint32_t attempt = 0;
  int64_t step = 0;
};
// A task published version `version` of model `model` into `repository` (the SDK's
// `published` report, docs/sdk-protocol.md), at training step `step` when it gave one, with the
// metrics it gave. `shoal status` shows the last one.
struct ModelPublished {
  static constexpr const char* kType = "model_published";
  std::string task;
  std::string model;
  uint64_t version = 0;
  std::string repository;
  std::optional<int64_t> step;
  std::map<std::string, double> metrics;
};
// One of ShardTable's records (shard_leased, shard_done, shard_returned, shards_frozen,
// shards_reopened, epoch_complete). Their fields are defined, written and applied by
// ShardTable (shard_table.h), which owns the dataset's state.
struct ShardRecord {
  nlohmann::json body;  // with its "type"
};

// A record of a type this Shoal does not write (an older or newer one did): kept, changes
// nothing.
struct OtherRecord {
  nlohmann::json body;
};

using JournalRecord =
    std::variant<JobSubmitted, JobStateChanged, OutcomeDecided, JobFinished, KillRequested,
                 MasterRecovered, DatasetListed, SidecarStarted, SidecarFailed, Queued, AdmissionRefused,
                 Admitted, Allocated, CancelledOutside, AgentRegistered, AgentRefused,
                 AgentReattached, ReattachFailed, AgentLeaving, AgentDisconnected, AgentSilent,
                 AgentNotice, PlaceLost, PlaceReplacing, Rendezvous, TaskStateChanged, TaskHung,
                 FailureHandled, SlotLeft, SlotRejoined, SlotDeferred, GroupRestartBegun,
                 GroupRestarted, CheckpointReported, ResumedReported, ModelPublished, ShardRecord,
                 OtherRecord>;

// A record as it lies in the journal: what happened and when.
struct JournalEntry {
  JournalRecord record;
  int64_t ts_us = 0;
  int64_t unix_ms() const { return ts_us / 1000; }
};

// The record's line, without the time stamps ({"type": ..., fields...}).
nlohmann::json ToJson(const JournalRecord& record);
// The full line: the record plus "ts" (milliseconds) and "ts_us".
nlohmann::json ToJson(const JournalEntry& entry);
// DataLoss naming the line's content when a known record's field has the wrong type, or the
// line is not an object. A line without a string "type" is an OtherRecord.
absl::StatusOr<JournalEntry> FromJson(const nlohmann::json& line);
// The "type" of the record.
std::string TypeOf(const JournalRecord& record);

}  // namespace shoal::master
