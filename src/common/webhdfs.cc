#include "common/webhdfs.h"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/http_client.h"
#include "nlohmann/json.hpp"

namespace shoal::common {
namespace {

using Ms = std::chrono::milliseconds;

std::string Escape(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (absl::ascii_isalnum(c) || c == '/' || c == '.' || c == '_' || c == '-' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += absl::StrFormat("%%%02X", c);
    }
  }
  return out;
}

absl::StatusOr<HttpReply> Send(const std::string& method, const std::string& base,
                                       const std::string& target,
                                       const std::string& body_file = "",
                                       Ms timeout = Ms(30000)) {
  HttpRequest request;
  request.method = method;
  request.base = base;
  request.target = target;
  request.body_file = body_file;
  request.content_type = "application/octet-stream";
  request.headers = {{"Accept", "application/json"}};
  request.timeout = timeout;
  return SendHttp(request);
}

// WebHDFS's errors: {"RemoteException": {"exception": ..., "message": ...}}.
absl::Status Refused(const std::string& what, const HttpReply& reply) {
  std::string message = reply.body.substr(0, 500);
  auto json = nlohmann::json::parse(reply.body, nullptr, false);
  if (json.is_object() && json.contains("RemoteException") &&
      json["RemoteException"].is_object() && json["RemoteException"].contains("message") &&
      json["RemoteException"]["message"].is_string()) {
    message = json["RemoteException"]["message"].get<std::string>();
  }
  // A DataNode appends the NameNode's Java stack to the message: its first line says it.
  message = std::string(absl::StripAsciiWhitespace(message.substr(0, message.find('\n'))));
  std::string text = absl::StrCat(what, ": HTTP ", reply.status, ": ", message);
  if (reply.status == 404) return absl::NotFoundError(text);
  return absl::FailedPreconditionError(text);
}

// The DataNode a NameNode names in a noredirect=true answer ({"Location": "http://dn/..."}):
// (http://host:port, /target?query).
absl::StatusOr<std::pair<std::string, std::string>> DataNodeTarget(const std::string& what,
                                                                     const HttpReply& reply) {
  auto json = nlohmann::json::parse(reply.body, nullptr, false);
  std::string location = json.is_object() && json.contains("Location") &&
                                 json["Location"].is_string()
                             ? json["Location"].get<std::string>()
                             : "";
  absl::string_view rest = location;
  if (!absl::ConsumePrefix(&rest, "http://") || rest.find('/') == absl::string_view::npos) {
    return absl::InternalError(
        absl::StrCat(what, ": the NameNode named no DataNode: ", reply.body.substr(0, 300)));
  }
  size_t slash = rest.find('/');
  return std::make_pair(absl::StrCat("http://", rest.substr(0, slash)),
                        std::string(rest.substr(slash)));
}

// Bytes read from a DataNode per request: well under the HTTP client's reply limit.
constexpr uint64_t kDownloadPieceBytes = 32ull << 20;

}  // namespace

std::string WebHdfs::Target(const std::string& path, const std::string& op) const {
  return absl::StrCat("/webhdfs/v1", Escape(path), "?op=", op, "&user.name=", Escape(user_));
}

absl::Status WebHdfs::Check() const {
  auto reply = Send("GET", webhdfs_, Target("/", "GETFILESTATUS"));
  if (!reply.ok()) return reply.status();
  if (reply->status != 200) return Refused("WebHDFS GETFILESTATUS /", *reply);
  auto json = nlohmann::json::parse(reply->body, nullptr, false);
  if (!json.is_object() || !json.contains("FileStatus")) {
    return absl::FailedPreconditionError(
        absl::StrCat(webhdfs_, "/webhdfs/v1/ does not answer as a NameNode's WebHDFS"));
  }
  return absl::OkStatus();
}

absl::Status WebHdfs::MakeDirs(const std::string& path) const {
  auto reply = Send("PUT", webhdfs_, Target(path, "MKDIRS"));
  if (!reply.ok()) return reply.status();
  if (reply->status != 200) return Refused("WebHDFS MKDIRS " + path, *reply);
  return absl::OkStatus();
}

