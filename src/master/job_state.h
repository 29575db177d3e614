#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "spec/job_spec.h"

namespace shoal::master {

enum class TaskState { kPending, kStarting, kRunning, kSucceeded, kFailed, kKilled };
enum class JobPhase { kQueued, kStarting, kRunning, kStopping, kSucceeded, kFailed, kKilled };

const char* TaskStateName(TaskState state);
const char* JobPhaseName(JobPhase phase);
bool IsTerminal(TaskState state);
bool IsTerminal(JobPhase phase);

struct TaskRecord {
  std::string role;
  uint32_t index = 0;
  uint32_t global_rank = 0;
  bool tracked = true;
  bool decides_success = false;
  TaskState state = TaskState::kPending;
  std::string node;
  int pid = 0;
  int exit_code = 0;
  int signal = 0;
  std::string reason;  // one line: why it failed or was killed
  uint32_t attempt = 0;       // launches so far minus one: SHOAL_RESTART_COUNT of the current one
  uint32_t restarts = 0;      // restart-task restarts spent on this task
  // Set by the master before a failure or stop that a restart will follow, so that the failure
  // does not decide the job's outcome.
  bool restart_pending = false;
  // False for an elastic slot left out of the current world; it does not count for success.
  bool in_world = true;
  uint64_t step = 0;          // last step reported through the SDK
  std::string hung_reason;    // set when the task was killed for lack of progress
  std::string cause;          // the last failure's cause, without the policy's decision

  std::string Key() const { return role + ":" + std::to_string(index); }
};

struct Outcome {
  JobPhase phase;
  std::string reason;
};

// The tasks of one job and the rules that turn their states into the job's outcome. Pure: no
// clock, no I/O; the master journals what Transition returns.
class JobState {
 public:
  explicit JobState(const spec::JobSpec& spec);

  std::vector<TaskRecord>& tasks() { return tasks_; }
  const std::vector<TaskRecord>& tasks() const { return tasks_; }
  TaskRecord* Find(const std::string& role, uint32_t index);

  // Moves `task` to `to`, refusing moves out of a terminal state or backwards. Returns the
  // journal record of the change.
  std::optional<nlohmann::json> Transition(TaskRecord& task, TaskState to,
                                           const std::string& reason = "");

  // Starts a new attempt of a finished task: back to pending, attempt + 1. Returns the journal
  // record, or nullopt if the task is not terminal.
  std::optional<nlohmann::json> Restart(TaskRecord& task);
  // Leaves a finished task out of (or takes it back into) the world. Out of the world it does not
  // count for success.
  void SetInWorld(TaskRecord& task, bool in_world);

  // Decided once a tracked task failed (the first failure names the job's reason) or every
  // task of the success roles succeeded. nullopt while the job should go on.
  std::optional<Outcome> DecideOutcome() const;

  // Every task of `role` has started (running or already finished).
  bool RoleStarted(const std::string& role) const;
  // No task is pending or starting any more.
  bool AllStarted() const { return not_started_ == 0; }
  bool AllTerminal() const { return not_terminal_ == 0; }

 private:
  std::vector<TaskRecord> tasks_;  // in global-rank order
  std::map<std::pair<std::string, uint32_t>, size_t> index_;  // (role, index) -> tasks_ slot
  std::optional<Outcome> first_failure_;
  // Kept by Transition so that the master's per-event checks are O(1), not O(tasks).
  size_t not_started_ = 0;
  size_t not_terminal_ = 0;
  size_t success_tasks_ = 0;
  size_t success_tasks_succeeded_ = 0;
  std::map<std::string, size_t> role_not_started_;
};

// "exited with code 3" / "was killed by signal 9 (SIGKILL)".
std::string DescribeExit(int exit_code, int signal);

}  // namespace shoal::master
