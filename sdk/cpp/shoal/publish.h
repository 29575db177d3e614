#pragma once

// Publishing a trained model into a model repository that `shoal serve` watches: the C++ side
// of the Python SDK's `shoal.publish_model` (sdk/python/shoal/publish.py, the reference), with
// the same files, lock and numbering, so that Python and C++ publishers of one model take
// turns and never share a version number (docs/sdk.md, "Publishing models"):
//
// - under `<repository>/<model>/.publish.lock` (flock, held while the number is chosen and the
//   version renamed into place), the files are written into a hidden
//   `<model>/.incoming-<pid>-<8 hex digits>` directory (which the server ignores), each file and
//   the directory fsync'd, then renamed to `<model>/<n>`, n = 1 + the highest version present;
//   a rename refused by an existing version takes the next number;
// - `.incoming-<pid>-*` directories whose process is gone (a publisher killed mid-write) are
//   removed by the next publication of the model;
// - with SHOAL_MODEL_KEEP (the job file's publish.keep) only that many newest versions are
//   left: each older one is renamed to `.removing-<n>-<hex>`, out of the server's view in one
//   step, then deleted;
// - the new version is reported to the agent (`published`, fire-and-forget), which the master
//   journals as model_published; `shoal status` shows the last one. It goes on a connection of
//   its own (AgentClient::ReportAlone), so that an older agent's error answer to the op cannot
//   be taken for the reply to a later ReportResumed.
//
// An hdfs://namenode[:port]/path repository is reached through WebHDFS (webhdfs.h) and has no
// lock; it follows the Python SDK's hdfs_publish.py step for step, with the same names
// (docs/design/0015-hdfs-model-repositories.md): config.yaml replaced by a RENAME when it
// changes; the number claimed by an exclusive CREATE of `<model>/.claims/<v>` (v = 1 + the
// highest version or claim; a taken claim means v + 1); the files (and `.shoal-complete`)
// written into `<model>/.incoming-<host>-<pid>-<hex>/`, renamed to `<model>/<v>` with
// renameoptions=NONE (refused, never merged, when it exists: then the next number is claimed);
// keep pruning by a rename to `.removing-<v>-<hex>` and a delete, claims below the oldest
// version kept deleted, `.incoming-`/`.removing-` leftovers untouched for an hour deleted.

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

inline constexpr const char* kClaimsDir = ".claims";
// How long an `.incoming-`/`.removing-` directory in HDFS stays untouched before pruning takes
// it for a dead publisher's: a live one is never that slow between two files.
inline constexpr long long kHdfsStaleAfterMs = 3600 * 1000LL;

// The PublishModel error for a failed WebHDFS operation, as the Python SDK's _hdfs_failure:
// unreachable (with the variable that fixes the address), permission denied (with the user), or
// what HDFS said. `what` is e.g. "publish m to".
inline std::string HdfsPublishFailure(const HdfsDir& repo, const std::string& what,
                                      const WebHdfsOutcome& outcome) {
  const std::string start = "PublishModel: cannot " + what + " " + repo.uri + ": ";
  if (outcome.unreachable && outcome.address != repo.base) {
    return start + "the DataNode at " + outcome.address +
           " that the NameNode named does not answer (" + outcome.reason + ")";
  }
  if (outcome.unreachable) {
    return start + "the NameNode's WebHDFS at " + repo.base + " is unreachable (" +
           outcome.reason + "); if its HTTP port is not 9870, set SHOAL_WEBHDFS=http://HOST:PORT";
  }
  if (outcome.exception == "AccessControlException") {
    return start + "permission denied for HDFS user '" + repo.user +
           "' (set HADOOP_USER_NAME to publish as another): " + outcome.remote_message;
  }
  return start + outcome.error;
}

// One WebHDFS client bound to a repository: its operations as outcomes.
struct HdfsRepository {
  HdfsDir dir;

  std::string ModelPath(const std::string& name) const { return HdfsJoin(dir, name); }

