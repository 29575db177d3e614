#include "process/task_cgroup.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "process/cgroup_fs.h"
#include "common/unique_fd.h"

namespace shoal::process {

TaskCgroup::~TaskCgroup() {
  if (!removed_) {
    KillAndRemove(std::chrono::steady_clock::now() + std::chrono::seconds(2)).IgnoreError();
  }
}

absl::Status TaskCgroup::AddProcess(pid_t pid) {
  for (const Dir& dir : dirs_) {
    absl::Status status = cgroup_fs::Write(absl::StrCat(dir.path, "/cgroup.procs"),
                                           absl::StrCat(pid));
    if (!status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat("joining cgroup ", dir.path, ": ", status.message()));
    }
  }
  return absl::OkStatus();
}

void TaskCgroup::KillAll() {
  for (const Dir& dir : dirs_) {
    if (!dir.tracking) continue;
    if (dir.v2 && cgroup_fs::Write(absl::StrCat(dir.path, "/cgroup.kill"), "1").ok()) continue;
    // Without cgroup.kill: a few passes over the whole subtree, since a member may fork between
    // reading and killing.
    for (int pass = 0; pass < 4; ++pass) {
      std::vector<pid_t> seen;
      for (const std::string& sub : cgroup_fs::Subtree(dir.path)) {
        for (pid_t pid : cgroup_fs::Procs(sub)) seen.push_back(pid);
      }
      if (seen.empty()) break;
      std::vector<std::pair<pid_t, UniqueFd>> opened;
      for (pid_t pid : seen) {
        int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
        if (fd >= 0) opened.emplace_back(pid, UniqueFd(fd));
      }
      // A pid still listed now is the process our pidfd refers to: the number cannot have been
      // recycled into this cgroup by anyone but a member.
      std::vector<pid_t> confirmed;
      for (const std::string& sub : cgroup_fs::Subtree(dir.path)) {
        for (pid_t pid : cgroup_fs::Procs(sub)) confirmed.push_back(pid);
      }
      for (auto& [pid, fd] : opened) {
        if (std::find(confirmed.begin(), confirmed.end(), pid) != confirmed.end()) {
          ::syscall(SYS_pidfd_send_signal, fd.get(), SIGKILL, nullptr, 0);
        }
      }
    }
  }
}

bool TaskCgroup::OomKilled() const {
  for (const Dir& dir : dirs_) {
    if (!dir.memory) continue;
    if (dir.v2) {
      auto kills = cgroup_fs::ReadKeyedValue(absl::StrCat(dir.path, "/memory.events"), "oom_kill");
      if (kills.ok() && *kills > 0) return true;
      continue;
    }
    auto kills = cgroup_fs::ReadKeyedValue(absl::StrCat(dir.path, "/memory.oom_control"),
                                           "oom_kill");
    if (kills.ok()) {
      if (*kills > 0) return true;
      continue;
    }
    // Kernels before 4.13 have no oom_kill counter: hitting the limit is the best evidence left.
    auto text = cgroup_fs::Read(absl::StrCat(dir.path, "/memory.failcnt"));
    int64_t failcnt = 0;
    if (text.ok() && absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &failcnt) && failcnt > 0) {
      return true;
    }
  }
  return false;
}

std::vector<pid_t> TaskCgroup::Procs() const {
  std::vector<pid_t> pids;
  for (const Dir& dir : dirs_) {
    if (!dir.tracking) continue;
    for (const std::string& sub : cgroup_fs::Subtree(dir.path)) {
      for (pid_t pid : cgroup_fs::Procs(sub)) {
        if (std::find(pids.begin(), pids.end(), pid) == pids.end()) pids.push_back(pid);
      }
    }
  }
  return pids;
}

bool TaskCgroup::TryRemove() {
  if (removed_) return true;
  bool all = true;
  // RemoveTree: a task may have made cgroups of its own below its directory (the agent's
  // directory, made by the local backend, holds the agent's task cgroups).
  for (const Dir& dir : dirs_) {
    if (!cgroup_fs::RemoveTree(dir.path).ok()) all = false;
  }
  removed_ = all;
  return all;
}

absl::Status TaskCgroup::KillAndRemove(std::chrono::steady_clock::time_point deadline) {
  auto backoff = std::chrono::microseconds(200);
  while (true) {
    KillAll();
    if (TryRemove()) return absl::OkStatus();
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) break;
    // Wait for the members to die, on their pidfds. A directory can stay busy for a moment
    // after its last member left (or hold one in uninterruptible sleep); then back off briefly.
    std::vector<UniqueFd> fds;
    std::vector<pollfd> pfds;
    for (pid_t pid : Procs()) {
      int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
      if (fd < 0) continue;
      pfds.push_back({fd, POLLIN, 0});
      fds.emplace_back(fd);
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    if (!pfds.empty()) {
      ::poll(pfds.data(), pfds.size(), static_cast<int>(std::max<int64_t>(1, left.count())));
    } else {
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(backoff,
                                                                               deadline - now));
      backoff = std::min(backoff * 2, std::chrono::microseconds(50'000));
    }
  }
  std::vector<std::string> paths;
  for (const Dir& dir : dirs_) paths.push_back(dir.path);
  return absl::DeadlineExceededError(absl::StrCat(
      "cgroup(s) ", absl::StrJoin(paths, ", "), " still busy; processes left: ",
      absl::StrJoin(Procs(), ",")));
}

bool TaskCgroup::tracks_processes() const {
  return std::any_of(dirs_.begin(), dirs_.end(), [](const Dir& d) { return d.tracking; });
}

}  // namespace shoal::process
