#include "common/journal.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "nlohmann/json.hpp"

namespace shoal {

absl::StatusOr<std::unique_ptr<Journal>> Journal::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(absl::StrCat("open journal ", path), errno);
  // A writer killed mid-line left a torn record: cut it off, or the next record would be glued
  // to it and both lost to readers.
  off_t size = ::lseek(fd, 0, SEEK_END);
  if (size > 0) {
    off_t keep = size;
    char c = 0;
    while (keep > 0 && ::pread(fd, &c, 1, keep - 1) == 1 && c != '\n') --keep;
    if (keep != size && ::ftruncate(fd, keep) != 0) {
      int err = errno;
      ::close(fd);
      return ErrnoStatus(absl::StrCat("truncate the torn end of journal ", path), err);
    }
  }
  return std::unique_ptr<Journal>(new Journal(fd, path));
}

Journal::~Journal() {
  (void)Sync();
  ::close(fd_);
}

void Journal::Append(const nlohmann::json& record) {
  pending_ += record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  pending_ += '\n';
}

absl::Status Journal::Sync() {
  if (pending_.empty()) return absl::OkStatus();
  std::string_view data = pending_;
  while (!data.empty()) {
    ssize_t n = ::write(fd_, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(absl::StrCat("append to journal ", path_), errno);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  pending_.clear();
  if (::fdatasync(fd_) != 0) return ErrnoStatus(absl::StrCat("fsync journal ", path_), errno);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<nlohmann::json>> Journal::ReadAll(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  std::vector<nlohmann::json> records;
  std::istringstream in(*text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_discarded()) continue;  // torn tail of a crashed writer
    records.push_back(std::move(record));
  }
  return records;
}

}  // namespace shoal
