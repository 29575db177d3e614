#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "process/process_launcher.h"
#include "process/process_spec.h"
#include "process/resource_limits.h"
#include "process/spawn_thread.h"
#include "process/task_cgroup.h"
#include "common/unique_fd.h"

namespace shoal::process {

struct SupervisorOptions {
  // cgroups are created under <hierarchy>/<agent's own cgroup>/<cgroup_name>/<instance_id>/<task>
  // (see ResourceLimits). Default: "shoal".
  std::string cgroup_name = "shoal";
  // Unique per agent on a machine; one directory name (no '/'). Default (empty): derived from
  // getpid() plus a per-process counter.
  std::string instance_id;
  // Where cgroup hierarchies are mounted. Default: /sys/fs/cgroup. Tests point it at a plain
  // directory to get a machine without cgroups.
  std::string cgroup_root = "/sys/fs/cgroup";
  // false: use only cgroup v1 hierarchies (to exercise those paths on hybrid machines).
  bool allow_cgroup_v2 = true;
  // The supervisor runs in a container whose own limits bound its processes (a Kubernetes
  // pod): what cgroups are missing is not told through on_notice.
  bool quiet_without_cgroups = false;
  // Starts, signals and reaps the processes. Null: SystemLauncher(). Tests may give a
  // FakeProcessLauncher; it must outlive the supervisor.
  ProcessLauncher* launcher = nullptr;
};

struct SupervisorCallbacks {
  // All callbacks run on the supervisor's own I/O thread, one at a time, never under a lock of
  // the supervisor: they may call Launch, Stop, StopAll and LiveCount (not the destructor).
  // Empty functions are skipped.

  // A chunk of a process's output as it arrived (no line buffering), after it was appended to
  // the spec's file. Chunks of one stream arrive in order.
  std::function<void(const std::string& key, OutputStream, std::string_view data)> on_output;
  // Exactly once per process whose Launch succeeded, after all of its output was delivered.
  // By then the key is free again and LiveCount no longer counts it. A process that dies at
  // once may be reported before Launch has returned its pid to the caller.
  std::function<void(const std::string& key, const ProcessExit&)> on_exit;
  // One-line facts for an operator, e.g. once after Create: "memory limits are advisory: no
  // writable memory cgroup (v2 or v1): ...".
  std::function<void(const std::string& notice)> on_notice;
};

// Launches and watches the processes of the tasks on this node.
//
// Each process runs in its own process group and, where the machine allows, its own cgroups
// (memory limit, OOM detection, and finding every descendant even after setsid). Exits are
// learned through the launcher's exit fd per child (a pidfd for real processes) in an epoll set
// shared with the stdout and stderr pipes; one I/O thread owned by the supervisor runs that loop
// and all callbacks. Every start, signal and reap goes through the ProcessLauncher.
//
// A task ends when its launched process ends: at that point whatever is left of its process
// group and cgroup is SIGKILLed, its pipes are drained of what is available, on_exit runs, and
// its cgroups are removed once empty.
//
// Thread-safe: Launch, Stop, StopAll and LiveCount may be called from any thread, including
// from callbacks. REQUIRES: SIGCHLD is not ignored in the agent, and nothing else in the agent
// reaps children with waitpid(-1) (statuses would be lost).
class ProcessSupervisor {
 public:
  static absl::StatusOr<std::unique_ptr<ProcessSupervisor>> Create(SupervisorOptions options,
                                                                   SupervisorCallbacks callbacks);

  ProcessSupervisor(const ProcessSupervisor&) = delete;
  ProcessSupervisor& operator=(const ProcessSupervisor&) = delete;

  // Stops the I/O thread (a callback in progress finishes first), then SIGKILLs every live
  // process (its process group and its cgroup), reaps it and removes its cgroups. No callback
  // runs after the destructor has begun: exits during destruction are not reported.
  // REQUIRES: not called from a callback; no Launch/Stop in flight.
  ~ProcessSupervisor();

