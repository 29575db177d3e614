#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace shoal::agent {

// A hung agent (stopped, deadlocked, starved of CPU) can stop neither its tasks nor itself, and
// some backends cannot reach into a place to do it for it: Slurm cannot end one task of a step.
// So every agent started by a backend runs a watchdog: a separate process that the agent pings
// at each heartbeat. When the pings stop for longer than the master waits before declaring the
// agent silent, the watchdog kills the agent and everything under it, which a resource manager
// then reports as the place's end. When the agent exits, the pipe closes and the watchdog goes.
class AgentWatchdog {
 public:
  // Starts `shoal_binary agent-watchdog` watching this process.
  static absl::StatusOr<std::unique_ptr<AgentWatchdog>> Start(const std::string& shoal_binary,
                                                              std::chrono::milliseconds limit);
  ~AgentWatchdog();

  // Never blocks; safe from any thread.
  void Ping();

  pid_t pid() const { return pid_; }

 private:
  AgentWatchdog(int fd, pid_t pid) : fd_(fd), pid_(pid) {}
  int fd_;
  pid_t pid_;
};

// The watchdog process itself: reads pings from `ping_fd`; EOF ends it quietly (exit 0); no ping
// for `limit` kills `agent` and its descendants (exit 3). Messages on stderr.
int RunAgentWatchdog(pid_t agent, int ping_fd, std::chrono::milliseconds limit);

}  // namespace shoal::agent
