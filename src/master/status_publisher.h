#pragma once

// What everyone following a job sees: the status snapshot (GetStatus), status.json, the
// watchers' streams of status, notices and output, and the tasks' output routed to their log
// files. Runs on the master's loop, except where a method says it is thread-safe.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/event_loop.h"
#include "master/journaled_state.h"
#include "master/task_logs.h"
#include "master/watch_queue.h"

namespace shoal::v1 {
class JobStatus;
}  // namespace shoal::v1

namespace shoal::master {

// What the status shows beside the journaled state.
struct StatusFacts {
  std::string name;
  int64_t created_unix_ms = 0;
  int64_t finished_unix_ms = 0;
  uint32_t world_size = 0;
};

// The job's status as clients read it. Pure.
v1::JobStatus BuildJobStatus(const JournaledState& job, const StatusFacts& facts);

class StatusPublisher {
 public:
  // Opens the job's log files (logs.txt and the tasks' own). `loop` and `clock` outlive it.
  static absl::StatusOr<std::unique_ptr<StatusPublisher>> Open(const std::string& job_dir,
                                                               EventLoop* loop, Clock* clock);

  TaskLogs& logs() { return *logs_; }
  // A state change: the next Publish sends the status and rewrites status.json.
  void StateChanged() { status_dirty_ = true; }
  // Only SDK steps changed: published at a slower pace of their own, status.json untouched.
  void ProgressChanged() { progress_dirty_ = true; }
  // After each batch of the loop, once the journal is durable: commits the output flushed to
  // logs.txt to watchers, and publishes the status when due. `job_over`: the job reached its
  // outcome (published at once). `build` makes the status.
  void AfterBatch(bool job_over, const std::function<v1::JobStatus()>& build);

  // Shown to every watcher, and to those that attach later.
  void EmitNotice(const std::string& notice);
  // A watcher's queue, not yet attached: Attach (on the loop) sends it the current status and
  // the notices so far. Thread-safe.
  std::shared_ptr<WatchQueue> NewWatcher(bool logs, uint64_t log_offset,
                                         std::function<void()> on_ready);
  void Attach(const std::shared_ptr<WatchQueue>& queue, bool job_over);
  // Closes every watcher's stream: nothing more will come.
  void CloseWatchers();
  // Gives watchers up to `limit` to take what is left. True when every one did. Thread-safe.
  bool WaitForWatchers(std::chrono::milliseconds limit);
  // The latest status. Thread-safe.
  void FillStatus(v1::JobStatus* status);

 private:
  StatusPublisher(std::string job_dir, EventLoop* loop, Clock* clock)
      : job_dir_(std::move(job_dir)), loop_(loop), clock_(clock) {}
  // write_file: also refresh status.json (state changes do; progress-only refreshes do not).
  void Publish(const v1::JobStatus& status, bool write_file, bool job_over);
  void WriteStatusFile();

  std::string job_dir_;
  EventLoop* loop_;
  Clock* clock_;
  std::unique_ptr<TaskLogs> logs_;

  // Owned by the loop.
  bool status_dirty_ = true;
  bool progress_dirty_ = false;
  // status.json is rewritten (with an fsync) at most every kStatusFileInterval while running,
  // so a burst of task changes in a large job costs one write, not thousands.
  static constexpr std::chrono::milliseconds kStatusFileInterval{250};
  Clock::TimePoint last_status_write_{};
  bool status_write_pending_ = false;
  static constexpr std::chrono::milliseconds kStatusPublishInterval{50};
  static constexpr std::chrono::milliseconds kProgressPublishInterval{1000};
  Clock::TimePoint last_publish_{};
  bool publish_pending_ = false;

  // Shared with the transport's threads.
  std::mutex mu_;
  std::string status_snapshot_;  // serialized v1::JobStatus, refreshed after each batch
  std::vector<std::weak_ptr<WatchQueue>> watchers_;
  // The notices watchers were sent, for those that attach later.
  WatchBacklog watch_backlog_;
  // logs.txt as watchers read it; committed after each batch's flush.
  std::shared_ptr<LogFeed> log_feed_;
};

}  // namespace shoal::master
