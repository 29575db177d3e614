#pragma once

// hdfs:// checkpoint directories through WebHDFS, as the Python SDK's WebHdfsStorage: the
// directory's address and user, the REST calls (NameNode redirects followed) and their
// answers.

#include <pwd.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shoal/checkpoint_format.h"
#include "shoal/http_client.h"
#include "shoal/json_scan.h"

namespace shoal::sdk {

namespace internal {

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

// The WebHDFS URL of `op` on `path`; `params` are (name, value) pairs added to the query.
inline std::string WebHdfsUrl(const HdfsDir& dir, const std::string& path, const char* op,
                              const std::vector<std::pair<std::string, std::string>>& params = {}) {
  std::string url = dir.base + "/webhdfs/v1" + PercentEncode(path, true) + "?op=" + op +
                    "&user.name=" + PercentEncode(dir.user, false);
  for (const auto& [name, value] : params) url += "&" + name + "=" + PercentEncode(value, false);
  return url;
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

// A WebHDFS call: the request, one 307/302 redirect (NameNode -> DataNode) followed. Returns ""
// with `response` (any status), or an error naming the op and URL; then `unanswered_url`, when
// given, is set to the URL that got no HTTP answer (the NameNode's or a DataNode's).
inline std::string WebHdfsCall(const std::string& method, const std::string& url, const char* op,
                               std::string_view body, HttpResponse* response,
                               std::string* unanswered_url = nullptr) {
  std::string target = url;
  for (int hop = 0; hop < 2; ++hop) {
    *response = HttpResponse();
    // The NameNode answers CREATE's redirect without reading a body: send it only to the
    // DataNode (WebHDFS's two-step create).
    bool to_namenode = hop == 0 && !body.empty();
    std::string error = HttpOnce(method, target, to_namenode ? std::string_view() : body, response);
    if (!error.empty()) {
      if (unanswered_url) *unanswered_url = target;
      return "WebHDFS " + std::string(op) + " " + target + ": " + error;
    }
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

// The outcome of one WebHDFS operation, for callers that tell its failures apart (publish.h).
struct WebHdfsOutcome {
  std::string error;  // "" when HDFS did it (a 2xx answer)
  int status = 0;     // the HTTP status, when an answer came
  // Nothing answered at `address` (http://host:port: the NameNode's, or the DataNode's it
  // redirected to); `reason` says what happened (refused, timed out, ...).
  bool unreachable = false;
  std::string address;
  std::string reason;
  std::string exception;       // the RemoteException's Java exception, e.g. "AccessControlException"
  std::string remote_message;  // its message's first line
  std::string body;            // the answer's body
  bool ok() const { return error.empty(); }
};

// The http://host:port of `url`.
inline std::string UrlAddress(const std::string& url) {
  size_t scheme = url.find("://");
  size_t start = scheme == std::string::npos ? 0 : scheme + 3;
  return url.substr(0, url.find('/', start));
}

// Performs `op` (method, url, body) and sorts out its failure.
inline WebHdfsOutcome WebHdfsOp(const char* method, const std::string& url, const char* op,
                                std::string_view body = {}) {
  WebHdfsOutcome outcome;
  HttpResponse response;
  std::string unanswered;
  outcome.error = WebHdfsCall(method, url, op, body, &response, &unanswered);
  if (!outcome.error.empty()) {
    outcome.unreachable = true;
    outcome.address = UrlAddress(unanswered);
    std::string prefix = "WebHDFS " + std::string(op) + " " + unanswered + ": ";
    outcome.reason = outcome.error.compare(0, prefix.size(), prefix) == 0
                         ? outcome.error.substr(prefix.size())
                         : outcome.error;
    return outcome;
  }
  outcome.status = response.status;
  outcome.body = std::move(response.body);
  if (size_t pos = outcome.body.find("\"RemoteException\""); pos != std::string::npos) {
    std::string_view remote = std::string_view(outcome.body).substr(pos);
    if (size_t value = FindValue(remote, "exception"); value != std::string_view::npos) {
      if (std::optional<std::string> name = ParseJsonString(remote, &value)) {
        outcome.exception = *name;
      }
    }
    outcome.remote_message = RemoteExceptionMessage(outcome.body);
    // A DataNode appends the NameNode's Java stack to the message: its first line says it.
    outcome.remote_message = outcome.remote_message.substr(0, outcome.remote_message.find('\n'));
  }
  if (std::string error = WebHdfsStatusError(op, url, response); !error.empty()) {
    outcome.error = error.substr(0, error.find('\n'));
  }
  return outcome;
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

}  // namespace internal

}  // namespace shoal::sdk
