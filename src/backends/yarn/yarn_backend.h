#pragma once

#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "backends/yarn/yarn_request.h"

namespace shoal::backends {

struct YarnBackendOptions {
  // The ResourceManager's web address, http://host:port (its REST API, /ws/v1/cluster).
  std::string rm_web;
  YarnRequest request;
  // Shoal's application master (src/backends/yarn/am) on this machine; it reaches the AM's
  // container as a local resource, with the `shoal` binary for the agents' containers.
  std::string am_jar;
  // The cluster's Hadoop jars and configuration as the NodeManagers have them, which the AM
  // runs with after its own jar (':'-separated; NodeManager expansions such as
  // {{HADOOP_COMMON_HOME}} and the launch script's $VARs are expanded in the container), and
  // where that came from, for messages ("SHOAL_YARN_AM_CLASSPATH", ...).
  std::string am_classpath;
  std::string am_classpath_source = "the caller";
  // Where the AM jar and the `shoal` binary are staged for the containers: the cluster's HDFS
  // (hdfs://host:port, the URI the NodeManagers download from), its NameNode's WebHDFS address
  // (http://host:port, how this machine uploads) and the HDFS user (simple authentication)
  // whose /user/<user>/.shoal/staging/<application id> holds them while the application runs.
  std::string hdfs;
  std::string webhdfs;
  std::string hdfs_user;
  // The java binary in the AM's container; NodeManagers pass JAVA_HOME on.
  std::string am_java = "{{JAVA_HOME}}/bin/java";
  uint64_t am_memory_mb = 256;
  // The AM gives up (stops every container, ends the application FAILED) when the master has
  // not polled it this long: a master that died leaves nothing running on the cluster.
  std::chrono::milliseconds am_idle_timeout{60000};
  // Where the application's id is recorded, for people and tools: <job dir>/agents/yarn.
  std::string state_dir;
  // How often the ResourceManager is asked about the application's state.
  std::chrono::milliseconds rm_poll_interval{500};
};

// Runs the job as one YARN application: Shoal's application master (Java; the only client of
// YARN's ApplicationMaster protocol there is) requests one container per Shoal task, holds them
// until the whole gang is allocated, and starts a Shoal agent in each. This backend submits the
// application through the ResourceManager's REST API, follows it there and through the AM's
// small HTTP API, and kills it through the REST API. See docs/backends/yarn.md.
class YarnBackend final : public Backend {
 public:
  explicit YarnBackend(YarnBackendOptions options);
  ~YarnBackend() override;

  std::string Name() const override { return "yarn"; }
  absl::StatusOr<std::vector<NodeGrant>> Acquire(const spec::JobSpec& job,
                                                 const std::string& job_id) override;
  absl::Status StartAgents(const AgentStartOptions& options) override;
  void SetPlaceLostCallback(PlaceLostCallback callback) override;
  void SetAllocationEventCallback(AllocationEventCallback callback) override;
  // A NodeManager ends a container (yarn application -kill, preemption) with SIGTERM to its
  // processes: a task's SIGTERM may be the first sign of a cancellation about to be reported.
  bool SignalsTasksFromOutside() const override { return true; }
  void TerminatePlace(const std::string& node) override;
  absl::Status ReplacePlace(const std::string& node, const AgentStartOptions& options) override;
  void SetOutcome(Outcome outcome, const std::string& reason) override;
  void Release() override;

  // The YARN application's name, which finds it in the ResourceManager: shoal-<job id>.
  std::string ApplicationName() const { return "shoal-" + job_id_; }
  // The application's id once submitted (application_<cluster>_<n>), else "".
  std::string ApplicationId() const;

  // The address this machine uses towards the ResourceManager of `rm_web`: where agents in
  // the cluster's containers can reach a master started here.
  static absl::StatusOr<std::string> AddressTowardsResourceManager(const std::string& rm_web);
  // Checks that `rm_web` answers as a ResourceManager (GET /ws/v1/cluster/info).
  static absl::Status CheckResourceManager(const std::string& rm_web);
  // The ResourceManager's configuration (GET /conf): every property, by name.
  static absl::StatusOr<std::map<std::string, std::string>> ClusterConfiguration(
      const std::string& rm_web);
  // Ids of the applications named `name` that the ResourceManager has not finished.
  static absl::StatusOr<std::vector<std::string>> UnfinishedApplications(
      const std::string& rm_web, const std::string& name);

 private:
  struct Command {
    std::string path;  // /stop or /replace
    std::string place;
  };
  void Watch();
  // One look at the application in the ResourceManager. Returns false once it has ended.
  bool PollResourceManager();
  void PollApplicationMaster();
  void HandleAmEvent(const std::string& kind, const std::string& place,
                     const std::string& container, const std::string& node, int exit_status,
                     const std::string& diagnostics, int allocated, int wanted);
  void Queued(const std::string& reason);
  void Lose(const std::string& place, const std::string& why);
  // Waits for the application to reach FINISHED, FAILED or KILLED; false after `limit`.
  bool WaitForEnd(std::chrono::milliseconds limit);
  void KillApplication();
  // Uploads the AM jar and the `shoal` binary to staging_dir_ (created); their local resources.
  absl::StatusOr<std::vector<YarnLocalResource>> Stage(const std::string& shoal_binary);
  void RemoveStagingDir();

  YarnBackendOptions options_;
  spec::JobSpec job_;
  std::string job_id_;
  std::vector<NodeGrant> places_;
  std::string am_key_;  // the bearer key of the AM's HTTP API (SHOAL_AM_KEY)

  // Written by StartAgents before the watcher starts, read by it and by Release afterwards.
  std::string app_id_;
  std::string token_;
  std::string staging_dir_;  // on HDFS, once created

  mutable absl::Mutex mu_;  // annotated, unlike std::mutex: clang checks what it guards
  std::string am_address_ ABSL_GUARDED_BY(mu_);  // host:port of the AM's HTTP API, once known
  bool launch_sent_ ABSL_GUARDED_BY(mu_) = false;
  bool gang_ ABSL_GUARDED_BY(mu_) = false;
  bool refused_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;  // the application reached a final state
  bool stop_watching_ ABSL_GUARDED_BY(mu_) = false;
  bool releasing_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  int64_t events_seen_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_queued_reason_ ABSL_GUARDED_BY(mu_);
  std::deque<Command> commands_ ABSL_GUARDED_BY(mu_);
  Outcome outcome_ ABSL_GUARDED_BY(mu_) = Outcome::kFailed;
  std::string outcome_reason_ ABSL_GUARDED_BY(mu_);
  PlaceLostCallback on_lost_ ABSL_GUARDED_BY(mu_);
  AllocationEventCallback on_event_ ABSL_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point last_rm_poll_;  // watcher thread only
  std::thread watcher_;
};

}  // namespace shoal::backends
