#include "process/process_supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "process/exec_plan.h"
#include "process/process_launcher.h"
#include "common/files.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace shoal::process {
namespace {

// epoll tags: 0 is the wake eventfd; a process's fds are (id << 2) | kind.
constexpr uint64_t kWakeTag = 0;
constexpr uint64_t kExitKind = 1;
constexpr uint64_t kStdoutKind = 2;
constexpr uint64_t kStderrKind = 3;

constexpr size_t kReadChunk = 64 * 1024;
// Per readiness event, so that one chatty process cannot starve the others.
constexpr size_t kReadBudget = 1024 * 1024;
// After an exit: what the dead process left in its pipe is at most a pipe buffer; the rest could
// only come from a descendant that escaped every kill, which must not hold up the report forever.
constexpr size_t kDrainBudget = 64 * 1024 * 1024;

// How long a finished task's busy cgroup is retried before it is given up with a notice.
constexpr auto kBusyCgroupPatience = std::chrono::seconds(30);

uint64_t Tag(uint64_t id, uint64_t kind) { return (id << 2) | kind; }

std::string DefaultInstanceId() {
  static std::atomic<uint64_t> counter{0};
  return absl::StrCat(::getpid(), "-", counter.fetch_add(1));
}

// A single path component that cannot escape its parent directory.
bool IsDirName(const std::string& s) {
  if (s.empty() || s.size() > 200 || s == "." || s == "..") return false;
  return std::none_of(s.begin(), s.end(), [](char c) {
    return c == '/' || absl::ascii_iscntrl(static_cast<unsigned char>(c));
  });
}

// The cgroup directory name of a task: unique by id, readable by key.
std::string TaskDirName(uint64_t id, const std::string& key) {
  std::string name = absl::StrCat("task-", id, "-");
  for (char c : key.substr(0, 100)) {
    name.push_back(absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-'
                       ? c
                       : '_');
  }
  return name;
}

absl::StatusOr<UniqueFd> OpenForAppend(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (!dir.empty()) SHOAL_RETURN_IF_ERROR(MakeDirs(dir));
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(absl::StrCat("open output file ", path), errno);
  return UniqueFd(fd);
}

absl::Status WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("write", errno);
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace

struct ProcessSupervisor::Process {
  uint64_t id = 0;
  std::string key;
  pid_t pid = -1;
  UniqueFd exit_fd;  // readable once it has exited (a pidfd, from the launcher)

  // I/O thread only once registered.
  UniqueFd stdout_pipe, stderr_pipe;
  UniqueFd stdout_file, stderr_file;
  std::string stdout_path, stderr_path;

  // Guarded by the supervisor's mu_.
  bool reaped = false;  // after this, pid and its process group id may be recycled
  bool stop_requested = false;
  std::optional<TimePoint> kill_at;
  std::unique_ptr<TaskCgroup> cgroup;  // null without any cgroup
};

absl::StatusOr<std::unique_ptr<ProcessSupervisor>> ProcessSupervisor::Create(
    SupervisorOptions options, SupervisorCallbacks callbacks) {
  if (options.instance_id.empty()) options.instance_id = DefaultInstanceId();
  if (!IsDirName(options.instance_id) || !IsDirName(options.cgroup_name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "instance_id '", options.instance_id, "' and cgroup_name '", options.cgroup_name,
        "' must each be one directory name: no '/', no control characters, not '.' or '..'"));
  }
  ProcessLauncher& launcher = options.launcher != nullptr ? *options.launcher : SystemLauncher();
  SHOAL_RETURN_IF_ERROR(launcher.CheckCanObserveExits());
  UniqueFd epoll_fd(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_fd.valid()) return ErrnoStatus("epoll_create1", errno);
  UniqueFd wake_fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake_fd.valid()) return ErrnoStatus("eventfd", errno);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeTag;
  if (::epoll_ctl(epoll_fd.get(), EPOLL_CTL_ADD, wake_fd.get(), &ev) != 0) {
    return ErrnoStatus("epoll_ctl(eventfd)", errno);
  }

  ResourceLimits::Options limit_options;
  limit_options.cgroup_name = options.cgroup_name;
  limit_options.instance_id = options.instance_id;
  limit_options.cgroup_root = options.cgroup_root;
  limit_options.allow_v2 = options.allow_cgroup_v2;
  std::unique_ptr<ResourceLimits> limits = ResourceLimits::Detect(limit_options);

  std::unique_ptr<ProcessSupervisor> supervisor(new ProcessSupervisor(
      launcher, std::move(callbacks), std::move(limits), std::move(epoll_fd), std::move(wake_fd)));
  {
    absl::MutexLock lock(&supervisor->mu_);
    if (!options.quiet_without_cgroups) {
      supervisor->pending_notices_ = supervisor->limits_->notices();
    }
  }
  supervisor->thread_ = std::thread([s = supervisor.get()] { s->Run(); });
  return supervisor;
}

