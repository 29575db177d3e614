#include "backends/slurm/slurm_backend.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <regex>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "process/exec_plan.h"
#include "process/process_launcher.h"
#include "common/files.h"
#include "common/local_address.h"
#include "process/process.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace shoal::backends {
namespace {

// Runs a short Slurm command (squeue, scancel, scontrol) and returns its stdout. Only from
// threads that may block for a moment: never the master's loop.
absl::StatusOr<std::string> RunQuick(const std::vector<std::string>& argv) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return absl::InternalError(std::strerror(errno));
  process::ProcessSpec spec;
  spec.key = argv.front();
  spec.argv = argv;
  spec.env = InheritedEnvironment({"SHOAL_AGENT_TOKEN"});
  auto plan = process::ExecPlan::Build(spec);
  if (!plan.ok()) {
    ::close(out[0]);
    ::close(out[1]);
    return plan.status();
  }
  int dev_null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  // stderr too: when the command fails, what it said is the message.
  process::ChildSetup setup;
  setup.stdin_fd = dev_null;
  setup.stdout_fd = setup.stderr_fd = out[1];
  auto child = process::SystemLauncher().Launch(*plan, setup);
  ::close(out[1]);
  if (dev_null >= 0) ::close(dev_null);
  if (!child.ok()) {
    ::close(out[0]);
    return child.status();
  }
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(out[0], buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) text.append(buf, static_cast<size_t>(n));
  }
  ::close(out[0]);
  int status = 0;
  while (::waitpid(child->pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::UnavailableError(
        absl::StrCat(argv.front(), " failed: ", absl::StripAsciiWhitespace(text)));
  }
  return text;
}

}  // namespace

SlurmBackend::SlurmBackend(SlurmBackendOptions options) : options_(std::move(options)) {}

SlurmBackend::~SlurmBackend() { Release(); }

absl::StatusOr<std::vector<NodeGrant>> SlurmBackend::Acquire(const spec::JobSpec& job,
                                                             const std::string& job_id) {
  job_ = job;
  job_id_ = job_id;
  places_ = OnePlacePerTask(job);
  std::string place_map = SlurmPlaceMap(SlurmComponents(job));
  for (uint32_t rank = 0; rank < places_.size(); ++rank) {
    if (auto place = SlurmPlaceOf(place_map, rank); place.ok()) place_of_rank_[rank] = *place;
  }
  // Whether Slurm can hold the gang is Slurm's to say, when srun asks (StartAgents): a refusal
  // or a wait in its queue arrives as an allocation event.
  return places_;
}

