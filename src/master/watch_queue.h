#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace shoal::master {

// Serialized WatchEvents waiting for one watching client. The master pushes from its loop; the
// client's gRPC handler thread pops and writes. A slow client never blocks the master: past
// kMaxQueued events, log events are dropped (status events are small and always kept).
class WatchQueue {
 public:
  static constexpr size_t kMaxQueued = 100000;
  explicit WatchQueue(bool logs) : wants_logs_(logs) {}

  bool wants_logs() const { return wants_logs_; }
  void Push(std::string event, bool is_log);
  // Marks the end: the last event was pushed.
  void Close();
  // Moves out what is queued, waiting up to `timeout` for something. False once closed and
  // drained.
  bool Pop(std::vector<std::string>* out, std::chrono::milliseconds timeout);

 private:
  const bool wants_logs_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> events_;
  bool closed_ = false;
};

}  // namespace shoal::master
