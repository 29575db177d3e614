#include "master/journaled_state.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace shoal::master {

std::optional<TaskState> TaskStateFromName(const std::string& name) {
  for (TaskState s : {TaskState::kPending, TaskState::kStarting, TaskState::kRunning,
                      TaskState::kSucceeded, TaskState::kFailed, TaskState::kKilled}) {
    if (name == TaskStateName(s)) return s;
  }
  return std::nullopt;
}

std::optional<JobPhase> JobPhaseFromName(const std::string& name) {
  for (JobPhase p : {JobPhase::kQueued, JobPhase::kStarting, JobPhase::kRunning,
                     JobPhase::kStopping, JobPhase::kSucceeded, JobPhase::kFailed,
                     JobPhase::kKilled}) {
    if (name == JobPhaseName(p)) return p;
  }
  return std::nullopt;
}

std::pair<std::string, uint32_t> SplitTaskKey(const std::string& key) {
  size_t colon = key.rfind(':');
  if (colon == std::string::npos) return {key, 0};
  return {key.substr(0, colon),
          static_cast<uint32_t>(std::strtoul(key.c_str() + colon + 1, nullptr, 10))};
}

std::optional<TaskStateChanged> TransitionRecord(const TaskRecord& task, TaskState to,
                                                 const std::string& reason) {
  if (IsTerminal(task.state) || static_cast<int>(to) <= static_cast<int>(task.state)) {
    return std::nullopt;
  }
  TaskStateChanged r;
  r.task = task.Key();
  r.from = TaskStateName(task.state);
  r.to = TaskStateName(to);
  if (!reason.empty()) r.reason = reason;
  r.attempt = task.attempt;
  if (to == TaskState::kRunning) r.pid = task.pid;
  if (IsTerminal(to)) {
    r.exit_code = task.exit_code;
    r.signal = task.signal;
  }
  return r;
}

std::optional<TaskStateChanged> RestartRecord(const TaskRecord& task) {
  if (!IsTerminal(task.state)) return std::nullopt;
  TaskStateChanged r;
  r.task = task.Key();
  r.from = TaskStateName(task.state);
  r.to = TaskStateName(TaskState::kPending);
  r.attempt = task.attempt + 1;
  return r;
}

JournaledState::JournaledState(std::string job_id_in, const spec::JobSpec& spec_in)
    : job_id(std::move(job_id_in)), spec(spec_in), tasks(spec_in), policy(spec_in) {
  if (spec.dataset.configured) shards = std::make_unique<ShardTable>(spec.dataset);
}

namespace {

TaskRecord* FindTask(JournaledState& state, const std::string& key) {
  auto [role, index] = SplitTaskKey(key);
  return state.tasks.Find(role, index);
}

// One overload per record kind that changes the state; the rest change nothing.
struct Applier {
  JournaledState& s;
  RecordSource source;
  Clock::TimePoint now;
  int64_t unix_ms;

