#include "master/restart_coordinator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace shoal::master {

std::chrono::milliseconds GroupRelaunchDelay(const spec::JobSpec& spec,
                                             const std::vector<TaskRecord>& tasks,
                                             const std::map<std::string, Clock::TimePoint>& parked,
                                             Clock::TimePoint now,
                                             std::chrono::milliseconds delay) {
  for (const auto& role : spec.roles) {
    if (role.min_instances == 0) continue;
    uint32_t in_world = 0;
    std::vector<Clock::TimePoint> back;
    for (const auto& t : tasks) {
      if (t.role != role.name) continue;
      if (t.in_world) {
        ++in_world;
      } else if (auto it = parked.find(t.Key()); it != parked.end()) {
        back.push_back(it->second);
      }
    }
    std::sort(back.begin(), back.end());
    for (size_t i = 0; in_world + i < role.min_instances && i < back.size(); ++i) {
      if (back[i] > now) {
        delay = std::max(delay,
                         std::chrono::duration_cast<std::chrono::milliseconds>(back[i] - now));
      }
    }
  }
  return delay;
}

std::vector<std::string> SlotsToRejoin(const spec::JobSpec& spec,
                                       const std::vector<TaskRecord>& tasks,
                                       const std::map<std::string, Clock::TimePoint>& parked,
                                       Clock::TimePoint now,
                                       const std::function<bool(const TaskRecord&)>& place_ready) {
  std::vector<std::string> rejoin;
  for (const auto& role : spec.roles) {
    if (role.min_instances == 0) continue;
    uint32_t in_world = 0;
    for (const auto& t : tasks) in_world += (t.role == role.name && t.in_world);
    for (const auto& t : tasks) {
      if (t.role != role.name || t.in_world) continue;
      auto it = parked.find(t.Key());
      bool due = (it == parked.end() || it->second <= now) && place_ready(t);
      if (due || in_world < role.min_instances) {
        rejoin.push_back(t.Key());
        ++in_world;
      }
    }
  }
  return rejoin;
}

void RestartCoordinator::JournalShardRecords(std::vector<nlohmann::json>& records) {
  for (auto& r : records) host_->Record(ShardRecord{std::move(r)});
  records.clear();
}

void RestartCoordinator::RestartTask(TaskRecord& task) {
  if (auto record = RestartRecord(task)) host_->Record(std::move(*record));
}

void RestartCoordinator::HandleCleanExit(TaskRecord& task) {
  PolicyDecision d = host_->Ending() ? PolicyDecision{} : job_->policy.OnCleanExit(task);
  if (d.action != PolicyDecision::Action::kRestartTask) {
    host_->Transition(task, TaskState::kSucceeded, "");
    return;
  }
  host_->Record(FailureHandled{task.Key(), task.attempt, ActionName(d.action),
                               FailureHandled::kCleanExitCause, d.restart_number,
                               d.delay.count()});
  host_->Transition(task, TaskState::kSucceeded, "");
  ScheduleTaskRestart(task, d);
}

void RestartCoordinator::HandleTaskFailure(TaskRecord& task, const std::string& cause) {
  using Action = PolicyDecision::Action;
  task.cause = cause;
  if (job_->shards) {
    std::vector<nlohmann::json> records;
    job_->shards->ReleaseTask(task.Key(), absl::StrCat(task.Key(), " ", cause), &records);
    JournalShardRecords(records);
  }
  if (task.restart_pending || host_->Ending()) {
    host_->Transition(task, TaskState::kFailed, cause);
    return;
  }
  uint32_t in_world_others = 0;
  for (const auto& t : job_->tasks.tasks()) {
    in_world_others += (t.role == task.role && t.in_world && &t != &task);
  }
  PolicyDecision d = job_->policy.OnFailure(task, cause, StoppingGroup(),
                                            in_world_others, clock_->Now());
  // Before the transition: a master replaying the journal must know the failure is not final.
  host_->Record(FailureHandled{task.Key(), task.attempt, ActionName(d.action), cause,
                               d.restart_number, d.delay.count()});
  host_->Transition(task, TaskState::kFailed, d.reason);
  switch (d.action) {
    case Action::kNone:
    case Action::kFail:
    case Action::kJoinGroupRestart:
      return;
    case Action::kRestartTask:
      ScheduleTaskRestart(task, d);
      return;
    case Action::kShrinkGroup:
      host_->Record(SlotLeft{task.Key()});
      BeginGroupRestart(absl::StrCat(task.Key(), " ", cause), std::chrono::milliseconds(0));
      return;
    case Action::kRestartGroup:
      BeginGroupRestart(absl::StrCat(task.Key(), " ", cause), d.delay);
      return;
  }
}

void RestartCoordinator::ScheduleTaskRestart(TaskRecord& task, const PolicyDecision& decision) {
  task.restarts = decision.restart_number;
  task.reason = decision.reason;
  host_->Notice(absl::StrCat(task.Key(), " ", decision.reason));
  host_->PostAfter(decision.delay, [this, role = task.role, index = task.index,
                                    attempt = task.attempt] { RelaunchTask(role, index, attempt); });
}