absl::Status SlurmBackend::StartAgents(const AgentStartOptions& options) {
  uint32_t ports = 0;
  for (const auto& [node, n] : options.ports_per_node) ports = std::max(ports, n);
  std::vector<std::string> agent_args = {
      "--master", options.master_address,
      "--work-dir", options_.agent_work_dir,
      "--ports", std::to_string(ports),
      "--master-grace-ms", std::to_string(options.master_grace_ms),
      "--heartbeat-interval-ms", std::to_string(options.heartbeat_interval_ms),
      "--watchdog-ms", std::to_string(WatchdogMs(options))};
  std::vector<std::string> argv = SrunCommand(job_, options_.request, options_.srun,
                                              SlurmJobName(), options.shoal_binary, agent_args);
  if (auto st = MakeDirs(options_.state_dir); !st.ok()) return st;
  process::ProcessSpec spec;
  spec.key = "srun:" + options.job_id;
  spec.argv = argv;
  // The agents get srun's environment (Slurm's --export=ALL), the token with it; never argv.
  // Slurm variables of an allocation this master might itself run in would make srun start a
  // step there instead of allocating the job's own.
  spec.env = InheritedEnvironment({"SHOAL_AGENT_TOKEN"});
  for (auto it = spec.env.begin(); it != spec.env.end();) {
    bool slurm = absl::StartsWith(it->first, "SLURM_") && it->first != "SLURM_CONF";
    it = slurm ? spec.env.erase(it) : std::next(it);
  }
  spec.env["SHOAL_AGENT_TOKEN"] = options.token;
  auto plan = process::ExecPlan::Build(spec);
  if (!plan.ok()) return plan.status();
  int log = ::open(LogPath().c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) {
    return absl::InternalError(absl::StrCat("cannot open ", LogPath(), ": ", std::strerror(errno)));
  }
  off_t start = ::lseek(log, 0, SEEK_END);
  int dev_null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  process::ChildSetup setup;
  setup.stdin_fd = dev_null;
  setup.stdout_fd = setup.stderr_fd = log;
  // srun holds the allocation: it must outlive a master that dies, so that a new master can
  // take the job over (Reattach) instead of losing every task.
  setup.die_with_parent = false;
  auto child = process::SystemLauncher().Launch(*plan, setup);
  ::close(log);
  if (dev_null >= 0) ::close(dev_null);
  if (!child.ok()) return child.status();
  spdlog::info("started {} (output in {})", absl::StrJoin(argv, " "), LogPath());
  pid_t pid = child->pid;
  {
    std::lock_guard<std::mutex> lock(mu_);
    srun_pid_ = pid;
    srun_started_ = true;
  }
  nlohmann::json record = {{"pid", pid}, {"slurm_job_name", SlurmJobName()},
                           {"log_offset", start}};
  if (auto st = ReplaceFile(RecordPath(), record.dump()); !st.ok()) return st;
  int pidfd = child->exit_fd.Release();
  watcher_ = std::thread([this, pid, pidfd, start] {
    Watch(pid, pidfd, static_cast<uint64_t>(start));
  });
  return absl::OkStatus();
}

absl::Status SlurmBackend::Reattach(const std::string& job_id,
                                    const std::vector<NodeGrant>& grants,
                                    const AgentStartOptions& options) {
  job_id_ = job_id;
  places_ = grants;
  auto text = ReadFile(RecordPath());
  nlohmann::json record =
      text.ok() ? nlohmann::json::parse(*text, nullptr, false) : nlohmann::json();
  pid_t pid = record.is_object() ? record.value("pid", 0) : 0;
  if (pid <= 0 || !ProcessRunning(pid, SlurmJobName())) {
    CancelSlurmJob();  // nothing of it may keep running unwatched
    return absl::NotFoundError(absl::StrCat("the srun holding job ", job_id,
                                            "'s Slurm allocation is gone"));
  }
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return absl::InternalError(absl::StrCat("pidfd_open: ", std::strerror(errno)));
  struct stat st {};
  uint64_t offset = ::stat(LogPath().c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    srun_pid_ = pid;
    srun_started_ = true;
  }
  watcher_ = std::thread([this, pid, pidfd, offset] { Watch(pid, pidfd, offset); });
  return absl::OkStatus();
}

