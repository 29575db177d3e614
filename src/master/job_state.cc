#include "master/job_state.h"

#include <signal.h>
#include <string.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace shoal::master {

const char* TaskStateName(TaskState state) {
  switch (state) {
    case TaskState::kPending: return "pending";
    case TaskState::kStarting: return "starting";
    case TaskState::kRunning: return "running";
    case TaskState::kSucceeded: return "succeeded";
    case TaskState::kFailed: return "failed";
    case TaskState::kKilled: return "killed";
  }
  return "unknown";
}

const char* JobPhaseName(JobPhase phase) {
  switch (phase) {
    case JobPhase::kQueued: return "queued";
    case JobPhase::kStarting: return "starting";
    case JobPhase::kRunning: return "running";
    case JobPhase::kStopping: return "stopping";
    case JobPhase::kSucceeded: return "succeeded";
    case JobPhase::kFailed: return "failed";
    case JobPhase::kKilled: return "killed";
  }
  return "unknown";
}

bool IsTerminal(TaskState state) {
  return state == TaskState::kSucceeded || state == TaskState::kFailed ||
         state == TaskState::kKilled;
}

bool IsTerminal(JobPhase phase) {
  return phase == JobPhase::kSucceeded || phase == JobPhase::kFailed || phase == JobPhase::kKilled;
}

std::string DescribeExit(int exit_code, int signal) {
  if (signal != 0) {
    const char* abbrev = sigabbrev_np(signal);
    return absl::StrCat("was killed by signal ", signal, " (SIG", abbrev ? abbrev : "?", ")");
  }
  return absl::StrCat("exited with code ", exit_code);
}

JobState::JobState(const spec::JobSpec& spec) {
  // Rank 0 is where torch's MASTER_ADDR points: a chief (or a role literally named master)
  // comes first, the other roles follow in file order.
  std::vector<const spec::Role*> order;
  for (const char* first : {"chief", "master"}) {
    if (const spec::Role* r = spec.FindRole(first)) order.push_back(r);
  }
  for (const auto& r : spec.roles) {
    if (std::find(order.begin(), order.end(), &r) == order.end()) order.push_back(&r);
  }
  uint32_t rank = 0;
  for (const auto& r : spec.roles) role_not_started_[r.name] = 0;
  for (const spec::Role* role : order) {
    bool decides = std::find(spec.success_roles.begin(), spec.success_roles.end(), role->name) !=
                   spec.success_roles.end();
    for (uint32_t i = 0; i < role->instances; ++i) {
      TaskRecord t;
      t.role = role->name;
      t.index = i;
      t.global_rank = rank++;
      t.tracked = !role->untracked;
      t.decides_success = decides;
      index_[{t.role, t.index}] = tasks_.size();
      success_tasks_ += decides;
      role_not_started_[t.role]++;
      tasks_.push_back(std::move(t));
    }
  }
  not_started_ = not_terminal_ = tasks_.size();
}

TaskRecord* JobState::Find(const std::string& role, uint32_t index) {
  auto it = index_.find({role, index});
  return it == index_.end() ? nullptr : &tasks_[it->second];
}

std::optional<nlohmann::json> JobState::Transition(TaskRecord& task, TaskState to,
                                                   const std::string& reason) {
  if (IsTerminal(task.state) || static_cast<int>(to) <= static_cast<int>(task.state)) {
    return std::nullopt;
  }
  nlohmann::json record = {{"type", "task_state"},
                           {"task", task.Key()},
                           {"from", TaskStateName(task.state)},
                           {"to", TaskStateName(to)}};
  bool was_started = task.state != TaskState::kPending && task.state != TaskState::kStarting;
  bool now_started = to != TaskState::kPending && to != TaskState::kStarting;
  if (!was_started && now_started) {
    --not_started_;
    --role_not_started_[task.role];
  }
  if (IsTerminal(to)) --not_terminal_;
  if (to == TaskState::kSucceeded && task.decides_success) ++success_tasks_succeeded_;
  task.state = to;
  if (!reason.empty()) {
    task.reason = reason;
    record["reason"] = reason;
  }
  if (IsTerminal(to)) {
    record["exit_code"] = task.exit_code;
    record["signal"] = task.signal;
  }
  if (to == TaskState::kFailed && task.tracked && !task.restart_pending && !first_failure_) {
    first_failure_ = Outcome{JobPhase::kFailed, absl::StrCat(task.Key(), " ", reason)};
  }
  return record;
}

std::optional<nlohmann::json> JobState::Restart(TaskRecord& task) {
  if (!IsTerminal(task.state)) return std::nullopt;
  if (!task.in_world) SetInWorld(task, true);
  if (task.state == TaskState::kSucceeded && task.decides_success) --success_tasks_succeeded_;
  ++not_terminal_;
  ++not_started_;
  ++role_not_started_[task.role];
  nlohmann::json record = {{"type", "task_state"},
                           {"task", task.Key()},
                           {"from", TaskStateName(task.state)},
                           {"to", "pending"},
                           {"attempt", task.attempt + 1}};
  task.state = TaskState::kPending;
  task.attempt++;
  task.restart_pending = false;
  task.hung_reason.clear();
  task.pid = 0;
  task.exit_code = 0;
  task.signal = 0;
  task.step = 0;
  task.reason.clear();
  return record;
}

void JobState::SetInWorld(TaskRecord& task, bool in_world) {
  if (task.in_world == in_world || !IsTerminal(task.state)) return;
  task.in_world = in_world;
  if (!task.decides_success) return;
  if (in_world) {
    ++success_tasks_;
    if (task.state == TaskState::kSucceeded) ++success_tasks_succeeded_;
  } else {
    --success_tasks_;
    if (task.state == TaskState::kSucceeded) --success_tasks_succeeded_;
  }
}

std::optional<Outcome> JobState::DecideOutcome() const {
  if (first_failure_) return first_failure_;
  if (success_tasks_ == 0 || success_tasks_succeeded_ < success_tasks_) return std::nullopt;
  return Outcome{JobPhase::kSucceeded, "every task of the success roles exited 0"};
}

bool JobState::RoleStarted(const std::string& role) const {
  auto it = role_not_started_.find(role);
  return it == role_not_started_.end() || it->second == 0;
}

}  // namespace shoal::master
