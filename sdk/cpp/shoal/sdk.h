// Shoal's training SDK for C++: crash-safe checkpoint files and reports to the node's agent.
//
// Header-only, C++17, POSIX (Linux for abstract socket addresses), nothing beyond the standard
// library and libc. A checkpoint directory is a local path or hdfs://namenode[:port]/path,
// read and written through WebHDFS (a minimal HTTP/1.1 client here, as the Python SDK's
// WebHdfsStorage). The Python SDK (sdk/python/shoal) is the reference; this header speaks the
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
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
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

// ---- hdfs:// checkpoint directories through WebHDFS (the Python SDK's WebHdfsStorage) ----

// How long one WebHDFS connect, send or receive may wait for progress.
inline constexpr int kWebHdfsTimeoutMs = 30000;

// An hdfs://namenode[:port]/path directory, resolved to the NameNode's WebHDFS address.
struct HdfsDir {
  std::string uri;   // as given, without trailing '/'
  std::string base;  // "http://host:port" (WebHDFS), without trailing '/'
  std::string path;  // absolute, without trailing '/' ("/" for the root)
  std::string user;
};

// Parses `uri`; `webhdfs` is the NameNode's HTTP address ("" for $SHOAL_WEBHDFS, else the
// NameNode's host on port 9870). nullopt with `error` set when `uri` is not hdfs://host/path.
inline std::optional<HdfsDir> ParseHdfsDir(const std::string& uri, const std::string& webhdfs,
                                           std::string* error) {
  constexpr std::string_view kScheme = "hdfs://";
  if (uri.compare(0, kScheme.size(), kScheme) != 0) {
    *error = "not an hdfs://namenode/path URI: " + uri;
    return std::nullopt;
  }
  size_t slash = uri.find('/', kScheme.size());
  std::string authority = uri.substr(kScheme.size(), slash == std::string::npos
                                                         ? std::string::npos
                                                         : slash - kScheme.size());
  std::string host = authority;
  if (size_t at = host.rfind('@'); at != std::string::npos) host = host.substr(at + 1);
  if (!host.empty() && host[0] == '[') {
    size_t close = host.find(']');
    host = close == std::string::npos ? "" : host.substr(0, close + 1);
  } else if (size_t colon = host.find(':'); colon != std::string::npos) {
    host = host.substr(0, colon);
  }
  if (host.empty() || slash == std::string::npos) {
    *error = "not an hdfs://namenode/path URI: " + uri;
    return std::nullopt;
  }
  HdfsDir dir;
  dir.uri = uri;
  while (dir.uri.size() > 1 && dir.uri.back() == '/') dir.uri.pop_back();
  dir.path = uri.substr(slash);
  if (size_t q = dir.path.find_first_of("?#"); q != std::string::npos) dir.path.resize(q);
  while (dir.path.size() > 1 && dir.path.back() == '/') dir.path.pop_back();
  if (dir.path.empty()) dir.path = "/";
  std::string base = webhdfs;
  if (base.empty()) {
    const char* env = std::getenv("SHOAL_WEBHDFS");
    base = env && *env ? env : "http://" + host + ":9870";
  }
  while (!base.empty() && base.back() == '/') base.pop_back();
  dir.base = base;
  // As Python's: HADOOP_USER_NAME, else getpass.getuser()'s environment, else the passwd entry.
  for (const char* name : {"HADOOP_USER_NAME", "LOGNAME", "USER", "LNAME", "USERNAME"}) {
    const char* value = std::getenv(name);
    if (value && *value) {
      dir.user = value;
      break;
    }
  }
  if (dir.user.empty()) {
    struct passwd pw;
    struct passwd* found = nullptr;
    char buffer[4096];
    if (::getpwuid_r(::getuid(), &pw, buffer, sizeof(buffer), &found) == 0 && found) {
      dir.user = found->pw_name;
    } else {
      dir.user = std::to_string(static_cast<long>(::getuid()));
    }
  }
  return dir;
}

