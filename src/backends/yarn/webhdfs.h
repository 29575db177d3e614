#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shoal::backends {

// What the NameNode says of one file: what a YARN local resource must state exactly (a
// NodeManager refuses to localize a file whose size or modification time differ).
struct HdfsFileStatus {
  uint64_t length = 0;
  int64_t modification_time_ms = 0;
};

// The few WebHDFS operations the YARN backend needs to stage files for its containers, as
// `user` (simple authentication, user.name=). `webhdfs` is the NameNode's HTTP address,
// http://host:port; paths are absolute HDFS paths. Blocking: never from the master's loop
// except where the backend interface allows it (StartAgents, Release).
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

 private:
  std::string Target(const std::string& path, const std::string& op) const;

  std::string webhdfs_;
  std::string user_;
};

// The NameNode's WebHDFS address for a file system URI: `webhdfs` when given, else the
// NameNode's host on Hadoop 3's default HTTP port, 9870. InvalidArgument unless `fs_uri` is
// hdfs://host[:port].
absl::StatusOr<std::string> WebHdfsAddress(const std::string& fs_uri, const std::string& webhdfs);

}  // namespace shoal::backends