void RestartCoordinator::RelaunchTask(const std::string& role, uint32_t index, uint32_t attempt) {
  TaskRecord* rec = job_->tasks.Find(role, index);
  if (rec == nullptr || rec->attempt != attempt || !rec->restart_pending) return;
  if (host_->Ending()) return;
  RestartTask(*rec);
  host_->Relaunch(role);
}

void RestartCoordinator::BeginGroupRestart(const std::string& reason,
                                           std::chrono::milliseconds delay) {
  uint32_t generation = job_->generation + 1;
  relaunch_waiting_ = false;
  // Applying it marks every running task of the group restart-pending: stopped, not failed.
  host_->Record(GroupRestartBegun{generation, reason, job_->policy.group_restarts(),
                                  delay.count()});
  host_->Notice(absl::StrCat("re-forming the group (generation ", generation, "): ", reason));
  if (job_->shards) {
    std::vector<nlohmann::json> records;
    if (job_->spec.checkpoint.configured) {
      // Shards completed after the checkpoint the new generation resumes from are redone.
      job_->shards->BeginRollback(&records);
    } else {
      for (const auto& t : job_->tasks.tasks()) {
        if (job_->InGroup(t)) {
          job_->shards->ReleaseTask(t.Key(), ShardTable::kGroupRestartReason, &records);
        }
      }
    }
    JournalShardRecords(records);
  }
  std::string why = absl::StrCat("stopped to re-form the group: ", reason);
  for (auto& t : job_->tasks.tasks()) {
    if (!job_->InGroup(t) || IsTerminal(t.state)) continue;
    t.restart_pending = true;
    host_->StopTask(t, stop_grace_, why);
  }
  MaybeRelaunchGroup();
}

void RestartCoordinator::MaybeRelaunchGroup() {
  if (!StoppingGroup() || host_->Ending()) return;
  for (const auto& t : job_->tasks.tasks()) {
    if (job_->InGroup(t) && !IsTerminal(t.state)) return;
  }
  // The group is down; the restart only waits now (group_restarted journals its end).
  relaunch_waiting_ = true;
  // An elastic role that fell below min waits for its earliest parked slots.
  auto delay = GroupRelaunchDelay(job_->spec, job_->tasks.tasks(), job_->policy.parked(),
                                  clock_->Now(), job_->group_restart_delay);
  uint32_t generation = job_->generation;
  host_->PostAfter(delay, [this, generation] {
    if (job_->generation != generation || StoppingGroup()) return;
    RelaunchGroup();
  });
}

void RestartCoordinator::RelaunchGroup() {
  if (host_->Ending()) return;
  auto place_ready = [this](const TaskRecord& t) { return host_->PlaceReady(t); };
  for (const std::string& key : SlotsToRejoin(job_->spec, job_->tasks.tasks(),
                                              job_->policy.parked(), clock_->Now(), place_ready)) {
    host_->Record(SlotRejoined{key});
  }
  for (auto& t : job_->tasks.tasks()) {
    if (!job_->InGroup(t) || !t.in_world) continue;
    t.restart_pending = true;  // Restart clears it
    RestartTask(t);
  }
  uint32_t generation = job_->generation + 1;
  std::optional<size_t> world = host_->FormWorld(generation);
  if (!world) return;
  relaunch_waiting_ = false;
  host_->Record(GroupRestarted{generation, *world});
  host_->Notice(absl::StrCat("generation ", generation, ": ", *world, " tasks rejoin"));
  host_->Relaunch("");
  CheckGrowth();
}

void RestartCoordinator::CheckGrowth() {
  if (job_->policy.parked().empty() || host_->Ending()) return;
  auto now = clock_->Now();
  if (!SlotsReady(now).empty()) {
    if (StoppingGroup()) return;  // RelaunchGroup checks again
    grow_pending_ = true;
    if (!job_->spec.checkpoint.configured) BeginGrowth();
    return;
  }
  // Slots whose backoff has passed wait for their place: its agent's registration calls this
  // again. The others wait for their time.
  std::optional<Clock::TimePoint> next = job_->policy.NextSlotBack(now);
  if (next && !grow_timer_set_) {
    grow_timer_set_ = true;
    host_->PostAfter(std::chrono::duration_cast<std::chrono::milliseconds>(*next - now) +
                         std::chrono::milliseconds(1),
                     [this] {
                       grow_timer_set_ = false;
                       CheckGrowth();
                     });
  }
}

std::vector<std::string> RestartCoordinator::SlotsReady(Clock::TimePoint now) {
  std::vector<std::string> ready;
  for (const std::string& key : job_->policy.SlotsBack(now)) {
    auto [role, index] = SplitTaskKey(key);
    const TaskRecord* t = job_->tasks.Find(role, index);
    if (t != nullptr && host_->PlaceReady(*t)) ready.push_back(key);
  }
  return ready;
}

void RestartCoordinator::OnCheckpoint() {
  if (grow_pending_) BeginGrowth();
}

void RestartCoordinator::BeginGrowth() {
  if (!grow_pending_ || StoppingGroup() || host_->Ending()) return;
  grow_pending_ = false;
  size_t back = SlotsReady(clock_->Now()).size();
  if (back == 0) return;
  BeginGroupRestart(absl::StrCat("capacity is back for ", back, " task(s)"),
                    std::chrono::milliseconds(0));
}

}  // namespace shoal::master