// Percent-encodes `text`; `keep_slash` for paths (as Python's urllib.parse.quote), else for
// query values (as urlencode, but %20 for a space).
inline std::string PercentEncode(std::string_view text, bool keep_slash) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (char ch : text) {
    unsigned char c = static_cast<unsigned char>(ch);
    bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/');
    if (plain) {
      out += ch;
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// The WebHDFS URL of `op` on `path`; `params` are (name, value) pairs added to the query.
inline std::string WebHdfsUrl(const HdfsDir& dir, const std::string& path, const char* op,
                              const std::vector<std::pair<std::string, std::string>>& params = {}) {
  std::string url = dir.base + "/webhdfs/v1" + PercentEncode(path, true) + "?op=" + op +
                    "&user.name=" + PercentEncode(dir.user, false);
  for (const auto& [name, value] : params) url += "&" + name + "=" + PercentEncode(value, false);
  return url;
}

// Decodes a chunked transfer-encoding body. nullopt when it is malformed or incomplete.
inline std::optional<std::string> DecodeChunked(std::string_view body) {
  std::string out;
  size_t pos = 0;
  while (true) {
    size_t eol = body.find("\r\n", pos);
    if (eol == std::string_view::npos) return std::nullopt;
    std::string size_text(body.substr(pos, eol - pos));
    if (size_t semi = size_text.find(';'); semi != std::string::npos) size_text.resize(semi);
    if (size_text.empty()) return std::nullopt;
    char* end = nullptr;
    unsigned long long size = std::strtoull(size_text.c_str(), &end, 16);
    while (*end == ' ' || *end == '\t') ++end;
    if (*end != '\0') return std::nullopt;
    pos = eol + 2;
    if (size == 0) return out;  // trailers, if any, are ignored
    if (body.size() - pos < size + 2) return std::nullopt;
    out.append(body.data() + pos, static_cast<size_t>(size));
    pos += static_cast<size_t>(size);
    if (body.substr(pos, 2) != "\r\n") return std::nullopt;
    pos += 2;
  }
}

// A JSON string literal starting at json[pos] ('"'), decoded (\uXXXX as UTF-8, BMP only);
// `pos` is left after it. nullopt when malformed.
inline std::optional<std::string> ParseJsonString(std::string_view json, size_t* pos) {
  if (*pos >= json.size() || json[*pos] != '"') return std::nullopt;
  std::string out;
  for (size_t i = *pos + 1; i < json.size(); ++i) {
    char c = json[i];
    if (c == '"') {
      *pos = i + 1;
      return out;
    }
    if (c != '\\') {
      out += c;
      continue;
    }
    if (++i >= json.size()) return std::nullopt;
    switch (json[i]) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'u': {
        if (i + 4 >= json.size()) return std::nullopt;
        unsigned code = static_cast<unsigned>(
            std::strtoul(std::string(json.substr(i + 1, 4)).c_str(), nullptr, 16));
        i += 4;
        if (code < 0x80) {
          out += static_cast<char>(code);
        } else if (code < 0x800) {
          out += static_cast<char>(0xC0 | (code >> 6));
          out += static_cast<char>(0x80 | (code & 0x3F));
        } else {
          out += static_cast<char>(0xE0 | (code >> 12));
          out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
          out += static_cast<char>(0x80 | (code & 0x3F));
        }
        break;
      }
      default: out += json[i];
    }
  }
  return std::nullopt;
}

// An entry of a LISTSTATUS answer.
struct HdfsEntry {
  std::string name;  // pathSuffix
  bool is_file = false;
  long long modification_time = 0;  // ms since the epoch
};

// The entries of a LISTSTATUS answer ({"FileStatuses":{"FileStatus":[{...},...]}}): each
// object's pathSuffix, type and modificationTime. WebHDFS's objects are flat.
inline std::vector<HdfsEntry> ParseFileStatuses(std::string_view json) {
  std::vector<HdfsEntry> entries;
  size_t pos = json.find("\"FileStatus\"");
  if (pos == std::string_view::npos) return entries;
  pos = json.find('[', pos);
  if (pos == std::string_view::npos) return entries;
  while (true) {
    size_t open = json.find_first_of("{]", pos);
    if (open == std::string_view::npos || json[open] == ']') break;
    // Find the object's end, skipping strings.
    size_t i = open + 1;
    HdfsEntry entry;
    bool named = false;
    while (i < json.size() && json[i] != '}') {
      if (json[i] != '"') {
        ++i;
        continue;
      }
      std::optional<std::string> key = ParseJsonString(json, &i);
      if (!key) return entries;
      size_t colon = SkipSpace(json, i);
      if (colon >= json.size() || json[colon] != ':') continue;
      i = SkipSpace(json, colon + 1);
      if (i < json.size() && json[i] == '"') {
        std::optional<std::string> value = ParseJsonString(json, &i);
        if (!value) return entries;
        if (*key == "pathSuffix") {
          entry.name = *value;
          named = true;
        } else if (*key == "type") {
          entry.is_file = *value == "FILE";
        }
      } else if (*key == "modificationTime") {
        entry.modification_time = std::strtoll(std::string(json.substr(i, 24)).c_str(), nullptr, 10);
      }
    }
    if (named) entries.push_back(std::move(entry));
    pos = i + 1;
  }
  return entries;
}

// The message of a WebHDFS error answer ({"RemoteException":{...,"message":"..."}}), else
// the body's start.
inline std::string RemoteExceptionMessage(std::string_view body) {
  size_t pos = body.find("\"RemoteException\"");
  if (pos != std::string_view::npos) {
    size_t value = FindValue(body.substr(pos), "message");
    if (value != std::string_view::npos) {
      size_t at = pos + value;
      if (std::optional<std::string> message = ParseJsonString(body, &at)) return *message;
    }
  }
  std::string text(body.substr(0, 300));
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text.empty() ? "no message" : text;
}

// The value of {"boolean": true|false}; nullopt when absent.
inline std::optional<bool> JsonBoolean(std::string_view json) {
  size_t value = FindValue(json, "boolean");
  if (value == std::string_view::npos) return std::nullopt;
  if (json.substr(value, 4) == "true") return true;
  if (json.substr(value, 5) == "false") return false;
  return std::nullopt;
}

struct HttpResponse {
  int status = 0;
  std::string location;
  std::string body;
};

// Blocks until `fd` is ready for `events` or the deadline. "" or an error.
inline std::string WaitFd(int fd, short events,
                          std::chrono::steady_clock::time_point deadline) {
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) return "timed out after " + std::to_string(kWebHdfsTimeoutMs / 1000) + "s";
    struct pollfd pfd = {fd, events, 0};
    int ready = ::poll(&pfd, 1, static_cast<int>(left));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return ErrnoText("poll", errno);
    if (ready > 0) return "";
  }
}

