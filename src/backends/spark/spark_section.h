#pragma once

#include <map>
#include <string>

#include "absl/strings/string_view.h"
#include "spec/job_section.h"
#include "spec/job_spec.h"

namespace shoal::backends {

// How the job's Spark application is made (`spark:` in the job file); --spark-master overrides
// `master`. Empty / 0: Spark's own default (or the cluster's).
struct SparkConfig : spec::SectionValue {
  std::string master;           // spark://HOST:PORT, yarn, local-cluster[N,C,M], k8s://...
  std::string deploy_mode;      // only "client": the Shoal master runs beside the driver
  std::string executor_memory;  // Spark's size syntax: 512m, 1g
  uint32_t executor_cores = 0;
  // k8s:// masters: the image that brings Shoal's agent bundle into the executor pods (empty:
  // kDefaultSparkAgentImage).
  std::string agent_image;
  std::map<std::string, std::string> conf;  // more Spark properties, spark.*
};

// The `spark:` section of the job file, for the parser (spec::JobSections).
spec::JobSection SparkJobSection();

// The agent image executor pods get on k8s:// masters when the job file names none: the one
// tools/kubernetes/agent_image.py makes, as the Kubernetes backend's default.
inline constexpr char kDefaultSparkAgentImage[] = "localhost/shoal-agent:latest";

// The job file's `spark:` section, or the defaults when it has none.
const SparkConfig& SparkConfigOf(const spec::JobSpec& job);

// The rules the section and the flags share.
inline constexpr char kSparkMasterForm[] =
    "a Spark master URL: spark://HOST:PORT[,HOST:PORT...], yarn, "
    "local-cluster[WORKERS,CORES,MEMORY_MB] or k8s://https://HOST:PORT";
bool IsSparkMaster(absl::string_view text);
inline constexpr char kSparkMemoryForm[] = "a Spark memory size, e.g. 512m or 1g";
bool IsSparkMemory(absl::string_view text);
// Properties the section sets through its own keys, or that a barrier stage cannot run with:
// the message says which key to use instead, or why; empty when `key` may be given in `conf`.
std::string SparkConfKeyProblem(absl::string_view key, absl::string_view value);

// The host:port pairs of a spark:// master URL (empty for other masters).
std::vector<std::pair<std::string, std::string>> SparkStandaloneAddresses(
    absl::string_view master);

}  // namespace shoal::backends
