#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "backends/backend.h"
#include "backends/kubernetes/kube_config.h"
#include "backends/kubernetes/kubernetes_objects.h"
#include "backends/kubernetes/kubernetes_section.h"
#include "nlohmann/json.hpp"

namespace shoal::backends {

class AdmissionLease;
class KubeClient;
struct PodObservation;

struct KubernetesBackendOptions {
  // The job; a master that takes a job over (Reattach) gets no Acquire to learn it from.
  spec::JobSpec job;
  KubeConfig kube;
  std::string ns;
  std::string task_image;         // the tasks' image unless a role names its own
  std::string image_pull_policy;  // empty: Kubernetes' default
  std::string agent_image = kDefaultAgentImage;
  std::string agent_image_pull_policy = "IfNotPresent";
  // Where the agent is installed on every node; empty: each pod copies it in from agent_image.
  std::string agent_host_path;
  // Where the job's object names are recorded, for people and tools: <job dir>/agents/kubernetes.
  std::string state_dir;
  // How long Release waits for the job's pods to be gone (their agents stop their tasks).
  std::chrono::milliseconds release_wait{60000};
  // Gang admission (docs/design/0013): pods are created gated and released together once the
  // whole gang fits, under a Lease that serializes Shoal's admissions in the namespace.
  bool gang_admission = true;
  std::string admission_lease = "shoal-gang-admission";
  // A holder that stopped renewing (a dead master) blocks the others at most this long.
  std::chrono::seconds admission_lease_duration{30};
  // Un-gated pods the scheduler has not bound by then are taken back and admitted again later:
  // the longest a gang holds part of the cluster without all of it.
  std::chrono::milliseconds admission_timeout{30000};
};

// Runs each Shoal task in a pod of its own, as on YARN one agent per place (role.index), on
// the cluster of a kubeconfig (docs/backends/kubernetes.md, docs/design/0013). The master runs
// beside the client; the pods' agents dial it. Every object hangs from one owner ConfigMap, so
// deleting it removes the job; the token is in a Secret. One thread watches the job's pods
// (a watch, not polling) and reports allocation events and lost places; another runs the
// master's commands (terminate, replace) so that API calls never block the master's loop.
class KubernetesBackend final : public Backend {
 public:
  explicit KubernetesBackend(KubernetesBackendOptions options);
  ~KubernetesBackend() override;

  std::string Name() const override { return "kubernetes"; }
  absl::StatusOr<std::vector<NodeGrant>> Acquire(const spec::JobSpec& job,
                                                 const std::string& job_id) override;
  absl::Status StartAgents(const AgentStartOptions& options) override;
  void SetPlaceLostCallback(PlaceLostCallback callback) override;
  void SetAllocationEventCallback(AllocationEventCallback callback) override;
  // The kubelet ends a deleted or preempted pod with SIGTERM to its processes.
  bool SignalsTasksFromOutside() const override { return true; }
  // The agent's hostname is its pod's name, which holds the place's attempt.
  bool IsCurrentAgent(const std::string& node, const std::string& hostname) const override;
  void TerminatePlace(const std::string& node) override;
  absl::Status ReplacePlace(const std::string& node, const AgentStartOptions& options) override;
  void Release() override;
  absl::Status Reattach(const std::string& job_id, const std::vector<NodeGrant>& grants,
                        const AgentStartOptions& options) override;

  // The places of `job`: one per task, named role.index, each for its one task.
  static std::vector<NodeGrant> Places(const spec::JobSpec& job);

