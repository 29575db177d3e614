// Shoal's training SDK for C++: crash-safe checkpoint files and reports to the node's agent.
//
// Header-only, C++17, POSIX (Linux for abstract socket addresses), nothing beyond the standard
// library and libc. The Python SDK (sdk/python/shoal) is the reference; this header speaks the
// same protocol (docs/sdk-protocol.md) and writes the same files (docs/sdk.md), so either
// language loads the other's checkpoints (Python with `serializer="raw"`).
//
// Two independent layers:
// - Checkpoint files: SaveCheckpoint / LoadLatestCheckpoint / ListCheckpoints. They never talk
//   to the agent: after a save call ReportCheckpointed(step); after loading (or finding
//   nothing) call ReportResumed(step or 0), which the master waits for after a group restart
//   before handing out data shards.
// - Reports: ReportProgress / ReportCheckpointed (fire-and-forget) and ReportResumed (waits for
//   the agent's answer). No-ops when SHOAL_AGENT_SOCKET is unset (not started by Shoal).
//
// Errors are values: nothing here throws (beyond std::bad_alloc). SaveCheckpoint returns a
// SaveResult, ReportResumed a ReportResult; fire-and-forget reports and skipped corrupt
// checkpoints print one line to stderr.
//
// Thread-safety: every function may be called from any thread. The agent connection is one per
// process, guarded by a mutex, and re-made in a forked child (a pthread_atfork handler takes the
// mutex around fork(), so a fork waits for a ReportResumed in flight on another thread).
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shoal::sdk {

// The outcome of SaveCheckpoint: `path` when ok, else `error`.
struct SaveResult {
  bool ok = false;
  std::string path;
  std::string error;
  explicit operator bool() const { return ok; }
};

// The outcome of a report that waits for the agent's answer.
struct ReportResult {
  bool ok = true;
  std::string error;
  explicit operator bool() const { return ok; }
};

// Checkpoint files are `ckpt-<step, 12 digits zero-padded>.pt` (wider for steps >= 10^12);
// in-progress writes are `.tmp-*` files in the same directory and are never loaded.
inline constexpr unsigned kDefaultCheckpointKeep = 3;
inline constexpr const char* kTempPrefix = ".tmp-";
// Test hook (also read by the Python SDK): seconds to sleep after writing half of the bytes.
inline constexpr const char* kTestWriteDelayEnv = "SHOAL_TEST_CHECKPOINT_WRITE_DELAY_S";
// How long ReportResumed waits for the answer, and a send may block on a full socket.
inline constexpr int kReplyTimeoutMs = 30000;

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

inline std::string ErrnoText(const std::string& what, int err) {
  return what + ": " + std::strerror(err);
}

// The scheme of a directory given as a URI ("hdfs" for hdfs://nn/ckpt), else "". This header
// reads and writes local directories only; a URI taken for a path would silently create a
// local directory named "hdfs:" and start training from scratch.
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

inline std::string NotLocalError(const std::string& dir) {
  return "checkpoint directory " + dir + " is a " + UriScheme(dir) +
         ":// URI; the C++ SDK reads and writes local directories only (the Python SDK "
         "reads and writes hdfs:// through WebHDFS: docs/sdk.md)";
}

inline bool WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

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

inline double TestWriteDelaySeconds() {
  const char* value = std::getenv(kTestWriteDelayEnv);
  if (!value || !*value) return 0;
  double seconds = std::strtod(value, nullptr);
  return seconds > 0 ? seconds : 0;
}

inline void SleepSeconds(double seconds) {
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(seconds);
  ts.tv_nsec = static_cast<long>((seconds - static_cast<double>(ts.tv_sec)) * 1e9);
  while (::nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
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

// The steps of the complete checkpoints in `dir`, ascending (empty when `dir` does not exist).
inline std::vector<uint64_t> ListCheckpoints(const std::string& dir) {
  std::vector<uint64_t> steps;
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
  if (!internal::UriScheme(dir).empty()) {
    result.error = internal::NotLocalError(dir);
    return result;
  }
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
  if (!internal::UriScheme(dir).empty()) {
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

namespace internal {

inline std::string JsonString(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", static_cast<unsigned>(c));
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

inline size_t SkipSpace(std::string_view text, size_t pos) {
  while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\t' || text[pos] == '\r')) ++pos;
  return pos;
}

// Where the value of the top-level-looking key `"key":` starts in a one-line JSON object, or
// npos. Enough for the agent's flat replies (`{"ok":false,"error":"..."}`).
inline size_t FindValue(std::string_view json, std::string_view key) {
  std::string quoted = JsonString(key);
  for (size_t pos = json.find(quoted); pos != std::string_view::npos;
       pos = json.find(quoted, pos + 1)) {
    size_t colon = SkipSpace(json, pos + quoted.size());
    if (colon < json.size() && json[colon] == ':') return SkipSpace(json, colon + 1);
  }
  return std::string_view::npos;
}

inline bool ReplyOk(std::string_view json) {
  size_t value = FindValue(json, "ok");
  return value != std::string_view::npos && json.substr(value, 4) == "true";
}

inline std::string ReplyError(std::string_view json) {
  size_t pos = FindValue(json, "error");
  if (pos == std::string_view::npos || json[pos] != '"') return "no reason given";
  std::string out;
  for (++pos; pos < json.size() && json[pos] != '"'; ++pos) {
    if (json[pos] == '\\' && pos + 1 < json.size()) {
      char c = json[++pos];
      out += c == 'n' ? '\n' : c == 't' ? '\t' : c;
    } else {
      out += json[pos];
    }
  }
  return out;
}

// The process's connection to the agent. One per process; every member is guarded by `mu`.
class AgentClient {
 public:
  static AgentClient& Get() {
    static AgentClient* client = [] {
      auto* c = new AgentClient();  // never destroyed: usable until the process exits
      ::pthread_atfork([] { Get().mu_.lock(); }, [] { Get().mu_.unlock(); },
                       [] {
                         AgentClient& self = Get();
                         self.mu_.unlock();
                         self.ResetLocked();  // never write to the parent's connection
                       });
      return c;
    }();
    return *client;
  }

  // Fire-and-forget. Never fails: a broken connection is re-made once, then reports are
  // disabled for the process with one warning.
  void Report(const char* op, uint64_t step) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!Refresh() || reports_disabled_) return;
    std::string line = Line(op, step);
    std::string error;
    if (SendLocked(line, &error)) return;
    CloseLocked();
    if (SendLocked(line, &error)) return;
    CloseLocked();
    reports_disabled_ = true;
    std::fprintf(stderr,
                 "shoal: cannot reach the Shoal agent at %s (%s); progress and checkpoint "
                 "reports are disabled for this process\n",
                 address_.c_str(), error.c_str());
  }

  ReportResult Request(const char* op, uint64_t step) {
    std::lock_guard<std::mutex> lock(mu_);
    ReportResult result;
    if (!Refresh()) return result;  // not started by Shoal: nothing to tell
    std::string line = Line(op, step);
    std::string error;
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::string reply;
      bool timed_out = false;
      if (SendLocked(line, &error) && ReadLineLocked(&reply, &error, &timed_out)) {
        result.ok = ReplyOk(reply);
        if (!result.ok) {
          result.error = std::string("the Shoal agent refused '") + op + "': " + ReplyError(reply);
        }
        return result;
      }
      CloseLocked();
      if (timed_out) break;
    }
    result.ok = false;
    result.error = std::string("cannot get an answer to '") + op + "' from the Shoal agent at " +
                   address_ + ": " + error;
    return result;
  }

 private:
  AgentClient() = default;

  // Re-reads SHOAL_AGENT_SOCKET (and the task's identity when it changed or after a fork).
  // False when it is unset.
  bool Refresh() {
    const char* address = std::getenv("SHOAL_AGENT_SOCKET");
    if (!address || !*address) return false;
    if (pid_ == ::getpid() && address_ == address) return true;
    CloseLocked();
    pid_ = ::getpid();
    address_ = address;
    reports_disabled_ = false;
    const char* role = std::getenv("SHOAL_ROLE");
    const char* index = std::getenv("SHOAL_INDEX");
    const char* attempt = std::getenv("SHOAL_RESTART_COUNT");
    task_json_ = JsonString(std::string(role ? role : "") + ":" + (index && *index ? index : "0"));
    attempt_ = attempt ? std::strtoll(attempt, nullptr, 10) : 0;
    return true;
  }

  void ResetLocked() {
    CloseLocked();
    pid_ = -1;
    address_.clear();
  }

  std::string Line(const char* op, uint64_t step) const {
    return std::string("{\"op\":\"") + op + "\",\"task\":" + task_json_ +
           ",\"attempt\":" + std::to_string(attempt_) + ",\"step\":" + std::to_string(step) +
           "}\n";
  }

  void CloseLocked() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    buffer_.clear();
  }

  bool ConnectLocked(std::string* error) {
    struct sockaddr_un addr;
    std::memset(&addr, 0, sizeof(addr));
    addr.sun_family = AF_UNIX;
    socklen_t len;
    if (address_[0] == '@') {
      std::string_view name = std::string_view(address_).substr(1);
      if (name.size() + 1 > sizeof(addr.sun_path)) {
        *error = "socket address too long";
        return false;
      }
      std::memcpy(addr.sun_path + 1, name.data(), name.size());
      len = static_cast<socklen_t>(offsetof(struct sockaddr_un, sun_path) + 1 + name.size());
    } else {
      if (address_.size() + 1 > sizeof(addr.sun_path)) {
        *error = "socket path too long";
        return false;
      }
      std::memcpy(addr.sun_path, address_.data(), address_.size());
      len = static_cast<socklen_t>(offsetof(struct sockaddr_un, sun_path) + address_.size() + 1);
    }
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      *error = ErrnoText("socket", errno);
      return false;
    }
    struct timeval tv;
    tv.tv_sec = kReplyTimeoutMs / 1000;
    tv.tv_usec = (kReplyTimeoutMs % 1000) * 1000;
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    int rc;
    do {
      rc = ::connect(fd, reinterpret_cast<struct sockaddr*>(&addr), len);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      *error = ErrnoText("connect", errno);
      ::close(fd);
      return false;
    }
    fd_ = fd;
    buffer_.clear();
    return true;
  }

  bool SendLocked(const std::string& line, std::string* error) {
    if (fd_ < 0 && !ConnectLocked(error)) return false;
    const char* data = line.data();
    size_t size = line.size();
    while (size > 0) {
      ssize_t n = ::send(fd_, data, size, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        *error = ErrnoText("send", errno);
        return false;
      }
      data += n;
      size -= static_cast<size_t>(n);
    }
    return true;
  }

  bool ReadLineLocked(std::string* line, std::string* error, bool* timed_out) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kReplyTimeoutMs);
    while (true) {
      size_t end = buffer_.find('\n');
      if (end != std::string::npos) {
        *line = buffer_.substr(0, end);
        buffer_.erase(0, end + 1);
        return true;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      deadline - std::chrono::steady_clock::now())
                      .count();
      struct pollfd pfd = {fd_, POLLIN, 0};
      int ready = left > 0 ? ::poll(&pfd, 1, static_cast<int>(left)) : 0;
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0) {
        *error = "no answer within " + std::to_string(kReplyTimeoutMs / 1000) + "s";
        *timed_out = true;
        return false;
      }
      if (ready < 0) {
        *error = ErrnoText("poll", errno);
        return false;
      }
      char chunk[4096];
      ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        *error = ErrnoText("recv", errno);
        return false;
      }
      if (n == 0) {
        *error = "the agent closed the connection";
        return false;
      }
      buffer_.append(chunk, static_cast<size_t>(n));
    }
  }

  std::mutex mu_;
  pid_t pid_ = -1;
  std::string address_;
  std::string task_json_;
  long long attempt_ = 0;
  int fd_ = -1;
  bool reports_disabled_ = false;
  std::string buffer_;
};

}  // namespace internal

// Reports that training step `step` completed (fire-and-forget; one send on the process's
// cached connection). Arms the role's hang watchdog and extends this task's shard leases.
inline void ReportProgress(uint64_t step) {
  internal::AgentClient::Get().Report("progress", step);
}

// Reports that the checkpoint of `step` is durable (fire-and-forget). Call after SaveCheckpoint.
inline void ReportCheckpointed(uint64_t step) {
  internal::AgentClient::Get().Report("checkpointed", step);
}

// Reports that the task resumed from the checkpoint of `step` (0: none) and waits up to
// kReplyTimeoutMs for the agent's answer. Ok without an agent (not started by Shoal).
inline ReportResult ReportResumed(uint64_t step) {
  return internal::AgentClient::Get().Request("resumed", step);
}

}  // namespace shoal::sdk
