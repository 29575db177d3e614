#pragma once

// The pieces of model publishing (publish.h) that its local and hdfs:// protocols share: the
// options and result, the names both write, the checks of the arguments, and the local
// repository's file helpers. Include publish.h.

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "shoal/agent_client.h"
#include "shoal/checkpoint_format.h"
#include "shoal/json_scan.h"
#include "shoal/local_files.h"
#include "shoal/posix.h"
#include "shoal/webhdfs.h"

namespace shoal::sdk {

// What PublishModel takes beside the model and its name. Every field may be left as it is.
struct PublishOptions {
  // A directory; "" means SHOAL_MODEL_REPOSITORY.
  std::string repository;
  // The model's config.yaml (docs/serving.md) as YAML text; "" leaves the model's config as it
  // is. Rewritten (atomically) only when it changes.
  std::string config;
  // The training step and metrics (name -> finite number; at most kMaxPublishMetrics names of
  // 1 to kMaxPublishMetricNameBytes bytes), carried by the report to the agent.
  std::optional<uint64_t> step;
  std::map<std::string, double> metrics;
};

// The outcome of PublishModel: `version` and its directory `path` when ok, else `error`.
struct PublishResult {
  bool ok = false;
  uint64_t version = 0;
  std::string path;
  std::string error;
  explicit operator bool() const { return ok; }
};

inline constexpr const char* kModelRepositoryEnv = "SHOAL_MODEL_REPOSITORY";
inline constexpr const char* kModelKeepEnv = "SHOAL_MODEL_KEEP";
inline constexpr const char* kPublishLockName = ".publish.lock";
inline constexpr const char* kIncomingPrefix = ".incoming-";
// An empty file in each version: it tells `shoal serve` the directory was renamed in whole, so
// the server loads it without its settle wait (src/serve/repository/model_repository.h).
inline constexpr const char* kCompleteMarker = ".shoal-complete";
inline constexpr const char* kRemovingPrefix = ".removing-";
// Test hook (also read by the Python SDK): seconds to sleep after writing half of model.pt.
inline constexpr const char* kTestPublishWriteDelayEnv = "SHOAL_TEST_PUBLISH_WRITE_DELAY_S";
// What the agent takes in one report (the same bounds as publish.py's).
inline constexpr size_t kMaxPublishMetrics = 64;
inline constexpr size_t kMaxPublishMetricNameBytes = 128;

namespace internal {

// The version number a directory entry names ("7"; not "07", "0" or "7a"), or 0.
inline uint64_t VersionOf(const char* name) {
  if (name[0] < '1' || name[0] > '9') return 0;
  uint64_t version = 0;
  for (const char* c = name; *c; ++c) {
    if (*c < '0' || *c > '9') return 0;
    uint64_t digit = static_cast<uint64_t>(*c - '0');
    if (version > (UINT64_MAX - digit) / 10) return 0;
    version = version * 10 + digit;
  }
  return version;
}

// The versions present in `model_dir`, ascending.
inline std::vector<uint64_t> ListVersions(const std::string& model_dir) {
  std::vector<uint64_t> versions;
  DIR* d = ::opendir(model_dir.c_str());
  if (!d) return versions;
  while (struct dirent* e = ::readdir(d)) {
    if (uint64_t v = VersionOf(e->d_name)) versions.push_back(v);
  }
  ::closedir(d);
  std::sort(versions.begin(), versions.end());
  return versions;
}

inline std::string RandomHex8() {
  static thread_local std::mt19937 generator(std::random_device{}() ^
                                             static_cast<unsigned>(::getpid()));
  char hex[16];
  std::snprintf(hex, sizeof(hex), "%08x", static_cast<unsigned>(generator()));
  return hex;
}

// rm -rf, best effort (the leftovers of a publication, or a pruned version).
inline void RemoveTree(const std::string& path) {
  ::nftw(
      path.c_str(),
      [](const char* entry, const struct stat*, int, struct FTW*) {
        ::remove(entry);
        return 0;
      },
      16, FTW_DEPTH | FTW_PHYS);
}

inline bool PidAlive(long pid) { return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH; }

// Removes the hidden directories of publications whose writer is gone (`.incoming-<pid>-*`).
inline void RemoveAbandonedIncoming(const std::string& model_dir) {
  std::vector<std::string> abandoned;
  DIR* d = ::opendir(model_dir.c_str());
  if (!d) return;
  const size_t prefix = std::strlen(kIncomingPrefix);
  while (struct dirent* e = ::readdir(d)) {
    if (std::strncmp(e->d_name, kIncomingPrefix, prefix) != 0) continue;
    char* end = nullptr;
    long pid = std::strtol(e->d_name + prefix, &end, 10);
    if (end == e->d_name + prefix || *end != '-' || pid <= 0) continue;
    if (pid != static_cast<long>(::getpid()) && !PidAlive(pid)) abandoned.push_back(e->d_name);
  }
  ::closedir(d);
  for (const std::string& name : abandoned) RemoveTree(model_dir + "/" + name);
}

// Writes `bytes` to a new file `path` and fsyncs it; with `delay_half`, sleeps that long after
// half of it (the test hook). "" or an error.
inline std::string WriteNewFile(const std::string& path, const std::string& bytes,
                                double delay_half = 0) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoText("cannot create " + path, errno);
  size_t half = delay_half > 0 ? bytes.size() / 2 : bytes.size();
  bool ok = WriteAll(fd, bytes.data(), half);
  if (ok && delay_half > 0) {
    SleepSeconds(delay_half);
    ok = WriteAll(fd, bytes.data() + half, bytes.size() - half);
  }
  if (!ok) {
    std::string error = ErrnoText("cannot write " + path, errno);
    ::close(fd);
    return error;
  }
  if (::fsync(fd) != 0) {
    std::string error = ErrnoText("cannot fsync " + path, errno);
    ::close(fd);
    return error;
  }
  if (::close(fd) != 0) return ErrnoText("cannot close " + path, errno);
  return "";
}

// Replaces `dir`/`name` by `text` unless it already holds exactly that: written to
// `.tmp-<name>.<pid>.<hex>`, fsync'd, renamed, the directory fsync'd. "" or an error.
inline std::string ReplaceFileIfChanged(const std::string& dir, const std::string& name,
                                        const std::string& text) {
  const std::string path = dir + "/" + name;
  std::string error;
  bool missing = false;
  if (std::optional<std::string> current = ReadFile(path, &error, &missing); current == text) {
    return "";
  }
  const std::string temp = dir + "/" + kTempPrefix + name + "." + std::to_string(::getpid()) +
                           "." + RandomHex8();
  if (std::string failed = WriteNewFile(temp, text); !failed.empty()) {
    ::unlink(temp.c_str());
    return failed;
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    std::string failed = ErrnoText("cannot rename " + temp + " to " + path, errno);
    ::unlink(temp.c_str());
    return failed;
  }
  if (!FsyncDir(dir)) return ErrnoText("cannot fsync directory " + dir, errno);
  return "";
}

// A metric as JSON: the shortest text that reads back as the same double.
inline std::string JsonNumber(double value) {
  char text[40];
  for (int precision = 15; precision <= 17; ++precision) {
    std::snprintf(text, sizeof(text), "%.*g", precision, value);
    if (std::strtod(text, nullptr) == value) break;
  }
  return text;
}

// The files of a version: (name, bytes), model.pt among them. "" or an error.
inline std::string ReadModelFiles(const std::string& model_path,
                                  std::vector<std::pair<std::string, std::string>>* files) {
  struct stat st;
  if (::stat(model_path.c_str(), &st) != 0) {
    return ErrnoText("PublishModel: cannot read the model " + model_path, errno);
  }
  std::string error;
  bool missing = false;
  if (S_ISREG(st.st_mode)) {
    std::optional<std::string> bytes = ReadFile(model_path, &error, &missing);
    if (!bytes) return "PublishModel: " + error;
    files->emplace_back("model.pt", std::move(*bytes));
  } else if (S_ISDIR(st.st_mode)) {
    DIR* d = ::opendir(model_path.c_str());
    if (!d) return ErrnoText("PublishModel: cannot list " + model_path, errno);
    std::vector<std::string> names;
    while (struct dirent* e = ::readdir(d)) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
        names.emplace_back(e->d_name);
      }
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    for (const std::string& name : names) {
      const std::string path = model_path + "/" + name;
      struct stat entry;
      if (::stat(path.c_str(), &entry) != 0 || !S_ISREG(entry.st_mode)) {
        return "PublishModel: " + path + " is not a regular file; a version is a directory of "
               "files (model.pt and what it needs)";
      }
      std::optional<std::string> bytes = ReadFile(path, &error, &missing);
      if (!bytes) return "PublishModel: " + error;
      files->emplace_back(name, std::move(*bytes));
    }
  } else {
    return "PublishModel: " + model_path + " is neither a file nor a directory";
  }
  auto model = std::find_if(files->begin(), files->end(),
                            [](const auto& f) { return f.first == "model.pt"; });
  if (model == files->end()) {
    return "PublishModel: " + model_path + " has no model.pt (the file shoal serve loads)";
  }
  if (model->second.compare(0, 2, "PK") != 0) {
    return "PublishModel: " + (S_ISDIR(st.st_mode) ? model_path + "/model.pt" : model_path) +
           " is not a TorchScript archive (save one with torch::jit::Module::save or "
           "torch.jit.script(module).save(path))";
  }
  return "";
}

