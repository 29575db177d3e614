#include "process/cgroup_fs.h"

#include <algorithm>
#include <filesystem>
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/files.h"

namespace shoal::process::cgroup_fs {

namespace {

bool HasMagic(const std::string& dir, long magic) {
  struct statfs fs;
  return ::statfs(dir.c_str(), &fs) == 0 && static_cast<long>(fs.f_type) == magic;
}

}  // namespace

bool IsCgroupV2(const std::string& dir) { return HasMagic(dir, CGROUP2_SUPER_MAGIC); }
bool IsCgroupV1(const std::string& dir) { return HasMagic(dir, CGROUP_SUPER_MAGIC); }

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

absl::StatusOr<std::string> Read(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(absl::StrCat("open ", path), errno);
  std::string out;
  char buf[4096];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return ErrnoStatus(absl::StrCat("read ", path), err);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

absl::Status Write(const std::string& path, const std::string& value) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(absl::StrCat("open ", path), errno);
  ssize_t n;
  do {
    n = ::write(fd, value.data(), value.size());
  } while (n < 0 && errno == EINTR);
  int err = errno;
  ::close(fd);
  if (n < 0) return ErrnoStatus(absl::StrCat("write '", value, "' to ", path), err);
  return absl::OkStatus();
}

absl::Status MakeDir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoStatus(absl::StrCat("mkdir ", path), errno);
  }
  return absl::OkStatus();
}

absl::Status RemoveDir(const std::string& path) {
  if (::rmdir(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoStatus(absl::StrCat("rmdir ", path), errno);
  }
  return absl::OkStatus();
}

std::vector<std::string> Subtree(const std::string& dir) {
  std::vector<std::string> out{dir};
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_directory(ec)) out.push_back(it->path().string());
  }
  return out;
}

absl::Status RemoveTree(const std::string& path) {
  // Nearly always a task's cgroup has no children: one rmdir, without listing the dozens of
  // control files of a cgroup directory (once per task exit, on the supervisor's I/O thread).
  if (::rmdir(path.c_str()) == 0 || errno == ENOENT) return absl::OkStatus();
  if (errno != EBUSY && errno != ENOTEMPTY) return ErrnoStatus(absl::StrCat("rmdir ", path), errno);
  std::vector<std::string> dirs = Subtree(path);
  // Deeper paths sort after their parents; remove in reverse so children go first.
  std::sort(dirs.begin(), dirs.end());
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    if (auto st = RemoveDir(*it); !st.ok()) return st;
  }
  return absl::OkStatus();
}

std::vector<pid_t> Procs(const std::string& dir) {
  std::vector<pid_t> pids;
  auto text = Read(absl::StrCat(dir, "/cgroup.procs"));
  if (!text.ok()) return pids;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipWhitespace())) {
    int pid;
    if (absl::SimpleAtoi(line, &pid) && pid > 0) pids.push_back(pid);
  }
  return pids;
}

absl::StatusOr<int64_t> ReadKeyedValue(const std::string& path, const std::string& key) {
  auto text = Read(path);
  if (!text.ok()) return text.status();
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipWhitespace())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(line, absl::MaxSplits(' ', 1));
    int64_t value;
    if (kv.first == key && absl::SimpleAtoi(absl::StripAsciiWhitespace(kv.second), &value)) {
      return value;
    }
  }
  return absl::NotFoundError(absl::StrCat("no '", key, "' in ", path));
}

}  // namespace shoal::process::cgroup_fs
