#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/unique_fd.h"
#include "process/exec_plan.h"
#include "process/process_spec.h"

namespace shoal::process {

// Where a child stands for signals and terminals.
enum class Grouping {
  // setsid(): a session and process group of its own (tasks, the master, agents). With autogroup
  // scheduling a session is also a scheduling group.
  kNewSession,
  // setpgid(0, 0): a process group of its own in the caller's session (the agent's watchdog,
  // the MPI worker's commands): a signal to the caller's group does not reach it.
  kNewProcessGroup,
  // The caller's session and group (a short query such as nvidia-smi).
  kCallersGroup,
};

// How a child is set up between its birth and exec, beyond what its ExecPlan says (command,
// environment, working directory, CPUs).
struct ChildSetup {
  // Parent fds that become the child's 0, 1 and 2; -1: /dev/null. Not consumed.
  int stdin_fd = -1;
  int stdout_fd = -1;
  int stderr_fd = -1;
  // More parent fds handed to the child at the given numbers (each > 2), e.g. a readiness pipe
  // as the child's fd 3. Not consumed. Every other fd of the parent is closed at exec.
  std::map<int, int> extra_fds;  // child fd -> parent fd
  Grouping grouping = Grouping::kNewSession;
  // Signals whose disposition the child resets to the default before exec (handlers are reset
  // by exec anyway; this undoes SIG_IGN). nullopt: every signal. The child's signal mask is
  // always emptied.
  std::optional<std::vector<int>> default_signals;
  // The child gets PR_SET_PDEATHSIG(SIGKILL): it dies with the launching *thread* (tasks never
  // outlive their agent). False for what must outlive its starter: agents, the master, the
  // watchdog.
  bool die_with_parent = true;
  // A cgroup v2 directory (an O_DIRECTORY fd) to be born in (clone3 CLONE_INTO_CGROUP; only where
  // CanStartInCgroup()), -1: none; and cgroup.procs files the child joins before exec.
  int into_cgroup_fd = -1;
  std::vector<std::string> cgroup_procs;
};

struct LaunchedProcess {
  pid_t pid = -1;
  // Becomes readable (poll/epoll) once the process has exited: a pidfd for a real process.
  UniqueFd exit_fd;
};

// Whom Signal() reaches.
enum class SignalTarget { kProcess, kProcessGroup };

// Starts processes and learns how they end: the one door through which Shoal starts a process
// (docs/design/0009-process-module.md). SystemLauncher() is the operating system; a
// FakeProcessLauncher (fake_process_launcher.h) stands in for it in tests. Thread-safe.
class ProcessLauncher {
 public:
  virtual ~ProcessLauncher() = default;

  // Starts `plan` as set up by `setup` and returns once it has exec'd. Errors (a missing binary,
  // a bad working directory, a cgroup that cannot be joined, EACCES...) name the command and the
  // errno text; a child that failed has been reaped by then.
  virtual absl::StatusOr<LaunchedProcess> Launch(const ExecPlan& plan, const ChildSetup& setup) = 0;
  // Builds `spec`'s plan and launches it: what a caller that starts one program once needs.
  absl::StatusOr<LaunchedProcess> Start(const ProcessSpec& spec, const ChildSetup& setup);

  // Sends `signal` to `pid`, or to the process group it leads. Errors are ignored: the process may
  // have ended meanwhile. REQUIRES: `pid` is not reaped yet (its pid could name another process).
  virtual void Signal(pid_t pid, int signal, SignalTarget target) = 0;

  // Waits for `pid` (a child of this process) to end and reaps it. nullopt: it is not a child
  // left to reap (someone else reaped it).
  virtual std::optional<ProcessExit> Wait(pid_t pid) = 0;
  // Reaps `pid` if it has ended; nullopt while it runs (or when it is not a child left to reap).
  virtual std::optional<ProcessExit> Poll(pid_t pid) = 0;

  // Whether Launch honours ChildSetup::into_cgroup_fd.
  virtual bool CanStartInCgroup() const = 0;
  // Whether exits of launched children can be observed and reaped here (e.g. SIGCHLD is not
  // ignored, exit_fd is available); a supervisor checks it once when it is created.
  virtual absl::Status CheckCanObserveExits() const = 0;
};

// The operating system's launcher: clone/exec (exec_plan.cc), kill, waitid. Lives for the
// process's life.
ProcessLauncher& SystemLauncher();

// The exit code a shell would report for `exit`: the code, or 128 + the signal.
int ShellExitCode(const ProcessExit& exit);

// Replaces this process with `argv` (PATH searched, this process's environment), for a command
// that *becomes* another program (`shoal tensorboard`): no second process to supervise, and the
// terminal's signals reach the program directly. Returns only when exec failed.
absl::Status ExecInPlace(const std::vector<std::string>& argv);

}  // namespace shoal::process
