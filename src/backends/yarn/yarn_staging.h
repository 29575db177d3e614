#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace shoal::backends {

// How a job's containers get Shoal: the application master's jar and the `shoal` binary are
// staged on the cluster's HDFS (YARN local resources), and the AM runs with the cluster's
// Hadoop classpath. Resolved and checked by `shoal run` on the submitting machine, before
// anything exists, and recorded in submit.json for the master (YarnBackendOptions).
struct YarnStaging {
  std::string am_jar;               // absolute
  std::string am_classpath;
  std::string am_classpath_source;  // where am_classpath came from, for messages
  std::string hdfs;                 // hdfs://NAMENODE:PORT, the URI the NodeManagers fetch from
  std::string webhdfs;              // http://NAMENODE:PORT, how this machine uploads
  std::string hdfs_user;
};

// The application master's jar: SHOAL_YARN_AM_JAR, else this checkout's build of it.
// FailedPrecondition, worded for `shoal run`, when there is no such file.
absl::StatusOr<std::string> FindYarnAmJar();

// The rest of YarnStaging from what the ResourceManager at `rm_web` says of its cluster (its
// /conf), each overridden by an environment variable (SHOAL_YARN_AM_CLASSPATH, SHOAL_HDFS,
// SHOAL_WEBHDFS, HADOOP_USER_NAME); checks that WebHDFS answers. FailedPrecondition, worded
// for `shoal run` ("--backend yarn: ..."), naming what to set.
absl::StatusOr<YarnStaging> ResolveYarnStaging(const std::string& rm_web,
                                               const std::string& am_jar);

}  // namespace shoal::backends
