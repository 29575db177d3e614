#include "backends/local/local_backend.h"

#include <signal.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <poll.h>
#include <sys/syscall.h>

#include <cerrno>
#include <filesystem>
#include <chrono>
#include <cmath>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/byte_size.h"
#include "process/exec_plan.h"
#include "process/process_launcher.h"
#include "common/files.h"
#include "process/process.h"
#include "nlohmann/json.hpp"

namespace shoal::backends {

LocalBackend::LocalBackend(LocalBackendOptions options)
    : options_(std::move(options)), ledger_(options_.ledger_dir) {}

LocalBackend::~LocalBackend() { Release(); }

absl::StatusOr<std::vector<NodeGrant>> LocalBackend::Acquire(const spec::JobSpec& job,
                                                             const std::string& job_id) {
  job_id_ = job_id;
  double cpus = 0;
  uint64_t memory = 0;
  uint32_t gpus = 0, whole_cores = 0;
  for (const auto& role : job.roles) {
    cpus += role.resources.cpus * role.instances;
    memory += role.resources.memory_bytes * role.instances;
    gpus += role.resources.gpus * role.instances;
    double c = role.resources.cpus;
    if (c >= 1 && std::floor(c) == c) whole_cores += static_cast<uint32_t>(c) * role.instances;
  }
  const machine::MachineInventory& m = options_.machine;
  if (cpus > m.cpus + 1e-9 || memory > m.memory_bytes || gpus > m.gpus.size()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the job needs %.2f CPUs, %s memory and %u GPUs; this machine has %.2f, %s and %u", cpus,
        FormatByteSize(memory), gpus, m.cpus, FormatByteSize(m.memory_bytes), m.gpus.size()));
  }
  auto reservation = ledger_.ReserveIf(
      [&](const std::vector<Reservation>& others) -> absl::StatusOr<Reservation> {
        double used_cpus = 0;
        uint64_t used_memory = 0;
        std::set<uint32_t> used_cores;
        std::set<std::string> used_gpus;
        std::vector<std::string> holders;
        for (const auto& r : others) {
          used_cpus += r.cpus;
          used_memory += r.memory_bytes;
          used_cores.insert(r.cores.begin(), r.cores.end());
          used_gpus.insert(r.gpus.begin(), r.gpus.end());
          holders.push_back(r.job_id);
        }
        std::vector<std::string> short_of;
        if (used_cpus + cpus > m.cpus + 1e-9) {
          short_of.push_back(absl::StrFormat("%.2f CPUs (%.2f free)", cpus, m.cpus - used_cpus));
        }
        if (used_memory + memory > m.memory_bytes) {
          short_of.push_back(absl::StrCat(FormatByteSize(memory), " memory (",
                                          FormatByteSize(m.memory_bytes - used_memory), " free)"));
        }
        std::vector<std::string> free_gpus;
        for (const auto& g : m.gpus) {
          if (!used_gpus.count(g)) free_gpus.push_back(g);
        }
        if (free_gpus.size() < gpus) {
          short_of.push_back(absl::StrFormat("%u GPUs (%u free)", gpus, free_gpus.size()));
        }
        if (!short_of.empty()) {
          std::string who;
          for (const auto& h : holders) who += (who.empty() ? "" : ", ") + h;
          return absl::UnavailableError(absl::StrCat("waiting for ", absl::StrJoin(short_of, ", "),
                                                     "; held by ", who));
        }
        Reservation mine;
        mine.job_id = job_id;
        mine.owner_pid = ::getpid();
        mine.cpus = cpus;
        mine.memory_bytes = memory;
        mine.gpus.assign(free_gpus.begin(), free_gpus.begin() + gpus);
        std::vector<uint32_t> free_cores;
        for (uint32_t core : m.cores) {
          if (!used_cores.count(core)) free_cores.push_back(core);
        }
        // Pin only when every whole-core task can get cores of its own; otherwise pinning
        // would pile tasks onto a few cores, worse than letting the kernel spread them.
        if (whole_cores > 0 && free_cores.size() >= whole_cores) {
          mine.cores.assign(free_cores.begin(), free_cores.begin() + whole_cores);
        }
        return mine;
      });
  if (!reservation.ok()) return reservation.status();
  reservation_ = *reservation;
  NodeGrant grant;
  grant.name = "local";
  grant.address = "127.0.0.1";
  grant.cpus = reservation->cpus;
  grant.memory_bytes = reservation->memory_bytes;
  grant.cores = reservation->cores;
  grant.gpus = reservation->gpus;
  return std::vector<NodeGrant>{grant};
}