  WebHdfsOutcome Op(const char* method, const std::string& path, const char* op,
                    const std::vector<std::pair<std::string, std::string>>& params = {},
                    std::string_view body = {}) const {
    return WebHdfsOp(method, WebHdfsUrl(dir, path, op, params), op, body);
  }
  // LISTSTATUS; a missing directory lists nothing.
  WebHdfsOutcome List(const std::string& path, std::vector<HdfsEntry>* entries) const {
    entries->clear();
    WebHdfsOutcome outcome = Op("GET", path, "LISTSTATUS");
    if (outcome.status == 404) return WebHdfsOutcome();
    if (outcome.ok()) *entries = ParseFileStatuses(outcome.body);
    return outcome;
  }
  WebHdfsOutcome Create(const std::string& path, std::string_view bytes, bool overwrite) const {
    return Op("PUT", path, "CREATE", {{"overwrite", overwrite ? "true" : "false"}}, bytes);
  }
  // RENAME (HDFS's rename2: renameoptions=NONE refuses an existing destination with
  // FileAlreadyExistsException; without options WebHDFS would move `from` INTO an existing
  // directory). A `false` answer becomes an error.
  WebHdfsOutcome Rename(const std::string& from, const std::string& to, bool overwrite) const {
    WebHdfsOutcome outcome = Op("PUT", from, "RENAME",
                                {{"destination", to},
                                 {"renameoptions", overwrite ? "OVERWRITE" : "NONE"}});
    if (outcome.ok() && JsonBoolean(outcome.body) == false) {
      outcome.error = "WebHDFS could not rename " + from + " to " + to;
    }
    return outcome;
  }
  WebHdfsOutcome Delete(const std::string& path, bool recursive) const {
    WebHdfsOutcome outcome =
        Op("DELETE", path, "DELETE", {{"recursive", recursive ? "true" : "false"}});
    return outcome.status == 404 ? WebHdfsOutcome() : outcome;
  }
};

// The numeric names among `entries` of one kind (directories: versions; files: claims),
// ascending.
inline std::vector<uint64_t> HdfsNumbers(const std::vector<HdfsEntry>& entries, bool files) {
  std::vector<uint64_t> numbers;
  for (const HdfsEntry& e : entries) {
    if (e.is_file != files) continue;
    if (uint64_t v = VersionOf(e.name.c_str())) numbers.push_back(v);
  }
  std::sort(numbers.begin(), numbers.end());
  return numbers;
}

inline std::string HostName() {
  char host[256] = "localhost";
  if (::gethostname(host, sizeof(host)) != 0) std::strcpy(host, "localhost");
  host[sizeof(host) - 1] = '\0';
  return host;
}

// Claims the next free number of the model at `model`: 1 + the highest version or claim, then
// up while the claim's CREATE (overwrite=false) finds the name taken. Outcome ok, or the failure.
inline WebHdfsOutcome HdfsClaim(const HdfsRepository& repo, const std::string& model,
                                uint64_t* version) {
  const std::string claims = model + "/" + kClaimsDir;
  WebHdfsOutcome outcome = repo.Op("PUT", claims, "MKDIRS");
  if (!outcome.ok()) return outcome;
  std::vector<HdfsEntry> entries;
  if (!(outcome = repo.List(model, &entries)).ok()) return outcome;
  std::vector<uint64_t> versions = HdfsNumbers(entries, false);
  if (!(outcome = repo.List(claims, &entries)).ok()) return outcome;
  std::vector<uint64_t> taken = HdfsNumbers(entries, true);
  *version = 1 + std::max(versions.empty() ? 0 : versions.back(), taken.empty() ? 0 : taken.back());
  while (true) {
    outcome = repo.Create(claims + "/" + std::to_string(*version), "", false);
    // The claim exists (closed), or its creator still holds it open (its lease): taken either way.
    if (outcome.ok() || (outcome.exception != "FileAlreadyExistsException" &&
                         outcome.exception != "AlreadyBeingCreatedException")) {
      return outcome;
    }
    ++*version;
  }
}

