#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace shoal::process {

// The cgroup directories of one task, one per hierarchy it is placed in (for instance a v1
// memory directory for its limit and a v2 directory to track and kill its processes). Created
// by ResourceLimits::CreateTask; owns the directories and removes them.
//
// Thread-compatible: the supervisor serialises calls on one object.
class TaskCgroup {
 public:
  struct Dir {
    std::string path;
    bool v2 = false;
    bool memory = false;    // carries the memory limit and the OOM counters
    bool tracking = false;  // enumerated and killed to catch processes that left the group
  };

  // REQUIRES: every dir exists.
  explicit TaskCgroup(std::vector<Dir> dirs) : dirs_(std::move(dirs)) {}
  TaskCgroup(const TaskCgroup&) = delete;
  TaskCgroup& operator=(const TaskCgroup&) = delete;
  // Best effort: KillAndRemove with a short deadline. Callers that care call it themselves.
  ~TaskCgroup();

  // Moves `pid` into every directory (writes cgroup.procs).
  absl::Status AddProcess(pid_t pid);

  // SIGKILLs every process in the tracking directories: through cgroup.kill on v2, else by
  // enumerating cgroup.procs (each pid is opened as a pidfd and confirmed to still be a member
  // before it is signalled, so a recycled pid is never hit). Non-blocking.
  void KillAll();

  // Whether the kernel's OOM killer acted in a memory directory (v2 memory.events oom_kill,
  // v1 memory.oom_control oom_kill, or memory.failcnt on kernels without that counter).
  bool OomKilled() const;

  // Processes still in the tracking directories.
  std::vector<pid_t> Procs() const;

  // Tries to rmdir every directory; true when all are gone. Fails (false) while processes remain.
  bool TryRemove();

  // KillAll and wait (on pidfds, no polling interval) until the directories can be removed, or
  // until `deadline`. DeadlineExceeded names what is left.
  absl::Status KillAndRemove(std::chrono::steady_clock::time_point deadline);

  bool tracks_processes() const;
  const std::vector<Dir>& dirs() const { return dirs_; }

 private:
  std::vector<Dir> dirs_;
  bool removed_ = false;
};

}  // namespace shoal::process
