#include "master/resource_logs.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/files.h"
#include "spdlog/spdlog.h"

namespace shoal::master {

double CpuPercent(double cpu_seconds_before, int64_t ms_before, double cpu_seconds_now,
                  int64_t ms_now) {
  if (ms_now <= ms_before || cpu_seconds_now < cpu_seconds_before) return 0;
  return (cpu_seconds_now - cpu_seconds_before) * 100'000.0 /
         static_cast<double>(ms_now - ms_before);
}

std::string ResourceLine(const ResourceSample& sample, double cpu_percent, uint64_t step) {
  std::string gpus;
  for (const ResourceSample::Gpu& gpu : sample.gpus) {
    absl::StrAppend(&gpus, gpus.empty() ? "" : ", ", "{\"index\": ", gpu.index,
                    ", \"util_percent\": ", gpu.util_percent, ", \"memory_bytes\": ",
                    gpu.memory_bytes, "}");
  }
  // One decimal: the sampling interval makes finer digits noise, and lines stay short.
  return absl::StrFormat(
      "{\"ts_ms\": %d, \"cpu_percent\": %.1f, \"rss_bytes\": %d, \"step\": %d, \"attempt\": %d, "
      "\"gpus\": [%s]}",
      sample.ts_unix_ms, std::round(cpu_percent * 10) / 10, sample.rss_bytes, step,
      sample.attempt, gpus);
}

ResourceLogs::ResourceLogs(std::string job_dir, uint64_t budget)
    : job_dir_(std::move(job_dir)), budget_(budget), writer_([this] { WriteLoop(); }) {}

ResourceLogs::~ResourceLogs() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    cv_.SignalAll();
  }
  writer_.join();
}

void ResourceLogs::Add(const std::string& dir_name, const ResourceSample& sample, uint64_t step) {
  auto [it, first] = previous_.try_emplace(dir_name);
  Previous& previous = it->second;
  double cpu_percent = 0;
  if (!first && previous.attempt == sample.attempt) {
    if (sample.ts_unix_ms <= previous.ts_unix_ms) return;  // late or repeated
    cpu_percent = CpuPercent(previous.cpu_seconds_total, previous.ts_unix_ms,
                             sample.cpu_seconds_total, sample.ts_unix_ms);
  } else if (sample.start_unix_ms > 0) {
    // A new series (the first sample, or a new attempt): since the launch, when CPU time was 0.
    cpu_percent = CpuPercent(0, sample.start_unix_ms, sample.cpu_seconds_total, sample.ts_unix_ms);
  }
  previous = {sample.attempt, sample.ts_unix_ms, sample.cpu_seconds_total};
  std::string line = ResourceLine(sample, cpu_percent, step);
  absl::MutexLock lock(&mu_);
  // A writer stuck on a hung disk must not grow the master without bound: samples are dropped
  // instead (the file has a gap there).
  if (queue_.size() >= kMaxQueuedLines) return;
  queue_.emplace_back(dir_name, std::move(line));
  ++queued_;
  cv_.SignalAll();
}

void ResourceLogs::Flush() {
  absl::MutexLock lock(&mu_);
  const uint64_t target = queued_;
  while (written_ < target) cv_.Wait(&mu_);
}

void ResourceLogs::WriteLoop() {
  std::vector<std::pair<std::string, std::string>> batch;
  mu_.Lock();
  while (true) {
    while (!stopping_ && queue_.empty()) cv_.Wait(&mu_);
    if (queue_.empty()) break;  // stopping, and everything is written
    batch.swap(queue_);
    mu_.Unlock();
    for (auto& [dir_name, line] : batch) {
      auto it = files_.find(dir_name);
      if (it == files_.end()) {
        const std::string dir = absl::StrCat(job_dir_, "/tasks/", dir_name);
        absl::Status made = MakeDirs(dir);
        absl::StatusOr<std::unique_ptr<BoundedLineFile>> file =
            made.ok() ? BoundedLineFile::Open(dir + "/resources.jsonl", budget_)
                      : absl::StatusOr<std::unique_ptr<BoundedLineFile>>(made);
        if (!file.ok()) {
          if (!failed_[dir_name]) {
            spdlog::warn("no resource samples for {}: {}", dir_name, file.status().ToString());
          }
          failed_[dir_name] = true;
          continue;
        }
        it = files_.emplace(dir_name, std::move(*file)).first;
      }
      if (absl::Status st = it->second->Append(line); !st.ok() && !failed_[dir_name]) {
        // Once per file: a full disk would say it every two seconds per task.
        spdlog::warn("resource samples of {}: {}", dir_name, st.ToString());
        failed_[dir_name] = true;
      }
    }
    const uint64_t done = batch.size();
    batch.clear();
    mu_.Lock();
    written_ += done;
    cv_.SignalAll();
  }
  mu_.Unlock();
}

}  // namespace shoal::master