// Connects to host:port within the timeout. The socket, or -1 with `error` set.
inline int ConnectTcp(const std::string& host, const std::string& port, std::string* error) {
  struct addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* found = nullptr;
  int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
  if (rc != 0) {
    *error = "cannot resolve " + host + ": " + ::gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (struct addrinfo* a = found; a != nullptr; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      *error = ErrnoText("socket", errno);
      continue;
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kWebHdfsTimeoutMs);
    int c = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (c != 0 && errno == EINPROGRESS) {
      std::string wait = WaitFd(fd, POLLOUT, deadline);
      if (wait.empty()) {
        int err = 0;
        socklen_t len = sizeof(err);
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err == 0) break;
        *error = ErrnoText("cannot connect to " + host + ":" + port, err);
      } else {
        *error = "cannot connect to " + host + ":" + port + ": " + wait;
      }
    } else if (c == 0) {
      break;
    } else {
      *error = ErrnoText("cannot connect to " + host + ":" + port, errno);
    }
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(found);
  return fd;
}

// Where the final answer starts in `raw`, after any complete interim 1xx answers ("100
// Continue", which DataNodes send before reading a CREATE's body).
inline size_t SkipInterimAnswers(std::string_view raw) {
  size_t start = 0;
  while (raw.size() - start > 12 && raw.substr(start, 5) == "HTTP/") {
    size_t space = raw.find(' ', start);
    if (space == std::string_view::npos || space + 1 >= raw.size() || raw[space + 1] != '1') break;
    size_t end = raw.find("\r\n\r\n", start);
    if (end == std::string_view::npos) break;
    start = end + 4;
  }
  return start;
}

