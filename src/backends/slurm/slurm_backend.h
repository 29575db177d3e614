#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <map>
#include <set>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "backends/slurm/srun_command.h"

namespace shoal::backends {

struct SlurmBackendOptions {
  SlurmRequest request;
  // Where srun's output (Slurm's messages and the agents' own log lines) and the record a
  // recovering master needs are kept: the job directory's agents/slurm.
  std::string state_dir;
  // Node-local directory under which each agent keeps its files (one subdirectory per place).
  std::string agent_work_dir;
  std::string srun = "srun";
  std::string scancel = "scancel";
  std::string squeue = "squeue";
};

// Runs the job as one Slurm job: a single srun allocates the whole gang as a heterogeneous job
// (one component per role) and starts one agent per Slurm task, and so per Shoal task; Slurm
// binds each its CPUs, memory and GPUs. The allocation lives as long as srun does. See
// docs/backends/slurm.md for why this shape.
class SlurmBackend final : public Backend {
 public:
  explicit SlurmBackend(SlurmBackendOptions options);
  ~SlurmBackend() override;

  std::string Name() const override { return "slurm"; }
  absl::StatusOr<std::vector<NodeGrant>> Acquire(const spec::JobSpec& job,
                                                 const std::string& job_id) override;
  absl::Status StartAgents(const AgentStartOptions& options) override;
  void SetPlaceLostCallback(PlaceLostCallback callback) override;
  void SetAllocationEventCallback(AllocationEventCallback callback) override;
  bool SignalsTasksFromOutside() const override { return true; }
  // Slurm cannot end one task of a step: a silent agent's own watchdog kills it and its tasks
  // (agent_watchdog.h) a heartbeat after the master gave up on it; the place is not reused.
  void TerminatePlace(const std::string& node) override {}
  void Release() override;
  absl::Status Reattach(const std::string& job_id, const std::vector<NodeGrant>& grants,
                        const AgentStartOptions& options) override;

  // The Slurm job's name, which finds it in squeue and scancel: shoal-<job id>.
  std::string SlurmJobName() const { return "shoal-" + job_id_; }

  // The address this machine uses towards the Slurm controller: where agents on the compute
  // nodes can reach a master started here. From `scontrol show config`.
  static absl::StatusOr<std::string> AddressTowardsController();
  // How many nodes `partition` holds, in any state (empty: the cluster's default partition).
  static absl::StatusOr<uint32_t> PartitionNodeCount(const std::string& partition);

 private:
  void Watch(pid_t pid, int pidfd, uint64_t log_offset);
  void HandleLine(const std::string& line);
  // squeue's reason for a pending job (e.g. "Resources", "Priority"), or "".
  std::string PendingReason(uint64_t slurm_job) const;
  void CancelSlurmJob();
  std::string LogPath() const { return options_.state_dir + "/srun.log"; }
  std::string RecordPath() const { return options_.state_dir + "/srun.json"; }

  SlurmBackendOptions options_;
  spec::JobSpec job_;
  std::string job_id_;
  std::vector<NodeGrant> places_;
  std::map<uint32_t, std::string> place_of_rank_;  // Slurm task rank -> place name

  std::mutex mu_;
  std::condition_variable srun_exited_;
  pid_t srun_pid_ ABSL_GUARDED_BY(mu_) = -1;
  int srun_status_ ABSL_GUARDED_BY(mu_) = -1;  // -1: unknown (not our child) or not exited
  bool srun_started_ ABSL_GUARDED_BY(mu_) = false;
  bool releasing_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::set<std::string> lost_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  PlaceLostCallback on_lost_ ABSL_GUARDED_BY(mu_);
  AllocationEventCallback on_event_ ABSL_GUARDED_BY(mu_);
  std::thread watcher_;
};

}  // namespace shoal::backends
