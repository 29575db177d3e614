#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "master/job_state.h"
#include "spec/job_spec.h"

namespace shoal::master {

// What to do about one task that ended (docs/fault-tolerance.md).
struct PolicyDecision {
  enum class Action {
    kNone,              // a clean exit: nothing to do
    kFail,              // final: a tracked task's failure fails the job
    kRestartTask,       // start this task alone again after `delay`
    kRestartGroup,      // stop the whole group; a new rendezvous after `delay`
    kShrinkGroup,       // elastic: leave the slot out; the survivors re-form at once
    kJoinGroupRestart,  // a group restart is already under way: this is part of it
  };
  Action action = Action::kNone;
  std::chrono::milliseconds delay{0};
  // The task's one-line reason as the user reads it: the cause, plus what happens next.
  std::string reason;
  uint32_t restart_number = 0;  // which restart this is (per task or for the group)
  Clock::TimePoint slot_back_at{};  // kShrinkGroup: when the slot may rejoin
};

const char* ActionName(PolicyDecision::Action action);

// The failure-handling state machine of one job: restart budgets, backoff and elastic slots.
// Pure: time is passed in, nothing is scheduled or sent; the master acts on the decisions.
class FailurePolicy {
 public:
  explicit FailurePolicy(const spec::JobSpec& job);

  // A task failed (non-zero exit, signal, hang, lost agent, could not start). `in_world_others`:
  // the tasks of its role in the current world, the failed one excluded.
  PolicyDecision OnFailure(const TaskRecord& task, const std::string& cause,
                           bool group_restart_in_progress, uint32_t in_world_others,
                           Clock::TimePoint now);
  // A task exited 0: restarted only under `restart: always`.
  PolicyDecision OnCleanExit(const TaskRecord& task);

  // Whether the task belongs to the group that restart-group and elastic restart together:
  // every role except restart-task roles.
  bool InGroup(const std::string& role) const;
  // The n-th restart (1-based) waits min(max, initial * 2^(n-1)); the 0th waits nothing.
  std::chrono::milliseconds Backoff(uint32_t restart_number) const;

  uint32_t group_restarts() const { return group_restarts_; }
  uint32_t task_restarts(const std::string& task_key) const;

  // Elastic slots left out of the world, and when each may rejoin.
  bool IsParked(const std::string& task_key) const { return parked_.count(task_key) > 0; }
  const std::map<std::string, Clock::TimePoint>& parked() const { return parked_; }
  // Slots whose time to rejoin has come, in key order.
  std::vector<std::string> SlotsBack(Clock::TimePoint now) const;
  // The earliest time after `now` at which a parked slot's backoff ends (slots already due wait
  // for something else: their place).
  std::optional<Clock::TimePoint> NextSlotBack(Clock::TimePoint now) const;
  // The slot rejoins the world (its time came, or its role fell below min).
  void Unpark(const std::string& task_key);
  // A slot the job started without (its place waits for room in the cluster): parked, back
  // from `now` on, without a failure or a restart counted.
  void Defer(const std::string& task_key, Clock::TimePoint now) { parked_[task_key] = now; }

  // A recovering master replays the decisions its predecessor journaled ("failure_handled"
  // records: task, action, restart), so budgets are never reset by a master crash. A parked
  // slot comes back `now`: its backoff was served while the masters changed.
  void Restore(const std::string& task_key, const std::string& action, uint32_t restart_number,
               Clock::TimePoint now);

 private:
  const spec::JobSpec& job_;
  uint32_t group_restarts_ = 0;
  std::map<std::string, uint32_t> task_restarts_;
  std::map<std::string, uint32_t> slot_failures_;
  std::map<std::string, Clock::TimePoint> parked_;
};

}  // namespace shoal::master
