#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "master/bounded_line_file.h"

namespace shoal::master {

// One resource sample of a task as the agent measured it (v1::TaskResources).
struct ResourceSample {
  uint32_t attempt = 0;
  int64_t ts_unix_ms = 0;
  int64_t start_unix_ms = 0;  // the attempt's launch, on the agent's clock
  double cpu_seconds_total = 0;
  uint64_t rss_bytes = 0;
  struct Gpu {
    uint32_t index = 0;
    uint32_t util_percent = 0;
    uint64_t memory_bytes = 0;
  };
  std::vector<Gpu> gpus;
};

// CPU use between two readings of a cumulative CPU time, in percent of one core (200: two cores
// busy). 0 when no time passed or the counter went back (a new process tree).
double CpuPercent(double cpu_seconds_before, int64_t ms_before, double cpu_seconds_now,
                  int64_t ms_now);

// One line of resources.jsonl (no newline), in the form docs/design/0014-web-ui.md gives:
// {"ts_ms": ..., "cpu_percent": ..., "rss_bytes": ..., "step": ..., "attempt": ..., "gpus": [...]}
std::string ResourceLine(const ResourceSample& sample, double cpu_percent, uint64_t step);

// The tasks' resource samples as the master keeps them: one JSON line per sample in
// `<job dir>/tasks/<role>-<index>/resources.jsonl`, each file bounded by `budget` bytes
// (BoundedLineFile). Add runs on the master's loop and only formats the line and queues it; a
// thread of its own writes the files, so that a file's occasional rewrite (read, write, fsync,
// rename) never holds up the loop.
class ResourceLogs {
 public:
  static constexpr uint64_t kDefaultBudget = 1 << 20;
  // Lines waiting for the writer past which new samples are dropped (~10 MB).
  static constexpr size_t kMaxQueuedLines = 64 * 1024;

  explicit ResourceLogs(std::string job_dir, uint64_t budget = kDefaultBudget);
  // Writes what is queued, then stops the writer.
  ~ResourceLogs();
  ResourceLogs(const ResourceLogs&) = delete;
  ResourceLogs& operator=(const ResourceLogs&) = delete;

  // A sample of the task whose directory is `dir_name` ("role-index"); `step` is the last SDK
  // step the master knows for it. Its cpu_percent is over the time since the previous sample of
  // the same attempt, or since the attempt's launch for the first one. A sample older than the
  // previous one of its attempt is dropped. Not thread-safe: the master's loop only.
  void Add(const std::string& dir_name, const ResourceSample& sample, uint64_t step);
  // Blocks until every line added so far is in its file (or failed to get there). Thread-safe.
  void Flush();

 private:
  void WriteLoop();

  const std::string job_dir_;
  const uint64_t budget_;

  // The master's loop only.
  struct Previous {
    uint32_t attempt = 0;
    int64_t ts_unix_ms = 0;
    double cpu_seconds_total = 0;
  };
  std::map<std::string, Previous> previous_;

  absl::Mutex mu_;
  absl::CondVar cv_;  // the queue filled, the writer wrote, or stopping_
  std::vector<std::pair<std::string, std::string>> queue_ ABSL_GUARDED_BY(mu_);  // (dir, line)
  uint64_t queued_ ABSL_GUARDED_BY(mu_) = 0;   // lines ever queued
  uint64_t written_ ABSL_GUARDED_BY(mu_) = 0;  // lines the writer is done with
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  // The writer thread only.
  std::map<std::string, std::unique_ptr<BoundedLineFile>> files_;
  std::map<std::string, bool> failed_;  // files whose error was logged once

  std::thread writer_;  // last: started once everything above exists
};

}  // namespace shoal::master
