#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/progress_slot.h"
#include "common/unique_fd.h"

namespace shoal::agent {

struct SdkServerCallbacks {
  // All run on the server's own thread. A request the agent cannot answer itself (lease, done,
  // resumed; checkpointed and published, whose task wants no reply), to relay to the master.
  // Every one has a request id of its own, increasing; the master's reply to a report is only
  // its acknowledgement, which Reply drops. A published report reaches it only once
  // ParseModelPublication took it.
  std::function<void(uint64_t request_id, const std::string& task, uint32_t attempt,
                     const std::string& json_line)>
      on_request;
  // A task with a progress timeout reported no step for that long. Once per attempt.
  std::function<void(const std::string& task, uint32_t attempt, uint64_t last_step,
                     std::chrono::milliseconds silent)>
      on_stalled;
};

struct TaskStep {
  std::string task;
  uint32_t attempt = 0;
  uint64_t step = 0;
};

// The agent's end of the SDK protocol (docs/sdk-protocol.md): a Unix stream socket that the
// tasks on this node talk to. It answers progress reports itself (they feed the heartbeat and
// the hang watchdog, which runs here so a hang is seen at its deadline, not at the next poll)
// and relays everything else to the master.
//
// Thread-safe: TaskLaunched, TaskEnded, Reply and TakeProgress may be called from any thread.
class SdkServer {
 public:
  // `address`: "@name" for Linux's abstract namespace, else a filesystem path.
  static absl::StatusOr<std::unique_ptr<SdkServer>> Create(std::string address,
                                                           SdkServerCallbacks callbacks);
  ~SdkServer();

  const std::string& address() const { return address_; }

  // The task's current attempt; requests of any other attempt are refused. progress_timeout 0:
  // no watchdog. With a `progress_file` path, a progress board is made there for the task
  // (ProgressSlot); the path is returned for the task's SHOAL_PROGRESS_FILE, or "" when it
  // could not be made (`error` says why; the task then reports over the socket).
  std::string TaskLaunched(const std::string& task, uint32_t attempt,
                           std::chrono::milliseconds progress_timeout,
                           const std::string& progress_file = "", std::string* error = nullptr);
  void TaskEnded(const std::string& task, uint32_t attempt);
  // The master's answer to a relayed request; dropped when its connection has closed.
  void Reply(uint64_t request_id, const std::string& json_line);
  // Tasks whose step changed since the last call.
  std::vector<TaskStep> TakeProgress();

 private:
  struct Connection {
    UniqueFd fd;
    uint64_t serial = 0;  // tells a reused fd number from the connection a reply was meant for
    std::string in;
    std::string out;
  };
  struct TaskEntry {
    uint32_t attempt = 0;
    std::chrono::milliseconds timeout{0};
    bool armed = false;
    bool stalled_reported = false;
    bool step_changed = false;
    uint64_t step = 0;
    std::chrono::steady_clock::time_point last_progress{};
    std::unique_ptr<ProgressSlot> slot;
    int64_t slot_seen_ns = 0;  // the report time of the last report taken from the slot
  };

  SdkServer(std::string address, SdkServerCallbacks callbacks);
  void Loop();
  void Accept();
  void ReadFrom(int fd);
  void HandleLine(int fd, const std::string& line);
  void QueueReply(int fd, const std::string& json_line);
  void FlushTo(Connection& c);
  void CloseConnection(int fd);
  void CheckWatchdogs();
  // Under mu_: takes a newer report from the task's progress board, as a socket report would.
  static void RefreshFromSlot(TaskEntry& e);
  int NextWatchdogTimeoutMs();
  void Wake();

  std::string address_;
  SdkServerCallbacks callbacks_;
  UniqueFd listen_fd_;
  UniqueFd epoll_fd_;
  UniqueFd wake_fd_;  // eventfd: stop, or replies queued from other threads
  std::thread thread_;
  bool stop_ = false;  // guarded by mu_

  std::mutex mu_;
  std::map<std::string, TaskEntry> tasks_;
  std::vector<std::pair<uint64_t, std::string>> pending_replies_;
  // Owned by the loop thread.
  std::map<int, Connection> connections_;
  // relayed request -> (fd, serial) of the connection awaiting its reply
  std::map<uint64_t, std::pair<int, uint64_t>> request_fd_;
  uint64_t next_request_ = 1;
  uint64_t next_serial_ = 1;
};

}  // namespace shoal::agent