ProcessSupervisor::ProcessSupervisor(ProcessLauncher& launcher, SupervisorCallbacks callbacks,
                                     std::unique_ptr<ResourceLimits> limits, UniqueFd epoll_fd,
                                     UniqueFd wake_fd)
    : launcher_(launcher),
      callbacks_(std::move(callbacks)),
      limits_(std::move(limits)),
      epoll_fd_(std::move(epoll_fd)),
      wake_fd_(std::move(wake_fd)),
      buffer_(kReadChunk) {}

ProcessSupervisor::~ProcessSupervisor() {
  if (std::this_thread::get_id() == thread_.get_id()) {
    std::fprintf(stderr, "ProcessSupervisor destroyed from one of its own callbacks\n");
    std::abort();
  }
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  Wake();
  if (thread_.joinable()) thread_.join();

  // Single-threaded from here on.
  absl::MutexLock lock(&mu_);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (auto& [id, process] : processes_) {
    if (!process->reaped) {
      KillNow(*process);
      launcher_.Wait(process->pid);
      process->reaped = true;
    }
    if (process->cgroup) {
      absl::Status status = process->cgroup->KillAndRemove(deadline);
      if (!status.ok()) {
        spdlog::warn("process '{}': {}", process->key, std::string(status.message()));
      }
    }
  }
  processes_.clear();
  for (BusyCgroup& busy : busy_cgroups_) {
    absl::Status status = busy.cgroup->KillAndRemove(deadline);
    if (!status.ok()) spdlog::warn("{}", std::string(status.message()));
  }
  busy_cgroups_.clear();
}

