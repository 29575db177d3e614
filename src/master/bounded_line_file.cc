#include "master/bounded_line_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/files.h"

namespace shoal::master {

namespace {

absl::Status WriteAt(int fd, std::string_view data, uint64_t offset, const std::string& path) {
  while (!data.empty()) {
    ssize_t n = ::pwrite(fd, data.data(), data.size(), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(absl::StrCat("write ", path), errno);
    data.remove_prefix(static_cast<size_t>(n));
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<BoundedLineFile>> BoundedLineFile::Open(std::string path,
                                                                       uint64_t budget) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(absl::StrCat("open ", path), errno);
  auto file = std::unique_ptr<BoundedLineFile>(new BoundedLineFile(path, budget, fd, 0));
  auto contents = ReadFile(path);
  if (!contents.ok()) return contents.status();
  // Whole lines only: a crash may have cut the last append short.
  size_t whole = contents->rfind('\n');
  whole = whole == std::string::npos ? 0 : whole + 1;
  if (whole != contents->size() && ::ftruncate(fd, static_cast<off_t>(whole)) != 0) {
    return ErrnoStatus(absl::StrCat("truncate ", path), errno);
  }
  file->size_ = whole;
  return file;
}

BoundedLineFile::~BoundedLineFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status BoundedLineFile::Append(std::string_view line) {
  const uint64_t bytes = line.size() + 1;
  if (bytes > budget_ / 4) {
    return absl::InvalidArgumentError(absl::StrCat("a line of ", bytes, " bytes for ", path_,
                                                   ", whose budget is ", budget_, " bytes"));
  }
  const uint64_t number = appended_++;
  if (provisional_at_) {
    if (::ftruncate(fd_, static_cast<off_t>(*provisional_at_)) != 0) {
      return ErrnoStatus(absl::StrCat("truncate ", path_), errno);
    }
    size_ = *provisional_at_;
    provisional_at_.reset();
  }
  // A line is at most a quarter of the budget, so once the file holds a single line the next
  // fits: this ends.
  while (size_ + bytes > budget_) {
    if (absl::Status st = Thin(); !st.ok()) return st;
  }
  std::string text(line);
  text.push_back('\n');
  if (absl::Status st = WriteAt(fd_, text, size_, path_); !st.ok()) return st;
  if (number % stride_ != 0) provisional_at_ = size_;
  size_ += bytes;
  return absl::OkStatus();
}

absl::Status BoundedLineFile::Thin() {
  std::string contents(size_, '\0');
  for (uint64_t done = 0; done < size_;) {
    ssize_t n = ::pread(fd_, contents.data() + done, size_ - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoStatus(absl::StrCat("read ", path_), n < 0 ? errno : EIO);
    done += static_cast<uint64_t>(n);
  }
  std::string kept;
  kept.reserve(contents.size() / 2 + 1);
  size_t line_number = 0;
  for (size_t begin = 0; begin < contents.size(); ++line_number) {
    size_t end = contents.find('\n', begin);
    end = end == std::string::npos ? contents.size() : end + 1;
    if (line_number % 2 == 0) kept.append(contents, begin, end - begin);
    begin = end;
  }
  if (absl::Status st = WriteFileAtomically(path_, kept); !st.ok()) return st;
  // The old descriptor points at the replaced file: continue in the new one.
  int fd = ::open(path_.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(absl::StrCat("open ", path_), errno);
  ::close(fd_);
  fd_ = fd;
  size_ = kept.size();
  stride_ *= 2;
  return absl::OkStatus();
}

}  // namespace shoal::master
