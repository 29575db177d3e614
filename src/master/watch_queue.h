#pragma once

#include <deque>
#include <functional>
#include <mutex>
#include <string>

namespace shoal::master {

// Serialized WatchEvents waiting for one watching client. The master pushes from its loop; the
// client's gRPC write reactor takes them one at a time as its writes complete. A slow client
// never blocks the master: past kMaxQueued events, log events are dropped (status events are
// small and always kept).
class WatchQueue {
 public:
  static constexpr size_t kMaxQueued = 100000;
  // `on_ready` runs (on the pusher's thread, outside the queue's lock) after every Push and
  // after Close: the reader then takes what it can with TryPop.
  WatchQueue(bool logs, std::function<void()> on_ready)
      : wants_logs_(logs), on_ready_(std::move(on_ready)) {}

  bool wants_logs() const { return wants_logs_; }
  void Push(std::string event, bool is_log);
  // Marks the end: the last event was pushed.
  void Close();

  enum class Next { kEvent, kEmpty, kEnded };
  // Moves the oldest event into `out` (kEvent); kEmpty when none is queued yet, kEnded once
  // closed and drained. `more` says whether another event is queued behind the one taken.
  Next TryPop(std::string* out, bool* more);

 private:
  const bool wants_logs_;
  const std::function<void()> on_ready_;
  std::mutex mu_;
  std::deque<std::string> events_;
  bool closed_ = false;
};

}  // namespace shoal::master
