#pragma once

// Publishing into an hdfs:// model repository (PublishModel in publish.h calls HdfsPublish).
// An hdfs://namenode[:port]/path repository is reached through WebHDFS (webhdfs.h) and has no
// lock; it follows the Python SDK's hdfs_publish.py step for step, with the same names
// (docs/design/0015-hdfs-model-repositories.md): config.yaml replaced by a RENAME when it
// changes; the number claimed by an exclusive CREATE of `<model>/.claims/<v>` (v = 1 + the
// highest version or claim; a taken claim means v + 1); the files (and `.shoal-complete`)
// written into `<model>/.incoming-<host>-<pid>-<hex>/`, renamed to `<model>/<v>` with
// renameoptions=NONE (refused, never merged, when it exists: then the next number is claimed);
// keep pruning by a rename to `.removing-<v>-<hex>` and a delete, claims below the oldest

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shoal/publish_common.h"
#include "shoal/webhdfs.h"

namespace shoal::sdk {
namespace internal {

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
}  // namespace shoal::sdk
