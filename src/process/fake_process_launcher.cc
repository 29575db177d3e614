#include "process/fake_process_launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace shoal::process {
namespace {

UniqueFd Copy(int fd) { return UniqueFd(fd >= 0 ? ::fcntl(fd, F_DUPFD_CLOEXEC, 3) : -1); }

}  // namespace

FakeProcessLauncher::~FakeProcessLauncher() = default;

void FakeProcessLauncher::Install(const std::string& command, Program program) {
  std::lock_guard<std::mutex> lock(mu_);
  programs_[command] = std::move(program);
}

absl::StatusOr<LaunchedProcess> FakeProcessLauncher::Launch(const ExecPlan& plan,
                                                            const ChildSetup& setup) {
  Program program;
  pid_t pid;
  LaunchedProcess launched;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = programs_.find(plan.command());
    if (it == programs_.end()) {
      return absl::NotFoundError(absl::StrCat("cannot start '", plan.command(),
                                              "': exec: No such file or directory"));
    }
    program = it->second;
    auto entry = std::make_unique<Entry>();
    entry->exit_event.Reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!entry->exit_event.valid()) return absl::InternalError("eventfd failed");
    launched.exit_fd = Copy(entry->exit_event.get());
    entry->stdout_fd = Copy(setup.stdout_fd);
    entry->stderr_fd = Copy(setup.stderr_fd);
    pid = next_pid_++;
    Process& p = entry->process;
    p.pid = pid;
    p.argv = plan.argv();
    p.environment = plan.environment();
    p.working_dir = plan.working_dir();
    p.grouping = setup.grouping;
    p.die_with_parent = setup.die_with_parent;
    p.extra_fds = setup.extra_fds;
    processes_[pid] = std::move(entry);
    launch_order_.push_back(pid);
  }
  changed_.notify_all();
  launched.pid = pid;
  program(*this, pid);
  return launched;
}

void FakeProcessLauncher::Write(pid_t pid, OutputStream stream, std::string_view data) {
  UniqueFd fd;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Entry* entry = FindLocked(pid);
    if (entry == nullptr || !entry->process.running) return;
    // A copy, written outside the lock: a full pipe blocks only this writer, as in a real child.
    fd = Copy((stream == OutputStream::kStdout ? entry->stdout_fd : entry->stderr_fd).get());
  }
  while (fd.valid() && !data.empty()) {
    ssize_t n = ::write(fd.get(), data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the reader is gone (EPIPE): like the child's lost write
    data.remove_prefix(static_cast<size_t>(n));
  }
}

void FakeProcessLauncher::Exit(pid_t pid, int exit_code) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Entry* entry = FindLocked(pid);
    if (entry == nullptr || !entry->process.running) return;
    EndLocked(*entry, exit_code, 0);
  }
  changed_.notify_all();
}

void FakeProcessLauncher::Ignore(pid_t pid, int signal) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry* entry = FindLocked(pid);
  if (entry != nullptr && signal != SIGKILL && signal != SIGSTOP) {
    entry->process.ignored.insert(signal);
  }
}

void FakeProcessLauncher::Signal(pid_t pid, int signal, SignalTarget target) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A group is its leader here: fake processes have no descendants.
    (void)target;
    Entry* entry = FindLocked(pid);
    if (entry == nullptr || entry->process.reaped) return;
    entry->process.signals.push_back(signal);
    // SIGCHLD, SIGURG and SIGWINCH are ignored by default; 0 only probes.
    bool ignored_by_default = signal == 0 || signal == SIGCHLD || signal == SIGURG ||
                              signal == SIGWINCH || signal == SIGCONT;
    if (!entry->process.running || ignored_by_default || entry->process.ignored.count(signal)) {
      return;
    }
    EndLocked(*entry, 0, signal);
  }
  changed_.notify_all();
}

void FakeProcessLauncher::EndLocked(Entry& entry, int exit_code, int signal) {
  entry.process.running = false;
  entry.process.exit.exit_code = exit_code;
  entry.process.exit.signal = signal;
  // As the kernel does at exit: the child's fds close (EOF for the reader), then it is a zombie
  // whose exit fd reads ready.
  entry.stdout_fd.Reset();
  entry.stderr_fd.Reset();
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(entry.exit_event.get(), &one, sizeof one);
}

FakeProcessLauncher::Entry* FakeProcessLauncher::FindLocked(pid_t pid) {
  auto it = processes_.find(pid);
  return it == processes_.end() ? nullptr : it->second.get();
}

std::optional<ProcessExit> FakeProcessLauncher::Wait(pid_t pid) {
  std::unique_lock<std::mutex> lock(mu_);
  Entry* entry = FindLocked(pid);
  if (entry == nullptr || entry->process.reaped) return std::nullopt;
  changed_.wait(lock, [&] { return !entry->process.running; });
  entry->process.reaped = true;
  return entry->process.exit;
}

std::optional<ProcessExit> FakeProcessLauncher::Poll(pid_t pid) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry* entry = FindLocked(pid);
  if (entry == nullptr || entry->process.reaped || entry->process.running) return std::nullopt;
  entry->process.reaped = true;
  return entry->process.exit;
}

std::optional<FakeProcessLauncher::Process> FakeProcessLauncher::Find(pid_t pid) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = processes_.find(pid);
  if (it == processes_.end()) return std::nullopt;
  return it->second->process;
}

std::vector<FakeProcessLauncher::Process> FakeProcessLauncher::Launches() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Process> launches;
  for (pid_t pid : launch_order_) launches.push_back(processes_.at(pid)->process);
  return launches;
}

pid_t FakeProcessLauncher::WaitForLaunch(size_t count) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return launch_order_.size() >= count; });
  return launch_order_[count - 1];
}

}  // namespace shoal::process
