#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "backends/backend.h"
#include "nlohmann/json.hpp"

namespace shoal::backends {

struct SparkBackendOptions {
  std::string master;  // the Spark master URL, checked (IsSparkMaster)
  // A Python with PySpark: it runs the driver program here, and (PYSPARK_PYTHON) the executors'
  // Python workers, so it must exist at the same path on the cluster's machines.
  std::string python;
  std::string executor_memory;  // empty: Spark's default
  uint32_t executor_cores = 0;  // 0: Spark's default
  std::map<std::string, std::string> conf;  // the job's spark.conf, applied last
  // Whether the `shoal` binary travels to the executors with the application (SparkContext.
  // addFile; each barrier task runs the copy SparkFiles gives it) rather than being run from
  // its path here, which only a cluster sharing this machine's filesystem can do.
  bool ship_binary = false;
  // k8s:// masters only: the image whose /opt/shoal (the agent bundle, tools/kubernetes/
  // agent_image.py) an init container copies into each executor pod, where the barrier tasks
  // run /opt/shoal/bin/shoal. Empty for other masters.
  std::string agent_image;
  // Master yarn only: the cluster's configuration directory (HADOOP_CONF_DIR and YARN_CONF_DIR
  // of the driver), and PySpark's directory here (its jars are used from that path on the
  // nodes: SparkOnYarnProperties).
  std::string hadoop_conf_dir;
  std::string spark_home;
  // Where the driver program, its settings and its log live: <job dir>/agents/spark.
  std::string state_dir;
  // How long a stopping driver has to end the application before it is killed.
  std::chrono::milliseconds stop_grace{20000};
};

// Runs the job as one Spark application whose barrier stage holds the whole gang: a small
// Python driver program (shoal_spark_driver.py, carried inside this binary) runs beside the
// master, in client mode, and submits a barrier stage of one task per place; each task dials
// back to the driver and starts the place's `shoal agent` when told, again when the place is
// replaced, and ends when its agent exits 0 or the driver says so. The driver reports what
// Spark and the tasks do on its stdout (lines "SHOAL-SPARK {json}"), which this backend turns
// into allocation events and lost places, and takes commands (replace, terminate, end) on its
// stdin. See docs/backends/spark.md and docs/design/0018-spark-backend.md.
class SparkBackend final : public Backend {
 public:
  explicit SparkBackend(SparkBackendOptions options);
  ~SparkBackend() override;

  std::string Name() const override { return "spark"; }
  absl::StatusOr<std::vector<NodeGrant>> Acquire(const spec::JobSpec& job,
                                                 const std::string& job_id) override;
  absl::Status StartAgents(const AgentStartOptions& options) override;
  void SetPlaceLostCallback(PlaceLostCallback callback) override;
  void SetAllocationEventCallback(AllocationEventCallback callback) override;
  // Spark kills a failed stage attempt's other barrier tasks, and with them their agents'
  // tasks: a task's SIGTERM may be part of a stage failure about to be reported.
  bool SignalsTasksFromOutside() const override { return true; }
  // Spark signals a task only through its agent's end (Spark kills the barrier task's Python
  // worker, and the agent with it), and the driver reports the place lost the moment that
  // task's connection ends: nothing like the 2 s a Slurm or YARN report may take. A task killed
  // on its own is judged that much sooner.
  std::chrono::milliseconds OutsideStopSettle() const override {
    return std::chrono::milliseconds(300);
  }
  void TerminatePlace(const std::string& node) override;
  absl::Status ReplacePlace(const std::string& node, const AgentStartOptions& options) override;
  void Release() override;

  // The Spark application's name: shoal-<job id>.
  std::string ApplicationName() const { return "shoal-" + job_id_; }

  // The Spark properties the driver sets for `job` (before the job's own conf): the barrier
  // tasks' size, the scheduler's patience for the gang, where executors reach the driver.
  static std::map<std::string, std::string> SparkProperties(const spec::JobSpec& job,
                                                            const SparkBackendOptions& options,
                                                            const std::string& driver_host);
  // k8s:// masters: the executor pod template (spark.kubernetes.executor.podTemplateFile)
  // that brings the agent bundle of `agent_image` into every executor pod, at /opt/shoal.
  static nlohmann::json ExecutorPodTemplate(const std::string& agent_image,
                                            const std::string& pull_policy);
  // The driver program (shoal_spark_driver.py), as built into this binary.
  static const char* DriverProgram();

 private:
  void Watch(int stdout_fd);
  void HandleEvent(const nlohmann::json& event);
  void LoseAll(const std::string& why);
  // One line to the driver's stdin: "replace PLACE", "terminate PLACE" or "end".
  void Command(const std::string& line) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  SparkBackendOptions options_;
  spec::JobSpec job_;
  std::string job_id_;
  std::vector<NodeGrant> places_;
  std::thread watcher_;

  mutable absl::Mutex mu_;
  pid_t driver_pid_ ABSL_GUARDED_BY(mu_) = -1;
  int driver_stdin_ ABSL_GUARDED_BY(mu_) = -1;  // where commands go; -1 once closed
  bool driver_exited_ ABSL_GUARDED_BY(mu_) = false;
  int driver_status_ ABSL_GUARDED_BY(mu_) = -1;
  std::string app_id_ ABSL_GUARDED_BY(mu_);
  bool gang_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::string finish_reason_ ABSL_GUARDED_BY(mu_);
  bool releasing_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  std::string last_queued_reason_ ABSL_GUARDED_BY(mu_);
  // Places whose barrier task has started an agent at least once: a later failure to start
  // one costs the place; a first one means the job cannot run there at all.
  std::set<std::string> started_places_ ABSL_GUARDED_BY(mu_);
  bool refused_ ABSL_GUARDED_BY(mu_) = false;
  PlaceLostCallback on_lost_ ABSL_GUARDED_BY(mu_);
  AllocationEventCallback on_event_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal::backends
