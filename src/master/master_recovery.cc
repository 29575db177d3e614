// The master's recovery: rebuilding a job from its journal after the previous master died,
// and reconciling what the agents that come back report. Part of class Master (master.h);
// apart from master.cc only to keep each file about one thing.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/files.h"
#include "master/master.h"
#include "master/shard_table.h"
#include "master/task_logs.h"
#include "shoal/v1/shoal.grpc.pb.h"
#include "spdlog/spdlog.h"

namespace shoal::master {

namespace {

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
  return {key.substr(0, colon), static_cast<uint32_t>(std::strtoul(key.c_str() + colon + 1, nullptr, 10))};
}

}  // namespace

absl::Status Master::Replay(const std::vector<nlohmann::json>& records) {
  auto now = options_.clock->Now();
  std::vector<nlohmann::json> shard_records;
  bool submitted = false;
  for (const auto& r : records) {
    std::string type = r.value("type", "");
    if (type == "job_submitted") {
      if (r.value("job_id", "") != options_.job_id) {
        return absl::DataLossError(absl::StrCat("events.jsonl belongs to job ",
                                                r.value("job_id", "?"), ", not ",
                                                options_.job_id));
      }
      submitted = true;
      previous_address_ = r.value("master", "");
    } else if (type == "master_recovered") {
      previous_address_ = r.value("master", previous_address_);
    } else if (type == "admitted") {
      grants_.clear();
      for (const auto& n : r.value("nodes", nlohmann::json::array())) {
        backends::NodeGrant g;
        g.name = n.value("name", "");
        g.address = n.value("address", "");
        g.cpus = n.value("cpus", 0.0);
        g.memory_bytes = n.value("memory_bytes", uint64_t{0});
        g.cores = n.value("cores", std::vector<uint32_t>{});
        g.gpus = n.value("gpus", std::vector<std::string>{});
        g.for_task = n.value("for_task", "");
        g.gpus_from_agent = n.value("gpus_from_agent", false);
        g.gpu_count = n.value("gpu_count", 0u);
        grants_.push_back(g);
        granted_nodes_.insert(g.name);
      }
    } else if (type == "agent_registered") {
      node_addresses_[r.value("node", "")] = r.value("address", "");
      node_gpus_[r.value("node", "")] = r.value("gpus", std::vector<std::string>{});
    } else if (type == "rendezvous") {
      rendezvous_done_ = true;
      generation_ = r.value("generation", 0u);
      for (const auto& rank : r.value("ranks", nlohmann::json::array())) {
        slot_ports_.try_emplace(rank.value("task", ""), rank.value("port", 0u));
        auto [role, index] = SplitTaskKey(rank.value("task", ""));
        if (TaskRecord* t = state_.Find(role, index)) {
          t->node = rank.value("node", "");
          t->global_rank = rank.value("rank", 0u);
        }
      }
    } else if (type == "task_state") {
      auto [role, index] = SplitTaskKey(r.value("task", ""));
      TaskRecord* t = state_.Find(role, index);
      auto to = TaskStateFromName(r.value("to", ""));
      if (t == nullptr || !to) {
        return absl::DataLossError(absl::StrCat("events.jsonl: unknown task or state in ", r.dump()));
      }
      if (!r.contains("from")) continue;  // the initial "pending" of job_submitted
      if (*to == TaskState::kPending) {
        state_.Restart(*t);
        continue;
      }
      if (r.contains("pid")) t->pid = r.value("pid", 0);
      t->exit_code = r.value("exit_code", 0);
      t->signal = r.value("signal", 0);
      state_.Transition(*t, *to, r.value("reason", ""));
    } else if (type == "failure_handled") {
      auto [role, index] = SplitTaskKey(r.value("task", ""));
      TaskRecord* t = state_.Find(role, index);
      std::string action = r.value("action", "");
      if (t != nullptr && action != "fail" && action != "none") t->restart_pending = true;
      policy_.Restore(r.value("task", ""), action, r.value("restart", 0u), now);
      if (action != "none" && r.value("cause", "") != "exited with code 0") {
        auto [frole, findex] = SplitTaskKey(r.value("task", ""));
        failures_.push_back({frole, findex, r.value("attempt", 0u), r.value("cause", ""), action,
                             r.value("restart", 0u), r.value("ts", int64_t{0})});
        ++failures_total_;
        if (failures_.size() > kFailuresKept) failures_.pop_front();
      }
      if (t != nullptr) t->restarts = policy_.task_restarts(t->Key());
    } else if (type == "slot_left" || type == "slot_rejoined") {
      auto [role, index] = SplitTaskKey(r.value("task", ""));
      if (TaskRecord* t = state_.Find(role, index)) {
        state_.SetInWorld(*t, type == "slot_rejoined");
        if (type == "slot_rejoined") policy_.Unpark(t->Key());
      }
    } else if (type == "group_restart_begun") {
      group_restart_in_progress_ = true;
      group_restart_delay_ = std::chrono::milliseconds(r.value("delay_ms", int64_t{0}));
      for (auto& t : state_.tasks()) {
        if (InGroup(t) && !IsTerminal(t.state)) t.restart_pending = true;
      }
    } else if (type == "group_restarted") {
      group_restart_in_progress_ = false;
      generation_ = r.value("generation", generation_);
    } else if (type == "job_state") {
      if (auto p = JobPhaseFromName(r.value("to", ""))) {
        phase_ = *p;
        phase_reason_ = r.value("reason", "");
      }
    } else if (type == "outcome_decided") {
      if (auto p = JobPhaseFromName(r.value("outcome", ""))) {
        pending_outcome_ = Outcome{*p, r.value("reason", "")};
      }
    } else if (type == "job_finished") {
      finished_before_recovery_ = true;
    } else if (ShardTable::IsShardRecord(r)) {
      shard_records.push_back(r);
    }
  }
  if (!submitted) return absl::DataLossError("events.jsonl has no job_submitted record");
  // The agents keep dialling the address they were given: listen there again.
  if (size_t colon = previous_address_.rfind(':');
      colon != std::string::npos && options_.listen_port == 0) {
    options_.listen_port =
        static_cast<uint16_t>(std::strtoul(previous_address_.c_str() + colon + 1, nullptr, 10));
  }
  if (shards_) {
    auto table = ShardTable::Replay(options_.spec.dataset, shard_records, now);
    if (!table.ok()) return table.status();
    *shards_ = std::move(*table);
  }
  return absl::OkStatus();
}

