#pragma once

// Saving and loading checkpoints in a local directory or an hdfs:// one: atomic writes, the
// newest readable checkpoint, the steps present. They never talk to the agent: after a save
// call ReportCheckpointed(step); after loading (or finding nothing) ReportResumed (reports.h).

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shoal/checkpoint_format.h"
#include "shoal/local_files.h"
#include "shoal/posix.h"
#include "shoal/webhdfs.h"

namespace shoal::sdk {

namespace internal {

inline SaveResult HdfsSave(const std::string& uri, uint64_t step, std::string_view bytes,
                           unsigned keep) {
  SaveResult result;
  std::optional<HdfsDir> dir = ParseHdfsDir(uri, "", &result.error);
  if (!dir) return result;
  const std::string name = CheckpointFileName(step);
  const std::string final_path = HdfsJoin(*dir, name);
  char host[256] = "localhost";
  if (::gethostname(host, sizeof(host)) != 0) std::strcpy(host, "localhost");
  host[sizeof(host) - 1] = '\0';
  static std::atomic<unsigned> counter{0};
  char suffix[64];
  std::snprintf(suffix, sizeof(suffix), ".%ld.%08x", static_cast<long>(::getpid()),
                static_cast<unsigned>(
                    std::chrono::steady_clock::now().time_since_epoch().count() ^
                    (counter.fetch_add(1) * 2654435761u)));
  const std::string temp_path = HdfsJoin(*dir, std::string(kTempPrefix) + name + "." + host + suffix);
  HttpResponse response;
  auto call = [&](const char* method, const std::string& url, const char* op,
                  std::string_view body) {
    std::string error = WebHdfsCall(method, url, op, body, &response);
    if (error.empty()) error = WebHdfsStatusError(op, url, response);
    return error;
  };
  if ((result.error = call("PUT", WebHdfsUrl(*dir, dir->path, "MKDIRS"), "MKDIRS", {}))
          .size()) {
    return result;
  }
  if (double delay = TestWriteDelaySeconds(); delay > 0) {
    size_t half = bytes.size() / 2;
    result.error = call("PUT", WebHdfsUrl(*dir, temp_path, "CREATE", {{"overwrite", "true"}}),
                        "CREATE", bytes.substr(0, half));
    if (result.error.empty()) {
      SleepSeconds(delay);
      result.error = call("POST", WebHdfsUrl(*dir, temp_path, "APPEND"), "APPEND",
                          bytes.substr(half));
    }
  } else {
    result.error = call("PUT", WebHdfsUrl(*dir, temp_path, "CREATE", {{"overwrite", "true"}}),
                        "CREATE", bytes);
  }
  if (!result.error.empty()) return result;
  // The temporary's time, which older leftovers are compared against.
  std::string status_url = WebHdfsUrl(*dir, temp_path, "GETFILESTATUS");
  if ((result.error = call("GET", status_url, "GETFILESTATUS", {})).size()) return result;
  long long written_ms = 0;
  if (size_t value = FindValue(response.body, "modificationTime"); value != std::string::npos) {
    written_ms = std::atoll(response.body.c_str() + value);
  }
  std::string rename_url = WebHdfsUrl(*dir, temp_path, "RENAME",
                                      {{"destination", final_path}, {"renameoptions", "OVERWRITE"}});
  if ((result.error = call("PUT", rename_url, "RENAME", {})).size()) return result;
  if (JsonBoolean(response.body) == false) {
    result.error = "WebHDFS RENAME " + rename_url + ": HDFS could not rename " + temp_path +
                   " to " + final_path;
    HdfsDelete(*dir, temp_path);
    return result;
  }
  // Pruning and cleanup are best effort: the checkpoint is durable already.
  std::vector<HdfsEntry> entries;
  bool missing = false;
  if (HdfsList(*dir, &entries, &missing).empty()) {
    auto checkpoints = HdfsCheckpoints(entries);
    size_t excess = checkpoints.size() > keep ? checkpoints.size() - keep : 0;
    for (const auto& [old_step, old_name] : checkpoints) {
      if (excess == 0) break;
      if (old_name == name) continue;
      if (std::string error = HdfsDelete(*dir, HdfsJoin(*dir, old_name)); !error.empty()) {
        std::fprintf(stderr, "shoal: cannot prune checkpoint: %s\n", error.c_str());
      }
      --excess;
    }
    for (const HdfsEntry& e : entries) {
      if (e.name.compare(0, std::strlen(kTempPrefix), kTempPrefix) == 0 &&
          e.modification_time < written_ms) {
        HdfsDelete(*dir, HdfsJoin(*dir, e.name));
      }
    }
  }
  result.ok = true;
  result.path = dir->uri + "/" + name;
  return result;
}

// LoadLatestCheckpoint for an hdfs:// directory (same contract).
inline std::optional<std::pair<uint64_t, std::string>> HdfsLoadLatest(
    const std::string& uri, const std::function<bool(uint64_t, std::string_view)>& accept) {
  std::string error;
  std::optional<HdfsDir> dir = ParseHdfsDir(uri, "", &error);
  std::vector<HdfsEntry> entries;
  bool missing = false;
  if (dir) error = HdfsList(*dir, &entries, &missing);
  if (!error.empty()) {
    // No error channel here: say it loudly rather than resume from nothing in silence.
    std::fprintf(stderr, "shoal: cannot load a checkpoint: %s\n", error.c_str());
    return std::nullopt;
  }
  auto checkpoints = HdfsCheckpoints(entries);
  for (auto it = checkpoints.rbegin(); it != checkpoints.rend(); ++it) {
    const std::string path = HdfsJoin(*dir, it->second);
    const std::string url = WebHdfsUrl(*dir, path, "OPEN");
    HttpResponse response;
    error = WebHdfsCall("GET", url, "OPEN", {}, &response);
    if (error.empty() && response.status == 404) continue;  // pruned since it was listed
    if (error.empty()) error = WebHdfsStatusError("OPEN", url, response);
    if (!error.empty()) {
      std::fprintf(stderr, "shoal: skipping checkpoint %s/%s: %s; trying the previous one\n",
                   dir->uri.c_str(), it->second.c_str(), error.c_str());
      continue;
    }
    if (accept && !accept(it->first, response.body)) {
      std::fprintf(stderr, "shoal: skipping checkpoint %s/%s: rejected as invalid; trying the "
                   "previous one\n", dir->uri.c_str(), it->second.c_str());
      continue;
    }
    return std::make_pair(it->first, std::move(response.body));
  }
  return std::nullopt;
}

}  // namespace internal

// The steps of the complete checkpoints in `dir`, ascending (empty when `dir` does not exist).
inline std::vector<uint64_t> ListCheckpoints(const std::string& dir) {
  std::vector<uint64_t> steps;
  if (internal::IsHdfs(dir)) {
    std::string error;
    std::optional<internal::HdfsDir> hdfs = internal::ParseHdfsDir(dir, "", &error);
    std::vector<internal::HdfsEntry> entries;
    bool missing = false;
    if (hdfs) error = internal::HdfsList(*hdfs, &entries, &missing);
    if (!error.empty()) {
      std::fprintf(stderr, "shoal: cannot list checkpoints: %s\n", error.c_str());
      return steps;
    }
    for (const auto& [step, name] : internal::HdfsCheckpoints(entries)) steps.push_back(step);
    return steps;
  }
  for (const auto& [step, name] : internal::ListDir(dir).checkpoints) steps.push_back(step);
  return steps;
}

// Writes `bytes` as the checkpoint of `step` in `dir` (created if missing), atomically: to a
// `.tmp-` file in `dir`, fsync'd, renamed to ckpt-<step>.pt, then `dir` fsync'd. A crash at any
// point leaves either no new checkpoint or the whole one. Then removes the oldest complete
// checkpoints beyond `keep` (>= 1; never the one just written) and `.tmp-` files last written
// before this write started (leftovers of killed writers). Does not report to the agent.
inline SaveResult SaveCheckpoint(const std::string& dir, uint64_t step, std::string_view bytes,
                                 unsigned keep) {
  SaveResult result;
  if (dir.empty()) {
    result.error = "no checkpoint directory (SHOAL_CHECKPOINT_DIR is unset?)";
    return result;
  }
  if (keep < 1) {
    result.error = "keep must be at least 1";
    return result;
  }
  if (internal::UnsupportedUri(dir)) {
    result.error = internal::NotLocalError(dir);
    return result;
  }
  if (internal::IsHdfs(dir)) return internal::HdfsSave(dir, step, bytes, keep);
  if (std::string error = internal::MakeDirs(dir); !error.empty()) {
    result.error = error;
    return result;
  }
  const std::string name = CheckpointFileName(step);
  const std::string final_path = dir + "/" + name;
  static std::atomic<unsigned> counter{0};
  std::string temp_path;
  int fd = -1;
  for (int tries = 0; fd < 0 && tries < 100; ++tries) {
    char suffix[64];
    std::snprintf(suffix, sizeof(suffix), ".%ld.%08x", static_cast<long>(::getpid()),
                  static_cast<unsigned>(
                      std::chrono::steady_clock::now().time_since_epoch().count() ^
                      (counter.fetch_add(1) * 2654435761u)));
    temp_path = dir + "/" + kTempPrefix + name + suffix;
    fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    result.error = internal::ErrnoText("cannot create " + temp_path, errno);
    return result;
  }
  auto fail = [&](const std::string& what) {
    result.error = internal::ErrnoText(what, errno);
    if (fd >= 0) ::close(fd);
    ::unlink(temp_path.c_str());
    return result;
  };
  struct stat st;
  if (::fstat(fd, &st) != 0) return fail("cannot stat " + temp_path);
  const struct timespec started = st.st_mtim;
  bool written;
  if (double delay = internal::TestWriteDelaySeconds(); delay > 0) {
    size_t half = bytes.size() / 2;
    written = internal::WriteAll(fd, bytes.data(), half);
    if (written) {
      internal::SleepSeconds(delay);
      written = internal::WriteAll(fd, bytes.data() + half, bytes.size() - half);
    }
  } else {
    written = internal::WriteAll(fd, bytes.data(), bytes.size());
  }
  if (!written) return fail("cannot write " + temp_path);
  if (::fsync(fd) != 0) return fail("cannot fsync " + temp_path);
  int closed = ::close(fd);
  fd = -1;
  if (closed != 0) return fail("cannot close " + temp_path);
  if (::rename(temp_path.c_str(), final_path.c_str()) != 0) {
    return fail("cannot rename " + temp_path + " to " + final_path);
  }
  if (!internal::FsyncDir(dir)) {
    result.error = internal::ErrnoText("cannot fsync directory " + dir, errno);
    return result;
  }

  internal::DirEntries entries = internal::ListDir(dir);
  size_t excess = entries.checkpoints.size() > keep ? entries.checkpoints.size() - keep : 0;
  for (const auto& [old_step, old_name] : entries.checkpoints) {
    if (excess == 0) break;
    if (old_name == name) continue;
    ::unlink((dir + "/" + old_name).c_str());
    --excess;
  }
  for (const std::string& temp : entries.temporaries) {
    std::string path = dir + "/" + temp;
    struct stat temp_st;
    if (::lstat(path.c_str(), &temp_st) == 0 &&
        (internal::Older(temp_st.st_mtim, started) || internal::WriterIsGone(temp))) {
      ::unlink(path.c_str());
    }
  }
  result.ok = true;
  result.path = final_path;
  return result;
}

// The newest checkpoint in `dir` that reads and that `accept(step, bytes)` accepts, as
// (step, bytes); nullopt when there is none. A checkpoint that cannot be read or is rejected
// is skipped with a warning on stderr, and the previous one is tried. `.tmp-` files are never
// considered. Does not report to the agent (call ReportResumed).
inline std::optional<std::pair<uint64_t, std::string>> LoadLatestCheckpoint(
    const std::string& dir, const std::function<bool(uint64_t, std::string_view)>& accept) {
  if (internal::IsHdfs(dir)) return internal::HdfsLoadLatest(dir, accept);
  if (internal::UnsupportedUri(dir)) {
    // No error channel here: say it loudly rather than resume from nothing in silence.
    std::fprintf(stderr, "shoal: cannot load a checkpoint: %s\n",
                 internal::NotLocalError(dir).c_str());
    return std::nullopt;
  }
  internal::DirEntries entries = internal::ListDir(dir);
  for (auto it = entries.checkpoints.rbegin(); it != entries.checkpoints.rend(); ++it) {
    const std::string path = dir + "/" + it->second;
    std::string error;
    bool missing = false;
    std::optional<std::string> bytes = internal::ReadFile(path, &error, &missing);
    if (!bytes) {
      if (missing) continue;  // pruned since it was listed
      std::fprintf(stderr, "shoal: skipping checkpoint %s: %s; trying the previous one\n",
                   path.c_str(), error.c_str());
      continue;
    }
    if (accept && !accept(it->first, *bytes)) {
      std::fprintf(stderr, "shoal: skipping checkpoint %s: rejected as invalid; trying the "
                   "previous one\n", path.c_str());
      continue;
    }
    return std::make_pair(it->first, std::move(*bytes));
  }
  return std::nullopt;
}

inline std::optional<std::pair<uint64_t, std::string>> LoadLatestCheckpoint(const std::string& dir) {
  return LoadLatestCheckpoint(dir, nullptr);
}

}  // namespace shoal::sdk
