#pragma once

#include <sched.h>
#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "process/process_spec.h"
#include "common/unique_fd.h"

namespace shoal::process {

struct ChildSetup;  // process_launcher.h

// Everything a child needs between fork() and exec(), computed before the fork: in the child of
// a multi-threaded parent only async-signal-safe calls are allowed, so no allocation, no locks,
// no PATH search with getenv. Immutable after Build(); Spawn() may be called from any thread.
class ExecPlan {
 public:
  // Validates `spec` (non-empty argv, CPU numbers in range) and resolves the PATH candidates.
  static absl::StatusOr<ExecPlan> Build(const ProcessSpec& spec);

  // The command (argv[0]), its arguments, and its complete environment as NAME=value.
  const std::string& command() const { return argv_.front(); }
  const std::vector<std::string>& argv() const { return argv_; }
  const std::vector<std::string>& environment() const { return envp_; }
  const std::string& working_dir() const { return working_dir_; }

 private:
  friend class SystemProcessLauncher;
  ExecPlan() = default;

  struct Child {
    pid_t pid = -1;
    UniqueFd pidfd;  // from clone(CLONE_PIDFD): no window in which the pid could be recycled
  };
  // Starts a child (clone with CLONE_VM | CLONE_VFORK, like posix_spawn) that resets its signal
  // dispositions (setup.default_signals) and mask, takes its place in a session or process group
  // (setup.grouping), is born in the cgroup v2 directory setup.into_cgroup_fd (-1: none; clone3
  // CLONE_INTO_CGROUP), joins the cgroups whose cgroup.procs files are given, redirects stdio to
  // the given fds (0-2 in the child; -1 means /dev/null) and hands over setup.extra_fds, chdirs,
  // pins its CPUs, marks every other fd close-on-exec and execs. Returns once exec succeeded: the
  // child writes a failure straight into this thread's memory before it exits. The fds are not
  // consumed. With setup.die_with_parent the child dies with the calling *thread*.
  // Thread-safe: each calling thread has a child stack of its own. Only SystemLauncher() calls
  // it, so that every process Shoal starts goes through a ProcessLauncher.
  absl::StatusOr<Child> Spawn(const ChildSetup& setup) const;

  // Whether Spawn honours into_cgroup_fd (clone3 with a trampoline exists for this CPU).
  static bool CanStartInCgroup();

  absl::Status ChildFailure(int stage, int err) const;

  std::vector<std::string> argv_;
  std::vector<std::string> envp_;       // "NAME=value"
  std::vector<std::string> exec_paths_;  // execve() is tried on each in turn, like execvp
  std::string search_path_;             // the PATH used, for error messages
  std::string working_dir_;
  bool pin_cpus_ = false;
  cpu_set_t cpus_{};
};

}  // namespace shoal::process
