#include "master/task_logs.h"

#include <sys/stat.h>

#include <cerrno>

#include "common/files.h"

namespace shoal::master {

absl::StatusOr<std::unique_ptr<TaskLogs>> TaskLogs::Open(const std::string& job_dir) {
  std::string path = job_dir + "/logs.txt";
  std::FILE* combined = std::fopen(path.c_str(), "a");
  if (combined == nullptr) return ErrnoStatus("open " + path, errno);
  // A recovering master appends to its predecessor's file: offsets into it stay valid.
  struct stat st {};
  if (::fstat(::fileno(combined), &st) != 0) {
    int err = errno;
    std::fclose(combined);
    return ErrnoStatus("stat " + path, err);
  }
  return std::unique_ptr<TaskLogs>(
      new TaskLogs(job_dir, combined, static_cast<uint64_t>(st.st_size)));
}

TaskLogs::~TaskLogs() {
  for (auto& [task, sink] : sinks_) {
    if (sink.out) std::fclose(sink.out);
    if (sink.err) std::fclose(sink.err);
  }
  std::fclose(combined_);
}

std::string TaskLogs::Append(const std::string& task, const std::string& dir_name, bool is_stderr,
                             std::string_view data) {
  auto [it, created] = sinks_.try_emplace(task);
  Sink& sink = it->second;
  if (created) {
    std::string dir = job_dir_ + "/tasks/" + dir_name;
    if (MakeDirs(dir).ok()) {
      sink.out = std::fopen((dir + "/stdout").c_str(), "a");
      sink.err = std::fopen((dir + "/stderr").c_str(), "a");
    }
  }
  if (std::FILE* f = is_stderr ? sink.err : sink.out) std::fwrite(data.data(), 1, data.size(), f);
  std::string& partial = sink.partial[is_stderr ? 1 : 0];
  partial.append(data);
  const std::string prefix = task + " | ";
  std::string lines;
  size_t start = 0;
  for (size_t nl; (nl = partial.find('\n', start)) != std::string::npos; start = nl + 1) {
    lines += prefix;
    lines.append(partial, start, nl - start + 1);
  }
  partial.erase(0, start);
  if (partial.size() > kMaxLine) {
    lines += prefix + partial + "\n";
    partial.clear();
  }
  WriteCombined(lines);
  return lines;
}

std::string TaskLogs::FinishTask(const std::string& task) {
  auto it = sinks_.find(task);
  if (it == sinks_.end()) return "";
  std::string lines;
  for (auto& partial : it->second.partial) {
    if (!partial.empty()) lines += task + " | " + partial + "\n";
    partial.clear();
  }
  WriteCombined(lines);
  return lines;
}

bool TaskLogs::Flush() {
  bool flushed = std::fflush(combined_) == 0;
  for (auto& [task, sink] : sinks_) {
    if (sink.out) std::fflush(sink.out);
    if (sink.err) std::fflush(sink.err);
  }
  return flushed;
}

void TaskLogs::WriteCombined(const std::string& lines) {
  if (lines.empty()) return;
  std::fwrite(lines.data(), 1, lines.size(), combined_);
  combined_bytes_ += lines.size();
}

}  // namespace shoal::master