absl::StatusOr<int> ProcessSupervisor::Launch(const ProcessSpec& spec) {
  if (spec.key.empty()) return absl::InvalidArgumentError("process key must not be empty");
  SHOAL_ASSIGN_OR_RETURN(ExecPlan plan, ExecPlan::Build(spec));
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::FailedPreconditionError("the supervisor is shutting down");
    if (keys_.count(spec.key) != 0) {
      return absl::AlreadyExistsError(absl::StrCat("process '", spec.key, "' is already running"));
    }
    id = next_id_++;
    keys_[spec.key] = id;
  }
  auto process = std::make_unique<Process>();
  absl::Status status = [&]() -> absl::Status {
    process->id = id;
    process->key = spec.key;
    if (!spec.stdout_path.empty()) {
      SHOAL_ASSIGN_OR_RETURN(process->stdout_file, OpenForAppend(spec.stdout_path));
      process->stdout_path = spec.stdout_path;
    }
    if (!spec.stderr_path.empty()) {
      SHOAL_ASSIGN_OR_RETURN(process->stderr_file, OpenForAppend(spec.stderr_path));
      process->stderr_path = spec.stderr_path;
    }
    SHOAL_ASSIGN_OR_RETURN(process->cgroup,
                           limits_->CreateTask(TaskDirName(id, spec.key), spec.memory_limit_bytes));

    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0) return ErrnoStatus("pipe2", errno);
    process->stdout_pipe.Reset(out[0]);
    UniqueFd stdout_writer(out[1]);
    if (::pipe2(err, O_CLOEXEC) != 0) return ErrnoStatus("pipe2", errno);
    process->stderr_pipe.Reset(err[0]);
    UniqueFd stderr_writer(err[1]);
    for (int fd : {out[0], err[0]}) {
      if (::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK) != 0) {
        return ErrnoStatus("fcntl(O_NONBLOCK)", errno);
      }
    }

    TaskCgroup* cgroup = process->cgroup.get();
    absl::StatusOr<LaunchedProcess> child;
    {
      absl::MutexLock launch_lock(&launch_mu_);
      // The first cgroup v2 directory is entered at birth (CLONE_INTO_CGROUP), the others
      // (v1 hierarchies) by the child before exec.
      std::vector<std::string> procs;
      UniqueFd into;
      if (cgroup != nullptr) {
        for (const auto& dir : cgroup->dirs()) {
          if (dir.v2 && !into.valid() && launcher_.CanStartInCgroup()) {
            into.Reset(::open(dir.path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
            if (into.valid()) continue;
          }
          procs.push_back(dir.path + "/cgroup.procs");
        }
      }
      ChildSetup setup;  // stdin: /dev/null
      setup.stdout_fd = stdout_writer.get();
      setup.stderr_fd = stderr_writer.get();
      setup.into_cgroup_fd = into.valid() ? into.get() : -1;
      setup.cgroup_procs = std::move(procs);
      spawner_->Run([&] { child = launcher_.Launch(plan, setup); });
      // Closed before the next launch can fork, so that no sibling holds them even briefly.
      stdout_writer.Reset();
      stderr_writer.Reset();
    }
    if (!child.ok()) return child.status();
    process->pid = child->pid;
    process->exit_fd = std::move(child->exit_fd);
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    if (process->cgroup) {
      process->cgroup->KillAndRemove(std::chrono::steady_clock::now() + std::chrono::seconds(2))
          .IgnoreError();
    }
    absl::MutexLock lock(&mu_);
    keys_.erase(spec.key);
    return absl::Status(status.code(),
                        absl::StrCat("launch '", spec.key, "': ", status.message()));
  }

  int pid = process->pid;
  absl::MutexLock lock(&mu_);
  Process& p = *process;
  processes_[id] = std::move(process);
  ++live_;
  // Registered under mu_, so the I/O thread finds the Process for the first event.
  for (auto [fd, kind] : {std::pair{p.exit_fd.get(), kExitKind},
                          std::pair{p.stdout_pipe.get(), kStdoutKind},
                          std::pair{p.stderr_pipe.get(), kStderrKind}}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = Tag(id, kind);
    if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      // Without its exit fd in the loop the process would never be reported: undo the launch.
      absl::Status error = ErrnoStatus(absl::StrCat("launch '", spec.key, "': epoll_ctl"), errno);
      for (int registered : {p.exit_fd.get(), p.stdout_pipe.get(), p.stderr_pipe.get()}) {
        ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, registered, nullptr);
      }
      KillNow(p);
      launcher_.Wait(p.pid);
      p.reaped = true;
      std::unique_ptr<TaskCgroup> cgroup = std::move(p.cgroup);
      processes_.erase(id);
      keys_.erase(spec.key);
      --live_;
      if (cgroup) {
        cgroup->KillAndRemove(std::chrono::steady_clock::now() + std::chrono::seconds(2))
            .IgnoreError();
      }
      return error;
    }
  }
  return pid;
}

void ProcessSupervisor::Stop(const std::string& key, std::chrono::milliseconds grace) {
  {
    absl::MutexLock lock(&mu_);
    auto key_it = keys_.find(key);
    if (key_it == keys_.end()) return;
    auto it = processes_.find(key_it->second);
    if (it == processes_.end()) return;  // still launching
    Process& p = *it->second;
    if (p.reaped) return;
    p.stop_requested = true;
    if (grace.count() <= 0) {
      KillNow(p);
      p.kill_at.reset();
      return;
    }
    // The leader is not reaped, so its pid still names its process group.
    launcher_.Signal(p.pid, SIGTERM, SignalTarget::kProcessGroup);
    TimePoint at = std::chrono::steady_clock::now() + grace;
    if (!p.kill_at || at < *p.kill_at) p.kill_at = at;
  }
  Wake();
}

void ProcessSupervisor::StopAll(std::chrono::milliseconds grace) {
  std::vector<std::string> keys;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, id] : keys_) keys.push_back(key);
  }
  for (const std::string& key : keys) Stop(key, grace);
}

size_t ProcessSupervisor::LiveCount() const {
  absl::MutexLock lock(&mu_);
  return live_;
}

