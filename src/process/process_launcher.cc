#include "process/process_launcher.h"

#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/files.h"

namespace shoal::process {
namespace {

std::optional<ProcessExit> WaitFor(pid_t pid, int options) {
  siginfo_t info{};
  int rc;
  do {
    rc = ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | options);
  } while (rc < 0 && errno == EINTR);
  // With WNOHANG, a child that has not ended leaves si_pid at 0.
  if (rc < 0 || info.si_pid == 0) return std::nullopt;
  ProcessExit exit;
  if (info.si_code == CLD_EXITED) {
    exit.exit_code = info.si_status;
  } else {
    exit.signal = info.si_status;
  }
  return exit;
}

}  // namespace

// Named (not in an anonymous namespace) because ExecPlan befriends it.
class SystemProcessLauncher final : public ProcessLauncher {
 public:
  absl::StatusOr<LaunchedProcess> Launch(const ExecPlan& plan, const ChildSetup& setup) override {
    absl::StatusOr<ExecPlan::Child> child = plan.Spawn(setup);
    if (!child.ok()) return child.status();
    LaunchedProcess launched;
    launched.pid = child->pid;
    launched.exit_fd = std::move(child->pidfd);
    return launched;
  }

  void Signal(pid_t pid, int signal, SignalTarget target) override {
    if (pid <= 0) return;  // kill(0 or -1, ...) would reach far more than one process
    ::kill(target == SignalTarget::kProcessGroup ? -pid : pid, signal);
  }

  std::optional<ProcessExit> Wait(pid_t pid) override { return WaitFor(pid, 0); }
  std::optional<ProcessExit> Poll(pid_t pid) override { return WaitFor(pid, WNOHANG); }

  bool CanStartInCgroup() const override { return ExecPlan::CanStartInCgroup(); }

  absl::Status CheckCanObserveExits() const override {
    struct sigaction chld;
    if (::sigaction(SIGCHLD, nullptr, &chld) == 0 &&
        (chld.sa_handler == SIG_IGN || (chld.sa_flags & SA_NOCLDWAIT) != 0)) {
      return absl::FailedPreconditionError(
          "SIGCHLD is ignored (or SA_NOCLDWAIT set) in this process: exit statuses would be lost");
    }
    int self_pidfd = static_cast<int>(::syscall(SYS_pidfd_open, ::getpid(), 0));
    if (self_pidfd < 0) return ErrnoStatus("pidfd_open (needs Linux 5.3 or newer)", errno);
    ::close(self_pidfd);
    return absl::OkStatus();
  }
};

absl::StatusOr<LaunchedProcess> ProcessLauncher::Start(const ProcessSpec& spec,
                                                       const ChildSetup& setup) {
  absl::StatusOr<ExecPlan> plan = ExecPlan::Build(spec);
  if (!plan.ok()) return plan.status();
  return Launch(*plan, setup);
}

ProcessLauncher& SystemLauncher() {
  static auto* launcher = new SystemProcessLauncher();  // never destroyed: used until exit
  return *launcher;
}

int ShellExitCode(const ProcessExit& exit) {
  return exit.signal != 0 ? 128 + exit.signal : exit.exit_code;
}

absl::Status ExecInPlace(const std::vector<std::string>& argv) {
  if (argv.empty() || argv.front().empty()) {
    return absl::InvalidArgumentError("no command to run");
  }
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  ::execvp(args[0], args.data());
  return ErrnoStatus(absl::StrCat("cannot run ", argv.front()), errno);
}

}  // namespace shoal::process