// One HTTP/1.1 request (Connection: close), no redirects followed. "" or an error.
inline std::string HttpOnce(const std::string& method, const std::string& url,
                            std::string_view body, HttpResponse* response) {
  constexpr std::string_view kHttp = "http://";
  if (url.compare(0, kHttp.size(), kHttp) != 0) return "not an http:// URL";
  size_t slash = url.find('/', kHttp.size());
  std::string authority = url.substr(kHttp.size(), slash == std::string::npos
                                                       ? std::string::npos
                                                       : slash - kHttp.size());
  std::string target = slash == std::string::npos ? "/" : url.substr(slash);
  std::string host = authority, port = "80";
  if (!host.empty() && host[0] == '[') {
    size_t close = host.find(']');
    if (close == std::string::npos) return "bad host in URL";
    if (close + 1 < host.size() && host[close + 1] == ':') port = host.substr(close + 2);
    host = host.substr(1, close - 1);
  } else if (size_t colon = host.rfind(':'); colon != std::string::npos) {
    port = host.substr(colon + 1);
    host = host.substr(0, colon);
  }
  if (host.empty()) return "no host in URL";
  std::string error;
  int fd = ConnectTcp(host, port, &error);
  if (fd < 0) return error;
  // Each wait gets the whole timeout: a large checkpoint may take long, a stalled peer may not.
  auto deadline = [] {
    return std::chrono::steady_clock::now() + std::chrono::milliseconds(kWebHdfsTimeoutMs);
  };
  std::string request = method + " " + target + " HTTP/1.1\r\nHost: " + authority +
                        "\r\nConnection: close\r\nContent-Length: " + std::to_string(body.size()) +
                        "\r\n";
  if (!body.empty()) request += "Content-Type: application/octet-stream\r\n";
  request += "\r\n";
  auto send_all = [&](std::string_view data) -> std::string {
    while (!data.empty()) {
      if (std::string wait = WaitFd(fd, POLLOUT, deadline()); !wait.empty()) return wait;
      ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return ErrnoText("send", errno);
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    return "";
  };
  std::string sent = send_all(request);
  if (sent.empty()) sent = send_all(body);
  // A server may answer (a redirect, an error) before reading the body: read its answer anyway.
  std::string raw;
  std::string read_error;
  while (true) {
    if (std::string wait = WaitFd(fd, POLLIN, deadline()); !wait.empty()) {
      read_error = wait;
      break;
    }
    char chunk[1 << 16];
    ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      read_error = ErrnoText("recv", errno);
      break;
    }
    if (n == 0) break;
    raw.append(chunk, static_cast<size_t>(n));
    // Stop once a Content-Length body is complete (the server may keep the connection).
    size_t start = SkipInterimAnswers(raw);
    size_t head_end = raw.find("\r\n\r\n", start);
    if (head_end != std::string::npos) {
      std::string head = raw.substr(start, head_end - start);
      for (char& c : head) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      size_t cl = head.find("\r\ncontent-length:");
      if (cl != std::string::npos && head.find("\r\ntransfer-encoding:") == std::string::npos) {
        unsigned long long length = std::strtoull(head.c_str() + cl + 17, nullptr, 10);
        if (raw.size() - head_end - 4 >= length) break;
      }
    }
  }
  ::close(fd);
  raw.erase(0, SkipInterimAnswers(raw));
  size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos) {
    if (!read_error.empty()) return read_error;
    return !sent.empty() ? sent : "connection closed before a complete answer";
  }
  std::string_view head(raw.data(), head_end);
  if (head.substr(0, 5) != "HTTP/" || head.find(' ') == std::string_view::npos) {
    return "not an HTTP answer";
  }
  response->status = std::atoi(std::string(head.substr(head.find(' ') + 1, 3)).c_str());
  bool chunked = false;
  long long content_length = -1;
  for (size_t pos = head.find("\r\n"); pos != std::string_view::npos;) {
    size_t next = head.find("\r\n", pos + 2);
    std::string_view line = head.substr(pos + 2, next == std::string_view::npos
                                                     ? std::string_view::npos
                                                     : next - pos - 2);
    pos = next;
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::string name(line.substr(0, colon));
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::string value(line.substr(SkipSpace(line, colon + 1)));
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.pop_back();
    if (name == "location") response->location = value;
    if (name == "content-length") content_length = std::atoll(value.c_str());
    if (name == "transfer-encoding") {
      for (char& c : value) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      chunked = value.find("chunked") != std::string::npos;
    }
  }
  std::string_view rest(raw.data() + head_end + 4, raw.size() - head_end - 4);
  if (chunked) {
    std::optional<std::string> decoded = DecodeChunked(rest);
    if (!decoded) return "incomplete chunked answer" + (read_error.empty() ? "" : ": " + read_error);
    response->body = std::move(*decoded);
  } else if (content_length >= 0) {
    if (rest.size() < static_cast<size_t>(content_length)) {
      return "answer shorter than its Content-Length" +
             (read_error.empty() ? "" : ": " + read_error);
    }
    response->body = std::string(rest.substr(0, static_cast<size_t>(content_length)));
  } else {
    if (!read_error.empty()) return read_error;
    response->body = std::string(rest);
  }
  return "";
}