std::vector<ProcessSupervisor::LiveProcess> ProcessSupervisor::LiveProcesses() const {
  std::vector<LiveProcess> live;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, process] : processes_) {
    if (process->reaped || process->pid <= 0) continue;
    LiveProcess& p = live.emplace_back();
    p.key = process->key;
    p.pid = process->pid;
    if (process->cgroup) p.cgroup_dirs = process->cgroup->dirs();
  }
  return live;
}

void ProcessSupervisor::Wake() {
  uint64_t one = 1;
  ssize_t ignored = ::write(wake_fd_.get(), &one, sizeof one);
  (void)ignored;
}

void ProcessSupervisor::KillNow(Process& process) {
  launcher_.Signal(process.pid, SIGKILL, SignalTarget::kProcessGroup);
  if (process.cgroup) process.cgroup->KillAll();
}

void ProcessSupervisor::Run() {
  DeliverNotices();
  epoll_event events[64];
  while (true) {
    int n = ::epoll_wait(epoll_fd_.get(), events, 64, NextTimeoutMs());
    if (n < 0 && errno != EINTR) {
      std::fprintf(stderr, "ProcessSupervisor: epoll_wait: %s\n", std::strerror(errno));
      std::abort();  // the loop cannot go on, and exits would silently stop being reported
    }
    for (int i = 0; i < n; ++i) {
      uint64_t tag = events[i].data.u64;
      if (tag == kWakeTag) {
        uint64_t value;
        ssize_t ignored = ::read(wake_fd_.get(), &value, sizeof value);
        (void)ignored;
        continue;
      }
      Process* process;
      {
        absl::MutexLock lock(&mu_);
        auto it = processes_.find(tag >> 2);
        process = it == processes_.end() ? nullptr : it->second.get();
      }
      if (process == nullptr) continue;  // finished earlier in this batch
      switch (tag & 3) {
        case kExitKind:
          HandleExit(*process);
          break;
        case kStdoutKind:
          ReadOutput(*process, OutputStream::kStdout, kReadBudget);
          break;
        case kStderrKind:
          ReadOutput(*process, OutputStream::kStderr, kReadBudget);
          break;
      }
    }
    FireDeadlines();
    RetryBusyCgroups();
    DeliverNotices();
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
  }
}

int ProcessSupervisor::NextTimeoutMs() {
  std::optional<TimePoint> next;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, process] : processes_) {
      if (process->kill_at && (!next || *process->kill_at < *next)) next = process->kill_at;
    }
  }
  for (const BusyCgroup& busy : busy_cgroups_) {
    if (!next || busy.next_try < *next) next = busy.next_try;
  }
  if (!next) return -1;
  auto left = *next - std::chrono::steady_clock::now();
  if (left <= std::chrono::steady_clock::duration::zero()) return 0;
  // Round up: waking a little late is fine, waking early would spin.
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<int64_t>(ms, 60'000));
}

void ProcessSupervisor::FireDeadlines() {
  absl::MutexLock lock(&mu_);
  TimePoint now = std::chrono::steady_clock::now();
  for (auto& [id, process] : processes_) {
    if (process->kill_at && *process->kill_at <= now) {
      process->kill_at.reset();
      if (!process->reaped) KillNow(*process);
    }
  }
}