void Master::Recover() {
  recovery_started_ = true;
  Journal({{"type", "master_recovered"},
           {"master", address_},
           {"pid", ::getpid()},
           {"generation", generation_},
           {"phase", JobPhaseName(phase_)}});
  EmitNotice("a new master took over the job from its journal");
  if (finished_before_recovery_ && pending_outcome_) {
    // The previous master finished the job and died before it exited: nothing is left to do.
    finished_unix_ms_ = options_.clock->UnixMillis();
    SetPhase(pending_outcome_->phase, pending_outcome_->reason);
    AfterBatch();
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished_ = true;
    }
    finished_cv_.notify_all();
    return;
  }
  if (phase_ == JobPhase::kQueued || grants_.empty()) {
    // Nothing was admitted yet: start over.
    phase_ = JobPhase::kQueued;
    TryAdmit();
    return;
  }
  auto placement = PlaceTasks(options_.spec, state_.tasks(), grants_);
  if (!placement.ok()) {
    BeginStopping(JobPhase::kFailed, std::string(placement.status().message()));
    return;
  }
  placement_ = *placement;
  if (rendezvous_done_) BuildPlan(/*journal=*/false);
  backends::AgentStartOptions start = AgentStartOptionsForJob();
  auto st = backend_->Reattach(options_.job_id, grants_, start);
  for (const auto& g : grants_) awaiting_reattach_.insert(g.name);
  if (!st.ok()) {
    spdlog::warn("re-attaching to the job's agents: {}", st.ToString());
    Journal({{"type", "reattach_failed"}, {"reason", std::string(st.message())}});
    for (const auto& g : grants_) {
      awaiting_reattach_.erase(g.name);
      OnPlaceLost(g.name, absl::StrCat("while the master was down: ", st.message()));
    }
    return;
  }
  // Agents that do not come back within the registration timeout are lost.
  register_timer_ = loop_.PostAfter(options_.register_timeout, [this] {
    for (const std::string& node : std::set<std::string>(awaiting_reattach_)) {
      awaiting_reattach_.erase(node);
      backend_->TerminatePlace(node);
      FailTasksOnNode(node, absl::StrCat("lost: the agent on ", node,
                                         " did not come back to the new master"));
    }
  });
  loop_.PostAfter(options_.heartbeat_interval, [this] { CheckHeartbeats(); });
  ArmLeaseTimer();
}

