#pragma once

// The job metrics of `GET /metrics` (docs/ui.md, "Prometheus metrics"): what each job directory
// says about its tasks, restarts, failures and latencies, and its Prometheus text exposition.
// Everything is computed from the files of the job directory (status.json, events.jsonl,
// checkpoints/, tasks/<role>-<index>/resources.jsonl), so the figures survive restarts of every
// process, the UI's included.

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace shoal::ui {

struct TaskMetricFacts {
  std::string task;  // "<role>:<index>"
  std::string role;
  std::string state;  // pending, starting, running, succeeded, failed, killed
  // From the last two samples of resources.jsonl when they belong to one attempt; absent
  // without them.
  bool has_steps_per_second = false;
  double steps_per_second = 0;
};

// Everything the metrics need from one job directory. Times are Unix milliseconds.
struct JobMetricFacts {
  std::string job_dir;
  std::string job_id;
  std::string name;
  // As `shoal status` says it: a job whose master died before the job ended is "lost"; a job
  // without status.json or journal state yet is "unknown".
  std::string state;
  // The end of the job: status.json's finished_unix_ms, else the journal's last record (a
  // lost job); 0 while live.
  int64_t ended_unix_ms = 0;
  std::vector<TaskMetricFacts> tasks;
  // Times a task of the role was started again (a `-> pending` move with attempt >= 1), for
  // whatever reason: restart-task, a group restart, `restart: always`. An elastic slot that
  // waited for its place (slot_deferred) costs none.
  std::map<std::string, int64_t> restarts_by_role;
  // Failures the failure policy handled, by cause class (FailureCauseClass).
  std::map<std::string, int64_t> failures_by_cause;
  // Per failure: from the moment it happened to the master's failure_handled decision.
  std::vector<double> detection_seconds;
  // Per failure whose task (or group) ran again: from the moment it happened until the task,
  // or every task of the re-formed group, was running again.
  std::vector<double> recovery_seconds;
  // Time spent in the queued phase, up to now for a job still queued: the finished stays
  // (queued_closed_ms) plus the open one since queued_since_unix_ms (0 when not queued now).
  int64_t queue_wait_ms = 0;
  int64_t queued_closed_ms = 0;
  int64_t queued_since_unix_ms = 0;
  // The newest checkpoint: the journal's last `checkpoint` report or the newest file under
  // <job_dir>/checkpoints, whichever is later; 0 when none is known.
  int64_t newest_checkpoint_unix_ms = 0;
  // The time of the journal's last record (where a lost job ended).
  int64_t last_record_unix_ms = 0;
  // The journal's last line was partly written (skipped; the rest is used).
  bool journal_truncated = false;
};

bool IsFinishedJobState(const std::string& state);

// The bounded class of a failure_handled cause, for a label: "exit_code" (a non-zero exit),
// "signal", "oom" (killed for its memory limit), "hung" (no progress), "lost" (its agent or
// place went away), "start_error" (could not be started), "other".
std::string FailureCauseClass(const std::string& cause);

// Reads one job directory. NotFound when the directory is gone (also when it vanishes while
// being read); a torn last journal line is skipped. A live job's queued time runs to
// `now_unix_ms`.
absl::StatusOr<JobMetricFacts> ReadJobMetricFacts(const std::string& job_dir, int64_t now_unix_ms);

struct MetricsRenderOptions {
  int64_t now_unix_ms = 0;
  // Per-job series are shown for live jobs and for jobs that ended at most this long ago, so
  // that the number of series stays bounded however many jobs the directory keeps.
  // Default: 10 minutes.
  int64_t recent_ms = 10 * 60 * 1000;
};

// The Prometheus text exposition (format 0.0.4) of `jobs`: every family once with its HELP and
// TYPE lines, even when `jobs` is empty.
std::string RenderJobMetrics(const std::vector<JobMetricFacts>& jobs,
                             const MetricsRenderOptions& options);

// Reads job directories for /metrics every scrape without reading 10,000 journals each time:
// a finished job is read again only when its events.jsonl (size, mtime) or status.json (mtime,
// inode) changed; a live job's journal likewise, while its status, checkpoints and resource
// samples (small) are read every time. Thread-safe.
class JobMetricsCache {
 public:
  // The facts of every directory of `job_dirs` that still exists, in that order. Entries of
  // directories not in `job_dirs` are dropped.
  std::vector<JobMetricFacts> Read(const std::vector<std::string>& job_dirs, int64_t now_unix_ms);

  // How many journals the last Read parsed (the others came from the cache).
  size_t journals_read_last() const;

 private:
  struct FileKey {
    int64_t events_size = -1;
    int64_t events_mtime_ns = -1;
    int64_t status_mtime_ns = -1;
    uint64_t status_inode = 0;
    bool operator==(const FileKey&) const = default;
  };
  struct Entry {
    FileKey key;
    JobMetricFacts journal;  // what events.jsonl alone says
    JobMetricFacts facts;    // with the rest of the directory, as last returned
  };
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  size_t journals_read_last_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shoal::ui
