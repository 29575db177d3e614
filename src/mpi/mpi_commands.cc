#include "mpi/mpi_commands.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/files.h"
#include "mpi/mpi_world.h"
#include "nlohmann/json.hpp"
#include "process/exec_plan.h"
#include "process/process.h"
#include "process/process_launcher.h"

namespace shoal::mpi {
namespace {

constexpr int kRshFailed = 255;  // ssh's code when the remote command could not be run
constexpr size_t kMaxLine = 1 << 20;
constexpr auto kConnectPatience = std::chrono::seconds(30);
constexpr auto kKillGrace = std::chrono::seconds(5);

void Say(const std::string& who, const std::string& what) {
  std::fprintf(stderr, "shoal %s: %s\n", who.c_str(), what.c_str());
  std::fflush(stderr);
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

absl::StatusOr<std::string> ClusterJson() {
  std::string path = Env("SHOAL_CLUSTER_SPEC_FILE");
  if (path.empty()) {
    return absl::FailedPreconditionError(
        "SHOAL_CLUSTER_SPEC_FILE is not set; this command only runs inside a Shoal MPI task");
  }
  return ReadFile(path);
}

// Reads one '\n'-terminated line; false on EOF, error, timeout or an overlong line.
bool ReadLine(int fd, std::string& line, int timeout_ms) {
  line.clear();
  char c;
  while (line.size() < kMaxLine) {
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    if (c == '\n') return true;
    line.push_back(c);
  }
  return false;
}

bool WriteAll(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

// ------------------------------------------------------------------ worker

std::atomic<bool> g_stop{false};
int g_stop_pipe[2] = {-1, -1};

void OnStopSignal(int) {
  g_stop = true;
  char b = 1;
  [[maybe_unused]] ssize_t n = ::write(g_stop_pipe[1], &b, 1);
}

class Worker {
 public:
  explicit Worker(std::string secret) : secret_(std::move(secret)) {}

  // Serves one caller: checks its secret, runs its command, reports the exit; kills the
  // command's process group if the caller goes away first.
  void Serve(int fd, std::string peer) {
    std::string line;
    auto request = ReadLine(fd, line, 10000) ? DecodeRequest(line)
                                             : absl::InvalidArgumentError("no request line");
    if (!request.ok()) {
      Say("mpi-worker", absl::StrCat("refused a caller from ", peer, ": ",
                                     request.status().message()));
      WriteAll(fd, nlohmann::json{{"error", std::string(request.status().message())}}.dump() + "\n");
      ::close(fd);
      return;
    }
    if (!SecretsEqual(request->secret, secret_)) {
      Say("mpi-worker", absl::StrCat("refused a caller from ", peer,
                                     ": it does not hold this job's secret"));
      WriteAll(fd, R"({"error": "wrong secret"})" "\n");
      ::close(fd);
      return;
    }
    process::ProcessSpec spec;
    spec.key = "mpi-command";
    spec.argv = {"/bin/sh", "-c", request->command};
    spec.env = InheritedEnvironment({});
    process::ChildSetup setup;  // stdin: /dev/null; stdout and stderr: the worker's
    setup.stdout_fd = STDOUT_FILENO;
    setup.stderr_fd = STDERR_FILENO;
    setup.grouping = process::Grouping::kNewProcessGroup;
    setup.default_signals = std::vector<int>{SIGTERM, SIGINT, SIGPIPE};
    setup.die_with_parent = false;
    absl::StatusOr<process::LaunchedProcess> child = process::SystemLauncher().Start(spec, setup);
    if (!child.ok()) {
      std::string why(child.status().message());
      Say("mpi-worker", why);
      WriteAll(fd, nlohmann::json{{"error", why}}.dump() + "\n");
      ::close(fd);
      return;
    }
    pid_t pid = child->pid;
    {
      std::lock_guard<std::mutex> lock(mu_);
      groups_.insert(pid);
    }
    absl::string_view trimmed = absl::StripLeadingAsciiWhitespace(request->command);
    std::string first_word(trimmed.substr(0, trimmed.find(' ')));
    Say("mpi-worker", absl::StrCat("started ", first_word, " for ", peer, " (pid ", pid, ")"));
    WriteAll(fd, nlohmann::json{{"started", pid}}.dump() + "\n");

    std::optional<process::ProcessExit> exit;
    bool caller_gone = false;
    while (true) {
      exit = process::SystemLauncher().Poll(pid);
      if (exit) break;
      pollfd p{fd, POLLIN, 0};
      if (!caller_gone && ::poll(&p, 1, 100) > 0) {
        char buf[256];
        ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) {
          caller_gone = true;
          Say("mpi-worker", absl::StrCat("caller ", peer, " went away; stopping pid ", pid));
          StopGroup(pid);
        }
      } else if (caller_gone) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      groups_.erase(pid);
    }
    int code = process::ShellExitCode(*exit);
    Say("mpi-worker", absl::StrCat(first_word, " (pid ", pid, ") exited with ", code));
    if (!caller_gone) WriteAll(fd, nlohmann::json{{"exit", code}}.dump() + "\n");
    ::close(fd);
  }

  // SIGTERM the whole group, SIGKILL what is left after the grace period.
  static void StopGroup(pid_t pgid) {
    ::kill(-pgid, SIGTERM);
    std::thread([pgid] {
      auto deadline = std::chrono::steady_clock::now() + kKillGrace;
      while (std::chrono::steady_clock::now() < deadline) {
        if (::kill(-pgid, 0) != 0) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      ::kill(-pgid, SIGKILL);
    }).detach();
  }

  void StopAll() {
    std::set<pid_t> groups;
    {
      std::lock_guard<std::mutex> lock(mu_);
      groups = groups_;
    }
    for (pid_t g : groups) ::kill(-g, SIGTERM);
    auto deadline = std::chrono::steady_clock::now() + kKillGrace;
    for (pid_t g : groups) {
      while (::kill(-g, 0) == 0 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      ::kill(-g, SIGKILL);
    }
  }

 private:
  const std::string secret_;
  std::mutex mu_;
  std::set<pid_t> groups_;
};

absl::StatusOr<int> Listen(const std::string& address, uint32_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  if (int rc = ::getaddrinfo(address.c_str(), service.c_str(), &hints, &res); rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", address, ": ", gai_strerror(rc)));
  }
  int err = 0;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 64) == 0) {
      ::freeaddrinfo(res);
      return fd;
    }
    err = errno;
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return absl::UnavailableError(
      absl::StrCat("cannot listen on ", address, ":", port, ": ", std::strerror(err)));
}

std::string PeerOf(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (ss.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, host, sizeof host);
  } else if (ss.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr, host,
                sizeof host);
  }
  return host;
}

// ------------------------------------------------------------------ rsh

absl::StatusOr<int> Connect(const MpiHost& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  std::string service = std::to_string(host.port);
  auto deadline = std::chrono::steady_clock::now() + kConnectPatience;
  std::string last;
  // The worker's process runs before its socket listens: retry refusals for a while.
  while (true) {
    addrinfo* res = nullptr;
    int rc = ::getaddrinfo(host.address.c_str(), service.c_str(), &hints, &res);
    if (rc != 0) {
      last = absl::StrCat("cannot resolve ", host.address, ": ", gai_strerror(rc));
    } else {
      for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
        int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
        if (fd < 0) continue;
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          ::freeaddrinfo(res);
          return fd;
        }
        last = std::strerror(errno);
        ::close(fd);
      }
      ::freeaddrinfo(res);
    }
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return absl::UnavailableError(absl::StrCat("cannot reach the mpi-worker of ", host.alias, " at ",
                                             host.address, ":", host.port, ": ", last));
}

}  // namespace

