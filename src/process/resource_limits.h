#pragma once

#include <cstdint>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "process/task_cgroup.h"

namespace shoal::process {

// What this machine offers to limit and track the processes of a task, detected once per
// supervisor, and the factory of per-task cgroups.
//
// Memory limits: cgroup v2 with the memory controller (at <root> when it is a cgroup2 mount, or
// <root>/unified on hybrid systems), else the cgroup v1 memory controller; else advisory.
// Tracking (finding every process of a task, including ones that left the process group with
// setsid): cgroup v2 (even with no controller: cgroup.procs and cgroup.kill need none), else
// v1 pids, v1 freezer, or the v1 memory hierarchy; else none.
//
// Directories are <hierarchy>/<the agent's own cgroup there>/<cgroup_name>/<instance_id>/<task>
// (falling back to <hierarchy>/<cgroup_name>/... when the agent's own cgroup is not writable),
// so that a task stays inside whatever limits the agent itself runs under. The instance
// directories are created by Detect and removed by the destructor.
//
// Thread-compatible; immutable after Detect except for CreateTask, which is thread-safe.
class ResourceLimits {
 public:
  struct Options {
    std::string cgroup_name = "shoal";
    // REQUIRES: non-empty, unique among agents sharing the machine, a valid directory name.
    std::string instance_id;
    // Where cgroup hierarchies are mounted, and where the agent reads its own membership.
    std::string cgroup_root = "/sys/fs/cgroup";
    std::string self_cgroup_file = "/proc/self/cgroup";
    // false: ignore cgroup v2 entirely (to exercise the v1 paths).
    bool allow_v2 = true;
  };

  // Never fails: what is not available is explained by notices() and Describe().
  static std::unique_ptr<ResourceLimits> Detect(const Options& options);

  ResourceLimits(const ResourceLimits&) = delete;
  ResourceLimits& operator=(const ResourceLimits&) = delete;
  // Removes the instance directories. REQUIRES: every TaskCgroup it created is gone.
  ~ResourceLimits();

  bool enforces_memory() const { return memory_.has_value(); }
  bool tracks_processes() const { return tracking_.has_value(); }

  // One line, e.g. "memory limits: cgroup v1 memory at ...; process tracking: cgroup v2 at ...".
  std::string Describe() const;

  // Removes the directories of other instances (siblings under <cgroup_name>) created more
  // than `min_age` ago, with everything below them; ones with processes inside stay (rmdir
  // fails while any remain). Cleans up after owners that were killed before they could.
  void RemoveStaleInstances(std::chrono::seconds min_age) const;

  // One-line facts worth telling an operator once, e.g. that memory limits are advisory.
  const std::vector<std::string>& notices() const { return notices_; }

  // Creates the directories of one task and writes its memory limit (0: none). `task` must be a
  // valid directory name unique among the live tasks of this instance. Returns nullptr when
  // there is nothing to create (no cgroup available at all).
  absl::StatusOr<std::unique_ptr<TaskCgroup>> CreateTask(const std::string& task,
                                                         uint64_t memory_limit_bytes) const;

 private:
  struct Hierarchy {
    std::string label;         // e.g. "cgroup v1 memory"
    std::string instance_dir;  // <parent>/<cgroup_name>/<instance_id>
    std::string name_dir;      // <parent>/<cgroup_name>, removed when empty
    bool v2 = false;
  };

  ResourceLimits() = default;
  // Creates <parent>/<cgroup_name>/<instance_id>; on v2 with `controller`, enables it on the way.
  static absl::StatusOr<Hierarchy> SetUp(const Options& options, const std::string& label,
                                         const std::string& parent, bool v2,
                                         const std::string& controller);

  std::optional<Hierarchy> memory_;
  std::optional<Hierarchy> tracking_;
  bool tracking_is_memory_ = false;  // one directory per task serves both roles
  std::vector<std::string> notices_;
  std::string memory_reasons_;  // why memory is advisory, for Describe()
};

}  // namespace shoal::process