void SlurmBackend::Watch(pid_t pid, int pidfd, uint64_t log_offset) {
  int log = -1;
  std::string partial;
  auto drain = [&] {
    if (log < 0) {
      log = ::open(LogPath().c_str(), O_RDONLY | O_CLOEXEC);
      if (log < 0) return;
      ::lseek(log, static_cast<off_t>(log_offset), SEEK_SET);
    }
    char buf[8192];
    ssize_t n;
    while ((n = ::read(log, buf, sizeof buf)) > 0) {
      partial.append(buf, static_cast<size_t>(n));
      size_t nl;
      while ((nl = partial.find('\n')) != std::string::npos) {
        HandleLine(partial.substr(0, nl));
        partial.erase(0, nl + 1);
      }
    }
  };
  for (;;) {
    // srun's output is a file, not a pipe, so that srun survives the master; it is read as
    // it grows. 20 ms keeps Slurm's news (queued, cancelled) prompt at a negligible cost.
    pollfd p{pidfd, POLLIN, 0};
    int ready = ::poll(&p, 1, 20);
    drain();
    if (ready > 0) break;
  }
  drain();
  if (!partial.empty()) HandleLine(partial);
  if (log >= 0) ::close(log);
  ::close(pidfd);
  int status = -1;
  if (::waitpid(pid, &status, WNOHANG) != pid) status = -1;  // not our child (re-attached)
  PlaceLostCallback on_lost;
  std::vector<std::string> lost;
  std::string why;
  {
    std::lock_guard<std::mutex> lock(mu_);
    srun_pid_ = -1;
    srun_status_ = status;
    srun_exited_.notify_all();
    if (releasing_) return;
    on_lost = on_lost_;
    if (status == -1) {
      why = "srun, which held the Slurm allocation, exited";
    } else if (WIFSIGNALED(status)) {
      why = absl::StrCat("srun, which held the Slurm allocation, was killed by signal ",
                         WTERMSIG(status));
    } else {
      why = absl::StrCat("srun, which held the Slurm allocation, exited with code ",
                         WEXITSTATUS(status));
    }
    if (cancelled_) why = "the Slurm job was cancelled";
    if (!last_error_.empty()) why += absl::StrCat(" (", last_error_, ")");
    for (const auto& p : places_) {
      if (lost_.insert(p.name).second) lost.push_back(p.name);
    }
  }
  if (on_lost) {
    for (const auto& place : lost) on_lost(place, why);
  }
}

void SlurmBackend::HandleLine(const std::string& line) {
  spdlog::debug("srun: {}", line);
  std::optional<SrunLineEvent> event = ClassifySrunLine(line);
  if (!event) {
    if (absl::StrContains(line, "error:") || absl::StrContains(line, "fatal:")) {
      std::lock_guard<std::mutex> lock(mu_);
      last_error_ = std::string(absl::StripAsciiWhitespace(line));
    }
    return;
  }
  AllocationEventCallback on_event;
  PlaceLostCallback on_lost;
  std::vector<std::string> lost;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (releasing_) return;
    on_event = on_event_;
    on_lost = on_lost_;
    if (event->kind == SrunLineEvent::kCancelled) {
      if (cancelled_) return;
      cancelled_ = true;
    }
    if (event->kind == SrunLineEvent::kTaskEnded) {
      if (cancelled_) return;  // the cancellation already explains it
      for (uint32_t rank : event->task_ranks) {
        auto it = place_of_rank_.find(rank);
        if (it != place_of_rank_.end() && lost_.insert(it->second).second) {
          lost.push_back(it->second);
        }
      }
    }
  }
  switch (event->kind) {
    case SrunLineEvent::kTaskEnded:
      if (on_lost) {
        for (const auto& place : lost) on_lost(place, event->reason);
      }
      return;
    case SrunLineEvent::kQueued: {
      std::string reason = PendingReason(event->slurm_job);
      if (!reason.empty()) event->reason += absl::StrCat(" (Slurm's reason: ", reason, ")");
      spdlog::info("{}", event->reason);
      if (on_event) on_event({AllocationEvent::kQueued, event->reason});
      return;
    }
    case SrunLineEvent::kAllocated:
      spdlog::info("{}", event->reason);
      if (on_event) on_event({AllocationEvent::kAllocated, event->reason});
      return;
    case SrunLineEvent::kRefused:
      spdlog::warn("{}", event->reason);
      if (on_event) on_event({AllocationEvent::kRefused, event->reason});
      return;
    case SrunLineEvent::kCancelled:
      spdlog::warn("{}", event->reason);
      if (on_event) on_event({AllocationEvent::kCancelled, event->reason});
      return;
  }
}

std::string SlurmBackend::PendingReason(uint64_t slurm_job) const {
  if (slurm_job == 0) return "";
  auto out = RunQuick({options_.squeue, "-h", "-j", std::to_string(slurm_job), "-o", "%r"});
  if (!out.ok()) return "";
  return std::string(absl::StripAsciiWhitespace(*out));
}

