#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "spec/job_spec.h"

namespace shoal::backends {

// One place granted to a job, where one agent will run the tasks placed on it.
struct NodeGrant {
  std::string name;               // stable within the job, e.g. "local" or a Slurm node name
  std::string address;            // how tasks on other nodes reach this one
  double cpus = 0;                // granted to this job
  uint64_t memory_bytes = 0;      // granted to this job
  std::vector<uint32_t> cores;    // cores this job may pin to exclusively; empty: no pinning
  std::vector<std::string> gpus;  // device ids granted to this job
  // Set where the resource manager sized the place for one task (Slurm: one Slurm task per
  // Shoal task): only that task ("role:index") may be placed here.
  std::string for_task;
  // The resource manager picks the devices when the agent starts (Slurm binds GPUs per task):
  // the agent reports them when it registers and the task gets those; `gpus` is then empty and
  // `gpu_count` says how many there will be.
  bool gpus_from_agent = false;
  uint32_t gpu_count = 0;
};

struct AgentStartOptions {
  std::string master_address;  // host:port the agents dial
  std::string token;           // passed to agents through their environment, never argv
  std::string job_id;
  std::string job_dir;
  std::string shoal_binary;    // the binary whose `agent` subcommand runs an agent
  std::map<std::string, uint32_t> ports_per_node;  // how many free ports each agent reports
  uint32_t master_grace_ms = 10000;
  uint32_t heartbeat_interval_ms = 1000;
  // How long the master waits for an agent's heartbeat before it declares the agent silent;
  // agents run a watchdog that kills them a heartbeat later (0: no watchdog).
  uint32_t silent_after_ms = 0;
};

// The agent's --watchdog-ms for `options`: one heartbeat past the later of the master's own
// limit (so the master has declared the agent silent and handled its tasks before the watchdog
// acts) and the agent's master grace (an agent whose heartbeats block on a master that stopped
// answering keeps its tasks that long, as it would if the master were gone).
inline uint32_t WatchdogMs(const AgentStartOptions& options) {
  if (options.silent_after_ms == 0) return 0;
  return std::max(options.silent_after_ms, options.master_grace_ms) + options.heartbeat_interval_ms;
}

// One place per task, named "role.index" and sized for that task alone (`for_task`), whole CPUs
// (resource managers that start one process per task grant no fractions), GPUs picked when the
// agent starts (`gpus_from_agent`): what Slurm and Spark grant.
std::vector<NodeGrant> OnePlacePerTask(const spec::JobSpec& job);

// Obtains and releases places to run agents for a gang of tasks. The master never knows which
// implementation it talks to. Methods are called from the master's event loop.
class Backend {
 public:
  using PlaceLostCallback = std::function<void(const std::string& node, const std::string& why)>;

  // What a resource manager tells about the whole allocation while the job runs.
  struct AllocationEvent {
    enum Kind {
      kQueued,     // accepted but waiting for resources (reason: the manager's words)
      kAllocated,  // the resources are held; agents are starting
      kRefused,    // the manager will never run it as asked (reason: the manager's words)
      kCancelled,  // ended from outside Shoal: scancel, a time limit, a node failure
    };
    Kind kind;
    std::string reason;
    // kAllocated only: granted places whose agents come later, when the cluster has room for
    // them (places of elastic roles beyond their min). The job may start without them; each
    // joins when its agent registers.
    std::vector<std::string> deferred = {};
  };
  using AllocationEventCallback = std::function<void(const AllocationEvent&)>;

  virtual ~Backend() = default;
  virtual std::string Name() const = 0;

  // The whole gang or nothing. Unavailable: it cannot fit now (the message says why; the
  // master retries). FailedPrecondition: it can never fit here.
  virtual absl::StatusOr<std::vector<NodeGrant>> Acquire(const spec::JobSpec& job,
                                                         const std::string& job_id) = 0;
  // Starts one agent per granted node. REQUIRES: Acquire succeeded.
  virtual absl::Status StartAgents(const AgentStartOptions& options) = 0;
  // Called (from any thread) when a place is lost: its agent died or the node went away.
  virtual void SetPlaceLostCallback(PlaceLostCallback callback) = 0;
  // Called (from any thread) by backends whose allocation is granted after StartAgents, by an
  // outside scheduler. Backends that hold everything from Acquire on never call it.
  virtual void SetAllocationEventCallback(AllocationEventCallback callback) {}
  // Whether the resource manager itself may signal the tasks (Slurm signals every process of a
  // step on scancel or at a time limit): a task's SIGTERM may then be part of a cancellation
  // the backend is about to report, rather than a failure.
  virtual bool SignalsTasksFromOutside() const { return false; }
  // Where it does, how long the master waits, after a task's unrequested SIGTERM/SIGKILL or an
  // agent's disconnect, for this backend to report why (a cancelled allocation, a lost place)
  // before it counts as a failure: as long as the manager may take to say so.
  virtual std::chrono::milliseconds OutsideStopSettle() const {
    return std::chrono::milliseconds(2000);
  }
  // Whether an agent registering for `node` from `hostname` is the one the backend started
  // there last. An agent of a replaced place that comes back to life (a node cut off, then
  // reachable again) must not be taken for its replacement.
  virtual bool IsCurrentAgent(const std::string& node, const std::string& hostname) const {
    return true;
  }
  // The master gave up on this place (its agent went silent): kill its agent and every task
  // there now, without waiting. Non-blocking; the place-lost callback may follow.
  virtual void TerminatePlace(const std::string& node) = 0;
  // How the job ended, told just before Release, for resource managers that keep a record of
  // it (YARN's final application status: SUCCEEDED, FAILED, or KILLED when killed through
  // Shoal). Backends that keep none ignore it.
  enum class Outcome { kSucceeded, kFailed, kKilled };
  virtual void SetOutcome(Outcome outcome, const std::string& reason) {}
  // Stops agents still running and frees everything Acquire took. Safe to call twice.
  virtual void Release() = 0;

  // The place's agent is gone (its death was reported through the place-lost callback): start a
  // new agent there, which registers like the first one did. Unimplemented where a lost place
  // cannot come back.
  virtual absl::Status ReplacePlace(const std::string& node, const AgentStartOptions& options) {
    return absl::UnimplementedError(Name() + " backend cannot replace a lost place");
  }

  // A new master took over the job after the previous one died: hold `grants` again (as
  // journaled by the previous master) and watch the agents it started, which keep running and
  // reconnect by themselves. NotFound for a place whose agent is gone, unless the backend can
  // replace places: then it reports such a place through the place-lost callback. Instead of
  // Acquire and StartAgents.
  virtual absl::Status Reattach(const std::string& job_id, const std::vector<NodeGrant>& grants,
                                const AgentStartOptions& options) {
    return absl::UnimplementedError(Name() + " backend cannot re-attach to a running job");
  }
};

}  // namespace shoal::backends