  absl::Status operator()(const JobSubmitted& r) {
    if (r.job_id != s.job_id) {
      return absl::DataLossError(absl::StrCat("events.jsonl belongs to job ",
                                              r.job_id.empty() ? "?" : r.job_id, ", not ",
                                              s.job_id));
    }
    s.submitted = true;
    s.master_address = r.master;
    return absl::OkStatus();
  }
  // The shards are those of submit.json: a journal that lists others belongs to another
  // listing, and its shard records would mean other files.
  absl::Status operator()(const DatasetListed& r) {
    if (s.shards == nullptr || r.files != s.shards->dataset().files) {
      return absl::DataLossError(absl::StrCat(
          "the journal's dataset_listed (", r.files.size(), " files of ", r.location,
          ") differs from the job's submit.json (",
          s.shards == nullptr ? 0 : s.shards->dataset().files.size(), " files)"));
    }
    return absl::OkStatus();
  }
  absl::Status operator()(const MasterRecovered& r) {
    s.master_address = r.master;
    return absl::OkStatus();
  }
  absl::Status operator()(const JobStateChanged& r) {
    if (auto p = JobPhaseFromName(r.to)) {
      s.phase = *p;
      s.phase_reason = r.reason;
    }
    return absl::OkStatus();
  }
  absl::Status operator()(const OutcomeDecided& r) {
    if (auto p = JobPhaseFromName(r.outcome)) s.pending_outcome = Outcome{*p, r.reason};
    return absl::OkStatus();
  }
  absl::Status operator()(const JobFinished&) {
    s.finished = true;
    return absl::OkStatus();
  }
  absl::Status operator()(const Admitted& r) {
    s.grants = r.nodes;
    for (const auto& g : s.grants) s.granted_nodes.insert(g.name);
    return absl::OkStatus();
  }
  absl::Status operator()(const Allocated& r) {
    s.deferred_places.insert(r.deferred.begin(), r.deferred.end());
    return absl::OkStatus();
  }
  absl::Status operator()(const AgentRegistered& r) {
    s.node_addresses[r.node] = r.address;
    s.node_gpus[r.node] = r.gpus;
    return absl::OkStatus();
  }
  absl::Status operator()(const Rendezvous& r) {
    s.rendezvous_done = true;
    s.generation = r.generation;
    for (const auto& rank : r.ranks) {
      // Each task keeps its port for the life of the job.
      s.slot_ports.try_emplace(rank.task, rank.port);
      if (TaskRecord* t = FindTask(s, rank.task)) {
        t->node = rank.node;
        t->global_rank = rank.rank;
      }
    }
    return absl::OkStatus();
  }
  absl::Status operator()(const TaskStateChanged& r) {
    TaskRecord* t = FindTask(s, r.task);
    auto to = TaskStateFromName(r.to);
    if (t == nullptr || !to) {
      return absl::DataLossError(
          absl::StrCat("events.jsonl: unknown task or state in ", ToJson(JournalRecord(r)).dump()));
    }
    if (!r.from) return absl::OkStatus();  // the initial "pending" of job_submitted
    if (*to == TaskState::kPending) {
      s.tasks.Restart(*t);
      return absl::OkStatus();
    }
    if (r.pid) t->pid = *r.pid;
    t->exit_code = r.exit_code.value_or(0);
    t->signal = r.signal.value_or(0);
    s.tasks.Transition(*t, *to, r.reason.value_or(""));
    return absl::OkStatus();
  }
  absl::Status operator()(const FailureHandled& r) {
    TaskRecord* t = FindTask(s, r.task);
    const bool final_failure = r.action == ActionName(PolicyDecision::Action::kFail) ||
                               r.action == ActionName(PolicyDecision::Action::kNone);
    if (t != nullptr && !final_failure) t->restart_pending = true;
    if (source == RecordSource::kReplay) s.policy.Restore(r.task, r.action, r.restart, now);
    if (r.action != ActionName(PolicyDecision::Action::kNone) &&
        r.cause != FailureHandled::kCleanExitCause) {
      auto [role, index] = SplitTaskKey(r.task);
      s.failures.push_back({role, index, r.attempt, r.cause, r.action, r.restart, unix_ms});
      ++s.failures_total;
      if (s.failures.size() > JournaledState::kFailuresKept) s.failures.pop_front();
    }
    if (t != nullptr) t->restarts = s.policy.task_restarts(t->Key());
    return absl::OkStatus();
  }
  absl::Status operator()(const SlotLeft& r) {
    if (TaskRecord* t = FindTask(s, r.task)) s.tasks.SetInWorld(*t, false);
    return absl::OkStatus();
  }
  absl::Status operator()(const SlotRejoined& r) {
    if (TaskRecord* t = FindTask(s, r.task)) {
      s.policy.Unpark(t->Key());
      s.tasks.SetInWorld(*t, true);
    }
    return absl::OkStatus();
  }
  absl::Status operator()(const SlotDeferred& r) {
    // Not the failure policy's decision: live and on replay alike, the record parks the slot.
    if (TaskRecord* t = FindTask(s, r.task)) {
      t->node = r.node;
      s.tasks.SetInWorld(*t, false);
      s.policy.Defer(t->Key(), now);
    }
    return absl::OkStatus();
  }
  absl::Status operator()(const GroupRestartBegun& r) {
    s.group_restart_in_progress = true;
    s.group_restart_delay = std::chrono::milliseconds(r.delay_ms);
    // Whatever of the group still runs is stopped for the new world, not failed.
    for (auto& t : s.tasks.tasks()) {
      if (s.InGroup(t) && !IsTerminal(t.state)) t.restart_pending = true;
    }
    return absl::OkStatus();
  }
  absl::Status operator()(const GroupRestarted& r) {
    s.group_restart_in_progress = false;
    s.generation = r.generation;
    return absl::OkStatus();
  }
  absl::Status operator()(const ModelPublished& r) {
    s.last_publication = PublicationEntry{r, unix_ms};
    return absl::OkStatus();
  }
  absl::Status operator()(const ShardRecord& r) {
    if (source == RecordSource::kLive || !s.shards) return absl::OkStatus();
    return s.shards->Apply(r.body, now);
  }
  // Facts for the reader of the journal that change no state of their own.
  template <typename Informative>
  absl::Status operator()(const Informative&) {
    return absl::OkStatus();
  }
};

}  // namespace

absl::Status Apply(const JournalEntry& entry, JournaledState& state, RecordSource source,
                   Clock::TimePoint now) {
  return std::visit(Applier{state, source, now, entry.unix_ms()}, entry.record);
}

absl::Status Replay(const std::vector<nlohmann::json>& lines, JournaledState& state,
                    Clock::TimePoint now) {
  for (const auto& line : lines) {
    auto entry = FromJson(line);
    if (!entry.ok()) return entry.status();
    if (auto st = Apply(*entry, state, RecordSource::kReplay, now); !st.ok()) return st;
  }
  if (!state.submitted) return absl::DataLossError("events.jsonl has no job_submitted record");
  return absl::OkStatus();
}

}  // namespace shoal::master
