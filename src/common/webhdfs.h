#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shoal::common {

// What the NameNode says of one file: what a YARN local resource must state exactly (a
// NodeManager refuses to localize a file whose size or modification time differ).
struct HdfsFileStatus {
  uint64_t length = 0;
  int64_t modification_time_ms = 0;
};

// One entry of a directory listing.
struct HdfsEntry {
  std::string name;
  bool directory = false;
  uint64_t length = 0;
  int64_t modification_time_ms = 0;
};

// The few WebHDFS operations Shoal needs, as `user` (simple authentication, user.name=): the
// YARN backend stages files for its containers, `shoal serve` mirrors an hdfs:// model
// repository. `webhdfs` is the NameNode's HTTP address, http://host:port; paths are absolute
// HDFS paths. Errors: Unavailable when nothing answers, NotFound for a missing path (where
// said), FailedPrecondition with the NameNode's message for any other refusal. Blocking: never
// from an event loop (the YARN backend calls it where the backend interface allows it,
// StartAgents and Release).
class WebHdfs {
 public:
  WebHdfs(std::string webhdfs, std::string user)
      : webhdfs_(std::move(webhdfs)), user_(std::move(user)) {}

  // GETFILESTATUS of "/": whether a NameNode answers there at all.
  absl::Status Check() const;
  absl::Status MakeDirs(const std::string& path) const;
  // Writes the local file `local` to `path` (overwriting), through the DataNode the NameNode
  // redirects to.
  absl::Status Upload(const std::string& local, const std::string& path) const;
  absl::StatusOr<HdfsFileStatus> Status(const std::string& path) const;
  // Deletes `path` and everything under it; a path that does not exist is no error.
  absl::Status DeleteRecursively(const std::string& path) const;
  // The entries of the directory `path`; NotFound when it does not exist.
  absl::StatusOr<std::vector<HdfsEntry>> List(const std::string& path) const;
  // Copies the file `path` into the local file `local` (created or truncated), in pieces read
  // from the DataNodes, so that no reply holds more than one piece.
  absl::Status Download(const std::string& path, const std::string& local) const;

  const std::string& address() const { return webhdfs_; }

 private:
  std::string Target(const std::string& path, const std::string& op) const;

  std::string webhdfs_;
  std::string user_;
};

// The NameNode's WebHDFS address for a file system URI: `webhdfs` when given, else the
// NameNode's host on Hadoop 3's default HTTP port, 9870. InvalidArgument unless `fs_uri` is
// hdfs://host[:port].
absl::StatusOr<std::string> WebHdfsAddress(const std::string& fs_uri, const std::string& webhdfs);

// hdfs://namenode[:port]/path taken apart, its WebHDFS address found as WebHdfsAddress does and
// its user as the SDKs find it: $HADOOP_USER_NAME, else this process's.
struct HdfsLocation {
  std::string uri;      // as given, without trailing '/'
  std::string webhdfs;  // http://host:port
  std::string path;     // absolute, without trailing '/'; never "/"
  std::string user;
};

// InvalidArgument naming the expected form unless `uri` is hdfs://host[:port]/path with a path
// below the root. `webhdfs`: the NameNode's HTTP address, "" for its host on port 9870.
absl::StatusOr<HdfsLocation> ParseHdfsLocation(const std::string& uri, const std::string& webhdfs);

}  // namespace shoal::common