// keep pruning after a publication (the protocol at the top of this header). Outcome ok, or the
// first failure.
inline WebHdfsOutcome HdfsPrune(const HdfsRepository& repo, const std::string& model,
                                unsigned keep) {
  std::vector<HdfsEntry> entries;
  WebHdfsOutcome outcome = repo.List(model, &entries);
  if (!outcome.ok()) return outcome;
  std::vector<uint64_t> versions = HdfsNumbers(entries, false);
  for (size_t i = 0; i + keep < versions.size(); ++i) {
    const std::string hidden = model + "/" + kRemovingPrefix + std::to_string(versions[i]) + "-" +
                               RandomHex8();
    outcome = repo.Rename(model + "/" + std::to_string(versions[i]), hidden, false);
    if (outcome.status == 404) continue;  // another publisher pruned it
    if (outcome.ok()) outcome = repo.Delete(hidden, true);
    if (!outcome.ok()) return outcome;
  }
  if (!versions.empty()) {
    // The newest claim is never below the oldest version kept: numbers are never reused.
    const uint64_t oldest_kept = versions[versions.size() > keep ? versions.size() - keep : 0];
    const std::string claims_dir = model + "/" + kClaimsDir;
    std::vector<HdfsEntry> claims;
    if (!(outcome = repo.List(claims_dir, &claims)).ok()) return outcome;
    for (uint64_t claim : HdfsNumbers(claims, true)) {
      if (claim >= oldest_kept) continue;
      if (!(outcome = repo.Delete(claims_dir + "/" + std::to_string(claim), false)).ok()) {
        return outcome;
      }
    }
  }
  const long long now_ms = static_cast<long long>(std::time(nullptr)) * 1000;
  for (const HdfsEntry& e : entries) {
    bool leftover = e.name.rfind(kIncomingPrefix, 0) == 0 || e.name.rfind(kRemovingPrefix, 0) == 0;
    if (leftover && now_ms - e.modification_time > kHdfsStaleAfterMs) {
      if (!(outcome = repo.Delete(model + "/" + e.name, true)).ok()) return outcome;
    }
  }
  return WebHdfsOutcome();
}

