#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace shoal::master {

// A job's task output as the master keeps it: each task's raw streams in
// `<job dir>/tasks/<role>-<index>/{stdout,stderr}` (created on first output), and `logs.txt`,
// whole lines prefixed "role:index | " in arrival order (what `shoal run` shows and `shoal logs`
// reads). Lines are assembled per task and stream; a line longer than kMaxLine without a
// newline is cut, so a task cannot grow the master's memory without bound.
// Owned by the master's loop; not thread-safe.
class TaskLogs {
 public:
  static constexpr size_t kMaxLine = 64 * 1024;

  static absl::StatusOr<std::unique_ptr<TaskLogs>> Open(const std::string& job_dir);
  ~TaskLogs();
  TaskLogs(const TaskLogs&) = delete;
  TaskLogs& operator=(const TaskLogs&) = delete;

  // Records `data` from one stream of a task (`task` is "role:index", `dir_name`
  // "role-index"); returns the whole lines it completed, prefixed, already in logs.txt.
  std::string Append(const std::string& task, const std::string& dir_name, bool is_stderr,
                     std::string_view data);
  // The task ended: its unfinished lines, prefixed and terminated, written to logs.txt ("" if
  // none).
  std::string FinishTask(const std::string& task);
  // Pushes buffered writes to the files (once per batch of the master's loop). False when
  // logs.txt could not take them (a full disk): what it holds then ends before
  // combined_bytes().
  bool Flush();
  // The size of logs.txt once everything written so far is flushed: whole lines only.
  uint64_t combined_bytes() const { return combined_bytes_; }

 private:
  struct Sink {
    std::FILE* out = nullptr;
    std::FILE* err = nullptr;
    std::string partial[2];
  };
  TaskLogs(std::string job_dir, std::FILE* combined, uint64_t size)
      : job_dir_(std::move(job_dir)), combined_(combined), combined_bytes_(size) {}
  void WriteCombined(const std::string& lines);

  std::string job_dir_;
  std::FILE* combined_;
  uint64_t combined_bytes_;
  std::map<std::string, Sink> sinks_;
};

}  // namespace shoal::master
