#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "agent/agent_watchdog.h"
#include "agent/log_batcher.h"
#include "agent/nvml.h"
#include "process/process_supervisor.h"
#include "agent/sdk_server.h"
#include "common/port_range.h"

namespace shoal::v1 {
class AgentMessage;
class MasterMessage;
}  // namespace shoal::v1

namespace shoal::agent {

// The process module's vocabulary, which the agent speaks throughout.
using process::ProcessExit;
using process::ProcessSpec;
using process::ProcessSupervisor;
using process::SupervisorCallbacks;
using process::SupervisorOptions;

class MasterLink;

struct AgentOptions {
  std::string master_address;   // host:port
  std::string token;            // from SHOAL_AGENT_TOKEN, never argv
  std::string node_name;        // the placement node this agent serves
  std::string work_dir;         // the agent's own copy of task output, cluster files
  uint32_t ports = 0;           // free ports to report for the tasks placed here
  // Where those ports come from (SHOAL_TASK_PORTS); unset: below the ephemeral range.
  std::optional<shoal::PortRange> task_ports;
  // Keep a copy of each task's output under work_dir. Off when the master's job directory is on
  // this same machine (the local backend): the master writes those files already.
  bool keep_task_output = true;
  std::optional<uint32_t> fake_gpus;
  // The GPUs a resource manager bound to this agent (Slurm's CUDA_VISIBLE_DEVICES for its
  // task): reported instead of the machine's, so the tasks get exactly those.
  std::optional<std::vector<std::string>> bound_gpus;
  // Started by srun: hide Slurm's description of its own step from the tasks (see Launch).
  bool hide_slurm_step_env = false;
  // The agent runs in a container of its own (a Kubernetes pod, one task in it): the
  // container's limits bound the task's memory, and every process it starts dies with the
  // container. A container gives no writable cgroup, and that is no news worth a notice.
  bool in_container = false;
  std::chrono::milliseconds heartbeat_interval{1000};
  // How long the agent keeps its tasks alive without a master. Past it, it kills them all.
  std::chrono::milliseconds master_grace{10000};
  std::chrono::milliseconds reconnect_interval{250};
  // Past this long without a heartbeat, a watchdog process (shoal_binary agent-watchdog) kills
  // the agent and everything under it (agent_watchdog.h). Zero: no watchdog.
  std::chrono::milliseconds watchdog_limit{0};
  std::string shoal_binary;
  // Task output is held this long and sent as one chunk per task stream (log_batcher.h);
  // a task's output always reaches the master before its exit. Zero: every read at once.
  std::chrono::milliseconds log_flush_window{200};
  // Every this long the agent measures each of its tasks (CPU, memory, GPUs: resource_sampler.h)
  // and sends the samples to the master, which keeps them in the task's resources.jsonl.
  // Zero: no samples.
  std::chrono::milliseconds resource_sample_interval{2000};
  // The NVML library GPU samples come from; absent: no GPU fields (nvml.h).
  std::string nvml_library = Nvml::kDefaultLibrary;
};

// Runs on one node: dials the master, launches what it is told, reports facts (started, output,
// exited), heartbeats, and kills its tasks when the master is gone for longer than the grace.
// It never decides policy.
class Agent {
 public:
  static absl::StatusOr<std::unique_ptr<Agent>> Create(AgentOptions options);
  ~Agent();

  // Blocks until the master shuts the agent down (returns 0), the master is lost for longer than
  // the grace (1), or RequestStop was called (0). Every task is dead when it returns.
  int Run();
  // Thread-safe; used by the SIGTERM handler thread.
  // `why` non-empty: told to the master first (the stop came from outside Shoal).
  void RequestStop(const std::string& why = "");
  // Joins the agent's threads and removes what it made on the machine (task cgroups, the SDK
  // socket), leaving only the connection object. The destructor calls it; a daemon about to
  // _exit calls it and need not destroy the agent (see KeepUntilExit). Idempotent.
  void Shutdown();

 private:
  explicit Agent(AgentOptions options);
  bool Connect();
  void HandleMessage(const v1::MasterMessage& message);
  void Launch(const v1::MasterMessage& message);
  void Send(const v1::AgentMessage& message);
  void HeartbeatLoop();
  // Measures the live tasks every resource_sample_interval and sends what it found.
  void SampleLoop();
  void StopTasksAndWait(std::chrono::milliseconds grace);
  void OnExit(const std::string& key, const ProcessExit& exit);

  AgentOptions options_;
  // Waits until the supervisor exists; null if it could not be created (the reason is in
  // supervisor_ready_).
  ProcessSupervisor* Supervisor();

  std::unique_ptr<ProcessSupervisor> supervisor_;  // set once supervisor_ready_ is ready
  std::shared_future<absl::Status> supervisor_ready_;
  std::unique_ptr<MasterLink> link_;
  std::unique_ptr<LogBatcher> log_batcher_;
  std::unique_ptr<SdkServer> sdk_;
  std::thread heartbeat_thread_;
  std::thread sample_thread_;
  std::unique_ptr<AgentWatchdog> watchdog_;
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> shutting_down_{false};

  // An absl::Mutex, not a std::mutex: clang's -Wthread-safety checks the ABSL_GUARDED_BY below
  // only against a mutex type that is annotated (tests/thread_safety: libstdc++'s is not).
  absl::Mutex mu_;
  absl::CondVar cv_;
  // Tasks whose TaskStarted has not been sent yet; an exit that races ahead waits here.
  std::set<std::string> starting_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, ProcessExit> early_exits_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> live_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> stopping_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint32_t> attempts_ ABSL_GUARDED_BY(mu_);  // task -> current attempt
  // How many bytes of each stream of its current attempt a task has written: where the next
  // chunk starts, so that the master can skip what it already has (master_outbox.h).
  struct OutputOffsets {
    uint32_t attempt = 0;
    uint64_t next[2] = {0, 0};  // stdout, stderr
  };
  std::map<std::string, OutputOffsets> output_offsets_ ABSL_GUARDED_BY(mu_);
  // Each task's last exit as reported. A master may die with it unread in its socket (the
  // write succeeded): the agent reports it again to every master it registers with after the
  // first, and the master ignores what it had seen (an older attempt, a finished task).
  struct ReportedExit {
    uint32_t attempt = 0;
    ProcessExit exit;
  };
  std::map<std::string, ReportedExit> last_exits_ ABSL_GUARDED_BY(mu_);
  bool registered_before_ ABSL_GUARDED_BY(mu_) = false;
  // What the resource samples of a task's current attempt carry beside the measures.
  struct SampledTask {
    int64_t start_unix_ms = 0;
    std::vector<uint32_t> gpus;  // the numeric device ids it was given (NVML indexes)
  };
  std::map<std::string, SampledTask> sampled_ ABSL_GUARDED_BY(mu_);
  uint64_t heartbeat_seq_ = 0;
};

}  // namespace shoal::agent