absl::Status LocalBackend::StartAgents(const AgentStartOptions& options) {
  uint32_t ports = 0;
  if (auto it = options.ports_per_node.find("local"); it != options.ports_per_node.end()) {
    ports = it->second;
  }
  std::vector<std::string> args = {options.shoal_binary,
                                   "agent",
                                   "--master",
                                   options.master_address,
                                   "--node",
                                   "local",
                                   "--work-dir",
                                   options_.agent_work_dir,
                                   "--ports",
                                   std::to_string(ports),
                                   "--master-grace-ms",
                                   std::to_string(options.master_grace_ms),
                                   "--heartbeat-interval-ms",
                                   std::to_string(options.heartbeat_interval_ms),
                                   "--watchdog-ms",
                                   std::to_string(WatchdogMs(options)),
                                   // Same machine as the job directory: the master keeps the logs.
                                   "--no-task-output"};
  if (options_.fake_gpus) {
    args.push_back("--fake-gpus");
    args.push_back(std::to_string(*options_.fake_gpus));
  }
  // The agent gets a cgroup of its own and is born in it; it makes its tasks' cgroups below,
  // so killing this one subtree reaches every task even when the agent hangs or dies.
  process::ResourceLimits::Options cg;
  cg.cgroup_name = "shoal-jobs";
  cg.instance_id = options.job_id;
  limits_ = process::ResourceLimits::Detect(cg);
  // Cgroups left by jobs whose master was killed. A live job's cgroup holds its agent from its
  // first moment, so it is busy and stays; the age keeps us off one being set up right now.
  limits_->RemoveStaleInstances(std::chrono::seconds(60));
  if (auto made = limits_->CreateTask("agent", 0); made.ok() && *made) {
    agent_cgroup_ = std::move(*made);
  }
  process::ProcessSpec spec;
  spec.key = "agent:" + options.job_id;
  spec.argv = args;
  spec.env = InheritedEnvironment({"SHOAL_AGENT_TOKEN"});
  spec.env["SHOAL_AGENT_TOKEN"] = options.token;
  auto plan = process::ExecPlan::Build(spec);
  if (!plan.ok()) return plan.status();
  int into = -1;
  std::vector<std::string> procs;
  if (agent_cgroup_) {
    for (const auto& dir : agent_cgroup_->dirs()) {
      if (dir.v2 && into < 0 && process::SystemLauncher().CanStartInCgroup()) {
        into = ::open(dir.path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (into >= 0) continue;
      }
      procs.push_back(dir.path + "/cgroup.procs");
    }
  }
  int dev_null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  // The agent's own log lines go where the master's go (master.log).
  process::ChildSetup setup;
  setup.stdin_fd = dev_null;
  setup.stdout_fd = STDOUT_FILENO;
  setup.stderr_fd = STDERR_FILENO;
  setup.die_with_parent = false;  // an agent outlives a master that restarts
  setup.into_cgroup_fd = into;
  setup.cgroup_procs = procs;
  auto child = process::SystemLauncher().Launch(*plan, setup);
  if (dev_null >= 0) ::close(dev_null);
  if (into >= 0) ::close(into);
  if (!child.ok()) return child.status();
  pid_t pid = child->pid;
  {
    absl::MutexLock lock(&mu_);
    agent_pid_ = pid;
  }
  watcher_ = std::thread([this, pid] { WatchAgent(pid, /*child=*/true); });
  // What a master taking over after this one dies needs to find the agent again, and the ledger
  // keeps the job's hold while the agent lives even if the master does not.
  nlohmann::json record = {{"pid", pid}, {"job_id", options.job_id}};
  record["cgroup_dirs"] = nlohmann::json::array();
  if (agent_cgroup_) {
    for (const auto& d : agent_cgroup_->dirs()) {
      record["cgroup_dirs"].push_back(
          {{"path", d.path}, {"v2", d.v2}, {"memory", d.memory}, {"tracking", d.tracking}});
    }
  }
  if (auto st = MakeDirs(options_.agent_work_dir); !st.ok()) return st;
  if (auto st = ReplaceFile(AgentRecordPath(), record.dump()); !st.ok()) return st;
  reservation_.agent_pid = pid;
  return ledger_.Put(reservation_);
}

absl::Status LocalBackend::ReplacePlace(const std::string& node,
                                        const AgentStartOptions& options) {
  {
    absl::MutexLock lock(&mu_);
    if (agent_pid_ > 0) {
      return absl::FailedPreconditionError("the local agent is still running");
    }
  }
  if (watcher_.joinable()) watcher_.join();
  // The dead agent's cgroup: whatever it left dies with it, and its name is free again.
  if (agent_cgroup_) {
    (void)agent_cgroup_->KillAndRemove(std::chrono::steady_clock::now() + std::chrono::seconds(5));
    agent_cgroup_.reset();
  }
  return StartAgents(options);
}

absl::Status LocalBackend::Reattach(const std::string& job_id,
                                    const std::vector<NodeGrant>& grants,
                                    const AgentStartOptions& options) {
  job_id_ = job_id;
  if (grants.size() != 1 || grants[0].name != "local") {
    return absl::InvalidArgumentError("the local backend holds exactly one place, 'local'");
  }
  const NodeGrant& g = grants[0];
  reservation_.job_id = job_id;
  reservation_.owner_pid = ::getpid();
  reservation_.cpus = g.cpus;
  reservation_.memory_bytes = g.memory_bytes;
  reservation_.cores = g.cores;
  reservation_.gpus = g.gpus;
  auto text = ReadFile(AgentRecordPath());
  nlohmann::json record =
      text.ok() ? nlohmann::json::parse(*text, nullptr, false) : nlohmann::json();
  pid_t pid = record.is_object() ? record.value("pid", 0) : 0;
  // The pid must still be this job's agent, not a recycled number.
  auto cmdline = ReadFile(absl::StrCat("/proc/", pid, "/cmdline"));
  bool alive = pid > 0 && ProcessRunning(pid) && cmdline.ok() &&
               cmdline->find(std::string("agent\0", 6)) != std::string::npos &&
               cmdline->find(options_.agent_work_dir) != std::string::npos;
  if (alive) {
    std::vector<process::TaskCgroup::Dir> dirs;
    for (const auto& d : record.value("cgroup_dirs", nlohmann::json::array())) {
      process::TaskCgroup::Dir dir;
      dir.path = d.value("path", "");
      dir.v2 = d.value("v2", false);
      dir.memory = d.value("memory", false);
      dir.tracking = d.value("tracking", false);
      if (!dir.path.empty() && std::filesystem::exists(dir.path)) dirs.push_back(dir);
    }
    if (!dirs.empty()) agent_cgroup_ = std::make_unique<process::TaskCgroup>(std::move(dirs));
    reservation_.agent_pid = pid;
    {
      absl::MutexLock lock(&mu_);
      agent_pid_ = pid;
    }
    watcher_ = std::thread([this, pid] { WatchAgent(pid, /*child=*/false); });
  }
  if (auto st = ledger_.Put(reservation_); !st.ok()) return st;
  if (!alive) {
    return absl::NotFoundError(absl::StrCat("the agent of job ", job_id,
                                            " is gone (it died with the previous master)"));
  }
  return absl::OkStatus();
}

void LocalBackend::WatchAgent(pid_t pid, bool child) {
  int status = 0;
  if (child) {
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  } else {
    // Not our child: a pidfd tells when it exits, though not how.
    int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (fd >= 0) {
      pollfd p{fd, POLLIN, 0};
      while (::poll(&p, 1, -1) < 0 && errno == EINTR) {
      }
      ::close(fd);
    }
    status = -1;
  }
  PlaceLostCallback callback;
  std::string why;
  {
    absl::MutexLock lock(&mu_);
    agent_pid_ = -1;
    agent_exited_.SignalAll();
    if (releasing_) return;
    callback = on_lost_;
  }
  if (status == -1) {
    why = "agent exited";
  } else if (WIFSIGNALED(status)) {
    why = absl::StrCat("agent killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  } else {
    why = absl::StrCat("agent exited with code ", WEXITSTATUS(status));
  }
  if (callback) callback("local", why);
}

void LocalBackend::KillAgentAndTasks() {
  {
    absl::MutexLock lock(&mu_);
    if (agent_pid_ > 0) ::kill(agent_pid_, SIGKILL);
  }
  if (agent_cgroup_) agent_cgroup_->KillAll();
}

void LocalBackend::TerminatePlace(const std::string& node) { KillAgentAndTasks(); }

void LocalBackend::SetPlaceLostCallback(PlaceLostCallback callback) {
  absl::MutexLock lock(&mu_);
  on_lost_ = std::move(callback);
}

void LocalBackend::Release() {
  pid_t pid;
  {
    absl::MutexLock lock(&mu_);
    releasing_ = true;
    pid = agent_pid_;
  }
  if (pid > 0) {
    // The master has normally sent the agent a Shutdown already and it is exiting; SIGTERM makes
    // it stop its tasks either way, and SIGKILL follows if it does not exit in time.
    absl::MutexLock lock(&mu_);
    absl::Time give_up_at = absl::Now() + absl::Milliseconds(500);
    while (agent_pid_ >= 0 && !agent_exited_.WaitWithDeadline(&mu_, give_up_at)) {
    }
    if (agent_pid_ >= 0) {
      ::kill(pid, SIGTERM);
      give_up_at = absl::Now() + absl::Seconds(5);
      while (agent_pid_ >= 0 && !agent_exited_.WaitWithDeadline(&mu_, give_up_at)) {
      }
      if (agent_pid_ >= 0) ::kill(pid, SIGKILL);
    }
  }
  // Whatever the agent left (it was killed, or a task escaped it) dies with its cgroup.
  if (agent_cgroup_) {
    (void)agent_cgroup_->KillAndRemove(std::chrono::steady_clock::now() + std::chrono::seconds(5));
    agent_cgroup_.reset();
  }
  limits_.reset();
  if (watcher_.joinable()) watcher_.join();
  if (!job_id_.empty()) (void)ledger_.Remove(job_id_);
}

}  // namespace shoal::backends
