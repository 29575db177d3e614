#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace shoal::master {

// The job's logs.txt as watchers read it. The master appends whole lines and, after each flush,
// commits the new size; every watcher reads from an offset of its own. The file on disk is the
// only buffer between a task's output and a slow client, so the master's memory does not grow
// with output nobody has read, and a client that falls behind still gets every line.
// Thread-safe.
class LogFeed {
 public:
  // The largest read handed to one watcher at a time: bounds the master's memory per watcher.
  // Larger than a line can be (TaskLogs::kMaxLine plus a prefix), so a read always ends on a
  // line boundary.
  static constexpr size_t kMaxRead = 256 * 1024;

  // Opens `path` for reading; what it holds already is committed.
  static absl::StatusOr<std::shared_ptr<LogFeed>> Open(const std::string& path);

  uint64_t committed() const { return committed_.load(std::memory_order_acquire); }
  // `size` bytes (whole lines) are on disk.
  void Commit(uint64_t size) { committed_.store(size, std::memory_order_release); }
  // Whole lines from [offset, limit), at most kMaxRead bytes of them.
  absl::StatusOr<std::string> Read(uint64_t offset, uint64_t limit) const;

 private:
  LogFeed(UniqueFd fd, uint64_t size) : fd_(std::move(fd)), committed_(size) {}
  UniqueFd fd_;
  std::atomic<uint64_t> committed_;
};

// What one watching client is sent next: status and notices, queued by the master's loop, and
// (when it asked for them) the job's output, read from the LogFeed at the client's own pace.
// The client's gRPC write reactor takes one item at a time as its writes complete, so a slow
// client holds at most one read of output here and never blocks the master.
//
// Each queued event carries the size logs.txt had when it was pushed (its mark): it is sent
// only after the output before it, so notices and the final status keep their place among
// the lines.
class WatchQueue {
 public:
  // Notices past this many are dropped; statuses never pile up (a newer one replaces an unsent
  // one at the back).
  static constexpr size_t kMaxQueued = 10000;

  // `logs` null: status and notices only. `on_ready` runs (on the pusher's thread, outside the
  // queue's lock) after every Push, NewOutput and Close: the reader then takes what it can.
  WatchQueue(std::shared_ptr<const LogFeed> logs, uint64_t log_offset,
             std::function<void()> on_ready)
      : logs_(std::move(logs)), log_offset_(log_offset), on_ready_(std::move(on_ready)) {}

  bool wants_logs() const { return logs_ != nullptr; }
  void Push(std::string event, uint64_t log_mark, bool is_status);
  // More output was committed to the LogFeed.
  void NewOutput();
  // Marks the end: the last event was pushed and the last output committed.
  void Close();

  enum class Next {
    kEvent,   // `out` holds a serialized event
    kOutput,  // `out` holds whole output lines read from the feed at `*offset`
    kOutputFailed,  // the feed cannot be read past `*offset` (why in `out`): no more output
    kEmpty,   // nothing to send yet
    kEnded,   // closed and everything sent
  };
  // `more` says whether something else is ready behind what was taken.
  Next TryPop(std::string* out, uint64_t* offset, bool* more);
  // Closed, and every event and every committed byte of output was handed out.
  bool Drained();

 private:
  struct Entry {
    std::string event;
    uint64_t log_mark;
    bool is_status;
  };
  // Under mu_.
  bool HasMoreLocked(uint64_t committed) const;

  const std::shared_ptr<const LogFeed> logs_;
  std::mutex mu_;
  uint64_t log_offset_;  // the next byte of logs.txt to send
  const std::function<void()> on_ready_;
  std::deque<Entry> events_;
  bool closed_ = false;
  bool output_failed_ = false;  // the feed could not be read: output stops, events go on
};

// Every notice sent to watchers so far, with its mark, replayed to a watcher that attaches
// later: `shoal run` connects moments after its master starts, and on a busy machine the
// TensorBoard address can come before it. Output needs no backlog: a watcher reads logs.txt
// from the offset it asks for. Not thread-safe: the master adds and replays under its own lock.
class WatchBacklog {
 public:
  void Add(std::string event, uint64_t log_mark) {
    notices_.emplace_back(std::move(event), log_mark);
  }
  void ReplayTo(WatchQueue& queue) const;

 private:
  std::vector<std::pair<std::string, uint64_t>> notices_;
};

}  // namespace shoal::master
