#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace shoal::process {

enum class OutputStream { kStdout, kStderr };

// What to run for one task of a job on this node.
struct ProcessSpec {
  // Names the process in callbacks and in Stop(), e.g. "worker:0". Unique among live processes
  // of one supervisor; may be reused once its on_exit has started.
  std::string key;
  // argv[0] without a '/' is looked up in the PATH of `env` (or the agent's PATH if `env` has
  // none, or "/usr/local/bin:/usr/bin:/bin" if neither has one). Must not be empty.
  std::vector<std::string> argv;
  // The COMPLETE environment of the child: nothing is inherited from the agent.
  std::map<std::string, std::string> env;
  // Must exist. Empty: the agent's own working directory.
  std::string working_dir;
  // CPUs the child is pinned to before exec. Empty: no pinning.
  std::vector<uint32_t> cpu_affinity;
  // Hard memory limit of the process and all its descendants, enforced through a memory cgroup
  // where one is writable (advisory otherwise, with a notice). 0: none.
  uint64_t memory_limit_bytes = 0;
  // Output is appended to these files as well as passed to on_output; missing parent
  // directories are created. Empty: not written to a file.
  std::string stdout_path;
  std::string stderr_path;
};

// How a launched process ended.
struct ProcessExit {
  int exit_code = 0;                // meaningful when signal == 0
  int signal = 0;                   // the terminating signal, 0 when it exited normally
  bool stopped_by_request = false;  // Stop/StopAll was called before it exited
  bool oom_killed = false;          // the kernel's OOM killer acted in the task's memory cgroup
};

}  // namespace shoal::process
