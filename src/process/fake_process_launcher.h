#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "process/process_launcher.h"

namespace shoal::process {

// A stand-in for the operating system's side of ProcessLauncher, for tests: it starts nothing,
// and a test plays the programs instead. It fakes the kernel (process table, signals, exit
// statuses, the child's end of its pipes), never a Shoal component, so the code under test runs
// unchanged: a supervisor still reads the child's stdout pipe and watches its exit fd.
//
// A launched fake process holds copies of the stdout/stderr fds it was given (as a child holds
// its 0-2), so Write() reaches the caller's pipe or file, and ending it closes them (EOF).
// Signals follow the default dispositions: a signal ends the process unless the program said it
// ignores it (SIGKILL always ends it). Fake pids lie above the kernel's pid_max, so a signal sent
// to one by mistake through kill() reaches no real process. Thread-safe.
class FakeProcessLauncher final : public ProcessLauncher {
 public:
  // What a launch does, run inside Launch() like the program's first moments: it may Write()
  // and Exit() at once, or leave the process running for the test to act on later.
  using Program = std::function<void(FakeProcessLauncher& os, pid_t pid)>;

  // A process as the fake kernel knows it.
  struct Process {
    pid_t pid = -1;
    std::vector<std::string> argv;
    std::vector<std::string> environment;  // NAME=value
    std::string working_dir;
    Grouping grouping = Grouping::kNewSession;
    bool die_with_parent = true;
    std::map<int, int> extra_fds;  // as given: child fd -> the caller's fd
    std::vector<int> signals;      // every signal sent to it (or its group), in order
    std::set<int> ignored;         // signals it ignores (SIG_IGN or a handler that stays)
    bool running = true;
    bool reaped = false;
    ProcessExit exit;
  };

  FakeProcessLauncher() = default;
  ~FakeProcessLauncher() override;

  // Installs the program that runs when `command` (argv[0] as given) is launched. Launching a
  // command without a program fails as exec would: NotFound, naming the command.
  void Install(const std::string& command, Program program);

  // The program's actions, usable from a Program or from the test.
  void Write(pid_t pid, OutputStream stream, std::string_view data);
  void Exit(pid_t pid, int exit_code);
  void Ignore(pid_t pid, int signal);

  // What the fake kernel knows of `pid` (a copy), or nullopt for a pid it never handed out.
  std::optional<Process> Find(pid_t pid) const;
  // Every launch so far, in order.
  std::vector<Process> Launches() const;
  // Blocks until `count` launches have happened and returns the pid of the last of them.
  pid_t WaitForLaunch(size_t count);

  // ProcessLauncher.
  absl::StatusOr<LaunchedProcess> Launch(const ExecPlan& plan, const ChildSetup& setup) override;
  void Signal(pid_t pid, int signal, SignalTarget target) override;
  std::optional<ProcessExit> Wait(pid_t pid) override;
  std::optional<ProcessExit> Poll(pid_t pid) override;
  bool CanStartInCgroup() const override { return false; }
  absl::Status CheckCanObserveExits() const override { return absl::OkStatus(); }

 private:
  struct Entry {
    Process process;
    UniqueFd stdout_fd, stderr_fd;  // the child's ends, closed when it ends
    UniqueFd exit_event;            // an eventfd, written when it ends
  };
  void EndLocked(Entry& entry, int exit_code, int signal);
  Entry* FindLocked(pid_t pid);

  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, Program> programs_;
  std::map<pid_t, std::unique_ptr<Entry>> processes_;
  std::vector<pid_t> launch_order_;
  // Above /proc/sys/kernel/pid_max's ceiling (2^22).
  pid_t next_pid_ = 1 << 24;
};

}  // namespace shoal::process
