// The master's recovery: taking over a job whose previous master died (its state was rebuilt
// from the journal by Replay, journaled_state.h), and reconciling what the agents that come
// back report. Part of class Master (master.h), on its loop.
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "master/master.h"
#include "shoal/v1/shoal.pb.h"
#include "spdlog/spdlog.h"

namespace shoal::master {

void Master::Recover() {
  recovery_started_ = true;
  Record(MasterRecovered{address_, ::getpid(), job_.generation, JobPhaseName(job_.phase)});
  Notice("a new master took over the job from its journal");
  if (job_.finished && job_.pending_outcome) {
    // The previous master finished the job and died before it exited: nothing is left to do.
    finished_unix_ms_ = options_.clock->UnixMillis();
    SetPhase(job_.pending_outcome->phase, job_.pending_outcome->reason);
    AfterBatch();
    Finished();
    return;
  }
  if (job_.phase == JobPhase::kQueued || job_.grants.empty()) {
    // Nothing was admitted yet: start over.
    job_.phase = JobPhase::kQueued;
    admission_.TryAdmit();
    return;
  }
  if (auto placed = admission_.PlaceAgain(); !placed.ok()) {
    BeginStopping(JobPhase::kFailed, std::string(placed.message()));
    return;
  }
  if (job_.rendezvous_done) FormWorld(job_.generation, /*journal=*/false);
  backends::AgentStartOptions start = AgentStartOptions();
  auto st = backend_->Reattach(options_.job_id, job_.grants, start);
  for (const auto& g : job_.grants) {
    // A deferred place whose agent never came has nothing to re-attach to: it registers as a
    // late one when the cluster has room.
    if (job_.deferred_places.count(g.name) > 0 && job_.node_addresses.count(g.name) == 0) {
      continue;
    }
    awaiting_reattach_.insert(g.name);
  }
  if (!st.ok()) {
    spdlog::warn("re-attaching to the job's agents: {}", st.ToString());
    Record(ReattachFailed{std::string(st.message())});
    for (const auto& g : job_.grants) {
      if (awaiting_reattach_.erase(g.name) == 0) continue;
      OnPlaceLost(g.name, absl::StrCat("while the master was down: ", st.message()));
    }
    return;
  }
  // Agents that do not come back within the registration timeout are lost.
  admission_.ArmReattachTimer([this] {
    for (const std::string& node : std::set<std::string>(awaiting_reattach_)) {
      awaiting_reattach_.erase(node);
      backend_->TerminatePlace(node);
      FailTasksOnNode(node, absl::StrCat("lost: the agent on ", node,
                                         " did not come back to the new master"));
      // Its tasks are now elastic slots out of the world: they come back only on a new agent.
      bool any = false, parked_only = true;
      for (const auto& t : job_.tasks.tasks()) {
        if (t.node != node) continue;
        any = true;
        parked_only &= !t.in_world && job_.policy.IsParked(t.Key());
      }
      if (any && parked_only) ReplacePlace(node);
    }
  });
  loop_.PostAfter(options_.heartbeat_interval, [this] { CheckHeartbeats(); });
  sdk_.ArmLeaseTimer();
}

void Master::ReconcileNode(const std::string& node, const v1::AgentMessage& registration) {
  awaiting_reattach_.erase(node);
  if (awaiting_reattach_.empty()) admission_.CancelRegisterTimer();
  std::map<std::string, uint32_t> running;
  for (const auto& t : registration.register_().running_tasks()) {
    running[absl::StrCat(t.role(), ":", t.index())] = t.attempt();
  }
  Record(AgentReattached{node, running.size()});
  AgentSession* session = agents_.ForNode(node);
  // Tasks the agent runs that the job no longer wants (a stop or a newer attempt was journaled
  // but never sent) are stopped; ours that it does not run were lost while no master listened.
  for (const auto& [key, attempt] : running) {
    auto [role, index] = SplitTaskKey(key);
    TaskRecord* t = job_.tasks.Find(role, index);
    if (t == nullptr || t->attempt != attempt || IsTerminal(t->state) ||
        t->state == TaskState::kPending) {
      v1::MasterMessage msg;
      auto* id = msg.mutable_stop()->add_tasks();
      id->set_role(role);
      id->set_index(index);
      id->set_attempt(attempt);
      msg.mutable_stop()->set_grace_ms(0);
      if (session) agents_.Send(*session, msg);
    }
  }
  std::vector<std::pair<std::string, uint32_t>> missing;
  for (auto& t : job_.tasks.tasks()) {
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
        TaskRecord* t = job_.tasks.Find(role, index);
        if (t == nullptr || t->attempt != attempt || IsTerminal(t->state)) continue;
        t->exit_code = -1;
        restarts_.HandleTaskFailure(*t, "lost while the master was down: its agent no longer runs it");
      }
      EvaluateOutcome();
      restarts_.MaybeRelaunchGroup();
      MaybeFinish();
    });
  }
  // Unfinished business of the previous master.
  if (job_.phase == JobPhase::kStopping) {
    for (auto& t : job_.tasks.tasks()) {
      if (t.node == node && !IsTerminal(t.state)) StopTask(t, options_.stop_grace, t.reason);
    }
    MaybeFinish();
    return;
  }
  if (restarts_.StoppingGroup()) {
    for (auto& t : job_.tasks.tasks()) {
      if (t.node == node && job_.InGroup(t) && !IsTerminal(t.state)) {
        StopTask(t, options_.stop_grace, t.reason);
      }
    }
    restarts_.MaybeRelaunchGroup();
  }
  if (awaiting_reattach_.empty()) {
    for (auto& t : job_.tasks.tasks()) {
      if (t.restart_pending && IsTerminal(t.state) && !job_.InGroup(t)) {
        restarts_.RelaunchTask(t.role, t.index, t.attempt);
      }
    }
    if (!restarts_.StoppingGroup() && job_.rendezvous_done) {
      // Tasks journaled as pending in the current generation whose launch never went out.
      bool any_pending = false;
      for (const auto& t : job_.tasks.tasks()) {
        any_pending |= (t.in_world && t.state == TaskState::kPending);
      }
      if (any_pending) {
        SendClusterSpec();
        launched_roles_.clear();
        LaunchReadyRoles();
      } else {
        for (const auto& role : options_.spec.roles) launched_roles_.push_back(role.name);
      }
    }
    restarts_.CheckGrowth();
    if (job_.phase == JobPhase::kStarting && job_.tasks.AllStarted()) {
      SetPhase(JobPhase::kRunning, "");
    }
  }
}

}  // namespace shoal::master
