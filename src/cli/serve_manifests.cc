#include "cli/serve_manifests.h"

#include <cstdio>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "backends/kubernetes/kubernetes_section.h"
#include "nlohmann/json.hpp"
#include "spec/job_section.h"

namespace shoal::cli {
namespace {

using Object = nlohmann::ordered_json;

// Where the pod finds what the manifests mount.
constexpr char kRepositoryMount[] = "/models";
constexpr char kTokenDir[] = "/etc/shoal-serve";
constexpr char kTokenKey[] = "token";
constexpr char kHostPathPrefix[] = "hostpath:";
constexpr char kPvcPrefix[] = "pvc:";
// What the image holds (tools/kubernetes/agent_image.py --serve).
constexpr char kShoalInImage[] = "/opt/shoal/bin/shoal";
constexpr char kBusyboxInImage[] = "/bin/busybox";
// The pods run as nobody: the server needs to read the repository and the token, nothing more.
constexpr int kNobody = 65534;
// Beyond the drain and the finish time: what the process needs to release its models.
constexpr int kGraceMarginSeconds = 5;

constexpr char kCpuForm[] =
    "a CPU quantity above 0: a number of CPUs (1, 0.25) or millicpus (250m)";
constexpr char kMemoryForm[] =
    "a memory quantity above 0: bytes, optionally with Ki, Mi, Gi, Ti, K, M, G or T (512Mi)";
constexpr char kVolumeForm[] =
    "hostpath:/DIR (a directory on every node) or pvc:CLAIM (a PersistentVolumeClaim's name)";
constexpr char kHostPathForm[] =
    "an absolute path without '.', '..', '//' or a trailing '/', other than /";

bool IsPositiveQuantity(absl::string_view text, std::initializer_list<absl::string_view> suffixes) {
  for (absl::string_view suffix : suffixes) {
    if (!suffix.empty() && absl::EndsWith(text, suffix)) {
      text.remove_suffix(suffix.size());
      break;
    }
  }
  if (text.empty() || text.front() == '.' || text.back() == '.') return false;
  int dots = 0;
  for (char c : text) {
    if (c == '.') {
      ++dots;
    } else if (c < '0' || c > '9') {
      return false;
    }
  }
  double value = 0;
  return dots <= 1 && absl::SimpleAtod(text, &value) && value > 0;
}

bool IsCpuQuantity(absl::string_view text) {
  if (absl::EndsWith(text, "m")) {
    text.remove_suffix(1);
    return !absl::StrContains(text, '.') && IsPositiveQuantity(text, {});
  }
  return IsPositiveQuantity(text, {});
}

bool IsMemoryQuantity(absl::string_view text) {
  for (absl::string_view suffix : {"Ki", "Mi", "Gi", "Ti", "K", "M", "G", "T"}) {
    if (absl::EndsWith(text, suffix)) {
      text.remove_suffix(suffix.size());
      return !absl::StrContains(text, '.') && IsPositiveQuantity(text, {});
    }
  }
  return !absl::StrContains(text, '.') && IsPositiveQuantity(text, {});
}

std::string Refused(absl::string_view flag, absl::string_view form, absl::string_view value) {
  return absl::StrCat(flag, ": must be ", form, ", got ", spec::DescribeText(value));
}

// 32 random bytes as hex: the token the Secret holds.
std::string RandomToken() {
  std::random_device device;  // /dev/urandom on Linux
  std::string token;
  for (int i = 0; i < 8; ++i) absl::StrAppend(&token, absl::Hex(device(), absl::kZeroPad8));
  return token;
}

// YAML in block style, keys in the order given; every string double-quoted (JSON's escapes are
// YAML's), so that no value is read back as a number or a boolean.
void AppendYaml(const Object& value, int indent, std::string& out) {
  std::string pad(indent, ' ');
  if (value.is_object()) {
    for (const auto& [key, item] : value.items()) {
      absl::StrAppend(&out, pad, key, ":");
      if ((item.is_object() || item.is_array()) && !item.empty()) {
        out += "\n";
        AppendYaml(item, indent + 2, out);
      } else {
        absl::StrAppend(&out, " ", item.dump(), "\n");
      }
    }
    return;
  }
  for (const Object& item : value) {
    if ((item.is_object() || item.is_array()) && !item.empty()) {
      std::string nested;
      AppendYaml(item, indent + 2, nested);
      // The item's first line carries the dash: "  key: v" at indent + 2 becomes "- key: v".
      absl::StrAppend(&out, pad, "- ", nested.substr(indent + 2));
    } else {
      absl::StrAppend(&out, pad, "- ", item.dump(), "\n");
    }
  }
}

Object Metadata(const ServeManifestFlags& flags, const std::string& name, const Object& labels) {
  Object metadata = {{"name", name}};
  if (!flags.ns.empty()) metadata["namespace"] = flags.ns;
  metadata["labels"] = labels;
  return metadata;
}

// A probe the kubelet runs inside the container: every endpoint needs the token, which an
// httpGet probe could only carry in the manifest itself. No wget -T: Debian 12's static
// busybox 1.35 crashes with it (SIGSEGV); the probe's timeoutSeconds bounds it instead.
Object HealthProbe(const serve::ServeOptions& serve, absl::string_view endpoint, int period,
                   int failures) {
  std::string check = absl::StrCat(
      "exec ", kBusyboxInImage, " wget -q -O /dev/null --header \"Authorization: Bearer $(",
      kBusyboxInImage, " cat ", kTokenDir, "/", kTokenKey, ")\" http://127.0.0.1:",
      serve.http_port, "/v2/health/", endpoint);
  return {{"exec", {{"command", {"/bin/sh", "-c", check}}}},
          {"periodSeconds", period},
          {"timeoutSeconds", 3},
          {"failureThreshold", failures}};
}

}  // namespace

std::vector<std::string> ServeManifestProblems(const ServeManifestFlags& flags,
                                               const serve::ServeOptions& serve,
                                               const ServeFlagsGiven& given) {
  std::vector<std::string> problems;
  if (given.model_repository) {
    problems.push_back(
        "--model-repository: not with --print-manifests: the pods serve the volume of "
        "--model-repository-volume, mounted at /models");
  }
  if (given.host) {
    problems.push_back("--host: not with --print-manifests: the pods listen on 0.0.0.0");
  }
  if (given.token_file) {
    problems.push_back(
        "--token-file: not with --print-manifests: the pods read the token from a Secret "
        "(--token-secret NAME, or one generated)");
  }
  if (flags.model_repository_volume.empty()) {
    problems.push_back(absl::StrCat("--model-repository-volume: required with --print-manifests: ",
                                    kVolumeForm));
  } else if (absl::StartsWith(flags.model_repository_volume, kHostPathPrefix)) {
    std::string dir = flags.model_repository_volume.substr(sizeof(kHostPathPrefix) - 1);
    if (!backends::IsAgentHostPath(dir)) {
      problems.push_back(Refused("--model-repository-volume hostpath:", kHostPathForm, dir));
    }
  } else if (absl::StartsWith(flags.model_repository_volume, kPvcPrefix)) {
    std::string claim = flags.model_repository_volume.substr(sizeof(kPvcPrefix) - 1);
    if (!backends::IsDnsSubdomain(claim)) {
      problems.push_back(Refused("--model-repository-volume pvc:", backends::kObjectNameForm,
                                 claim));
    }
  } else {
    problems.push_back(
        Refused("--model-repository-volume", kVolumeForm, flags.model_repository_volume));
  }
  // NAME-token must stay a label-sized name too.
  if (!backends::IsDnsLabel(flags.name) || flags.name.size() > 57) {
    problems.push_back(Refused(
        "--name",
        "at most 57 lowercase letters, digits and '-', starting with a letter and ending with a "
        "letter or digit, e.g. shoal-serve",
        flags.name));
  } else if (flags.name.front() < 'a' || flags.name.front() > 'z') {
    problems.push_back(Refused("--name", "a name starting with a letter (a Service's rule)",
                               flags.name));
  }
  if (!flags.ns.empty() && !backends::IsDnsLabel(flags.ns)) {
    problems.push_back(Refused("--namespace", backends::kNamespaceForm, flags.ns));
  }
  if (!backends::IsImageReference(flags.image)) {
    problems.push_back(Refused("--image", backends::kImageForm, flags.image));
  }
  if (!backends::IsPullPolicy(flags.image_pull_policy)) {
    problems.push_back(
        Refused("--image-pull-policy", backends::kPullPolicyForm, flags.image_pull_policy));
  }
  if (!flags.token_secret.empty() && !backends::IsDnsSubdomain(flags.token_secret)) {
    problems.push_back(Refused("--token-secret", backends::kObjectNameForm, flags.token_secret));
  }
  if (!IsCpuQuantity(flags.cpu)) problems.push_back(Refused("--cpu", kCpuForm, flags.cpu));
  if (!IsMemoryQuantity(flags.memory)) {
    problems.push_back(Refused("--memory", kMemoryForm, flags.memory));
  }
  if (serve.http_port == 0) {
    problems.push_back("--http-port: must be a port above 0 with --print-manifests (the Service "
                       "and the probes name it)");
  }
  if (serve.grpc_port == 0) {
    problems.push_back("--grpc-port: must be a port above 0 with --print-manifests (the Service "
                       "names it)");
  }
  if (serve.http_port != 0 && serve.http_port == serve.grpc_port) {
    problems.push_back(absl::StrCat("--grpc-port: must differ from --http-port (both are ",
                                    serve.http_port, ")"));
  }
  return problems;
}

std::string ServeManifests(const ServeManifestFlags& flags, const serve::ServeOptions& serve) {
  const Object labels = {{"app.kubernetes.io/name", "shoal-serve"},
                         {"app.kubernetes.io/instance", flags.name}};
  std::string secret_name =
      flags.token_secret.empty() ? flags.name + "-token" : flags.token_secret;
  std::vector<Object> documents;
  if (flags.token_secret.empty()) {
    documents.push_back({{"apiVersion", "v1"},
                         {"kind", "Secret"},
                         {"metadata", Metadata(flags, secret_name, labels)},
                         {"type", "Opaque"},
                         {"stringData", {{kTokenKey, RandomToken()}}}});
  }

  Object command = {kShoalInImage,
                    "serve",
                    "--model-repository",
                    kRepositoryMount,
                    "--host",
                    "0.0.0.0",
                    "--http-port",
                    std::to_string(serve.http_port),
                    "--grpc-port",
                    std::to_string(serve.grpc_port),
                    "--token-file",
                    absl::StrCat(kTokenDir, "/", kTokenKey),
                    "--drain-seconds",
                    std::to_string(serve.drain_seconds),
                    "--finish-seconds",
                    std::to_string(serve.finish_seconds),
                    "--http-threads",
                    std::to_string(serve.http_threads),
                    "--grpc-threads",
                    std::to_string(serve.grpc_threads),
                    "--max-request-bytes",
                    std::to_string(serve.max_request_bytes),
                    "--repository-poll-ms",
                    std::to_string(serve.repository_poll_ms),
                    "--repository-settle-ms",
                    std::to_string(serve.repository_settle_ms)};

  Object repository_volume = {{"name", "model-repository"}};
  if (absl::StartsWith(flags.model_repository_volume, kHostPathPrefix)) {
    repository_volume["hostPath"] = {
        {"path", flags.model_repository_volume.substr(sizeof(kHostPathPrefix) - 1)},
        {"type", "Directory"}};
  } else {
    repository_volume["persistentVolumeClaim"] = {
        {"claimName", flags.model_repository_volume.substr(sizeof(kPvcPrefix) - 1)},
        {"readOnly", true}};
  }

  Object container = {
      {"name", "shoal-serve"},
      {"image", flags.image},
      {"imagePullPolicy", flags.image_pull_policy},
      {"command", command},
      {"ports",
       {{{"name", "http"}, {"containerPort", serve.http_port}, {"protocol", "TCP"}},
        {{"name", "grpc"}, {"containerPort", serve.grpc_port}, {"protocol", "TCP"}}}},
      // Ready once the models are loaded, and no longer from SIGTERM on (the drain).
      {"readinessProbe", HealthProbe(serve, "ready", 2, 1)},
      {"livenessProbe", HealthProbe(serve, "live", 10, 3)},
      {"resources",
       {{"requests", {{"cpu", flags.cpu}, {"memory", flags.memory}}},
        {"limits", {{"cpu", flags.cpu}, {"memory", flags.memory}}}}},
      {"securityContext",
       {{"allowPrivilegeEscalation", false}, {"capabilities", {{"drop", {"ALL"}}}}}},
      {"volumeMounts",
       {{{"name", "model-repository"}, {"mountPath", kRepositoryMount}, {"readOnly", true}},
        {{"name", "token"}, {"mountPath", kTokenDir}, {"readOnly", true}}}}};

  Object pod_spec = {
      // The server drains on SIGTERM itself (no preStop sleep needed); the kubelet's SIGKILL
      // must come only after the drain and the requests in flight.
      {"terminationGracePeriodSeconds",
       serve.drain_seconds + serve.finish_seconds + kGraceMarginSeconds},
      {"securityContext",
       {{"runAsNonRoot", true}, {"runAsUser", kNobody}, {"runAsGroup", kNobody},
        {"fsGroup", kNobody}}},
      {"containers", Object::array({container})},
      {"volumes",
       {repository_volume,
        {{"name", "token"}, {"secret", {{"secretName", secret_name}, {"defaultMode", 0440}}}}}}};

  documents.push_back(
      {{"apiVersion", "apps/v1"},
       {"kind", "Deployment"},
       {"metadata", Metadata(flags, flags.name, labels)},
       {"spec",
        {{"replicas", flags.replicas},
         {"selector", {{"matchLabels", labels}}},
         // One new pod at a time, and an old one goes only once a new one is ready.
         {"strategy",
          {{"type", "RollingUpdate"}, {"rollingUpdate", {{"maxUnavailable", 0}, {"maxSurge", 1}}}}},
         {"template", {{"metadata", {{"labels", labels}}}, {"spec", pod_spec}}}}}});

  documents.push_back(
      {{"apiVersion", "v1"},
       {"kind", "Service"},
       {"metadata", Metadata(flags, flags.name, labels)},
       {"spec",
        {{"type", "ClusterIP"},
         {"selector", labels},
         {"ports",
          {{{"name", "http"}, {"port", serve.http_port}, {"targetPort", "http"},
            {"protocol", "TCP"}},
           {{"name", "grpc"}, {"port", serve.grpc_port}, {"targetPort", "grpc"},
            {"protocol", "TCP"}, {"appProtocol", "grpc"}}}}}}});

  std::string out = absl::StrCat(
      "# shoal serve on Kubernetes: ", flags.replicas, " replica(s) of ", flags.image,
      " behind the Service ", flags.name, " (docs/serving.md, \"Running on Kubernetes\")\n");
  for (const Object& document : documents) {
    out += "---\n";
    AppendYaml(document, 0, out);
  }
  return out;
}

}  // namespace shoal::cli
