#include "agent/agent_watchdog.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace shoal::agent {
namespace {

constexpr int kWatchdogFd = 3;  // where the watchdog reads pings

// Parent pid of every live process, from /proc/<pid>/stat (the field after the command,
// which itself may hold spaces and parentheses).
std::map<pid_t, pid_t> ParentsOfAll() {
  std::map<pid_t, pid_t> parents;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return parents;
  while (dirent* e = ::readdir(proc)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0') continue;
    std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    size_t close = text.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    long ppid = 0;
    if (std::sscanf(text.c_str() + close + 1, " %c %ld", &state, &ppid) != 2) continue;
    parents[static_cast<pid_t>(pid)] = static_cast<pid_t>(ppid);
  }
  ::closedir(proc);
  return parents;
}

std::set<pid_t> DescendantsOf(pid_t root) {
  std::map<pid_t, pid_t> parents = ParentsOfAll();
  std::set<pid_t> found;
  bool grew = true;
  while (grew) {
    grew = false;
    for (const auto& [pid, ppid] : parents) {
      if ((ppid == root || found.count(ppid)) && !found.count(pid)) {
        found.insert(pid);
        grew = true;
      }
    }
  }
  return found;
}

}  // namespace

absl::StatusOr<std::unique_ptr<AgentWatchdog>> AgentWatchdog::Start(
    const std::string& shoal_binary, std::chrono::milliseconds limit) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("watchdog pipe: ", std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  // dup2 clears close-on-exec on the copy; the original ends stay close-on-exec.
  posix_spawn_file_actions_adddup2(&actions, fds[0], kWatchdogFd);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigfillset(&defaults);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  // Its own process group: a signal to the agent's group (Ctrl-C) must not take it along
  // before the agent has gone.
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  std::string agent = std::to_string(::getpid());
  std::string limit_ms = std::to_string(limit.count());
  std::vector<char*> argv = {const_cast<char*>(shoal_binary.c_str()),
                             const_cast<char*>("agent-watchdog"),
                             const_cast<char*>(agent.c_str()),
                             const_cast<char*>(limit_ms.c_str()), nullptr};
  pid_t pid = -1;
  int rc = posix_spawn(&pid, shoal_binary.c_str(), &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(fds[0]);
  if (rc != 0) {
    ::close(fds[1]);
    return absl::InternalError(
        absl::StrCat("cannot start the agent's watchdog ", shoal_binary, ": ", std::strerror(rc)));
  }
  ::fcntl(fds[1], F_SETFL, O_NONBLOCK);
  return std::unique_ptr<AgentWatchdog>(new AgentWatchdog(fds[1], pid));
}

AgentWatchdog::~AgentWatchdog() {
  ::close(fd_);  // EOF: the watchdog exits
  int status;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
}

void AgentWatchdog::Ping() {
  char b = 'p';
  // A full pipe means the watchdog is behind on pings it has not read: nothing lost.
  [[maybe_unused]] ssize_t n = ::write(fd_, &b, 1);
}

int RunAgentWatchdog(pid_t agent, int ping_fd, std::chrono::milliseconds limit) {
  ::signal(SIGPIPE, SIG_IGN);
  auto last = std::chrono::steady_clock::now();
  char buf[256];
  for (;;) {
    auto left = limit - std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now() - last);
    pollfd p{ping_fd, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (r < 0 && errno == EINTR) continue;
    if (r > 0) {
      ssize_t n = ::read(ping_fd, buf, sizeof buf);
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) return 0;  // the agent is gone
      last = std::chrono::steady_clock::now();
      continue;
    }
    if (r < 0) return 1;
    break;  // silent for `limit`
  }
  // Freeze the agent so it starts nothing new, then kill what runs under it (tasks are leaders
  // of their own process groups; their children are in those groups), then the agent.
  ::kill(agent, SIGSTOP);
  std::set<pid_t> under = DescendantsOf(agent);
  under.erase(::getpid());
  std::fprintf(stderr,
               "shoal agent-watchdog: the agent (pid %d) sent no heartbeat for %.1fs: killing it "
               "and its %zu processes\n",
               agent, limit.count() / 1000.0, under.size());
  for (pid_t pid : under) {
    if (::getpgid(pid) == pid) ::kill(-pid, SIGKILL);
    ::kill(pid, SIGKILL);
  }
  ::kill(agent, SIGKILL);
  return 3;
}

}  // namespace shoal::agent
