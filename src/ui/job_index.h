#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace simdjson::dom {
class parser;
}  // namespace simdjson::dom

namespace shoal::ui {

// One row of the jobs page: what status.json and submit.json say, with a dead master's job
// read as `lost` (as `shoal list` does).
struct JobSummary {
  std::string job_id;
  std::string name;
  std::string state;
  std::string backend;
  std::string reason;
  int tasks = 0;
  int restarts = 0;  // task restarts plus group restarts
  int64_t created_unix_ms = 0;
  int64_t finished_unix_ms = 0;  // 0 while the job runs
  std::string dir;
};

struct JobQuery {
  std::vector<std::string> states;  // empty: every state
  std::string text;                 // case-insensitive substring of id, name or reason
  std::string sort = "-created";    // created|name|state|duration|restarts, '-': descending
  int page = 1;                     // 1-based
  int per_page = 50;
};

struct JobPage {
  int total = 0;                    // after both filters
  std::map<std::string, int> states;  // after the text filter only
  std::vector<JobSummary> jobs;
};

// Validates a query's fields; InvalidArgument names the field and what it accepts.
absl::Status ValidateJobQuery(const JobQuery& query);

// Every job directory under a jobs root, kept current by Refresh(): a directory whose
// status.json is unchanged (mtime and size) is not read again, so that a refresh of 10,000
// finished jobs costs a directory listing and one stat each. Thread-safe.
class JobIndex {
 public:
  // `now_unix_ms`: the clock, for the duration of live jobs. `master_alive`: whether a job
  // directory's master runs (tests inject it; the default reads master.json and the pid).
  JobIndex(std::string jobs_root, std::function<int64_t()> now_unix_ms,
           std::function<bool(const std::string& job_dir)> master_alive = {});

  // Rescans the root. Directories that vanished drop out; ones being created (no spec.yaml
  // yet) wait for the next refresh.
  void Refresh();

  // Refresh()es at most once per `max_age_ms`, then answers.
  JobPage Query(const JobQuery& query, int64_t max_age_ms = 1000);

  const std::string& root() const { return root_; }

 private:
  struct Entry {
    JobSummary summary;
    struct timespec status_mtime {};
    off_t status_size = -1;
    bool backend_loaded = false;
  };
  // Reads the directory's status into `entry`; false when it is not (or no longer) a job.
  bool Load(const std::string& dir, Entry& entry, simdjson::dom::parser& parser);
  void LoadBackend(Entry& entry);

  const std::string root_;
  std::function<int64_t()> now_unix_ms_;
  std::function<bool(const std::string&)> master_alive_;
  absl::Mutex mu_;
  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);  // by directory name
  int64_t refreshed_at_ms_ ABSL_GUARDED_BY(mu_) = -1;
};

}  // namespace shoal::ui