// The hdfs:// half of PublishModel (the protocol at the top of this header); `result` filled in.
inline void HdfsPublish(const std::string& repository, const std::string& name,
                        const std::vector<std::pair<std::string, std::string>>& files,
                        const std::string& config, unsigned keep, PublishResult* result) {
  std::string parse_error;
  std::optional<HdfsDir> dir = ParseHdfsDir(repository, "", &parse_error);
  if (!dir) {
    result->error = "PublishModel: the repository " + repository +
                    " must be hdfs://namenode[:port]/path (a NameNode host, then an absolute "
                    "path)";
    return;
  }
  const HdfsRepository repo{*dir};
  WebHdfsOutcome outcome = repo.Op("GET", dir->path, "GETFILESTATUS");
  if (outcome.status == 404) {
    result->error = "PublishModel: the repository " + repository +
                    " does not exist in HDFS (create it first, e.g. hdfs dfs -mkdir -p)";
    return;
  }
  if (!outcome.ok()) {
    result->error = HdfsPublishFailure(*dir, "reach the repository", outcome);
    return;
  }
  if (size_t type = FindValue(outcome.body, "type"); type == std::string::npos ||
                                                     outcome.body.compare(type, 11,
                                                                          "\"DIRECTORY\"") != 0) {
    result->error = "PublishModel: the repository " + repository + " is not a directory";
    return;
  }
  const std::string what = "publish " + name + " to";
  auto fail = [&](const WebHdfsOutcome& failed) {
    result->error = HdfsPublishFailure(*dir, what, failed);
  };
  const std::string model = repo.ModelPath(name);
  const std::string unique = HostName() + "-" + std::to_string(::getpid()) + "-" + RandomHex8();
  // config.yaml first: a version is never served under an older config than its publisher gave.
  if (!config.empty()) {
    const std::string config_path = model + "/config.yaml";
    outcome = repo.Op("GET", config_path, "OPEN");
    if (outcome.status != 404 && !outcome.ok()) return fail(outcome);
    if (outcome.status == 404 || outcome.body != config) {
      const std::string temp = model + "/" + kTempPrefix + "config.yaml." + HostName() + "." +
                               std::to_string(::getpid()) + "." + RandomHex8();
      if (!(outcome = repo.Create(temp, config, true)).ok()) return fail(outcome);
      if (!(outcome = repo.Rename(temp, config_path, true)).ok()) {
        repo.Delete(temp, false);
        return fail(outcome);
      }
    }
  }
  uint64_t version = 0;
  if (!(outcome = HdfsClaim(repo, model, &version)).ok()) return fail(outcome);
  const std::string incoming = model + "/" + kIncomingPrefix + unique;
  if (!(outcome = repo.Op("PUT", incoming, "MKDIRS")).ok()) return fail(outcome);
  double delay = 0;
  if (const char* text = std::getenv(kTestPublishWriteDelayEnv); text && *text) {
    delay = std::strtod(text, nullptr);
  }
  auto write = [&](const std::string& file, std::string_view bytes) {
    const std::string path = incoming + "/" + file;
    if (file != "model.pt" || delay <= 0) return repo.Create(path, bytes, false);
    size_t half = bytes.size() / 2;
    WebHdfsOutcome written = repo.Create(path, bytes.substr(0, half), false);
    if (!written.ok()) return written;
    SleepSeconds(delay);
    return repo.Op("POST", path, "APPEND", {}, bytes.substr(half));
  };
  bool has_marker = false;
  for (const auto& [file, bytes] : files) {
    has_marker = has_marker || file == kCompleteMarker;
    if (!(outcome = write(file, bytes)).ok()) break;
  }
  if (outcome.ok() && !has_marker) outcome = write(kCompleteMarker, "");
  while (outcome.ok()) {
    outcome = repo.Rename(incoming, model + "/" + std::to_string(version), false);
    // A version made without a claim (copied in by hand) is never merged into or overwritten:
    // the next free number is claimed instead.
    if (outcome.ok() || outcome.exception != "FileAlreadyExistsException") break;
    outcome = HdfsClaim(repo, model, &version);
  }
  if (!outcome.ok()) {
    repo.Delete(incoming, true);
    return fail(outcome);
  }
  result->ok = true;
  result->version = version;
  result->path = dir->uri + "/" + name + "/" + std::to_string(version);
  if (keep == 0) return;
  // As the Python SDK's: a failed prune fails the call, though the version is in place.
  if (!(outcome = HdfsPrune(repo, model, keep)).ok()) {
    result->ok = false;
    result->error = HdfsPublishFailure(*dir, "prune old versions of " + name + " in", outcome) +
                    " (version " + std::to_string(version) + " is published)";
  }
}

}  // namespace internal