void ProcessSupervisor::RetryBusyCgroups() {
  TimePoint now = std::chrono::steady_clock::now();
  for (auto it = busy_cgroups_.begin(); it != busy_cgroups_.end();) {
    if (it->next_try > now) {
      ++it;
      continue;
    }
    it->cgroup->KillAll();
    if (it->cgroup->TryRemove()) {
      it = busy_cgroups_.erase(it);
      continue;
    }
    if (now >= it->give_up) {
      absl::MutexLock lock(&mu_);
      pending_notices_.push_back(absl::StrCat(
          "cgroup ", it->cgroup->dirs().front().path, " of a finished task is still busy after ",
          kBusyCgroupPatience.count(), "s; retrying when the supervisor is destroyed"));
      it->give_up = TimePoint::max();
      it->next_try = TimePoint::max();
      ++it;
      continue;
    }
    it->backoff = std::min(it->backoff * 2, std::chrono::microseconds(100'000));
    it->next_try = now + it->backoff;
    ++it;
  }
}

void ProcessSupervisor::DeliverNotices() {
  std::vector<std::string> notices;
  {
    absl::MutexLock lock(&mu_);
    notices.swap(pending_notices_);
  }
  if (!callbacks_.on_notice) return;
  for (const std::string& notice : notices) callbacks_.on_notice(notice);
}

void ProcessSupervisor::HandleExit(Process& process) {
  std::optional<ProcessExit> exit;
  {
    absl::MutexLock lock(&mu_);
    // The leader is a zombie: its pid still names the group. What is left of the task dies now
    // (before the drain, so that nothing more is written after it).
    KillNow(process);
    exit = launcher_.Wait(process.pid);
    process.reaped = true;
    process.kill_at.reset();
    if (!exit) {
      exit = ProcessExit{};
      exit->exit_code = -1;
      pending_notices_.push_back(absl::StrCat(
          "process '", process.key, "' (pid ", process.pid,
          ") was reaped by someone else; its exit status is unknown (reported as exit code -1)"));
    }
    exit->stopped_by_request = process.stop_requested;
    exit->oom_killed = process.cgroup != nullptr && process.cgroup->OomKilled();
  }
  ReadOutput(process, OutputStream::kStdout, kDrainBudget);
  ReadOutput(process, OutputStream::kStderr, kDrainBudget);
  for (UniqueFd* fd : {&process.exit_fd, &process.stdout_pipe, &process.stderr_pipe}) {
    if (!fd->valid()) continue;
    ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, fd->get(), nullptr);
    fd->Reset();
  }
  process.stdout_file.Reset();
  process.stderr_file.Reset();

  std::unique_ptr<TaskCgroup> cgroup;
  std::unique_ptr<Process> owned;
  {
    absl::MutexLock lock(&mu_);
    cgroup = std::move(process.cgroup);
    auto key_it = keys_.find(process.key);
    if (key_it != keys_.end() && key_it->second == process.id) keys_.erase(key_it);
    --live_;
    auto it = processes_.find(process.id);
    owned = std::move(it->second);
    processes_.erase(it);
  }
  if (callbacks_.on_exit) callbacks_.on_exit(owned->key, *exit);
  if (cgroup) {
    // Removed after this batch of events (RetryBusyCgroups), not before the exit is reported:
    // a cgroup v1 rmdir can wait for an RCU grace period, and a group restart stops many tasks
    // at once, whose exits (and so the relaunch) would queue behind each other's rmdirs.
    TimePoint now = std::chrono::steady_clock::now();
    auto backoff = std::chrono::microseconds(500);
    busy_cgroups_.push_back({std::move(cgroup), now, backoff, now + kBusyCgroupPatience});
  }
}

void ProcessSupervisor::ReadOutput(Process& process, OutputStream stream, size_t budget) {
  UniqueFd& pipe = stream == OutputStream::kStdout ? process.stdout_pipe : process.stderr_pipe;
  size_t total = 0;
  while (pipe.valid() && total < budget) {
    ssize_t n = ::read(pipe.get(), buffer_.data(), buffer_.size());
    if (n > 0) {
      total += static_cast<size_t>(n);
      Deliver(process, stream, std::string_view(buffer_.data(), static_cast<size_t>(n)));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    // EOF (every writer is gone) or a broken pipe: nothing more will come.
    ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, pipe.get(), nullptr);
    pipe.Reset();
  }
}

void ProcessSupervisor::Deliver(Process& process, OutputStream stream, std::string_view data) {
  bool is_stdout = stream == OutputStream::kStdout;
  UniqueFd& file = is_stdout ? process.stdout_file : process.stderr_file;
  if (file.valid()) {
    absl::Status status = WriteAll(file.get(), data);
    if (!status.ok()) {
      file.Reset();
      absl::MutexLock lock(&mu_);
      pending_notices_.push_back(absl::StrCat(
          "output of '", process.key, "' can no longer be appended to ",
          is_stdout ? process.stdout_path : process.stderr_path, " (", status.message(),
          "); it still reaches on_output"));
    }
  }
  if (callbacks_.on_output) callbacks_.on_output(process.key, stream, data);
}

}  // namespace shoal::process
