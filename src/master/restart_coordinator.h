#pragma once

// Acting on the failure policy's decisions: a task restarted alone, the group stopped and
// re-formed as a new generation, an elastic group shrunk without a lost slot and grown back
// when its backoff is served (docs/fault-tolerance.md). FailurePolicy decides; this carries the
// decision out through its Host (the master). Runs on the master's loop.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/clock.h"
#include "master/journaled_state.h"

namespace shoal::master {

// How long a group restart waits before the new rendezvous: `delay`, or longer while an elastic
// role is below its min and its earliest parked slots are not back yet. Pure.
std::chrono::milliseconds GroupRelaunchDelay(const spec::JobSpec& spec,
                                             const std::vector<TaskRecord>& tasks,
                                             const std::map<std::string, Clock::TimePoint>& parked,
                                             Clock::TimePoint now,
                                             std::chrono::milliseconds delay);

// The parked slots that rejoin at a relaunch: those whose time is up and whose place is ready
// (`place_ready`: its agent is registered), and earlier or placeless ones while their role is
// below min. Task keys, in JobState's order per role. Pure.
std::vector<std::string> SlotsToRejoin(const spec::JobSpec& spec,
                                       const std::vector<TaskRecord>& tasks,
                                       const std::map<std::string, Clock::TimePoint>& parked,
                                       Clock::TimePoint now,
                                       const std::function<bool(const TaskRecord&)>& place_ready);

class RestartCoordinator {
 public:
  // What the coordinator needs of the master.
  class Host {
   public:
    virtual ~Host() = default;
    virtual void Record(JournalRecord record) = 0;  // applied and journaled
    virtual void Transition(TaskRecord& task, TaskState to, const std::string& reason) = 0;
    virtual void StopTask(TaskRecord& task, std::chrono::milliseconds grace,
                          const std::string& reason) = 0;
    virtual void Notice(const std::string& text) = 0;
    virtual uint64_t PostAfter(std::chrono::milliseconds delay, std::function<void()> task) = 0;
    // The job is stopping or over: nothing is restarted any more.
    virtual bool Ending() const = 0;
    // A new world as `generation`: ranks for the tasks in it, journaled. Returns its
    // size, or nothing when it cannot be formed (the job then stops).
    virtual std::optional<size_t> FormWorld(uint32_t generation) = 0;
    // Launches the pending tasks of `role` (empty: every role of the group) again.
    virtual void Relaunch(const std::string& role) = 0;
    // Whether the task's place has an agent that could run it now: a slot whose place was lost
    // and is being replaced (a preempted pod waiting for room) would hold the whole group in
    // its rendezvous if it rejoined before its new agent registered.
    virtual bool PlaceReady(const TaskRecord& task) = 0;
  };

  RestartCoordinator(JournaledState* job, Host* host, Clock* clock,
                     std::chrono::milliseconds stop_grace)
      : job_(job), host_(host), clock_(clock), stop_grace_(stop_grace) {}

  // Applies the role's policy to a task that ended badly (exit, signal, hang, lost agent).
  void HandleTaskFailure(TaskRecord& task, const std::string& cause);
  void HandleCleanExit(TaskRecord& task);
  // Starts the next attempt of a task whose restart was scheduled, unless things moved on.
  void RelaunchTask(const std::string& role, uint32_t index, uint32_t attempt);
  // Stops every task of the group for a new rendezvous, which starts `delay` after the last
  // of them is gone.
  void BeginGroupRestart(const std::string& reason, std::chrono::milliseconds delay);
  // Relaunches the group once every task of it has stopped.
  void MaybeRelaunchGroup();
  // Elastic: parked slots come back once their backoff has passed and their place is ready
  // (Host::PlaceReady). The job grows towards max at the next checkpoint (no work lost), or at
  // once when the job keeps no checkpoints. Called again when a place becomes ready.
  void CheckGrowth();
  // A checkpoint was reported: a pending growth happens now.
  void OnCheckpoint();
  // A group restart is stopping the group's tasks. Not while it only waits for its delay once
  // they are all down (the journal's group_restart_in_progress lasts until group_restarted).
  bool StoppingGroup() const { return job_->group_restart_in_progress && !relaunch_waiting_; }
  // Starts a restarted task's next attempt: journaled as its move back to pending.
  void RestartTask(TaskRecord& task);
  // Journals the shard table's records.
  void JournalShardRecords(std::vector<nlohmann::json>& records);

 private:
  void ScheduleTaskRestart(TaskRecord& task, const PolicyDecision& decision);
  void RelaunchGroup();
  void BeginGrowth();
  // The parked slots whose backoff has passed and whose place is ready.
  std::vector<std::string> SlotsReady(Clock::TimePoint now);

  JournaledState* job_;
  Host* host_;
  Clock* clock_;
  std::chrono::milliseconds stop_grace_;
  bool grow_pending_ = false;  // elastic: capacity is back; grow after the next checkpoint
  bool grow_timer_set_ = false;
  bool relaunch_waiting_ = false;
};

}  // namespace shoal::master
