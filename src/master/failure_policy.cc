#include "master/failure_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shoal::master {
namespace {

std::string Seconds(std::chrono::milliseconds d) {
  return absl::StrFormat("%.1fs", d.count() / 1000.0);
}

}  // namespace

const char* ActionName(PolicyDecision::Action action) {
  switch (action) {
    case PolicyDecision::Action::kNone: return "none";
    case PolicyDecision::Action::kFail: return "fail";
    case PolicyDecision::Action::kRestartTask: return "restart-task";
    case PolicyDecision::Action::kRestartGroup: return "restart-group";
    case PolicyDecision::Action::kShrinkGroup: return "shrink-group";
    case PolicyDecision::Action::kJoinGroupRestart: return "join-group-restart";
  }
  return "none";
}

FailurePolicy::FailurePolicy(const spec::JobSpec& job) : job_(job) {}

bool FailurePolicy::InGroup(const std::string& role_name) const {
  const spec::Role* role = job_.FindRole(role_name);
  return role != nullptr && role->on_failure != spec::OnFailure::kRestartTask;
}

std::chrono::milliseconds FailurePolicy::Backoff(uint32_t restart_number) const {
  const auto& b = job_.backoff;
  if (restart_number == 0 || b.initial.count() == 0) return std::chrono::milliseconds(0);
  auto delay = b.initial;
  for (uint32_t i = 1; i < restart_number && delay < b.max; ++i) delay *= 2;
  return std::min(delay, b.max);
}

uint32_t FailurePolicy::task_restarts(const std::string& task_key) const {
  auto it = task_restarts_.find(task_key);
  return it == task_restarts_.end() ? 0 : it->second;
}

PolicyDecision FailurePolicy::OnFailure(const TaskRecord& task, const std::string& cause,
                                        bool group_restart_in_progress, uint32_t in_world_others,
                                        Clock::TimePoint now) {
  using Action = PolicyDecision::Action;
  PolicyDecision d;
  d.reason = cause;
  const spec::Role* role = job_.FindRole(task.role);
  if (role == nullptr) {
    d.action = Action::kFail;
    return d;
  }
  // Stopped for a group restart and failed on the way down: the same incident, no extra cost.
  if (group_restart_in_progress && InGroup(task.role)) {
    d.action = Action::kJoinGroupRestart;
    return d;
  }
  if (role->restart == spec::RestartMode::kNever || role->on_failure == spec::OnFailure::kFailJob) {
    d.action = Action::kFail;
    return d;
  }
  if (role->on_failure == spec::OnFailure::kRestartTask) {
    uint32_t& used = task_restarts_[task.Key()];
    if (used >= role->max_restarts) {
      d.action = Action::kFail;
      d.reason = absl::StrCat(cause, "; its restart limit (", role->max_restarts, ") is spent");
      return d;
    }
    d.action = Action::kRestartTask;
    d.restart_number = ++used;
    d.delay = Backoff(d.restart_number);
    d.reason = absl::StrCat(cause, "; restarting in ", Seconds(d.delay), " (restart ",
                            d.restart_number, " of ", role->max_restarts, ")");
    return d;
  }
  // restart-group and elastic share one budget: the failures of the whole group.
  if (group_restarts_ >= role->max_restarts) {
    d.action = Action::kFail;
    d.reason = absl::StrCat(cause, "; the job's restart limit (", role->max_restarts,
                            ") is spent");
    return d;
  }
  d.restart_number = ++group_restarts_;
  if (role->on_failure == spec::OnFailure::kElastic && role->min_instances > 0 &&
      in_world_others >= role->min_instances) {
    uint32_t failures = ++slot_failures_[task.Key()];
    d.action = Action::kShrinkGroup;
    d.slot_back_at = now + Backoff(failures);
    parked_[task.Key()] = d.slot_back_at;
    d.reason = absl::StrCat(cause, "; the group goes on with ", in_world_others, " of ",
                            role->max_instances, " ", task.role, " tasks (restart ",
                            d.restart_number, " of ", role->max_restarts, "), this one back in ",
                            Seconds(Backoff(failures)));
    return d;
  }
  d.action = Action::kRestartGroup;
  d.delay = Backoff(d.restart_number);
  d.reason = absl::StrCat(cause, "; restarting the group in ", Seconds(d.delay), " (restart ",
                          d.restart_number, " of ", role->max_restarts, ")");
  return d;
}

PolicyDecision FailurePolicy::OnCleanExit(const TaskRecord& task) {
  PolicyDecision d;
  const spec::Role* role = job_.FindRole(task.role);
  if (role == nullptr || role->restart != spec::RestartMode::kAlways ||
      role->on_failure != spec::OnFailure::kRestartTask) {
    return d;
  }
  uint32_t& used = task_restarts_[task.Key()];
  if (used >= role->max_restarts) return d;
  d.action = PolicyDecision::Action::kRestartTask;
  d.restart_number = ++used;
  d.delay = Backoff(d.restart_number);
  d.reason = absl::StrCat("exited with code 0 and restarts always; restarting in ",
                          Seconds(d.delay), " (restart ", d.restart_number, " of ",
                          role->max_restarts, ")");
  return d;
}

std::vector<std::string> FailurePolicy::SlotsBack(Clock::TimePoint now) const {
  std::vector<std::string> back;
  for (const auto& [key, at] : parked_) {
    if (at <= now) back.push_back(key);
  }
  return back;
}

std::optional<Clock::TimePoint> FailurePolicy::NextSlotBack(Clock::TimePoint now) const {
  std::optional<Clock::TimePoint> next;
  for (const auto& [key, at] : parked_) {
    if (at > now && (!next || at < *next)) next = at;
  }
  return next;
}

void FailurePolicy::Unpark(const std::string& task_key) { parked_.erase(task_key); }

void FailurePolicy::Restore(const std::string& task_key, const std::string& action,
                            uint32_t restart_number, Clock::TimePoint now) {
  if (action == ActionName(PolicyDecision::Action::kRestartTask)) {
    task_restarts_[task_key] = std::max(task_restarts_[task_key], restart_number);
  } else if (action == ActionName(PolicyDecision::Action::kRestartGroup)) {
    group_restarts_ = std::max(group_restarts_, restart_number);
  } else if (action == ActionName(PolicyDecision::Action::kShrinkGroup)) {
    group_restarts_ = std::max(group_restarts_, restart_number);
    ++slot_failures_[task_key];
    parked_[task_key] = now;
  }
}

}  // namespace shoal::master
