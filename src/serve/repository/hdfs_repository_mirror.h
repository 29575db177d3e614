#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/webhdfs.h"

namespace shoal::serve {

struct HdfsMirrorOptions {
  std::string uri;      // hdfs://namenode[:port]/path
  std::string webhdfs;  // the NameNode's HTTP address; "": $SHOAL_WEBHDFS, else its host:9870
  // Where the copy lives. "": a fresh temporary directory, removed when the mirror stops. A
  // directory given must be empty or an earlier mirror's (it holds kMarkerName): what it held
  // is replaced.
  std::string cache_dir;
  std::chrono::milliseconds poll_interval{1000};  // 0: copied once at start, never again
};

// Keeps a local copy of an hdfs:// model repository (docs/serving.md, "HDFS repositories"), so
// that the rest of `shoal serve` (scan, watcher, manager) serves a local directory as ever.
//
// Each pass lists the repository through WebHDFS and makes the copy follow it: a version
// directory new in HDFS is downloaded into a hidden directory of the copy and renamed to its
// number, so the watcher sees it whole or not at all; a version or model gone from HDFS is
// renamed to a hidden name, then deleted; a model's config.yaml is fetched again when its size
// or modification time changes. Versions are never changed once they appear in HDFS (the
// publication protocol renames them in whole: docs/design/0015-hdfs-model-repositories.md), so
// one copied is never compared again. Hidden entries in HDFS (.claims, .incoming-*) are not
// copied.
class HdfsRepositoryMirror {
 public:
  static constexpr char kMarkerName[] = ".shoal-hdfs-mirror";

  // Parses the URI, prepares the cache directory and copies the repository once; then, with a
  // poll interval, a thread of its own repeats the pass. InvalidArgument for a malformed URI or
  // an unusable cache directory; Unavailable when the NameNode does not answer; NotFound or
  // FailedPrecondition when HDFS refuses. Blocking.
  static absl::StatusOr<std::unique_ptr<HdfsRepositoryMirror>> Start(
      const HdfsMirrorOptions& options);
  // Stops the thread (a pass in progress finishes first); removes a temporary cache directory.
  ~HdfsRepositoryMirror();

  // The copy: a model repository directory for ScanModelRepository.
  const std::string& local_dir() const { return local_dir_; }
  const common::HdfsLocation& location() const { return location_; }

 private:
  HdfsRepositoryMirror(HdfsMirrorOptions options, common::HdfsLocation location,
                       std::string local_dir, bool temporary);

  // One pass; the first error ends it (the next pass starts over).
  absl::Status Sync();
  absl::Status SyncModel(const std::string& model);
  // Copies the HDFS directory `from` into the new local directory `to`, recursively.
  absl::Status CopyDirectory(const std::string& from, const std::string& to);
  void Run();

  const HdfsMirrorOptions options_;
  const common::HdfsLocation location_;
  const common::WebHdfs hdfs_;
  const std::string local_dir_;
  const bool temporary_;
  // Per model, the (length, modification time) of the config.yaml copied. Only the thread
  // running passes (Start's, then Run's) uses it.
  std::map<std::string, std::pair<uint64_t, int64_t>> configs_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace shoal::serve