int RunMpiLauncher(const std::string& shoal_binary, const std::vector<std::string>& command) {
  const std::string who = "mpi-launcher";
  if (command.empty()) {
    Say(who, "no command to run (give the MPI program after --)");
    return 2;
  }
  auto json = ClusterJson();
  if (!json.ok()) {
    Say(who, std::string(json.status().message()));
    return 1;
  }
  auto hosts = WorkerHosts(*json);
  if (!hosts.ok()) {
    Say(who, std::string(hosts.status().message()));
    return 1;
  }
  uint32_t slots = 1;
  if (std::string s = Env("SHOAL_MPI_SLOTS_PER_WORKER"); !s.empty() && !absl::SimpleAtoi(s, &slots)) {
    Say(who, absl::StrCat("SHOAL_MPI_SLOTS_PER_WORKER must be a number, got '", s, "'"));
    return 1;
  }
  if (Env("SHOAL_MPI_SECRET").empty()) {
    Say(who, "SHOAL_MPI_SECRET is not set; mpi-rsh could not authenticate to the workers");
    return 1;
  }
  std::string spec_file = Env("SHOAL_CLUSTER_SPEC_FILE");
  std::string hostfile = spec_file.substr(0, spec_file.find_last_of('/') + 1) + "mpi-hostfile";
  if (auto st = ReplaceFile(hostfile, Hostfile(*hosts, slots)); !st.ok()) {
    Say(who, std::string(st.message()));
    return 1;
  }
  // Open MPI reads MCA parameters from OMPI_MCA_* variables, so a command that runs mpirun
  // itself (`mpirun -np 4 python3 train.py`) gets the same hostfile and remote shell.
  ::setenv("OMPI_MCA_orte_default_hostfile", hostfile.c_str(), 1);
  ::setenv("OMPI_MCA_plm", "rsh", 1);
  std::string rsh = shoal_binary + " mpi-rsh";
  ::setenv("OMPI_MCA_plm_rsh_agent", rsh.c_str(), 1);
  // Only the launcher holds what mpi-rsh needs to reach the workers, so it starts every daemon.
  ::setenv("OMPI_MCA_plm_rsh_no_tree_spawn", "1", 1);
  // Without tree spawn Open MPI passes --daemonize to orted, which would then leave the
  // worker's process group and session: the worker could no longer stop it, and a daemon
  // that died early would go unnoticed by mpirun, which waits for it forever.
  ::setenv("OMPI_MCA_orte_leave_session_attached", "1", 1);
  // Open MPI 4.1's rtc/hwloc shares the topology with the ranks through a segment mapped at a
  // guessed hole in the address space; orted crashed there (SIGSEGV in
  // hwloc_shmem_topology_write) in about 1 start of 10 here. It only binds ranks, which
  // --bind-to none leaves to the worker task's CPU pinning anyway. A role's env may set it.
  ::setenv("OMPI_MCA_rtc", "^hwloc", 0);
  std::vector<std::string> argv = LauncherArgv(command, static_cast<uint32_t>(hosts->size()) * slots);
  Say(who, absl::StrCat(hosts->size(), " worker(s) x ", slots, " slot(s), hostfile ", hostfile,
                        "; running: ", absl::StrJoin(argv, " ")));
  // The task becomes mpirun: its exit is the task's, and the agent's signals reach it directly.
  absl::Status replaced = process::ExecInPlace(argv);
  Say(who, absl::StrCat(replaced.message(), absl::IsNotFound(replaced)
                                                 ? " (is Open MPI installed? Debian: openmpi-bin)"
                                                 : ""));
  return 127;
}