absl::Status WebHdfs::Upload(const std::string& local, const std::string& path) const {
  std::error_code size_error;
  uint64_t size = std::filesystem::file_size(local, size_error);
  if (size_error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read ", local, ": ", size_error.message()));
  }
  // The NameNode names the DataNode to write to; noredirect=true has it say so in the body
  // rather than in a 307, so that the file is sent once, to the DataNode.
  auto where = Send("PUT", webhdfs_,
                    Target(path, "CREATE") + "&overwrite=true&noredirect=true");
  if (!where.ok()) return where.status();
  if (where->status != 200 && where->status != 307) {
    return Refused("WebHDFS CREATE " + path, *where);
  }
  auto datanode = DataNodeTarget("WebHDFS CREATE " + path, *where);
  if (!datanode.ok()) return datanode.status();
  const auto& [base, target] = *datanode;
  // A generous bound: the agent binary is tens of MB, and a DataNode writes it at disk speed.
  Ms timeout = Ms(60000 + static_cast<int64_t>(size >> 20) * 1000);
  auto written = Send("PUT", base, target, local, timeout);
  if (!written.ok()) return written.status();
  if (written->status != 201 && written->status != 200) {
    return Refused("WebHDFS CREATE " + path + " (DataNode)", *written);
  }
  return absl::OkStatus();
}

absl::StatusOr<HdfsFileStatus> WebHdfs::Status(const std::string& path) const {
  auto reply = Send("GET", webhdfs_, Target(path, "GETFILESTATUS"));
  if (!reply.ok()) return reply.status();
  if (reply->status != 200) return Refused("WebHDFS GETFILESTATUS " + path, *reply);
  auto json = nlohmann::json::parse(reply->body, nullptr, false);
  // Checked before reading: nlohmann's value() throws on a field of another type, and a
  // NameNode's odd answer must be a Status, not an exception in the master's loop.
  const nlohmann::json* file = json.is_object() && json.contains("FileStatus")
                                   ? &json["FileStatus"]
                                   : nullptr;
  if (file == nullptr || !file->is_object() || !file->contains("length") ||
      !(*file)["length"].is_number_unsigned() || !file->contains("modificationTime") ||
      !(*file)["modificationTime"].is_number_integer()) {
    return absl::InternalError(absl::StrCat("WebHDFS GETFILESTATUS ", path, ": ",
                                            reply->body.substr(0, 300)));
  }
  HdfsFileStatus status;
  status.length = (*file)["length"].get<uint64_t>();
  status.modification_time_ms = (*file)["modificationTime"].get<int64_t>();
  return status;
}

