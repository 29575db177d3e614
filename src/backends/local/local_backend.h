#pragma once

#include <sys/types.h>

#include <memory>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "backends/backend.h"
#include "process/resource_limits.h"
#include "backends/local/resource_ledger.h"
#include "machine/machine_inventory.h"

namespace shoal::backends {

struct LocalBackendOptions {
  machine::MachineInventory machine;  // what this machine offers (detected or declared)
  std::string ledger_dir;          // shared by every job under the same jobs root
  std::string agent_work_dir;      // the agent keeps its own task logs under here
  std::optional<uint32_t> fake_gpus;  // forwarded to the agent's inventory
};

// Runs the whole job on this machine: one agent process, a child of the master in its own
// process group. Gang admission is against the machine minus what other live jobs hold.
class LocalBackend final : public Backend {
 public:
  explicit LocalBackend(LocalBackendOptions options);
  ~LocalBackend() override;

  std::string Name() const override { return "local"; }
  absl::StatusOr<std::vector<NodeGrant>> Acquire(const spec::JobSpec& job,
                                                 const std::string& job_id) override;
  absl::Status StartAgents(const AgentStartOptions& options) override;
  void SetPlaceLostCallback(PlaceLostCallback callback) override;
  void TerminatePlace(const std::string& node) override;
  void Release() override;
  absl::Status ReplacePlace(const std::string& node, const AgentStartOptions& options) override;
  absl::Status Reattach(const std::string& job_id, const std::vector<NodeGrant>& grants,
                        const AgentStartOptions& options) override;

 private:
  // `child`: the agent is our child (waitpid); else it was adopted and is watched via a pidfd.
  void WatchAgent(pid_t pid, bool child);
  std::string AgentRecordPath() const { return options_.agent_work_dir + "/agent.json"; }
  // SIGKILL to the agent and, through its cgroup, to every process it started.
  void KillAgentAndTasks();

  LocalBackendOptions options_;
  ResourceLedger ledger_;
  Reservation reservation_;
  std::string job_id_;
  absl::Mutex mu_;  // annotated, unlike std::mutex: clang checks the ABSL_GUARDED_BY below
  absl::CondVar agent_exited_;
  pid_t agent_pid_ ABSL_GUARDED_BY(mu_) = -1;
  bool releasing_ ABSL_GUARDED_BY(mu_) = false;
  PlaceLostCallback on_lost_ ABSL_GUARDED_BY(mu_);
  std::thread watcher_;
  // The agent's own cgroup (tracking only); the agent makes its tasks' cgroups below it, so
  // killing it reaches every task even when the agent is hung or dead. Null where no cgroup
  // can be made: then the tasks' PR_SET_PDEATHSIG is the only guard.
  std::unique_ptr<process::ResourceLimits> limits_;
  std::unique_ptr<process::TaskCgroup> agent_cgroup_;
};

}  // namespace shoal::backends
