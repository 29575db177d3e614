#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "spec/job_section.h"
#include "spec/job_spec.h"

namespace shoal::backends {

// One volume mounted into a task's container (`kubernetes.volumes[i]`, or a role's).
struct KubeVolume {
  enum class Source { kHostPath, kPersistentVolumeClaim, kConfigMap, kEmptyDir };
  std::string name;  // a DNS-1123 label, unique among the pod's volumes
  Source source = Source::kEmptyDir;
  std::string source_name;  // the host path, the claim's name or the ConfigMap's name
  std::string empty_dir_medium;       // "" (the node's disk) or "Memory"
  std::optional<uint64_t> size_limit;  // empty_dir only
  std::string mount_path;             // absolute
  bool read_only = false;
};

struct KubeToleration {
  std::string key;       // empty with operator Exists: every taint
  std::string op;        // "Equal" or "Exists"
  std::string value;     // Equal only
  std::string effect;    // "", NoSchedule, PreferNoSchedule or NoExecute
  std::optional<int64_t> toleration_seconds;  // NoExecute only
};

// What may differ per role (`kubernetes.roles.<role>`); unset: the section's value.
struct KubeRoleSettings {
  std::optional<std::string> image;
  std::optional<std::string> image_pull_policy;
  std::vector<KubeVolume> volumes;  // in addition to the section's
  std::map<std::string, std::string> node_selector;  // merged over the section's
  std::vector<KubeToleration> tolerations;           // in addition to the section's
};

// Where and how the job's pods run on Kubernetes (`kubernetes:` in the job file). The flags of
// `shoal run --backend kubernetes` win over these (docs/backends/kubernetes.md).
struct KubernetesConfig : spec::SectionValue {
  std::string namespace_;  // empty: --namespace, else the kubeconfig context's, else default
  std::string image;       // the tasks' image; required (here, per role, or --image)
  std::string image_pull_policy;  // empty: Kubernetes' default for the image's tag
  // The image that brings Shoal's agent into each pod (tools/kubernetes/agent_image.py);
  // empty: kDefaultAgentImage.
  std::string agent_image;
  // Where the agent is already on every node (`shoal kubernetes agent-daemonset` puts it there):
  // the pods mount it instead of copying it in with an init container. Empty: the init container.
  std::string agent_host_path;
  std::string service_account;
  std::string priority_class;
  std::map<std::string, std::string> node_selector;
  std::vector<KubeToleration> tolerations;
  std::map<std::string, std::string> labels;       // added to every object Shoal creates
  std::map<std::string, std::string> annotations;  // added to every pod
  bool host_network = false;
  std::vector<KubeVolume> volumes;
  std::map<std::string, KubeRoleSettings> roles;
};

inline constexpr char kDefaultAgentImage[] = "localhost/shoal-agent:latest";
// Where the agent's bundle is mounted in every task container; no volume may use it.
inline constexpr char kAgentMountPath[] = "/opt/shoal";
// Where `shoal kubernetes agent-daemonset` installs the agent on each node unless told otherwise.
inline constexpr char kDefaultAgentHostPath[] = "/var/lib/shoal/agent";
// Label keys under this prefix are Shoal's own (the job's id, role, place).
inline constexpr char kShoalLabelPrefix[] = "shoal.io/";

// The `kubernetes:` section of the job file, for the parser (spec::JobSections).
spec::JobSection KubernetesJobSection();

// The job file's `kubernetes:` section, or the defaults when it has none.
const KubernetesConfig& KubernetesConfigOf(const spec::JobSpec& job);

// The rules the section and the flags share, with their words for messages.
inline constexpr char kNamespaceForm[] =
    "a Kubernetes namespace: at most 63 lowercase letters, digits and '-', starting and ending "
    "with a letter or digit, e.g. ml-team";
inline constexpr char kObjectNameForm[] =
    "a Kubernetes object name: at most 253 lowercase letters, digits, '-' and '.', starting and "
    "ending with a letter or digit, e.g. training-jobs";
inline constexpr char kImageForm[] =
    "a container image reference without spaces, e.g. registry.example.com/team/train:1.2";
inline constexpr char kPullPolicyForm[] = "one of Always, IfNotPresent, Never";
inline constexpr char kAgentHostPathForm[] =
    "an absolute path on the nodes, without '.', '..', '//' or a trailing '/', other than /, "
    "e.g. /var/lib/shoal/agent";
bool IsDnsLabel(absl::string_view text);      // RFC 1123 label, <= 63
bool IsDnsSubdomain(absl::string_view text);  // RFC 1123 subdomain, <= 253
bool IsImageReference(absl::string_view text);
bool IsPullPolicy(absl::string_view text);
bool IsAgentHostPath(absl::string_view text);
// A label or annotation key: [prefix/]name, the name at most 63 of [A-Za-z0-9-_.] starting and
// ending alphanumeric, the prefix a DNS subdomain.
bool IsQualifiedName(absl::string_view text);
// A label value: empty, or at most 63 of [A-Za-z0-9-_.] starting and ending alphanumeric.
bool IsLabelValue(absl::string_view text);

}  // namespace shoal::backends
