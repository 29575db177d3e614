#pragma once

// Admission: from a submitted job to places granted and agents started. Asks the backend for
// places (again every `retry` while it answers Unavailable), places the tasks on them, starts
// the agents, and waits for a batch scheduler that queues the job (allocation events). The
// registration deadline for the agents is armed here. Runs on the master's loop.

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "backends/backend.h"
#include "master/journaled_state.h"
#include "master/placement.h"

namespace shoal::master {

class Admission {
 public:
  class Host {
   public:
    virtual ~Host() = default;
    virtual void Record(JournalRecord record) = 0;  // applied and journaled
    virtual void SetPhase(JobPhase phase, const std::string& reason) = 0;
    virtual void BeginStopping(JobPhase outcome, const std::string& reason) = 0;
    virtual bool Ending() const = 0;
    virtual uint64_t PostAfter(std::chrono::milliseconds delay, std::function<void()> task) = 0;
    virtual void CancelTimer(uint64_t id) = 0;
    // Whether the agent of `node` registered.
    virtual bool Registered(const std::string& node) = 0;
    // The agents were started: heartbeats are watched from now on.
    virtual void AgentsStarted() = 0;
    // What the backend needs to start (or replace) this job's agents.
    virtual backends::AgentStartOptions AgentStartOptions() const = 0;
    // Deferred places were named: the agents the rendezvous waits for may all be in already.
    virtual void RendezvousMayComplete() = 0;
  };

  struct Options {
    std::string job_id;
    std::chrono::milliseconds retry{1000};             // MasterOptions::admission_retry
    std::chrono::milliseconds register_timeout{30000};  // MasterOptions::register_timeout
  };

  Admission(JournaledState* job, backends::Backend* backend, Host* host, Options options)
      : job_(job), backend_(backend), host_(host), options_(std::move(options)) {}

  void TryAdmit();
  void OnAllocationEvent(const backends::Backend::AllocationEvent& event);
  // The agents must register within the timeout, or the job fails naming those missing.
  // Deferred places (journaled_state.h) are not waited for.
  void ArmRegisterTimer();
  void CancelRegisterTimer();
  // A recovering master: the agents must come back within the timeout; `on_timeout` then.
  void ArmReattachTimer(std::function<void()> on_timeout);
  // Places the tasks on the journaled grants again (a recovering master).
  absl::Status PlaceAgain();
  // Where each task runs, parallel to JobState's tasks; empty before admission.
  const std::vector<PlacedTask>& placement() const { return placement_; }
  const backends::NodeGrant* GrantFor(const std::string& node) const;

 private:
  JournaledState* job_;
  backends::Backend* backend_;
  Host* host_;
  Options options_;
  std::vector<PlacedTask> placement_;
  uint64_t register_timer_ = 0;
};

}  // namespace shoal::master
