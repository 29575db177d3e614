#pragma once

// The checkpoint files both SDKs write and read (docs/sdk.md): their names, the temporary
// files of writes in progress, the environment that says where they go and how many are kept,
// and which directories (local paths and hdfs:// URIs) the C++ SDK takes.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

namespace shoal::sdk {

// The outcome of SaveCheckpoint: `path` when ok, else `error`.
struct SaveResult {
  bool ok = false;
  std::string path;
  std::string error;
  explicit operator bool() const { return ok; }
};

// Checkpoint files are `ckpt-<step, 12 digits zero-padded>.pt` (wider for steps >= 10^12);
// in-progress writes are `.tmp-*` files in the same directory and are never loaded.
inline constexpr unsigned kDefaultCheckpointKeep = 3;
inline constexpr const char* kTempPrefix = ".tmp-";
// Test hook (also read by the Python SDK): seconds to sleep after writing half of the bytes.
inline constexpr const char* kTestWriteDelayEnv = "SHOAL_TEST_CHECKPOINT_WRITE_DELAY_S";

// "ckpt-000000000200.pt".
inline std::string CheckpointFileName(uint64_t step) {
  char name[48];
  std::snprintf(name, sizeof(name), "ckpt-%012llu.pt", static_cast<unsigned long long>(step));
  return name;
}

// The step of a checkpoint file name, or nullopt when `name` is not one.
inline std::optional<uint64_t> CheckpointStep(std::string_view name) {
  constexpr std::string_view kPrefix = "ckpt-", kSuffix = ".pt";
  if (name.size() <= kPrefix.size() + kSuffix.size() || name.substr(0, kPrefix.size()) != kPrefix ||
      name.substr(name.size() - kSuffix.size()) != kSuffix) {
    return std::nullopt;
  }
  std::string_view digits = name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  uint64_t step = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    uint64_t digit = static_cast<uint64_t>(c - '0');
    if (step > (UINT64_MAX - digit) / 10) return std::nullopt;
    step = step * 10 + digit;
  }
  return step;
}

// SHOAL_CHECKPOINT_DIR, or "" when unset (not started by Shoal, or no `checkpoint` section).
inline std::string CheckpointDirFromEnv() {
  const char* dir = std::getenv("SHOAL_CHECKPOINT_DIR");
  return dir ? dir : "";
}

// SHOAL_CHECKPOINT_KEEP when it is a positive integer, else kDefaultCheckpointKeep.
inline unsigned CheckpointKeepFromEnv() {
  const char* value = std::getenv("SHOAL_CHECKPOINT_KEEP");
  if (!value || !*value) return kDefaultCheckpointKeep;
  char* end = nullptr;
  unsigned long keep = std::strtoul(value, &end, 10);
  if (*end != '\0' || keep < 1 || keep > 1000000) return kDefaultCheckpointKeep;
  return static_cast<unsigned>(keep);
}

namespace internal {

// The scheme of a directory given as a URI ("hdfs" for hdfs://nn/ckpt), else "". hdfs:// goes
// through WebHDFS; any other scheme is refused (taken for a path, it would silently create a
// local directory named "s3:" and start training from scratch).
inline std::string UriScheme(const std::string& dir) {
  size_t colon = dir.find("://");
  if (colon == std::string::npos || colon == 0) return "";
  for (size_t i = 0; i < colon; ++i) {
    char c = dir[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (i > 0 && ((c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.'));
    if (!ok) return "";
  }
  return dir.substr(0, colon);
}

// True for a URI this header cannot read or write (any scheme but hdfs).
inline bool UnsupportedUri(const std::string& dir) {
  std::string scheme = UriScheme(dir);
  return !scheme.empty() && scheme != "hdfs";
}

inline bool IsHdfs(const std::string& dir) { return UriScheme(dir) == "hdfs"; }

inline std::string NotLocalError(const std::string& dir) {
  return "checkpoint directory " + dir + " is a " + UriScheme(dir) +
         ":// URI; the C++ SDK reads and writes local directories and hdfs://namenode/path "
         "(through WebHDFS: docs/sdk.md) only";
}

inline double TestWriteDelaySeconds() {
  const char* value = std::getenv(kTestWriteDelayEnv);
  if (!value || !*value) return 0;
  double seconds = std::strtod(value, nullptr);
  return seconds > 0 ? seconds : 0;
}

}  // namespace internal

}  // namespace shoal::sdk