// The checks PublishModel makes before it writes anything. "" or an error.
inline std::string CheckPublishArguments(const std::string& name, const PublishOptions& options,
                                         const std::string& repository, unsigned* keep) {
  if (repository.empty()) {
    return std::string("PublishModel: no repository: set PublishOptions::repository, or ") +
           kModelRepositoryEnv + " (a job's `publish: {repository: DIR}` sets it for every task)";
  }
  if (UnsupportedUri(repository)) {
    return "PublishModel: the repository " + repository + " is a " + UriScheme(repository) +
           ":// URI; the C++ SDK publishes to local directories";
  }
  bool name_ok = !name.empty() && name[0] != '.' && name.size() <= 255 &&
                 std::all_of(name.begin(), name.end(), [](char c) {
                   return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                          (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
                 });
  if (!name_ok) {
    return "PublishModel: model name '" + name + "' must be letters, digits, '_', '-' and '.', "
           "not starting with '.' (it appears in URLs)";
  }
  struct stat st;
  if (!IsHdfs(repository) && (::stat(repository.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))) {
    return "PublishModel: the repository " + repository + " is not a directory";
  }
  *keep = 0;
  if (const char* text = std::getenv(kModelKeepEnv); text && *text) {
    char* end = nullptr;
    long value = std::strtol(text, &end, 10);
    if (*end != '\0' || value < 1 || value > 1000000) {
      return std::string("PublishModel: ") + kModelKeepEnv + "='" + text +
             "' must be an integer >= 1 (the job file's publish.keep)";
    }
    *keep = static_cast<unsigned>(value);
  }
  if (options.step && *options.step > static_cast<uint64_t>(INT64_MAX)) {
    return "PublishModel: step " + std::to_string(*options.step) + " is beyond 2^63 - 1";
  }
  if (options.metrics.size() > kMaxPublishMetrics) {
    return "PublishModel: metrics has " + std::to_string(options.metrics.size()) +
           " entries; at most " + std::to_string(kMaxPublishMetrics) + " are recorded";
  }
  for (const auto& [metric, value] : options.metrics) {
    if (metric.empty() || metric.size() > kMaxPublishMetricNameBytes) {
      return "PublishModel: metric name '" + metric + "' must be 1 to " +
             std::to_string(kMaxPublishMetricNameBytes) + " bytes";
    }
    if (!std::isfinite(value)) {
      return "PublishModel: metric '" + metric + "' must be a finite number, not " +
             JsonNumber(value);
    }
  }
  return "";
}

// The `published` report's fields after op, task and attempt.
inline std::string PublishedFields(const std::string& name, uint64_t version,
                                   const std::string& repository, const PublishOptions& options) {
  std::string fields = "\"model\":" + JsonString(name) + ",\"version\":" +
                       std::to_string(version) + ",\"repository\":" + JsonString(repository) +
                       ",\"metrics\":{";
  bool first = true;
  for (const auto& [metric, value] : options.metrics) {
    fields += (first ? "" : ",") + JsonString(metric) + ":" + JsonNumber(value);
    first = false;
  }
  fields += "}";
  if (options.step) fields += ",\"step\":" + std::to_string(*options.step);
  return fields;
}

inline std::string AbsolutePath(const std::string& path) {
  if (!path.empty() && path[0] == '/') return path;
  char cwd[4096];
  if (::getcwd(cwd, sizeof(cwd)) == nullptr) return path;
  return std::string(cwd) + "/" + path;
}


}  // namespace internal
}  // namespace shoal::sdk
