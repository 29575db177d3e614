#pragma once

#include <sched.h>
#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/process_spec.h"
#include "common/unique_fd.h"

namespace shoal::agent {

// Everything a child needs between fork() and exec(), computed before the fork: in the child of
// a multi-threaded parent only async-signal-safe calls are allowed, so no allocation, no locks,
// no PATH search with getenv. Immutable after Build(); Spawn() may be called from any thread.
class ExecPlan {
 public:
  // Validates `spec` (non-empty argv, CPU numbers in range) and resolves the PATH candidates.
  static absl::StatusOr<ExecPlan> Build(const ProcessSpec& spec);

  struct Child {
    pid_t pid = -1;
    UniqueFd pidfd;  // from pidfd_open, taken while the child still waits for its release
  };

  // Starts a child (clone with CLONE_VM | CLONE_VFORK, like posix_spawn) that resets its signal
  // dispositions and mask, leads a new session (and so a new process group), is born in the
  // cgroup v2 directory `into_cgroup_fd` (-1: none; clone3 CLONE_INTO_CGROUP), joins the cgroups
  // whose cgroup.procs files are given, redirects stdio to the given fds (0-2 in the child),
  // chdirs, pins its CPUs, marks every other fd close-on-exec and execs. Returns once exec
  // succeeded: the child writes a failure straight into this thread's memory before it exits.
  // Errors (a cgroup that cannot be joined, a missing binary, a bad working directory,
  // EACCES...) name the command and the errno text; the failed child has been reaped by then.
  // The fds are not consumed; the caller closes its copies.
  // The child gets PR_SET_PDEATHSIG(SIGKILL): it dies with the calling *thread*, so call this
  // from a thread that lives as long as the agent (the agent launches from its main thread).
  // Thread-safe: each calling thread has a child stack of its own.
  absl::StatusOr<Child> Spawn(int stdin_fd, int stdout_fd, int stderr_fd, int into_cgroup_fd,
                              const std::vector<std::string>& cgroup_procs) const;

  // Default true: the child dies with the spawning thread (tasks never outlive their agent).
  // A backend starting an agent sets false: an agent must outlive a master that restarts.
  void set_die_with_parent(bool die) { die_with_parent_ = die; }

  // Whether Spawn honours into_cgroup_fd (clone3 with a trampoline exists for this CPU).
  static bool CanStartInCgroup();

  const std::string& command() const { return argv_.front(); }

 private:
  ExecPlan() = default;
  absl::Status ChildFailure(int stage, int err) const;

  std::vector<std::string> argv_;
  std::vector<std::string> envp_;       // "NAME=value"
  std::vector<std::string> exec_paths_;  // execve() is tried on each in turn, like execvp
  std::string search_path_;             // the PATH used, for error messages
  std::string working_dir_;
  bool pin_cpus_ = false;
  bool die_with_parent_ = true;
  cpu_set_t cpus_{};
};

}  // namespace shoal::agent