  // Starts `spec` in its own process group and (where available) its own cgroups, which it
  // joins before exec. Returns the pid once exec has succeeded. Errors: InvalidArgument (empty
  // key or argv), AlreadyExists (key live), NotFound/PermissionDenied/... when exec or chdir
  // failed in the child (the message names the command and the errno text); no on_exit follows
  // an error. Blocks until the child has exec'd; launches are serialised.
  absl::StatusOr<int> Launch(const ProcessSpec& spec);

  // SIGTERM to the process group of `key`; after `grace` (or at once if grace <= 0) SIGKILL to
  // the group and to every process still in the task's cgroup. Non-blocking; the exit arrives
  // through on_exit with stopped_by_request = true. Unknown or finished keys are ignored; a
  // second Stop can shorten the grace but never lengthen it.
  void Stop(const std::string& key, std::chrono::milliseconds grace);
  // Stop for every live process.
  void StopAll(std::chrono::milliseconds grace);

  // Processes launched whose on_exit has not started yet.
  size_t LiveCount() const;

  // Where to measure a live process: its pid (not reaped yet, so not recycled, at the moment
  // of the call) and its cgroup directories (empty without cgroups).
  struct LiveProcess {
    std::string key;
    pid_t pid = -1;
    std::vector<TaskCgroup::Dir> cgroup_dirs;
  };
  // Every live process that has been started (not those whose launch is in progress).
  std::vector<LiveProcess> LiveProcesses() const;

  // How limits are enforced on this machine, e.g. "memory limits: cgroup v1 memory at ...".
  std::string LimitsDescription() const { return limits_->Describe(); }

 private:
  struct Process;
  using TimePoint = std::chrono::steady_clock::time_point;
  // A finished task's cgroup that was still busy with dying processes.
  struct BusyCgroup {
    std::unique_ptr<TaskCgroup> cgroup;
    TimePoint next_try;
    std::chrono::microseconds backoff;
    TimePoint give_up;
  };

  ProcessSupervisor(ProcessLauncher& launcher, SupervisorCallbacks callbacks,
                    std::unique_ptr<ResourceLimits> limits, UniqueFd epoll_fd, UniqueFd wake_fd);

  void Wake();
  // SIGKILL to the group and the cgroup. REQUIRES: the process has not been reaped.
  void KillNow(Process& process) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The I/O thread and what it alone runs.
  void Run();
  int NextTimeoutMs();
  void FireDeadlines();
  void RetryBusyCgroups();
  void DeliverNotices();
  void HandleExit(Process& process);
  // Reads and delivers up to `budget` bytes or until EAGAIN/EOF; closes the pipe at EOF.
  void ReadOutput(Process& process, OutputStream stream, size_t budget);
  void Deliver(Process& process, OutputStream stream, std::string_view data);

  ProcessLauncher& launcher_;
  const SupervisorCallbacks callbacks_;
  const std::unique_ptr<ResourceLimits> limits_;
  const UniqueFd epoll_fd_;
  const UniqueFd wake_fd_;  // an eventfd in the epoll set: wakes the loop for new deadlines

  // Serialises fork/exec: a child must never inherit another launch's pipes (they are
  // close-on-exec, but a sibling that is slow to exec would hold them open meanwhile).
  absl::Mutex launch_mu_;

  mutable absl::Mutex mu_;
  // Launched processes until their exit has been reported. Entries are inserted by Launch and
  // erased only by the I/O thread (or the destructor after joining it), so the I/O thread may
  // keep a Process& across unlocked sections.
  std::map<uint64_t, std::unique_ptr<Process>> processes_ ABSL_GUARDED_BY(mu_);
  // Keys of live processes, and of launches in progress (reserved before the fork).
  std::map<std::string, uint64_t> keys_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  size_t live_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> pending_notices_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  // I/O thread only.
  std::vector<BusyCgroup> busy_cgroups_;
  std::vector<char> buffer_;

  std::thread thread_;
  // Starts every task. Declared last, so destroyed after the destructor's body has killed every
  // task (its thread's exit SIGKILLs the tasks it started).
  std::unique_ptr<SpawnThread> spawner_ = std::make_unique<SpawnThread>();
};

}  // namespace shoal::process