 private:
  struct Place {
    std::string role;
    uint32_t index = 0;
    uint32_t attempt = 0;      // of the pod now serving it
    bool scheduled = false;    // that pod was bound to a node
    bool running = false;      // and its containers started
    bool lost = false;         // reported lost; until replaced
    bool ending = false;       // its pod is being deleted (said once)
    // A place of an elastic role beyond its min: the job may start without it, and it is
    // admitted on its own whenever the cluster has room for it.
    bool optional = false;
    bool admitted = false;     // its pod was released to the scheduler (or never gated)
  };
  // What Acquire and Reattach both learn: the job's names and places.
  std::vector<NodeGrant> Init(const std::string& job_id);
  void SetAgentArgs(const AgentStartOptions& options);
  void StartThreads();
  // The last lines the pod's agent container wrote, for a reason ("" when there are none).
  std::string LogTail(const std::string& pod);
  absl::Status CreateOwnerAndSecret(const std::string& token);
  absl::StatusOr<nlohmann::json> PodManifest(const std::string& place, uint32_t attempt);
  // A gated pod waits for admission (TryAdmit); an ungated one was admitted already.
  absl::Status CreatePod(const std::string& place, uint32_t attempt, bool gated);
  std::string PodsPath() const;
  std::string LabelSelector() const;
  using ObjectHandler = std::function<void(const nlohmann::json& object, bool deleted)>;
  // Told each failed call (`failures` before it since the last success); false gives up.
  using FailureHandler =
      std::function<bool(const absl::Status& status, const char* what, int failures)>;
  // Lists `path` and watches it from the list's version until the backend stops (a watch that
  // ends resumes; "too old" lists again), handing `on_object` every object; a failed call is
  // retried after 0.5 s to 8 s. `on_recovered`: a success after failures.
  void ListAndWatch(const std::string& path, const ObjectHandler& on_object,
                    const FailureHandler& on_failure, const std::function<void()>& on_recovered);
  // The job's pods, from one watch: allocation events and lost places.
  void Watch();
  // The namespace's FailedMount events (a second watch): a pod that will never mount its
  // volumes shows only there. Ends by itself where events may not be read.
  void WatchMountFailures();
  void OnMountFailure(const nlohmann::json& event);
  void RunCommands();
  // One attempt to admit every place waiting for admission: see the options' comments.
  void TryAdmit();
  // The job's first admission before its pods exist (StartAgents, before the threads start):
  // the places admitted, whose pods are then created without the gate; none when another
  // admission holds the lease or the gang does not fit now (TryAdmit then says why).
  std::vector<std::string> AdmitBeforeCreating();
  // Whether `required` fits the cluster now and how many of `optional` (a prefix) fit beside
  // it; Unavailable with the reason when the required do not (or, with none required, when not
  // one optional does).
  absl::StatusOr<size_t> FitNow(const std::vector<nlohmann::json>& required,
                                const std::vector<nlohmann::json>& optional);
  // Waits until the scheduler has bound `places` (released to it), then releases the lease;
  // those not bound within the admission timeout are taken back whole.
  void AwaitBound(const std::vector<std::string>& places, bool first);
  absl::StatusOr<bool> TakeLease();
  void ReleaseLease();
  void Queue(const std::string& reason);
  void Observe(const PodObservation& pod);
  void DeletePod(const std::string& pod);
  void WaitForPodsGone(std::chrono::milliseconds limit);

  KubernetesBackendOptions options_;
  std::unique_ptr<KubeClient> client_;
  absl::Status client_status_;
  spec::JobSpec job_;
  std::string job_id_;
  JobObjectsContext context_;
  PodAgentArgs agent_args_;

  mutable absl::Mutex mu_;
  std::map<std::string, Place> places_ ABSL_GUARDED_BY(mu_);
  bool gang_ ABSL_GUARDED_BY(mu_) = false;      // every admitted first pod runs: allocated
  // The gang (every place that is not optional) was admitted; later admissions are of single
  // places (optional ones, replacements), each whenever it fits.
  bool gang_admitted_ ABSL_GUARDED_BY(mu_) = false;
  bool refused_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  std::string last_queued_reason_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<std::string, std::string>> deletions_ ABSL_GUARDED_BY(mu_);  // place, pod
  std::deque<std::string> creations_ ABSL_GUARDED_BY(mu_);  // places to give a new pod
  // Places whose (gated) pod waits for admission, and when to try next.
  std::vector<std::string> waiting_admission_ ABSL_GUARDED_BY(mu_);
  // Places admitted before their pods were created: the commander waits for them to be bound.
  std::vector<std::string> bind_wait_ ABSL_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point next_admission_ ABSL_GUARDED_BY(mu_);
  int admission_failures_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, nlohmann::json> manifests_ ABSL_GUARDED_BY(mu_);  // by place
  // The commander thread's only, and StartAgents' before it starts the threads.
  std::unique_ptr<AdmissionLease> lease_;
  bool fit_unavailable_ = false;  // commander thread only: no right to read nodes and pods
  bool lease_unavailable_ = false;  // commander thread only: no right to use the lease
  std::string last_wait_reason_;    // commander thread only: said once per reason
  PlaceLostCallback on_lost_ ABSL_GUARDED_BY(mu_);
  AllocationEventCallback on_event_ ABSL_GUARDED_BY(mu_);
  std::thread watcher_;
  std::thread event_watcher_;
  std::thread commander_;
};

}  // namespace shoal::backends