// A WebHDFS call: the request, one 307/302 redirect (NameNode -> DataNode) followed. Returns ""
// with `response` (any status), or an error naming the op and URL.
inline std::string WebHdfsCall(const std::string& method, const std::string& url, const char* op,
                               std::string_view body, HttpResponse* response) {
  std::string target = url;
  for (int hop = 0; hop < 2; ++hop) {
    *response = HttpResponse();
    // The NameNode answers CREATE's redirect without reading a body: send it only to the
    // DataNode (WebHDFS's two-step create).
    bool to_namenode = hop == 0 && !body.empty();
    std::string error = HttpOnce(method, target, to_namenode ? std::string_view() : body, response);
    if (!error.empty()) return "WebHDFS " + std::string(op) + " " + target + ": " + error;
    bool redirect = response->status == 307 || response->status == 302 ||
                    response->status == 303 || response->status == 301 ||
                    response->status == 308;
    if (!redirect) {
      if (to_namenode && response->status / 100 == 2) {
        // No redirect (a gateway that takes the data itself): send it with the body.
        continue;
      }
      return "";
    }
    if (response->location.empty()) {
      return "WebHDFS " + std::string(op) + " " + target + ": redirect without a Location";
    }
    if (hop == 1) return "WebHDFS " + std::string(op) + " " + url + ": too many redirects";
    target = response->location;
  }
  return "";
}

// "" when `response` is a 2xx, else an error naming the op, URL and HDFS's message.
inline std::string WebHdfsStatusError(const char* op, const std::string& url,
                                      const HttpResponse& response) {
  if (response.status / 100 == 2) return "";
  return "WebHDFS " + std::string(op) + " " + url + ": HTTP " + std::to_string(response.status) +
         ": " + RemoteExceptionMessage(response.body);
}

