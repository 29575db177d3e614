#include "backends/kubernetes/kubernetes_objects.h"

#include <cmath>
#include <functional>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shoal::backends {
namespace {

constexpr size_t kJobObjectMaxLength = 45;
constexpr char kAgentVolume[] = "shoal-agent";
constexpr char kAgentInstallMount[] = "/mnt/shoal";

// Lowercase letters, digits and '-', no '-' at either end or twice in a row.
std::string DnsLabelOf(const std::string& text) {
  std::string out;
  for (char c : text) {
    char lower = absl::ascii_tolower(static_cast<unsigned char>(c));
    bool keep = absl::ascii_islower(static_cast<unsigned char>(lower)) ||
                absl::ascii_isdigit(static_cast<unsigned char>(lower));
    if (keep) {
      out += lower;
    } else if (!out.empty() && out.back() != '-') {
      out += '-';
    }
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out.empty() ? "job" : out;
}

// FNV-1a: stable across builds and machines (std::hash is not), for names derived from ids.
uint32_t StableHash(const std::string& text) {
  uint32_t h = 2166136261u;
  for (unsigned char c : text) {
    h ^= c;
    h *= 16777619u;
  }
  return h;
}

nlohmann::json ObjectMeta(const std::string& name, const KubernetesConfig& config,
                          const JobObjectsContext& context) {
  nlohmann::json meta = {{"name", name}, {"namespace", context.ns}};
  meta["labels"] = JobLabels(config, context);
  meta["annotations"] = {{kJobIdAnnotation, context.job_id}};
  if (!context.owner_uid.empty()) {
    meta["ownerReferences"] = nlohmann::json::array({{{"apiVersion", "v1"},
                                                      {"kind", "ConfigMap"},
                                                      {"name", context.job_object},
                                                      {"uid", context.owner_uid},
                                                      {"blockOwnerDeletion", true}}});
  }
  return meta;
}

nlohmann::json VolumeJson(const KubeVolume& v) {
  nlohmann::json out = {{"name", v.name}};
  switch (v.source) {
    case KubeVolume::Source::kHostPath:
      out["hostPath"] = {{"path", v.source_name}};
      break;
    case KubeVolume::Source::kPersistentVolumeClaim:
      out["persistentVolumeClaim"] = {{"claimName", v.source_name}};
      break;
    case KubeVolume::Source::kConfigMap:
      out["configMap"] = {{"name", v.source_name}};
      break;
    case KubeVolume::Source::kEmptyDir: {
      nlohmann::json empty = nlohmann::json::object();
      if (!v.empty_dir_medium.empty()) empty["medium"] = v.empty_dir_medium;
      if (v.size_limit) empty["sizeLimit"] = MemoryQuantity(*v.size_limit);
      out["emptyDir"] = empty;
      break;
    }
  }
  return out;
}

nlohmann::json TolerationJson(const KubeToleration& t) {
  nlohmann::json out = {{"operator", t.op}};
  if (!t.key.empty()) out["key"] = t.key;
  if (!t.value.empty()) out["value"] = t.value;
  if (!t.effect.empty()) out["effect"] = t.effect;
  if (t.toleration_seconds) out["tolerationSeconds"] = *t.toleration_seconds;
  return out;
}

}  // namespace

std::string JobObjectName(const std::string& job_id) {
  std::string name = "shoal-" + DnsLabelOf(job_id);
  if (name.size() <= kJobObjectMaxLength) return name;
  std::string suffix = absl::StrFormat("-%08x", StableHash(job_id));
  name.resize(kJobObjectMaxLength - suffix.size());
  while (!name.empty() && name.back() == '-') name.pop_back();
  return name + suffix;
}

std::string PodName(const std::string& job_object, const std::string& role, uint32_t index,
                    uint32_t attempt) {
  return absl::StrCat(job_object, "-", DnsLabelOf(role), "-", index, "-", attempt);
}

std::string CpuQuantity(double cpus) {
  return absl::StrCat(static_cast<int64_t>(std::llround(cpus * 1000)), "m");
}

std::string MemoryQuantity(uint64_t bytes) {
  if (bytes % (1ull << 20) == 0) return absl::StrCat(bytes >> 20, "Mi");
  return absl::StrCat(bytes);
}

std::map<std::string, std::string> JobLabels(const KubernetesConfig& config,
                                             const JobObjectsContext& context) {
  std::map<std::string, std::string> labels = config.labels;
  labels[kJobLabel] = context.job_object;
  labels["app.kubernetes.io/managed-by"] = "shoal";
  return labels;
}

nlohmann::json OwnerConfigMap(const KubernetesConfig& config, const JobObjectsContext& context) {
  JobObjectsContext unowned = context;
  unowned.owner_uid.clear();
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", ObjectMeta(context.job_object, config, unowned)},
          {"data", {{"job-id", context.job_id}}}};
}

