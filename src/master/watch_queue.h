#pragma once

#include <cstddef>
#include <cstdint>
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

// Every notice and the most recent task output sent to watchers so far, replayed to a watcher
// that attaches later. `shoal run` connects moments after its master starts, and on a busy
// machine the job's first lines (or TensorBoard's address) can come before it: what a user sees
// must not depend on who got there first. Output past `max_output_bytes` drops its oldest
// chunks (the job's log files keep every line); notices are few (deduplicated) and all kept.
// Not thread-safe: the master adds and replays under its own lock.
class WatchBacklog {
 public:
  explicit WatchBacklog(size_t max_output_bytes) : max_output_bytes_(max_output_bytes) {}

  void Add(const std::string& event, bool is_log);
  // Pushes the backlog to `queue`, oldest first; output only if it wants logs, after
  // `omitted_notice` (a serialized notice event) when older output was dropped.
  void ReplayTo(WatchQueue& queue, const std::string& omitted_notice) const;
  uint64_t omitted_output_bytes() const { return omitted_output_bytes_; }

 private:
  struct Entry {
    std::string event;
    bool is_log;
  };
  const size_t max_output_bytes_;
  std::deque<Entry> entries_;
  size_t output_bytes_ = 0;
  uint64_t omitted_output_bytes_ = 0;
};

}  // namespace shoal::master
