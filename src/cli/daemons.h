#pragma once

#include <optional>
#include <string>
#include <vector>

namespace shoal::cli {

// `shoal master --job-dir DIR`: the per-job master, started by `shoal run`.
// `ready_fd` >= 0: a pipe to write one byte to once the master listens (its address is in
// master.json); `shoal run` waits on it.
int RunMasterDaemon(const std::string& job_dir, const std::string& shoal_binary, bool recover,
                    int ready_fd = -1);

struct AgentFlags {
  std::string master;
  std::string node = "local";
  std::string work_dir;
  uint32_t ports = 0;
  std::string task_ports;  // LOW-HIGH; empty: below the kernel's ephemeral range
  uint32_t master_grace_ms = 10000;
  uint32_t heartbeat_interval_ms = 0;
  bool keep_task_output = true;
  std::optional<uint32_t> fake_gpus;
  // Started by srun for one Slurm task: the job's place map ("chief:0,worker:1") and
  // SLURM_PROCID name its place; the GPUs Slurm bound to the task are the agent's.
  std::string slurm_place;
  // The resource manager bound this agent's GPUs (YARN's GPU plugin): they are the ones in
  // CUDA_VISIBLE_DEVICES, none when it is unset.
  bool gpus_from_env = false;
  // Runs in a container whose limits bound the tasks (a Kubernetes pod): see AgentOptions.
  bool in_container = false;
  uint32_t watchdog_ms = 0;   // 0: no watchdog
  uint32_t log_flush_ms = 200;  // how long task output is held before it goes to the master
  std::string shoal_binary;   // for the watchdog
};
// `shoal agent ...`: one node's agent, started by a backend.
int RunAgentDaemon(const AgentFlags& flags);

}  // namespace shoal::cli