void SlurmBackend::CancelSlurmJob() {
  if (job_id_.empty()) return;
  // By name: it also finds a job srun was still waiting for, whose id srun never printed.
  auto st = RunQuick({options_.scancel, "--name=" + SlurmJobName()});
  if (!st.ok()) spdlog::warn("scancel --name={}: {}", SlurmJobName(), st.status().ToString());
}

void SlurmBackend::SetPlaceLostCallback(PlaceLostCallback callback) {
  std::lock_guard<std::mutex> lock(mu_);
  on_lost_ = std::move(callback);
}

void SlurmBackend::SetAllocationEventCallback(AllocationEventCallback callback) {
  std::lock_guard<std::mutex> lock(mu_);
  on_event_ = std::move(callback);
}

void SlurmBackend::Release() {
  pid_t pid;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (releasing_ && srun_pid_ < 0 && !watcher_.joinable()) return;
    releasing_ = true;
    pid = srun_pid_;
  }
  if (pid > 0) {
    // The master has normally told every agent to shut down: the step then ends and srun
    // with it, releasing the allocation. Otherwise Slurm is asked to cancel the job.
    std::unique_lock<std::mutex> lock(mu_);
    bool exited = srun_exited_.wait_for(lock, std::chrono::milliseconds(3000),
                                        [&] { return srun_pid_ < 0; });
    if (!exited) {
      lock.unlock();
      CancelSlurmJob();
      lock.lock();
      if (!srun_exited_.wait_for(lock, std::chrono::seconds(15), [&] { return srun_pid_ < 0; })) {
        ::kill(pid, SIGKILL);
      }
    }
  }
  if (watcher_.joinable()) watcher_.join();
  bool started, clean;
  {
    std::lock_guard<std::mutex> lock(mu_);
    started = srun_started_;
    clean = srun_status_ != -1 && WIFEXITED(srun_status_) && WEXITSTATUS(srun_status_) == 0;
  }
  // A job srun left behind (it was killed, or never got its allocation) must not hold nodes.
  if (started && !clean) CancelSlurmJob();
}

absl::StatusOr<uint32_t> SlurmBackend::PartitionNodeCount(const std::string& partition) {
  // "%P %D": partition name (the default one marked '*') and its node count, one line each.
  auto out = RunQuick({"sinfo", "-h", "-o", "%P %D"});
  if (!out.ok()) return out.status();
  uint32_t total = 0;
  bool found = false;
  std::istringstream lines(*out);
  std::string name, count;
  while (lines >> name >> count) {
    bool is_default = !name.empty() && name.back() == '*';
    if (is_default) name.pop_back();
    if (partition.empty() ? !is_default : name != partition) continue;
    uint32_t n = 0;
    if (!absl::SimpleAtoi(count, &n)) continue;
    // A partition may come on several lines (sinfo groups nodes by what it shows): sum them.
    total += n;
    found = true;
  }
  if (!found) {
    return absl::NotFoundError(absl::StrCat("sinfo lists no partition ",
                                            partition.empty() ? "marked default" : partition));
  }
  return total;
}

absl::StatusOr<std::string> SlurmBackend::AddressTowardsController() {
  auto config = RunQuick({"scontrol", "show", "config"});
  if (!config.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot ask Slurm for its controller (scontrol show config): ",
                     config.status().message()));
  }
  // "SlurmctldHost[0]       = ctl(10.0.0.1)" or "= ctl"
  static const std::regex host(R"(SlurmctldHost\[0\]\s*=\s*([^\s(]+)(?:\(([^)]+)\))?)");
  std::smatch m;
  if (!std::regex_search(*config, m, host)) {
    return absl::UnavailableError("scontrol show config names no SlurmctldHost");
  }
  std::string controller = m[2].matched ? m[2].str() : m[1].str();
  return common::LocalAddressTowards(controller, "6817", "the Slurm controller");
}

}  // namespace shoal::backends
