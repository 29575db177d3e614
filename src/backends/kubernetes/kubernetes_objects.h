#pragma once

// The Kubernetes objects a job is made of, as pure functions of the job file and the backend's
// settings: the owner ConfigMap that every other object hangs from, the Secret holding the
// control-plane token, and one pod per Shoal task. Golden-tested in
// tests/backends/kubernetes/kubernetes_objects_test.cc; no API calls here.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "backends/kubernetes/kubernetes_section.h"
#include "nlohmann/json.hpp"
#include "spec/job_spec.h"

namespace shoal::backends {

// Shoal's labels on every object of a job.
inline constexpr char kJobLabel[] = "shoal.io/job";      // JobObjectName(job id)
inline constexpr char kRoleLabel[] = "shoal.io/role";    // on pods
inline constexpr char kPlaceLabel[] = "shoal.io/place";  // on pods: role.index
inline constexpr char kJobIdAnnotation[] = "shoal.io/job-id";  // the whole job id
// The scheduling gate on every pod until Shoal's gang admission releases it.
inline constexpr char kGangGate[] = "shoal.io/gang";
// The Secret's key holding the token the agents present to the master.
inline constexpr char kTokenSecretKey[] = "token";
// Memory a pod gets beyond its task's, for the agent beside it (as on YARN).
inline constexpr uint64_t kAgentMemoryHeadroomBytes = 128ull << 20;

// A name for the job's objects: the job id made a DNS-1123 label of at most 45 characters
// (lowercase, '-' for anything else; a long id is cut and given a hash of the whole, so two
// ids never share a name), leaving room for a pod's "-<role>-<index>-<attempt>".
std::string JobObjectName(const std::string& job_id);

// The pod of place `place` (role.index) at its `attempt`-th start (0 for the first; a replaced
// place gets a new pod beside the one still terminating).
std::string PodName(const std::string& job_object, const std::string& role, uint32_t index,
                    uint32_t attempt);

struct JobObjectsContext {
  std::string job_id;
  std::string ns;
  std::string job_object;  // JobObjectName(job_id)
  // The owner ConfigMap's uid, once created: every other object names it as its owner, so
  // deleting the owner (or `kubectl delete configmap <job object>`) removes the whole job.
  std::string owner_uid;
  std::string task_image;  // the section's or --image; a role may override it
  std::string image_pull_policy;
  std::string agent_image;
  std::string agent_image_pull_policy = "IfNotPresent";
  // Where the agent is already on every node (kubernetes.agent_host_path or --agent-host-path);
  // empty: each pod copies it in from agent_image.
  std::string agent_host_path;
};

// What the agent in a pod is started with (backend.h's AgentStartOptions, resolved).
struct PodAgentArgs {
  std::string master_address;
  uint32_t ports = 0;
  uint32_t master_grace_ms = 10000;
  uint32_t heartbeat_interval_ms = 1000;
  uint32_t watchdog_ms = 0;
  std::string task_ports;  // SHOAL_TASK_PORTS, when set
};

// The labels Shoal puts on every object of the job, with the section's own.
std::map<std::string, std::string> JobLabels(const KubernetesConfig& config,
                                             const JobObjectsContext& context);

nlohmann::json OwnerConfigMap(const KubernetesConfig& config, const JobObjectsContext& context);
nlohmann::json TokenSecret(const KubernetesConfig& config, const JobObjectsContext& context,
                           const std::string& token);

// The pod running place role.index: an init container from the agent image copies Shoal's
// self-contained agent into an emptyDir at kAgentMountPath (or, with context.agent_host_path,
// the node's copy is mounted there read-only and there is no init container), and the task
// container (the user's image, which needs nothing of Shoal) runs that agent, which starts the
// task. The token comes
// from the Secret through the environment, never as a literal in the pod.
nlohmann::json TaskPod(const spec::Role& role, uint32_t index,
                       uint32_t attempt, const KubernetesConfig& config,
                       const JobObjectsContext& context, const PodAgentArgs& agent);

// The image a role's tasks run: the role's, else the context's.
std::string RoleImage(const KubernetesConfig& config, const JobObjectsContext& context,
                      const std::string& role);

// Kubernetes quantities: cpus as millicores ("1500m"), bytes as "<n>Mi" or plain bytes.
std::string CpuQuantity(double cpus);
std::string MemoryQuantity(uint64_t bytes);

}  // namespace shoal::backends