absl::Status WebHdfs::DeleteRecursively(const std::string& path) const {
  auto reply = Send("DELETE", webhdfs_, Target(path, "DELETE") + "&recursive=true");
  if (!reply.ok()) return reply.status();
  if (reply->status != 200) return Refused("WebHDFS DELETE " + path, *reply);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<HdfsEntry>> WebHdfs::List(const std::string& path) const {
  auto reply = Send("GET", webhdfs_, Target(path, "LISTSTATUS"));
  if (!reply.ok()) return reply.status();
  if (reply->status != 200) return Refused("WebHDFS LISTSTATUS " + path, *reply);
  auto json = nlohmann::json::parse(reply->body, nullptr, false);
  const nlohmann::json* statuses = nullptr;
  if (json.is_object() && json.contains("FileStatuses") && json["FileStatuses"].is_object() &&
      json["FileStatuses"].contains("FileStatus") &&
      json["FileStatuses"]["FileStatus"].is_array()) {
    statuses = &json["FileStatuses"]["FileStatus"];
  }
  if (statuses == nullptr) {
    return absl::InternalError(absl::StrCat("WebHDFS LISTSTATUS ", path, ": ",
                                            reply->body.substr(0, 300)));
  }
  std::vector<HdfsEntry> entries;
  for (const nlohmann::json& status : *statuses) {
    // Checked before reading, as in Status(): an odd field is an error, never an exception.
    if (!status.is_object() || !status.contains("pathSuffix") ||
        !status["pathSuffix"].is_string() || !status.contains("type") ||
        !status["type"].is_string() || !status.contains("length") ||
        !status["length"].is_number_unsigned() || !status.contains("modificationTime") ||
        !status["modificationTime"].is_number_integer()) {
      return absl::InternalError(absl::StrCat("WebHDFS LISTSTATUS ", path,
                                              ": an entry without name, type, length or time: ",
                                              status.dump().substr(0, 300)));
    }
    HdfsEntry entry;
    entry.name = status["pathSuffix"].get<std::string>();
    entry.directory = status["type"].get<std::string>() == "DIRECTORY";
    entry.length = status["length"].get<uint64_t>();
    entry.modification_time_ms = status["modificationTime"].get<int64_t>();
    entries.push_back(std::move(entry));
  }
  return entries;
}

absl::Status WebHdfs::Download(const std::string& path, const std::string& local) const {
  absl::StatusOr<HdfsFileStatus> status = Status(path);
  if (!status.ok()) return status.status();
  std::ofstream out(local, std::ios::binary | std::ios::trunc);
  if (!out) return absl::FailedPreconditionError(absl::StrCat("cannot write ", local));
  for (uint64_t offset = 0; offset < status->length; offset += kDownloadPieceBytes) {
    uint64_t length = std::min(kDownloadPieceBytes, status->length - offset);
    std::string what = absl::StrCat("WebHDFS OPEN ", path, " at ", offset);
    auto where = Send("GET", webhdfs_,
                      absl::StrCat(Target(path, "OPEN"), "&offset=", offset, "&length=", length,
                                   "&noredirect=true"));
    if (!where.ok()) return where.status();
    if (where->status != 200) return Refused(what, *where);
    auto datanode = DataNodeTarget(what, *where);
    if (!datanode.ok()) return datanode.status();
    auto piece = Send("GET", datanode->first, datanode->second, "", Ms(120000));
    if (!piece.ok()) return piece.status();
    if (piece->status != 200) return Refused(what + " (DataNode)", *piece);
    if (piece->body.size() != length) {
      return absl::DataLossError(absl::StrCat(what, ": the DataNode sent ", piece->body.size(),
                                              " bytes of ", length));
    }
    out.write(piece->body.data(), static_cast<std::streamsize>(piece->body.size()));
  }
  out.close();
  if (!out) return absl::FailedPreconditionError(absl::StrCat("cannot write ", local));
  return absl::OkStatus();
}

absl::StatusOr<std::string> WebHdfsAddress(const std::string& fs_uri, const std::string& webhdfs) {
  absl::string_view rest = fs_uri;
  if (!absl::ConsumePrefix(&rest, "hdfs://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("not an hdfs://HOST:PORT file system: '", fs_uri, "'"));
  }
  while (absl::ConsumeSuffix(&rest, "/")) {
  }
  std::string authority(rest.substr(0, rest.find('/')));
  if (authority.empty() || authority.front() == ':') {
    return absl::InvalidArgumentError(
        absl::StrCat("not an hdfs://HOST:PORT file system: '", fs_uri, "'"));
  }
  if (!webhdfs.empty()) return webhdfs;
  return absl::StrCat("http://", authority.substr(0, authority.rfind(':') == std::string::npos
                                                         ? authority.size()
                                                         : authority.rfind(':')),
                      ":9870");
}

absl::StatusOr<HdfsLocation> ParseHdfsLocation(const std::string& uri,
                                               const std::string& webhdfs) {
  auto invalid = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", uri, "' is not hdfs://namenode[:port]/path (a NameNode host, then a path below "
        "the root)"));
  };
  absl::string_view rest = uri;
  if (!absl::ConsumePrefix(&rest, "hdfs://")) return invalid();
  while (absl::ConsumeSuffix(&rest, "/")) {
  }
  size_t slash = rest.find('/');
  if (slash == absl::string_view::npos || slash == 0 || rest.front() == ':') return invalid();
  auto address = WebHdfsAddress(uri, webhdfs);
  if (!address.ok()) return invalid();
  HdfsLocation location;
  location.uri = absl::StrCat("hdfs://", rest);
  location.webhdfs = *address;
  location.path = std::string(rest.substr(slash));
  if (const char* user = std::getenv("HADOOP_USER_NAME"); user != nullptr && *user != '\0') {
    location.user = user;
  } else {
    const passwd* pw = getpwuid(geteuid());
    location.user = pw != nullptr ? pw->pw_name : "shoal";
  }
  return location;
}

}  // namespace shoal::common
