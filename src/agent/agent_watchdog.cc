#include "agent/agent_watchdog.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
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
#include "process/exec_plan.h"
#include "process/process.h"
#include "process/process_launcher.h"

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
  process::ProcessSpec spec;
  spec.key = "agent-watchdog";
  spec.argv = {shoal_binary, "agent-watchdog", std::to_string(::getpid()),
               std::to_string(limit.count())};
  spec.env = InheritedEnvironment({});
  process::ChildSetup setup;  // stdin: /dev/null; stdout and stderr: the agent's
  setup.stdout_fd = STDOUT_FILENO;
  setup.stderr_fd = STDERR_FILENO;
  setup.extra_fds[kWatchdogFd] = fds[0];
  // Its own process group: a signal to the agent's group (Ctrl-C) must not take it along
  // before the agent has gone. It outlives the agent on purpose: it is what kills a hung one.
  setup.grouping = process::Grouping::kNewProcessGroup;
  setup.die_with_parent = false;
  absl::StatusOr<process::LaunchedProcess> child = process::SystemLauncher().Start(spec, setup);
  ::close(fds[0]);
  if (!child.ok()) {
    ::close(fds[1]);
    return absl::InternalError(absl::StrCat("cannot start the agent's watchdog ", shoal_binary,
                                            ": ", child.status().message()));
  }
  pid_t pid = child->pid;
  ::fcntl(fds[1], F_SETFL, O_NONBLOCK);
  return std::unique_ptr<AgentWatchdog>(new AgentWatchdog(fds[1], pid));
}

AgentWatchdog::~AgentWatchdog() {
  ::close(fd_);  // EOF: the watchdog exits
  process::SystemLauncher().Wait(pid_);
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
