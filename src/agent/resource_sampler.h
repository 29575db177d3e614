#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "agent/nvml.h"
#include "common/clock.h"
#include "process/task_cgroup.h"

namespace shoal::agent {

// What to measure of one task: its launched process and what the supervisor knows of it.
struct TaskToSample {
  std::string key;
  pid_t pid = -1;
  std::vector<process::TaskCgroup::Dir> cgroup_dirs;  // empty without cgroups
  std::vector<uint32_t> gpus;                         // NVML indexes of the GPUs it was given
};

struct TaskUsage {
  std::string key;
  int64_t ts_unix_ms = 0;
  double cpu_seconds_total = 0;  // since the task's launch, its whole tree
  uint64_t rss_bytes = 0;
  struct Gpu {
    uint32_t index = 0;
    uint32_t util_percent = 0;
    uint64_t memory_bytes = 0;
  };
  std::vector<Gpu> gpus;  // empty without NVML
};

struct ResourceSamplerOptions {
  // Where procfs is mounted. Tests point it at a directory of fake <pid>/stat files.
  std::string proc_root = "/proc";
  // Stamps each sample (UnixMillis). Must outlive the sampler.
  Clock* clock = SystemClock::Get();
  // Units of /proc/<pid>/stat's times and rss. 0: the machine's (sysconf).
  long clock_ticks_per_second = 0;
  long page_size = 0;
  // Null: no GPU is sampled. Must outlive the sampler.
  Nvml* nvml = nullptr;
};

// Measures the tasks of one agent: the CPU time and memory of each task's whole process tree,
// and the GPUs it was given.
//
//   CPU:    the task's cgroup v2 cpu.stat usage_usec when it has a v2 cgroup (it counts every
//           process that ever ran in it, those that left the process group included); else the
//           sum over its live processes of utime + stime + cutime + cstime from /proc/<pid>/stat
//           (a child reaped by its parent is in the parent's cutime; an orphan is lost).
//   Memory: the task's memory cgroup (v2 memory.current, v1 memory.usage_in_bytes: the figure
//           its memory limit is enforced against, page cache included) when it has one; else
//           the summed RSS of its processes (pages shared between them count once per process).
//   Processes: those in its tracking cgroup when it has one, else its launched process and every
//           descendant by parent pid, from one scan of procfs per Sample call.
//   GPUs:   NVML's utilisation and memory in use of each device the task was given.
//
// Thread-compatible: one sampling thread per agent.
class ResourceSampler {
 public:
  explicit ResourceSampler(ResourceSamplerOptions options);

  // One sample per task, all stamped with the same time. A task whose process is already gone
  // gets a sample of zeros; the caller skips tasks that have exited.
  std::vector<TaskUsage> Sample(const std::vector<TaskToSample>& tasks);

 private:
  struct ProcStat {
    pid_t ppid = 0;
    uint64_t cpu_ticks = 0;  // utime + stime + cutime + cstime
    uint64_t rss_pages = 0;
  };
  // /proc/<pid>/stat; false when the process is gone or the file is not one.
  bool ReadStat(pid_t pid, ProcStat* stat) const;
  // Every process of procfs, read once for all tasks of a Sample call.
  const std::map<pid_t, ProcStat>& AllProcesses();
  std::vector<pid_t> TreeOf(pid_t root);

  ResourceSamplerOptions options_;
  std::map<pid_t, ProcStat> all_;  // this Sample call's scan
  bool scanned_ = false;
};

}  // namespace shoal::agent
