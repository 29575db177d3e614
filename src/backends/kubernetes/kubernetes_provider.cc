#include "backends/kubernetes/kubernetes_provider.h"

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "backends/kubernetes/kube_client.h"
#include "backends/kubernetes/kube_config.h"
#include "backends/kubernetes/kubernetes_backend.h"
#include "backends/kubernetes/kubernetes_section.h"
#include "common/local_address.h"
#include "nlohmann/json.hpp"

namespace shoal::backends {
namespace {

// The host of an https://host:port URL.
std::string HostOf(const std::string& server) {
  absl::string_view rest = server;
  if (!absl::ConsumePrefix(&rest, "https://")) absl::ConsumePrefix(&rest, "http://");
  rest = rest.substr(0, rest.find('/'));
  if (absl::StartsWith(rest, "[")) return std::string(rest.substr(1, rest.find(']') - 1));
  return std::string(rest.substr(0, rest.rfind(':')));
}

bool IsLoopback(const std::string& host) {
  return host == "localhost" || absl::StartsWith(host, "127.") || host == "::1";
}

// Where pods can reach a master started here: the address this machine uses towards the API
// server, unless that is loopback (a cluster on this machine), then the address of its default
// route, which the pods' traffic reaches through their node.
absl::StatusOr<std::string> MasterAddressFor(const std::string& server) {
  std::string host = HostOf(server);
  if (!IsLoopback(host)) {
    return common::LocalAddressTowards(host, "443", "the Kubernetes API server");
  }
  // TEST-NET-3: nothing is sent (a UDP connect only picks the route), and no network owns it.
  return common::LocalAddressTowards("203.0.113.1", "9", "the default route");
}

void CheckFlagValue(const std::map<std::string, std::string>& flags, const char* name,
                    bool (*valid)(absl::string_view), const char* form,
                    std::vector<std::string>& problems) {
  auto it = flags.find(name);
  if (it != flags.end() && !valid(it->second)) {
    problems.push_back(
        absl::StrCat(name, ": must be ", form, ", got ", spec::DescribeText(it->second)));
  }
}

std::string FlagOr(const std::map<std::string, std::string>& flags, const char* name,
                   const std::string& fallback) {
  auto it = flags.find(name);
  return it == flags.end() ? fallback : it->second;
}

// May the caller `verb` `resource` in `ns`? Asked of the API server itself
// (SelfSubjectAccessReview), so the answer is RBAC's, whatever the credentials are.
absl::StatusOr<bool> MayDo(KubeClient& client, const std::string& ns, const char* verb,
                           const char* resource, std::string& why) {
  nlohmann::json review = {
      {"apiVersion", "authorization.k8s.io/v1"},
      {"kind", "SelfSubjectAccessReview"},
      {"spec", {{"resourceAttributes",
                 {{"namespace", ns}, {"verb", verb}, {"resource", resource}}}}}};
  auto answer =
      client.Create("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review);
  if (!answer.ok()) return answer.status();
  const nlohmann::json status = answer->value("status", nlohmann::json::object());
  why = status.value("reason", "");
  return status.value("allowed", false);
}

}  // namespace

std::vector<RunFlag> KubernetesProvider::Flags() const {
  return {{"--kubeconfig", "kubeconfig file (default $KUBECONFIG, ~/.kube/config, in-cluster)"},
          {"--namespace", "Kubernetes namespace (kubernetes.namespace)"},
          {"--image", "container image of the tasks (kubernetes.image)"},
          {"--agent-image", "image that brings Shoal's agent into each pod "
                            "(kubernetes.agent_image)"},
          {"--agent-host-path", "the agent is installed at this path on every node (shoal "
                                "kubernetes agent-daemonset): pods mount it instead of copying "
                                "it in (kubernetes.agent_host_path)"}};
}

std::optional<spec::JobSection> KubernetesProvider::JobSection() const {
  return KubernetesJobSection();
}

absl::StatusOr<Preflight> KubernetesProvider::Check(const PreflightRequest& request) const {
  const KubernetesConfig& section = KubernetesConfigOf(*request.job);
  // The flags' own rules first: a mistyped flag is named as such, whatever else is missing.
  std::vector<std::string> problems;
  CheckFlagValue(request.flags, "--namespace", IsDnsLabel, kNamespaceForm, problems);
  CheckFlagValue(request.flags, "--image", IsImageReference, kImageForm, problems);
  CheckFlagValue(request.flags, "--agent-image", IsImageReference, kImageForm, problems);
  CheckFlagValue(request.flags, "--agent-host-path", IsAgentHostPath, kAgentHostPathForm,
                 problems);
  if (auto it = request.flags.find("--kubeconfig");
      it != request.flags.end() && it->second.empty()) {
    problems.push_back("--kubeconfig: must be a file name, got ''");
  }
  if (!problems.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid flag: ", absl::StrJoin(problems, "\n")));
  }
  const std::string image = FlagOr(request.flags, "--image", section.image);
  std::vector<std::string> without_image;
  for (const spec::Role& role : request.job->roles) {
    auto it = section.roles.find(role.name);
    bool own = it != section.roles.end() && it->second.image.has_value();
    if (!own && image.empty()) without_image.push_back(role.name);
  }
  if (!without_image.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--backend kubernetes needs the image the tasks run: kubernetes.image in the job file, "
        "or --image (no image for role ", absl::StrJoin(without_image, ", "),
        "); the image needs nothing of Shoal installed"));
  }