void RemoveDirectories(const std::vector<std::string>& paths) {
  for (const std::string& path : paths) {
    std::error_code ignored;  // what cannot go stays, as a killed Open MPI's own files do
    std::filesystem::remove_all(path, ignored);
  }
}

// Open MPI keeps two things per machine that several workers of one job on a machine must not
// share, as each worker is a machine of its own to Open MPI:
// - the daemons' session files, under OMPI_MCA_orte_tmpdir_base (/tmp)/ompi.<host>.<uid>/
//   jf.<job family>. Open MPI 4.1 creates that directory with a look and then a mkdir, which
//   fails with "File exists" when two daemons start at once, and the job with it (it failed
//   a CI run).
// - the ranks' shared-memory segments, OMPI_MCA_btl_vader_backing_directory (/dev/shm)/
//   vader_segment.<host>.<job id>.<local rank>. Two workers' ranks of the same local rank open
//   the same segment, and crash in mca_btl_vader_poll_handle_frag (2 workers x 2 slots did,
//   every time).
// So each worker makes a directory of its own for each, for the daemons and ranks it starts,
// and removes them when it stops. A variable the role's env sets keeps its value.
absl::StatusOr<std::vector<std::string>> GiveRanksDirectoriesOfTheirOwn(const std::string& role,
                                                                       uint32_t index) {
  std::string tmp = TemporaryDirectoryRoot();
  std::string shm = ::access("/dev/shm", W_OK | X_OK) == 0 ? "/dev/shm" : tmp;
  const std::pair<const char*, std::string> wanted[] = {
      {"OMPI_MCA_orte_tmpdir_base", tmp}, {"OMPI_MCA_btl_vader_backing_directory", shm}};
  std::vector<std::string> made;
  for (const auto& [variable, parent] : wanted) {
    if (!Env(variable).empty()) continue;
    auto path = MakeTemporaryDirectory(absl::StrCat("shoal-mpi-", role, index, "-"), parent);
    if (!path.ok()) {
      RemoveDirectories(made);
      return absl::Status(path.status().code(),
                          absl::StrCat(variable, ": ", path.status().message()));
    }
    ::setenv(variable, path->c_str(), 1);
    made.push_back(std::move(*path));
  }
  return made;
}