// The directory's entries; `missing` set when it does not exist. "" or an error.
inline std::string HdfsList(const HdfsDir& dir, std::vector<HdfsEntry>* entries, bool* missing) {
  std::string url = WebHdfsUrl(dir, dir.path, "LISTSTATUS");
  HttpResponse response;
  if (std::string error = WebHdfsCall("GET", url, "LISTSTATUS", {}, &response); !error.empty()) {
    return error;
  }
  *missing = response.status == 404;
  if (*missing) return "";
  if (std::string error = WebHdfsStatusError("LISTSTATUS", url, response); !error.empty()) {
    return error;
  }
  *entries = ParseFileStatuses(response.body);
  return "";
}

inline std::string HdfsJoin(const HdfsDir& dir, const std::string& name) {
  return dir.path == "/" ? "/" + name : dir.path + "/" + name;
}

// The complete checkpoints of an HDFS directory, ascending by step.
inline std::vector<std::pair<uint64_t, std::string>> HdfsCheckpoints(
    const std::vector<HdfsEntry>& entries) {
  std::vector<std::pair<uint64_t, std::string>> checkpoints;
  for (const HdfsEntry& e : entries) {
    if (!e.is_file) continue;
    if (std::optional<uint64_t> step = CheckpointStep(e.name)) checkpoints.emplace_back(*step, e.name);
  }
  std::sort(checkpoints.begin(), checkpoints.end());
  return checkpoints;
}

inline std::string HdfsDelete(const HdfsDir& dir, const std::string& path) {
  std::string url = WebHdfsUrl(dir, path, "DELETE");
  HttpResponse response;
  if (std::string error = WebHdfsCall("DELETE", url, "DELETE", {}, &response); !error.empty()) {
    return error;
  }
  if (response.status == 404) return "";
  return WebHdfsStatusError("DELETE", url, response);
}

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

namespace internal {

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

// The task's progress board (SHOAL_PROGRESS_FILE, docs/sdk-protocol.md): a step is a few
// stores into shared memory that the agent reads when it needs to, so reporting every step
// sends nothing and wakes no one. Mapped once per process; a forked child shares the mapping,
// which is the same task's.
class ProgressBoard {
 public:
  static ProgressBoard& Get() {
    static ProgressBoard* board = new ProgressBoard();  // never destroyed
    return *board;
  }
  // False when there is no board (not run by Shoal, or an agent without one).
  bool Write(uint64_t step) {
    if (words_ == nullptr) return false;
    // words_[1]: sequence, odd while a write is under way; [2]: step; [3]: report time. The
    // agent is another process: GCC/Clang atomics, since this header builds as C++17 too.
    uint64_t odd = __atomic_load_n(&words_[1], __ATOMIC_RELAXED) | 1;
    __atomic_store_n(&words_[1], odd, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    timespec now{};
    ::clock_gettime(CLOCK_MONOTONIC, &now);
    __atomic_store_n(&words_[2], step, __ATOMIC_RELAXED);
    __atomic_store_n(&words_[3],
                     static_cast<uint64_t>(now.tv_sec) * 1000000000ull +
                         static_cast<uint64_t>(now.tv_nsec),
                     __ATOMIC_RELAXED);
    __atomic_store_n(&words_[1], odd + 1, __ATOMIC_RELEASE);
    return true;
  }

 private:
  ProgressBoard() {
    const char* path = std::getenv("SHOAL_PROGRESS_FILE");
    if (path == nullptr || *path == '\0') return;
    int fd = ::open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return;
    void* map = ::mmap(nullptr, 64, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) return;
    if (std::memcmp(map, "SHOALPG1", 8) != 0) {
      ::munmap(map, 64);
      return;
    }
    words_ = static_cast<uint64_t*>(map);
  }
  uint64_t* words_ = nullptr;
};

}  // namespace internal

// Reports that training step `step` completed (fire-and-forget). Under a Shoal agent with a
// progress board this is a few stores to shared memory; otherwise one send on the process's
// cached connection. Arms the role's hang watchdog and extends this task's shard leases.
inline void ReportProgress(uint64_t step) {
  if (internal::ProgressBoard::Get().Write(step)) return;
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
