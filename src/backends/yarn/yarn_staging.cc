#include "backends/yarn/yarn_staging.h"

#include <pwd.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/webhdfs.h"
#include "backends/yarn/yarn_backend.h"
#include "backends/yarn/yarn_request.h"

namespace shoal::backends {
namespace {

using common::WebHdfs;
using common::WebHdfsAddress;

std::string EnvOr(const char* name, std::string fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::string(value) : fallback;
}

}  // namespace

absl::StatusOr<std::string> FindYarnAmJar() {
  std::string am_jar = EnvOr("SHOAL_YARN_AM_JAR", SHOAL_DEFAULT_YARN_AM_JAR);
  if (!std::filesystem::is_regular_file(am_jar)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--backend yarn: no application master jar at ", am_jar,
        "; build it with src/backends/yarn/am/build.sh (./setup.sh does), or name it with "
        "SHOAL_YARN_AM_JAR"));
  }
  return std::filesystem::absolute(am_jar).string();
}

absl::StatusOr<YarnStaging> ResolveYarnStaging(const std::string& rm_web,
                                               const std::string& am_jar) {
  YarnStaging out;
  out.am_jar = am_jar;
  // What the cluster says of itself (its ResourceManager's configuration): where Hadoop is
  // on the NodeManagers, and its file system. An environment variable overrides each.
  auto cluster_conf = YarnBackend::ClusterConfiguration(rm_web);
  auto cluster_setting = [&](const std::string& key) -> std::string {
    if (!cluster_conf.ok()) return "";
    auto it = cluster_conf->find(key);
    return it == cluster_conf->end() ? "" : it->second;
  };
  if (const char* env = std::getenv("SHOAL_YARN_AM_CLASSPATH"); env != nullptr && *env != '\0') {
    out.am_classpath = env;
    out.am_classpath_source = "SHOAL_YARN_AM_CLASSPATH";
  } else if (std::string cluster =
                 YarnClasspathFromConfig(cluster_setting("yarn.application.classpath"));
             !cluster.empty()) {
    out.am_classpath = cluster;
    out.am_classpath_source = "the cluster's yarn.application.classpath";
  } else {
    out.am_classpath = DefaultYarnAmClasspath();
    out.am_classpath_source = "YARN's default application classpath";
  }
  // The containers get the AM jar and this binary from HDFS (YARN local resources).
  std::string hdfs = EnvOr("SHOAL_HDFS", cluster_setting("fs.defaultFS"));
  while (absl::StartsWith(hdfs, "hdfs://") && absl::EndsWith(hdfs, "/")) hdfs.pop_back();
  std::string webhdfs_setting = EnvOr("SHOAL_WEBHDFS", "");
  if (webhdfs_setting.empty()) {
    // dfs.namenode.http-address, where the ResourceManager's configuration has it with a
    // real host; else the NameNode's host on the default port.
    std::string http = cluster_setting("dfs.namenode.http-address");
    if (!http.empty() && !absl::StartsWith(http, "0.0.0.0:") && !absl::EndsWith(http, ":0")) {
      webhdfs_setting = "http://" + http;
    }
  }
  auto webhdfs = WebHdfsAddress(hdfs, webhdfs_setting);
  if (!webhdfs.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--backend yarn: the containers get the application master's jar and the shoal binary "
        "from HDFS, but ",
        hdfs.empty() ? std::string("the cluster names no file system")
                     : "the cluster's file system is '" + hdfs + "'",
        cluster_conf.ok() ? std::string()
                          : absl::StrCat(" (its ResourceManager's /conf: ",
                                         cluster_conf.status().message(), ")"),
        "; name its HDFS with SHOAL_HDFS=hdfs://NAMENODE:PORT"));
  }
  auto checked_webhdfs = NormalizeRmWebAddress(*webhdfs);
  std::string hdfs_user = EnvOr("HADOOP_USER_NAME", "");
  if (hdfs_user.empty()) {
    const passwd* pw = ::getpwuid(::geteuid());
    hdfs_user = pw != nullptr ? pw->pw_name : "shoal";
  }
  absl::Status webhdfs_ok = checked_webhdfs.ok()
                                ? WebHdfs(*checked_webhdfs, hdfs_user).Check()
                                : absl::InvalidArgumentError("it must be http://HOST:PORT");
  if (!webhdfs_ok.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--backend yarn: the NameNode's WebHDFS at '", *webhdfs, "' (for ", hdfs,
        ") does not answer: ", webhdfs_ok.message(),
        "; give its HTTP address with SHOAL_WEBHDFS=http://NAMENODE:PORT"));
  }
  out.hdfs = hdfs;
  out.webhdfs = *checked_webhdfs;
  out.hdfs_user = hdfs_user;
  return out;
}

}  // namespace shoal::backends
