#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace shoal::agent {

// One task's progress board: a small shared file the task's SDK writes its latest step into,
// so that reporting a step costs the training loop a few stores instead of a message, and wakes
// no one (docs/sdk-protocol.md, "The progress file"). The agent reads it when it builds a
// heartbeat and when the task's hang watchdog is due.
//
// Layout (little-endian, 64 bytes): magic "SHOALPG1", u64 sequence (odd while a write is under
// way), u64 step, i64 CLOCK_MONOTONIC nanoseconds of the report.
class ProgressSlot {
 public:
  static constexpr size_t kSize = 64;
  static constexpr char kMagic[9] = "SHOALPG1";

  struct Report {
    uint64_t step = 0;
    int64_t monotonic_ns = 0;
  };

  // Creates (or empties) the file at `path`, mode 0600, and maps it.
  static absl::StatusOr<std::unique_ptr<ProgressSlot>> Create(const std::string& path);
  ~ProgressSlot();  // unmaps and removes the file
  ProgressSlot(const ProgressSlot&) = delete;
  ProgressSlot& operator=(const ProgressSlot&) = delete;

  const std::string& path() const { return path_; }
  // The latest complete report; nullopt before the first, or when a write was caught half done
  // a few times in a row (the next look will see it).
  std::optional<Report> Read() const;

 private:
  ProgressSlot(std::string path, void* map) : path_(std::move(path)), map_(map) {}
  std::string path_;
  void* map_;
};

}  // namespace shoal::agent
