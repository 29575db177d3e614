#pragma once

// Checkpoint directories on the local file system: creating them, durable renames (fsync of
// the directory), listing checkpoints and the leftovers of killed writers, reading a file.

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shoal/checkpoint_format.h"
#include "shoal/posix.h"

namespace shoal::sdk {

namespace internal {

// Creates `dir` and its missing parents. Returns "" or an error.
inline std::string MakeDirs(const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0) {
    return S_ISDIR(st.st_mode) ? "" : "checkpoint directory " + dir + " is not a directory";
  }
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    std::string prefix = dir.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoText("cannot create checkpoint directory " + prefix, errno);
    }
  }
  return "";
}

inline bool FsyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = ::fsync(fd) == 0;
  ::close(fd);
  return ok;
}

struct DirEntries {
  std::vector<std::pair<uint64_t, std::string>> checkpoints;  // ascending by step
  std::vector<std::string> temporaries;
};

inline DirEntries ListDir(const std::string& dir) {
  DirEntries entries;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return entries;
  while (struct dirent* e = ::readdir(d)) {
    std::string_view name = e->d_name;
    if (name.substr(0, std::strlen(kTempPrefix)) == kTempPrefix) {
      entries.temporaries.emplace_back(name);
      continue;
    }
    std::optional<uint64_t> step = CheckpointStep(name);
    if (!step) continue;
    struct stat st;
    std::string path = dir + "/" + std::string(name);
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    entries.checkpoints.emplace_back(*step, std::string(name));
  }
  ::closedir(d);
  std::sort(entries.checkpoints.begin(), entries.checkpoints.end());
  return entries;
}

inline bool Older(const struct timespec& a, const struct timespec& b) {
  return a.tv_sec < b.tv_sec || (a.tv_sec == b.tv_sec && a.tv_nsec < b.tv_nsec);
}

// `.tmp-<name>.<pid>.<random>` names a pid with no live process on this machine: its writer
// died (file times tick coarsely, so a writer killed a moment ago can share our timestamp).
inline bool WriterIsGone(const std::string& temp_name) {
  size_t last = temp_name.rfind('.');
  if (last == std::string::npos || last == 0) return false;
  size_t before = temp_name.rfind('.', last - 1);
  if (before == std::string::npos) return false;
  std::string pid_text = temp_name.substr(before + 1, last - before - 1);
  if (pid_text.empty() ||
      !std::all_of(pid_text.begin(), pid_text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return false;
  }
  long pid = std::strtol(pid_text.c_str(), nullptr, 10);
  if (pid <= 0 || pid == static_cast<long>(::getpid())) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
  std::string stat_path = "/proc/" + pid_text + "/stat";
  FILE* f = std::fopen(stat_path.c_str(), "r");
  if (f == nullptr) return true;
  char buf[512];
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* paren = std::strrchr(buf, ')');
  return paren != nullptr && paren[1] == ' ' && paren[2] == 'Z';  // a zombie is gone too
}

// The file's bytes, or nullopt with `error` set (and `missing` when it does not exist).
inline std::optional<std::string> ReadFile(const std::string& path, std::string* error,
                                           bool* missing) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *missing = errno == ENOENT;
    *error = ErrnoText("cannot open " + path, errno);
    return std::nullopt;
  }
  std::string bytes;
  struct stat st;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) bytes.reserve(static_cast<size_t>(st.st_size));
  char buffer[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      *error = ErrnoText("cannot read " + path, errno);
      ::close(fd);
      return std::nullopt;
    }
    if (n == 0) break;
    bytes.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return bytes;
}

}  // namespace internal

}  // namespace shoal::sdk