int RunMpiWorker() {
  const std::string who = "mpi-worker";
  auto json = ClusterJson();
  if (!json.ok()) {
    Say(who, std::string(json.status().message()));
    return 1;
  }
  uint32_t index = 0;
  std::string role = Env("SHOAL_ROLE");
  if (role.empty() || !absl::SimpleAtoi(Env("SHOAL_INDEX"), &index)) {
    Say(who, "SHOAL_ROLE and SHOAL_INDEX must name this task");
    return 1;
  }
  auto me = FindTask(*json, role, index);
  if (!me.ok()) {
    Say(who, std::string(me.status().message()));
    return 1;
  }
  std::string secret = Env("SHOAL_MPI_SECRET");
  if (secret.empty()) {
    Say(who, "SHOAL_MPI_SECRET is not set; refusing to serve without authentication");
    return 1;
  }
  // The ranks this task hosts have no use for it.
  ::unsetenv("SHOAL_MPI_SECRET");
  auto listener = Listen(me->address, me->port);
  if (!listener.ok()) {
    Say(who, std::string(listener.status().message()));
    return 1;
  }
  if (::pipe2(g_stop_pipe, O_CLOEXEC) != 0) return 1;
  struct sigaction sa{};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  auto own_directories = GiveRanksDirectoriesOfTheirOwn(role, index);
  if (!own_directories.ok()) {
    Say(who, std::string(own_directories.status().message()));
    ::close(*listener);
    return 1;
  }
  Say(who, absl::StrCat("hosting MPI ranks as ", HostAlias(index), " on ", me->address, ":",
                        me->port));
  Worker worker(secret);
  while (!g_stop) {
    pollfd p[2] = {{*listener, POLLIN, 0}, {g_stop_pipe[0], POLLIN, 0}};
    int r = ::poll(p, 2, -1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 || (p[1].revents & POLLIN)) break;
    if (!(p[0].revents & POLLIN)) continue;
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    int fd = ::accept4(*listener, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::thread([&worker, fd, peer = PeerOf(ss)] { worker.Serve(fd, peer); }).detach();
  }
  ::close(*listener);
  worker.StopAll();
  RemoveDirectories(*own_directories);
  Say(who, "stopped");
  return 0;
}

int RunMpiRsh(const std::vector<std::string>& args) {
  const std::string who = "mpi-rsh";
  // ssh-style: options (none used by Open MPI here) before the host, then the command words.
  size_t i = 0;
  while (i < args.size() && !args[i].empty() && args[i][0] == '-') ++i;
  if (i + 1 >= args.size()) {
    Say(who, "usage: shoal mpi-rsh HOST COMMAND...");
    return kRshFailed;
  }
  const std::string& alias = args[i];
  std::string command;
  for (size_t j = i + 1; j < args.size(); ++j) {
    absl::string_view word = absl::StripAsciiWhitespace(args[j]);
    if (word.empty()) continue;
    absl::StrAppend(&command, command.empty() ? "" : " ", args[j]);
  }
  auto json = ClusterJson();
  if (!json.ok()) {
    Say(who, std::string(json.status().message()));
    return kRshFailed;
  }
  auto hosts = WorkerHosts(*json);
  if (!hosts.ok()) {
    Say(who, std::string(hosts.status().message()));
    return kRshFailed;
  }
  const MpiHost* host = nullptr;
  for (const auto& h : *hosts) {
    if (h.alias == alias) host = &h;
  }
  if (host == nullptr) {
    Say(who, absl::StrCat("unknown host '", alias, "': the hostfile Shoal wrote names ",
                          HostAlias(0), " to ", HostAlias(hosts->size() - 1)));
    return kRshFailed;
  }
  auto fd = Connect(*host);
  if (!fd.ok()) {
    Say(who, std::string(fd.status().message()));
    return kRshFailed;
  }
  ::signal(SIGPIPE, SIG_IGN);
  if (!WriteAll(*fd, EncodeRequest({Env("SHOAL_MPI_SECRET"), command}))) {
    Say(who, absl::StrCat(alias, ": the connection closed before the request was sent"));
    return kRshFailed;
  }
  // Until the command ends, which is as long as the job runs: our exit is Open MPI's sign that
  // the daemon is gone, and our death (mpirun kills us) makes the worker stop the daemon.
  std::string line;
  while (ReadLine(*fd, line, -1)) {
    nlohmann::json doc = nlohmann::json::parse(line, nullptr, false);
    if (doc.is_discarded() || !doc.is_object()) break;
    if (doc.contains("error")) {
      Say(who, absl::StrCat(alias, ": ", doc["error"].is_string() ? doc["error"].get<std::string>()
                                                                  : doc["error"].dump()));
      return kRshFailed;
    }
    if (doc.contains("exit") && doc["exit"].is_number_integer()) return doc["exit"].get<int>();
  }
  Say(who, absl::StrCat(alias, ": the worker task went away before the command ended"));
  return kRshFailed;
}

}  // namespace shoal::mpi
