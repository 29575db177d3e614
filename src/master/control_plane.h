#pragma once

// What the master's gRPC face (MasterService) may ask of the job: the master's interface toward
// its transport. MasterService depends on this, never on Master itself; Master implements it.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/clock.h"

namespace shoal::v1 {
class AgentMessage;
class LogChunk;
class MasterMessage;
class JobStatus;
}  // namespace shoal::v1

namespace shoal::master {

class WatchQueue;

// A stream to one agent. Implemented over gRPC by MasterService; thread-safe.
class AgentConnection {
 public:
  virtual ~AgentConnection() = default;
  virtual bool Send(const v1::MasterMessage& message) = 0;
  virtual void Close() = 0;

  // When the agent was last heard from. Written on the transport's thread for every message,
  // read by the master's loop: heartbeats, the bulk of the traffic, never wake the loop.
  void Touch(Clock::TimePoint now) {
    last_seen_ns_.store(now.time_since_epoch().count(), std::memory_order_relaxed);
  }
  Clock::TimePoint last_seen() const {
    return Clock::TimePoint(Clock::Duration(last_seen_ns_.load(std::memory_order_relaxed)));
  }

 private:
  std::atomic<int64_t> last_seen_ns_{0};
};

// Every method is called from the transport's threads and must not block on the job's loop.
class ControlPlane {
 public:
  virtual ~ControlPlane() = default;

  virtual bool Authorized(const std::string& authorization_header) const = 0;
  // A new agent stream; returns its session id.
  virtual uint64_t AgentConnected(std::shared_ptr<AgentConnection> connection) = 0;
  virtual void AgentMessageReceived(AgentConnection* connection, uint64_t session,
                                    const v1::AgentMessage& message) = 0;
  virtual void AgentDisconnected(uint64_t session) = 0;
  virtual void FillStatus(v1::JobStatus* status) = 0;  // a snapshot
  // A new watcher's queue; `on_ready` runs whenever events were pushed, output was committed or
  // it was closed. With `logs`, output is sent from byte `log_offset` of logs.txt on.
  virtual std::shared_ptr<WatchQueue> AddWatcher(bool logs, uint64_t log_offset,
                                                 std::function<void()> on_ready) = 0;
  // Stops the job; the outcome is `killed` unless it was already decided.
  virtual void Kill(const std::string& reason) = 0;
};

}  // namespace shoal::master