// Publishes a new version of model `name`: `model_path` is a saved TorchScript file (it becomes
// the version's model.pt) or a directory of files (model.pt among them), copied as they are.
// Returns the new version's number and directory, or an error naming what is wrong (nothing is
// published then). The protocol is the Python SDK's (top of this header), so publishers in
// either language may share a model. Then reports the publication to the agent
// (fire-and-forget; nothing without SHOAL_AGENT_SOCKET). Nothing throws.
inline PublishResult PublishModel(const std::string& model_path, const std::string& name,
                                  const PublishOptions& options = {}) {
  PublishResult result;
  std::string repository = options.repository;
  if (repository.empty()) {
    const char* from_env = std::getenv(kModelRepositoryEnv);
    repository = from_env ? from_env : "";
  }
  unsigned keep = 0;
  if ((result.error = internal::CheckPublishArguments(name, options, repository, &keep)).size()) {
    return result;
  }
  std::vector<std::pair<std::string, std::string>> files;
  if ((result.error = internal::ReadModelFiles(model_path, &files)).size()) return result;
  std::string config = options.config;
  if (!config.empty() && config.back() != '\n') config += '\n';
  if (internal::IsHdfs(repository)) {
    internal::HdfsPublish(repository, name, files, config, keep, &result);
    if (!result.ok) return result;
    internal::AgentClient::Get().ReportAlone(
        "published", internal::PublishedFields(name, result.version, repository, options));
    return result;
  }

  const std::string model_dir = repository + "/" + name;
  if (::mkdir(model_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    result.error = internal::ErrnoText("PublishModel: cannot create " + model_dir, errno);
    return result;
  }
  const std::string lock_path = model_dir + "/" + kPublishLockName;
  int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0) {
    result.error = internal::ErrnoText("PublishModel: cannot open " + lock_path, errno);
    return result;
  }
  int locked;
  do {
    locked = ::flock(lock_fd, LOCK_EX);
  } while (locked != 0 && errno == EINTR);
  if (locked != 0) {
    result.error = internal::ErrnoText("PublishModel: cannot lock " + lock_path, errno);
    ::close(lock_fd);
    return result;
  }
  // Everything below runs under the lock; `finish` releases it.
  auto finish = [&](std::string error) {
    ::close(lock_fd);
    result.error = std::move(error);
    result.ok = result.error.empty();
    return result;
  };
  internal::RemoveAbandonedIncoming(model_dir);
  if (!config.empty()) {
    if (std::string error = internal::ReplaceFileIfChanged(model_dir, "config.yaml", config);
        !error.empty()) {
      return finish("PublishModel: " + error);
    }
  }
  std::string incoming;
  for (int tries = 0; tries < 100; ++tries) {
    incoming = model_dir + "/" + kIncomingPrefix + std::to_string(::getpid()) + "-" +
               internal::RandomHex8();
    if (::mkdir(incoming.c_str(), 0755) == 0) break;
    if (errno != EEXIST) {
      return finish(internal::ErrnoText("PublishModel: cannot create " + incoming, errno));
    }
    incoming.clear();
  }
  if (incoming.empty()) return finish("PublishModel: no free hidden directory in " + model_dir);
  double delay = 0;
  if (const char* text = std::getenv(kTestPublishWriteDelayEnv); text && *text) {
    delay = std::strtod(text, nullptr);
  }
  for (const auto& [file, bytes] : files) {
    std::string error =
        internal::WriteNewFile(incoming + "/" + file, bytes, file == "model.pt" ? delay : 0);
    if (!error.empty()) {
      internal::RemoveTree(incoming);
      return finish("PublishModel: " + error);
    }
  }
  bool has_marker = false;
  for (const auto& file : files) has_marker = has_marker || file.first == kCompleteMarker;
  if (!has_marker) {
    std::string error = internal::WriteNewFile(incoming + "/" + kCompleteMarker, "", 0);
    if (!error.empty()) {
      internal::RemoveTree(incoming);
      return finish("PublishModel: " + error);
    }
  }
  if (!internal::FsyncDir(incoming)) {
    std::string error = internal::ErrnoText("PublishModel: cannot fsync " + incoming, errno);
    internal::RemoveTree(incoming);
    return finish(error);
  }
  std::vector<uint64_t> existing = internal::ListVersions(model_dir);
  uint64_t version = (existing.empty() ? 0 : existing.back()) + 1;
  while (true) {
    // Refuses an existing non-empty version: a version is never overwritten, even by a
    // publisher that does not take the lock.
    std::string target = model_dir + "/" + std::to_string(version);
    if (::rename(incoming.c_str(), target.c_str()) == 0) break;
    if (errno != EEXIST && errno != ENOTEMPTY && errno != EISDIR) {
      std::string error = internal::ErrnoText(
          "PublishModel: cannot rename " + incoming + " to " + target, errno);
      internal::RemoveTree(incoming);
      return finish(error);
    }
    ++version;
  }
  result.version = version;
  result.path = model_dir + "/" + std::to_string(version);
  if (!internal::FsyncDir(model_dir)) {
    return finish(internal::ErrnoText("PublishModel: cannot fsync " + model_dir, errno));
  }
  if (keep >= 1) {
    std::vector<uint64_t> versions = internal::ListVersions(model_dir);
    for (size_t i = 0; i + keep < versions.size(); ++i) {
      std::string hidden = model_dir + "/" + kRemovingPrefix + std::to_string(versions[i]) + "-" +
                           internal::RandomHex8();
      if (::rename((model_dir + "/" + std::to_string(versions[i])).c_str(), hidden.c_str()) != 0) {
        continue;  // another publisher pruned it
      }
      internal::RemoveTree(hidden);
    }
  }
  finish("");
  internal::AgentClient::Get().ReportAlone(
      "published", internal::PublishedFields(name, version, internal::AbsolutePath(repository),
                                             options));
  return result;
}

}  // namespace shoal::sdk