  std::optional<std::string> kubeconfig_flag;
  std::string kubeconfig_path;
  if (auto it = request.flags.find("--kubeconfig"); it != request.flags.end()) {
    std::error_code ec;
    kubeconfig_path = std::filesystem::absolute(it->second, ec).string();
    kubeconfig_flag = kubeconfig_path;
  }
  absl::StatusOr<KubeConfig> kube = LoadKubeConfig(kubeconfig_flag);
  if (!kube.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend kubernetes: ", kube.status().message()));
  }
  const std::string ns = FlagOr(request.flags, "--namespace",
                                !section.namespace_.empty() ? section.namespace_
                                : !kube->namespace_.empty() ? kube->namespace_
                                                            : "default");
  absl::StatusOr<std::unique_ptr<KubeClient>> client = KubeClient::Create(*kube);
  if (!client.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend kubernetes: ", kube->source, ": ", client.status().message()));
  }
  auto version = (*client)->Get("/version");
  if (!version.ok()) {
    if (version.status().code() == absl::StatusCode::kUnauthenticated) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--backend kubernetes: the API server at ", kube->server,
          " refused the credentials of ", kube->source, ": ", version.status().message()));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("--backend kubernetes: the API server at ", kube->server, " (",
                     kube->source, ") does not answer: ", version.status().message()));
  }
  auto namespace_object = (*client)->Get(absl::StrCat("/api/v1/namespaces/", ns));
  if (!namespace_object.ok() && namespace_object.status().code() == absl::StatusCode::kNotFound) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--backend kubernetes: namespace ", ns, " does not exist on ", kube->server,
        " (create it, or choose another with --namespace or kubernetes.namespace)"));
  }
  for (const char* resource : {"pods", "secrets", "configmaps"}) {
    for (const char* verb : {"create", "delete", "watch"}) {
      if (std::string(resource) != "pods" && std::string(verb) == "watch") continue;
      std::string why;
      absl::StatusOr<bool> allowed = MayDo(**client, ns, verb, resource, why);
      if (!allowed.ok()) {
        return absl::FailedPreconditionError(
            absl::StrCat("--backend kubernetes: cannot ask ", kube->server,
                         " what this user may do: ", allowed.status().message()));
      }
      if (!*allowed) {
        return absl::FailedPreconditionError(absl::StrCat(
            "--backend kubernetes: the user of ", kube->source, " may not ", verb, " ", resource,
            " in namespace ", ns, why.empty() ? "" : absl::StrCat(" (", why, ")"),
            "; Shoal creates the job's pods, a secret and a configmap there"));
      }
    }
  }

  Preflight out;
  out.listen_host = request.listen_host;
  if (out.listen_host.empty()) {
    absl::StatusOr<std::string> address = MasterAddressFor(kube->server);
    if (!address.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("--backend kubernetes: ", address.status().message(),
                       "; give the address the cluster's pods reach this machine at with "
                       "--listen"));
    }
    out.listen_host = *address;
  }
  out.settings = {
      {"kubeconfig", kubeconfig_path},
      {"server", kube->server},
      {"namespace", ns},
      {"image", image},
      {"agent_image", FlagOr(request.flags, "--agent-image",
                             section.agent_image.empty() ? kDefaultAgentImage
                                                         : section.agent_image)},
      {"agent_host_path",
       FlagOr(request.flags, "--agent-host-path", section.agent_host_path)}};
  return out;
}

absl::StatusOr<CreatedBackend> KubernetesProvider::Create(const BackendContext& context) const {
  const nlohmann::json& settings = *context.settings;
  const KubernetesConfig& section = KubernetesConfigOf(*context.job);
  std::string kubeconfig = settings.value("kubeconfig", "");
  absl::StatusOr<KubeConfig> kube =
      LoadKubeConfig(kubeconfig.empty() ? std::nullopt : std::optional<std::string>(kubeconfig));
  if (!kube.ok()) return kube.status();
  KubernetesBackendOptions options;
  options.job = *context.job;
  options.kube = *kube;
  options.ns = settings.value("namespace", "");
  options.task_image = settings.value("image", section.image);
  options.image_pull_policy = section.image_pull_policy;
  options.agent_image = settings.value("agent_image", std::string(kDefaultAgentImage));
  options.agent_host_path = settings.value("agent_host_path", section.agent_host_path);
  options.state_dir = context.job_dir + "/agents/kubernetes";
  if (options.ns.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(context.job_dir, "/submit.json lacks kubernetes.namespace"));
  }
  CreatedBackend out;
  out.listen_host = context.listen_host;
  if (out.listen_host.empty()) {
    absl::StatusOr<std::string> address = MasterAddressFor(kube->server);
    if (!address.ok()) return address.status();
    out.listen_host = *address;
  }
  out.backend = std::make_unique<KubernetesBackend>(std::move(options));
  return out;
}

}  // namespace shoal::backends
