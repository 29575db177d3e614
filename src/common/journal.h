#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace shoal {

// An append-only file of JSON lines. Lines become durable in groups: Append buffers, Sync writes
// everything buffered with one write and one fsync, so a burst of events costs one fsync
// (group commit). A reader that meets a torn last line (a crash mid-write) ignores it.
// Not thread-safe: owned by one event loop.
class Journal {
 public:
  // Opens for appending; an existing journal is continued (a recovering master), minus a torn
  // last line.
  static absl::StatusOr<std::unique_ptr<Journal>> Open(const std::string& path);
  ~Journal();

  void Append(const nlohmann::json& record);
  absl::Status Sync();
  size_t pending() const { return pending_.size(); }

  // Every complete record of the file at `path`, oldest first.
  static absl::StatusOr<std::vector<nlohmann::json>> ReadAll(const std::string& path);

 private:
  Journal(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_;
  std::string path_;
  std::string pending_;
};

}  // namespace shoal
