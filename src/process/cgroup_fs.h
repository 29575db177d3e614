#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Small file operations on cgroup filesystems, with errors that name the file. Shared by
// ResourceLimits (detection) and TaskCgroup (one task's directories).
namespace shoal::process::cgroup_fs {

// Whether `dir` is the root or a directory of a mounted cgroup filesystem of that version.
bool IsCgroupV2(const std::string& dir);
bool IsCgroupV1(const std::string& dir);

bool Exists(const std::string& path);

// Reads a whole (small) pseudo-file.
absl::StatusOr<std::string> Read(const std::string& path);

// Writes `value` with a single write(2), as cgroup files require.
absl::Status Write(const std::string& path, const std::string& value);

// mkdir; an existing directory is fine.
absl::Status MakeDir(const std::string& path);

// rmdir; a missing directory is fine. EBUSY while processes remain.
absl::Status RemoveDir(const std::string& path);

// rmdir of `path` and every cgroup below it, deepest first (a cgroup can only go once its
// children have). Fails (EBUSY) while processes remain anywhere in the subtree.
absl::Status RemoveTree(const std::string& path);

// `dir` and every cgroup directory below it.
std::vector<std::string> Subtree(const std::string& dir);

// The pids in `dir`/cgroup.procs; empty when unreadable.
std::vector<pid_t> Procs(const std::string& dir);

// The value of `key` in a "key value" per-line file (memory.events, memory.oom_control).
absl::StatusOr<int64_t> ReadKeyedValue(const std::string& path, const std::string& key);

}  // namespace shoal::process::cgroup_fs