nlohmann::json TokenSecret(const KubernetesConfig& config, const JobObjectsContext& context,
                           const std::string& token) {
  return {{"apiVersion", "v1"},
          {"kind", "Secret"},
          {"metadata", ObjectMeta(context.job_object + "-token", config, context)},
          {"type", "Opaque"},
          {"stringData", {{kTokenSecretKey, token}}}};
}

std::string RoleImage(const KubernetesConfig& config, const JobObjectsContext& context,
                      const std::string& role) {
  if (auto it = config.roles.find(role); it != config.roles.end() && it->second.image) {
    return *it->second.image;
  }
  return context.task_image;
}

nlohmann::json TaskPod(const spec::Role& role, uint32_t index,
                       uint32_t attempt, const KubernetesConfig& config,
                       const JobObjectsContext& context, const PodAgentArgs& agent) {
  const KubeRoleSettings* role_settings = nullptr;
  if (auto it = config.roles.find(role.name); it != config.roles.end()) {
    role_settings = &it->second;
  }
  const std::string place = absl::StrCat(role.name, ".", index);
  nlohmann::json meta =
      ObjectMeta(PodName(context.job_object, role.name, index, attempt), config, context);
  meta["labels"][kRoleLabel] = DnsLabelOf(role.name);
  meta["labels"][kPlaceLabel] = DnsLabelOf(place);
  for (const auto& [key, value] : config.annotations) meta["annotations"][key] = value;
  meta["annotations"]["shoal.io/place"] = place;
  meta["annotations"]["shoal.io/attempt"] = absl::StrCat(attempt);

  // The agent's command line: as on YARN, one agent per pod serving one place.
  std::vector<std::string> command = {
      absl::StrCat(kAgentMountPath, "/bin/shoal"), "agent",
      "--master", agent.master_address,
      "--node", place,
      "--work-dir", "/tmp/shoal-agent",
      "--ports", absl::StrCat(agent.ports),
      "--master-grace-ms", absl::StrCat(agent.master_grace_ms),
      "--heartbeat-interval-ms", absl::StrCat(agent.heartbeat_interval_ms),
      "--watchdog-ms", absl::StrCat(agent.watchdog_ms),
      "--in-container"};
  if (!agent.task_ports.empty()) {
    command.push_back("--task-ports");
    command.push_back(agent.task_ports);
  }
  if (role.resources.gpus > 0) command.push_back("--gpus-from-env");

  nlohmann::json resources = nlohmann::json::object();
  nlohmann::json requests = {{"cpu", CpuQuantity(role.resources.cpus)}};
  nlohmann::json limits = {{"cpu", CpuQuantity(role.resources.cpus)}};
  if (role.resources.memory_bytes > 0) {
    std::string memory = MemoryQuantity(role.resources.memory_bytes + kAgentMemoryHeadroomBytes);
    requests["memory"] = memory;
    limits["memory"] = memory;
  } else {
    requests["memory"] = MemoryQuantity(kAgentMemoryHeadroomBytes);
  }
  if (role.resources.gpus > 0) {
    // Extended resources are limits only; Kubernetes sets the request equal.
    limits["nvidia.com/gpu"] = role.resources.gpus;
  }
  resources["requests"] = requests;
  resources["limits"] = limits;

  nlohmann::json env = nlohmann::json::array();
  env.push_back({{"name", "SHOAL_AGENT_TOKEN"},
                 {"valueFrom",
                  {{"secretKeyRef",
                    {{"name", context.job_object + "-token"}, {"key", kTokenSecretKey}}}}}});
  // The training SDK comes with the agent, so the user's image needs nothing of Shoal; a role's
  // own PYTHONPATH (its env) still wins, as every role env does.
  env.push_back({{"name", "PYTHONPATH"}, {"value", absl::StrCat(kAgentMountPath, "/python")}});

  nlohmann::json mounts = nlohmann::json::array();
  mounts.push_back({{"name", kAgentVolume}, {"mountPath", kAgentMountPath}, {"readOnly", true}});
  nlohmann::json volumes = nlohmann::json::array();
  if (context.agent_host_path.empty()) {
    volumes.push_back({{"name", kAgentVolume}, {"emptyDir", nlohmann::json::object()}});
  } else {
    // Installed on the node beforehand (AgentDaemonSet): no second container to start, which
    // is most of what a pod costs beyond its task's (docs/design/0013). Type Directory: a node
    // without it fails the mount, rather than running an empty one.
    volumes.push_back({{"name", kAgentVolume},
                       {"hostPath", {{"path", context.agent_host_path}, {"type", "Directory"}}}});
  }
  auto add_volume = [&](const KubeVolume& v) {
    volumes.push_back(VolumeJson(v));
    mounts.push_back({{"name", v.name}, {"mountPath", v.mount_path}, {"readOnly", v.read_only}});
  };
  for (const KubeVolume& v : config.volumes) add_volume(v);
  if (role_settings != nullptr) {
    for (const KubeVolume& v : role_settings->volumes) add_volume(v);
  }

  std::string pull_policy = context.image_pull_policy;
  if (role_settings != nullptr && role_settings->image_pull_policy) {
    pull_policy = *role_settings->image_pull_policy;
  }
  nlohmann::json task = {{"name", "task"},
                         {"image", RoleImage(config, context, role.name)},
                         {"command", command},
                         {"env", env},
                         {"resources", resources},
                         {"volumeMounts", mounts}};
  if (!pull_policy.empty()) task["imagePullPolicy"] = pull_policy;

  nlohmann::json install = {
      {"name", "shoal-agent"},
      {"image", context.agent_image},
      {"imagePullPolicy", context.agent_image_pull_policy},
      {"command", {"/bin/cp", "-a", absl::StrCat(kAgentMountPath, "/."),
                   absl::StrCat(kAgentInstallMount, "/")}},
      {"volumeMounts", {{{"name", kAgentVolume}, {"mountPath", kAgentInstallMount}}}},
      // The copy needs little; requests count towards the pod's and must not make it bigger.
      {"resources", {{"requests", {{"cpu", "10m"}, {"memory", "32Mi"}}}}}};

  std::map<std::string, std::string> node_selector = config.node_selector;
  nlohmann::json tolerations = nlohmann::json::array();
  for (const KubeToleration& t : config.tolerations) tolerations.push_back(TolerationJson(t));
  if (role_settings != nullptr) {
    for (const auto& [k, v] : role_settings->node_selector) node_selector[k] = v;
    for (const KubeToleration& t : role_settings->tolerations) {
      tolerations.push_back(TolerationJson(t));
    }
  }

  nlohmann::json spec = {{"restartPolicy", "Never"},
                         {"containers", {task}},
                         {"volumes", volumes},
                         // Shoal's rendezvous gives tasks their peers; service links would only
                         // add variables to every task's environment.
                         {"enableServiceLinks", false},
                         {"hostNetwork", config.host_network}};
  if (context.agent_host_path.empty()) spec["initContainers"] = nlohmann::json::array({install});
  if (config.host_network) spec["dnsPolicy"] = "ClusterFirstWithHostNet";
  if (!node_selector.empty()) spec["nodeSelector"] = node_selector;
  if (!tolerations.empty()) spec["tolerations"] = tolerations;
  if (!config.priority_class.empty()) spec["priorityClassName"] = config.priority_class;
  if (config.service_account.empty()) {
    // Tasks get no API credentials unless the job names an account for them.
    spec["automountServiceAccountToken"] = false;
  } else {
    spec["serviceAccountName"] = config.service_account;
  }
  return {{"apiVersion", "v1"}, {"kind", "Pod"}, {"metadata", meta}, {"spec", spec}};
}

}  // namespace shoal::backends