void Master::ReconcileNode(const std::string& node, const v1::AgentMessage& registration) {
  awaiting_reattach_.erase(node);
  if (awaiting_reattach_.empty()) loop_.CancelTimer(register_timer_);
  std::map<std::string, uint32_t> running;
  for (const auto& t : registration.register_().running_tasks()) {
    running[absl::StrCat(t.role(), ":", t.index())] = t.attempt();
  }
  Journal({{"type", "agent_reattached"}, {"node", node}, {"running", running.size()}});
  AgentSession* session = SessionForNode(node);
  // Tasks the agent runs that the job no longer wants (a stop or a newer attempt was journaled
  // but never sent) are stopped; ours that it does not run were lost while no master listened.
  for (const auto& [key, attempt] : running) {
    auto [role, index] = SplitTaskKey(key);
    TaskRecord* t = state_.Find(role, index);
    if (t == nullptr || t->attempt != attempt || IsTerminal(t->state) ||
        t->state == TaskState::kPending) {
      v1::MasterMessage msg;
      auto* id = msg.mutable_stop()->add_tasks();
      id->set_role(role);
      id->set_index(index);
      id->set_attempt(attempt);
      msg.mutable_stop()->set_grace_ms(0);
      if (session) SendToAgent(*session, msg);
    }
  }
  std::vector<std::pair<std::string, uint32_t>> missing;
  for (auto& t : state_.tasks()) {
    if (t.node != node || IsTerminal(t.state) || t.state == TaskState::kPending) continue;
    auto it = running.find(t.Key());
    if (it == running.end() || it->second != t.attempt) missing.emplace_back(t.Key(), t.attempt);
  }
  // The agent sends what happened while it was cut off (exits, starts) right after its
  // registration; give those a moment to arrive before calling a task lost.
  if (!missing.empty()) {
    loop_.PostAfter(std::chrono::seconds(2), [this, missing] {
      for (const auto& [key, attempt] : missing) {
        auto [role, index] = SplitTaskKey(key);
        TaskRecord* t = state_.Find(role, index);
        if (t == nullptr || t->attempt != attempt || IsTerminal(t->state)) continue;
        t->exit_code = -1;
        HandleTaskFailure(*t, "lost while the master was down: its agent no longer runs it");
      }
      EvaluateOutcome();
      MaybeRelaunchGroup();
      MaybeFinish();
    });
  }
  // Unfinished business of the previous master.
  if (phase_ == JobPhase::kStopping) {
    for (auto& t : state_.tasks()) {
      if (t.node == node && !IsTerminal(t.state)) StopTask(t, options_.stop_grace, t.reason);
    }
    MaybeFinish();
    return;
  }
  if (group_restart_in_progress_) {
    for (auto& t : state_.tasks()) {
      if (t.node == node && InGroup(t) && !IsTerminal(t.state)) {
        StopTask(t, options_.stop_grace, t.reason);
      }
    }
    MaybeRelaunchGroup();
  }
  if (awaiting_reattach_.empty()) {
    for (auto& t : state_.tasks()) {
      if (t.restart_pending && IsTerminal(t.state) && !InGroup(t)) {
        RelaunchTask(t.role, t.index, t.attempt);
      }
    }
    if (!group_restart_in_progress_ && rendezvous_done_) {
      // Tasks journaled as pending in the current generation whose launch never went out.
      bool any_pending = false;
      for (const auto& t : state_.tasks()) any_pending |= (t.in_world && t.state == TaskState::kPending);
      if (any_pending) {
        SendClusterSpec();
        launched_roles_.clear();
        LaunchReadyRoles();
      } else {
        for (const auto& role : options_.spec.roles) launched_roles_.push_back(role.name);
      }
    }
    CheckGrowth();
    if (phase_ == JobPhase::kStarting && state_.AllStarted()) SetPhase(JobPhase::kRunning, "");
  }
}

}  // namespace shoal::master
