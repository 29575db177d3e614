#pragma once

#include <map>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "spec/job_spec.h"

namespace shoal::backends {

// What `--spark-master yarn` needs beyond the other masters (docs/backends/spark.md, "On YARN";
// docs/design/0018-spark-backend.md). Pure functions, except YarnConfDir and
// YarnResourceManagerAddress, which read the environment and the configuration directory.

// How the job's executors are sized where the cluster manager runs each executor in a container
// whose memory it enforces (spark.executor.memory + spark.executor.memoryOverhead) and starts
// exactly spark.executor.instances executors (2 unless told) of spark.executor.cores cores (1
// unless told): YARN and Kubernetes. Enough executors, with cores for whole barrier tasks, for
// the gang to start at once, and room in each container for Spark's own overhead plus the
// places' processes, which run outside the executor's heap.
// `executor_cores`/`executor_memory`: the `spark:` section's (0/empty: not given).
std::map<std::string, std::string> ContainerExecutorProperties(const spec::JobSpec& job,
                                                               uint32_t executor_cores,
                                                               const std::string& executor_memory);

// What master yarn sets: the sizes above, and Spark's jars and UI as YARN needs them.
// `spark_home`: PySpark's directory on this machine (empty: unknown); its jars are then used
// from that path on the nodes (spark.yarn.jars=local:...) instead of being uploaded to HDFS for
// every application: the nodes already need this very PySpark there (SHOAL_SPARK_PYTHON is the
// executors' Python).
std::map<std::string, std::string> SparkOnYarnProperties(const spec::JobSpec& job,
                                                         uint32_t executor_cores,
                                                         const std::string& executor_memory,
                                                         const std::string& spark_home);

// The value of `name` in a Hadoop configuration file's text (<property><name>..</name>
// <value>..</value></property>), with ${other} references to properties of the same text
// expanded; empty when absent.
std::string HadoopProperty(absl::string_view xml, absl::string_view name);

// The directory with the cluster's yarn-site.xml, as Spark finds it: $HADOOP_CONF_DIR, else
// $YARN_CONF_DIR. InvalidArgument naming both when neither is set, or when it has no
// yarn-site.xml.
absl::StatusOr<std::string> YarnConfDir();

// The ResourceManager's client address (host, port) that `conf_dir`/yarn-site.xml gives:
// yarn.resourcemanager.address, else yarn.resourcemanager.hostname:8032 (with HA, those of
// the first of yarn.resourcemanager.ha.rm-ids).
absl::StatusOr<std::pair<std::string, std::string>> YarnResourceManagerAddress(
    const std::string& conf_dir);

}  // namespace shoal::backends
