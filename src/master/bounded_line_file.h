#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace shoal::master {

// A file of lines (JSON lines) that never grows past a fixed budget however many lines are
// appended, and still spans everything appended: the first line and the newest are always in
// it, and the lines between thin out evenly as it ages.
//
// The scheme: lines are appended while they fit. When the next one would not, the file is
// rewritten keeping every second line (lines 0, 2, 4, ... : a temporary file, fsync, rename,
// so a reader sees the old file or the new one, never a mix), and from then on only every 2nd
// appended line is kept; the next rewrite makes it every 4th, and so on. A line that is not
// due is still written, so that the newest sample is always there, but provisionally: the next
// append truncates it away first. Appends are plain write(2)s, never fsynced; a crash may leave
// a partly written last line, which readers skip and Open cuts off.
//
// Thread-compatible: one writer.
class BoundedLineFile {
 public:
  // Opens or creates `path`. `budget`: the most bytes the file may hold (a few KiB at least).
  static absl::StatusOr<std::unique_ptr<BoundedLineFile>> Open(std::string path, uint64_t budget);
  ~BoundedLineFile();
  BoundedLineFile(const BoundedLineFile&) = delete;
  BoundedLineFile& operator=(const BoundedLineFile&) = delete;

  // Appends `line` (no newline of its own). InvalidArgument, nothing written, for a line longer
  // than a quarter of the budget; otherwise errors name the file and the failed call.
  absl::Status Append(std::string_view line);

  uint64_t size() const { return size_; }
  // Every how many appended lines one is kept now: 1, then 2, 4, ...
  uint64_t stride() const { return stride_; }

 private:
  BoundedLineFile(std::string path, uint64_t budget, int fd, uint64_t size)
      : path_(std::move(path)), budget_(budget), fd_(fd), size_(size) {}
  // Rewrites the file with every second line of it.
  absl::Status Thin();

  const std::string path_;
  const uint64_t budget_;
  int fd_;
  uint64_t size_;
  uint64_t stride_ = 1;
  uint64_t appended_ = 0;  // lines appended since Open
  // Where the provisional newest line starts, when the last one appended was not due.
  std::optional<uint64_t> provisional_at_;
};

}  // namespace shoal::master
