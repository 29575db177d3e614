// The master's handling of places whose agent was lost (disconnected, silent, reported lost by
// the backend) and their replacement, and the end of the job: its outcome, stopping the tasks,
// releasing the agents. Part of class Master (master.h), on its loop.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "master/master.h"
#include "shoal/v1/shoal.pb.h"
#include "spdlog/spdlog.h"

namespace shoal::master {

void Master::OnPlaceLost(const std::string& node, const std::string& why) {
  if (IsTerminal(job_.phase)) return;
  Record(PlaceLost{node, why});
  // A place lost while a new master waits for it: it will not come back by itself.
  if (awaiting_reattach_.erase(node) > 0 && awaiting_reattach_.empty()) {
    admission_.CancelRegisterTimer();
  }
  FailTasksOnNode(node, absl::StrCat("lost: ", why));
  // Nothing will report these tasks any more; the agent killed them or they died with it.
  agents_.DropNode(node);
  replacing_nodes_.erase(node);  // a replacement that died before registering
  for (auto& t : job_.tasks.tasks()) {
    if (t.node != node || IsTerminal(t.state)) continue;
    if (t.state == TaskState::kPending && job_.rendezvous_done &&
        job_.phase != JobPhase::kStopping) {
      continue;
    }
    Transition(t, TaskState::kKilled, "lost with its agent");
  }
  if (!job_.rendezvous_done && job_.phase != JobPhase::kStopping &&
      job_.deferred_places.count(node) > 0) {
    // The job may start without it; its slot waits for a new agent, asked for once the
    // rendezvous is done.
    deferred_lost_.insert(node);
  } else if (!job_.rendezvous_done && job_.phase != JobPhase::kStopping) {
    BeginStopping(JobPhase::kFailed,
                  absl::StrCat("the agent for ", node, " ended before registering: ", why));
  }
  MaybeFinish();
  ReplacePlace(node);
}

void Master::ReplacePlace(const std::string& node) {
  if (!job_.rendezvous_done || Ending() || replacing_nodes_.count(node)) return;
  // A place whose agents keep dying is not replaced forever.
  uint32_t limit = 1;
  for (const auto& role : options_.spec.roles) limit = std::max(limit, role.max_restarts);
  if (++place_replacements_[node] > limit) {
    Record(PlaceReplacing{node, false, "its agents were lost too often"});
    for (auto& t : job_.tasks.tasks()) {
      if (t.node == node && t.state == TaskState::kPending && t.in_world) {
        t.exit_code = -1;
        Transition(t, TaskState::kFailed,
                   absl::StrCat("its place ", node, " lost its agent ", limit, " times"));
      }
    }
    EvaluateOutcome();
    MaybeFinish();
    return;
  }
  bool needed = false;
  for (const auto& t : job_.tasks.tasks()) {
    // A parked elastic slot can only come back on a place with an agent.
    needed |= (t.node == node && (t.restart_pending || t.state == TaskState::kPending ||
                                  job_.policy.IsParked(t.Key())));
  }
  if (!needed) return;
  backends::AgentStartOptions start = AgentStartOptions();
  auto st = backend_->ReplacePlace(node, start);
  Record(PlaceReplacing{node, st.ok(), std::string(st.message())});
  if (!st.ok()) {
    spdlog::warn("cannot replace the lost place {}: {}", node, st.ToString());
    for (auto& t : job_.tasks.tasks()) {
      if (t.node == node && t.state == TaskState::kPending && t.in_world) {
        t.exit_code = -1;
        restarts_.HandleTaskFailure(
            t, absl::StrCat("its place ", node, " was lost and cannot be replaced: ", st.message()));
      }
    }
    EvaluateOutcome();
    MaybeFinish();
    return;
  }
  replacing_nodes_.insert(node);
  Notice(absl::StrCat("started a new agent on ", node, " for the tasks that restart there"));
}

void Master::FailTasksOnNode(const std::string& node, const std::string& reason) {
  for (auto& t : job_.tasks.tasks()) {
    if (t.node != node || IsTerminal(t.state)) continue;
    // Not launched yet: it never ran on the lost agent and waits for its replacement.
    if (t.state == TaskState::kPending && job_.rendezvous_done &&
        job_.phase != JobPhase::kStopping) {
      continue;
    }
    if (job_.phase == JobPhase::kStopping || t.restart_pending) {
      Transition(t, TaskState::kKilled, t.restart_pending ? t.reason : reason);
    } else {
      t.exit_code = -1;
      restarts_.HandleTaskFailure(t, reason);
    }
  }
  EvaluateOutcome();
  restarts_.MaybeRelaunchGroup();
  MaybeFinish();
}

void Master::CheckHeartbeats() {
  if (IsTerminal(job_.phase)) return;
  auto limit = options_.heartbeat_interval * options_.heartbeat_misses;
  for (const auto& node : agents_.SilentNodes(options_.clock->Now(), limit)) {
    double secs = std::chrono::duration<double>(limit).count();
    Record(AgentSilent{node, secs});
    backend_->TerminatePlace(node);  // a hung agent must not leave its tasks running
    agents_.DropNode(node);
    FailTasksOnNode(node, absl::StrFormat("lost: the agent on %s was silent for %.1fs", node, secs));
  }
  loop_.PostAfter(options_.heartbeat_interval, [this] { CheckHeartbeats(); });
}

// ---------------------------------------------------------------- outcome and shutdown

void Master::EvaluateOutcome() {
  if (Ending()) return;
  auto outcome = job_.tasks.DecideOutcome();
  if (outcome) BeginStopping(outcome->phase, outcome->reason);
}

void Master::BeginStopping(JobPhase outcome, const std::string& reason) {
  if (Ending()) return;
  Record(OutcomeDecided{JobPhaseName(outcome), reason});
  SetPhase(JobPhase::kStopping, reason);
  // Restarts that were scheduled will not happen: say so instead of promising them.
  for (auto& t : job_.tasks.tasks()) {
    if (!t.in_world && !t.restart_pending && IsTerminal(t.state) &&
        job_.policy.IsParked(t.Key())) {
      t.reason = absl::StrCat(t.reason, "; the job ended before it could join");  // deferred
      continue;
    }
    if (!t.restart_pending || !IsTerminal(t.state)) continue;
    t.restart_pending = false;
    if (t.state == TaskState::kSucceeded) {
      t.reason.clear();
    } else if (t.state == TaskState::kKilled) {
      t.reason = absl::StrCat(t.reason, "; not restarted: the job ended");
    } else {
      t.reason = absl::StrCat(t.cause.empty() ? DescribeExit(t.exit_code, t.signal) : t.cause,
                              "; not restarted: the job ended");
    }
  }
  std::string stop_reason = outcome == JobPhase::kSucceeded
                                ? "stopped: the job succeeded"
                                : (outcome == JobPhase::kKilled ? "stopped: " + reason
                                                                : "stopped: the job failed");
  std::map<std::string, v1::MasterMessage> stops;
  for (auto& t : job_.tasks.tasks()) {
    if (IsTerminal(t.state)) continue;
    if (t.state == TaskState::kPending) {
      Transition(t, TaskState::kKilled, "never started: " + stop_reason.substr(9));
      continue;
    }
    t.reason = stop_reason;
    auto& msg = stops[t.node];
    auto* task = msg.mutable_stop()->add_tasks();
    task->set_role(t.role);
    task->set_index(t.index);
    msg.mutable_stop()->set_grace_ms(static_cast<uint32_t>(options_.stop_grace.count()));
  }
  for (auto& [node, msg] : stops) {
    if (AgentSession* s = agents_.ForNode(node)) {
      agents_.Send(*s, msg);
    } else {
      for (auto& t : job_.tasks.tasks()) {
        if (t.node == node && !IsTerminal(t.state)) {
          Transition(t, TaskState::kKilled, "its agent is gone");
        }
      }
    }
  }
  // An agent that does not confirm in time is released by the backend, which kills it and
  // with it its tasks.
  loop_.PostAfter(options_.stop_grace + std::chrono::seconds(2), [this] {
    if (IsTerminal(job_.phase)) return;
    for (auto& t : job_.tasks.tasks()) {
      if (!IsTerminal(t.state)) {
        Transition(t, TaskState::kKilled, "did not stop in time; its agent was terminated");
      }
    }
    MaybeFinish();
  });
  MaybeFinish();
}

void Master::MaybeFinish() {
  if (job_.phase != JobPhase::kStopping || !job_.tasks.AllTerminal()) return;
  Finish();
}

void Master::Finish() {
  v1::MasterMessage shutdown;
  shutdown.mutable_shutdown()->set_reason("the job has ended");
  for (auto& [id, s] : agents_.sessions()) agents_.Send(s, shutdown);
  Commit();  // now, not after the batch: the agents exit on it, and Release waits for them
  const JobPhase phase = job_.pending_outcome->phase;
  const std::string reason = job_.pending_outcome->reason;
  using BackendOutcome = backends::Backend::Outcome;
  backend_->SetOutcome(phase == JobPhase::kSucceeded ? BackendOutcome::kSucceeded
                       : phase == JobPhase::kKilled  ? BackendOutcome::kKilled
                                                     : BackendOutcome::kFailed,
                       reason);
  backend_->Release();
  agents_.CloseAll();
  finished_unix_ms_ = options_.clock->UnixMillis();
  Record(JobFinished{JobPhaseName(phase), reason});
  SetPhase(phase, reason);
  AfterBatch();  // durable before anyone is told
  publisher_->CloseWatchers();
  resource_logs_->Flush();  // the job's files are complete when its end is known
  Finished();
}

void Master::Finished() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    finished_ = true;
  }
  finished_cv_.notify_all();
}

}  // namespace shoal::master
