#include "backends/kubernetes/kube_config.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "yaml-cpp/yaml.h"

namespace shoal::backends {
namespace {

namespace fs = std::filesystem;

std::optional<std::string> Env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

// The whole file, or why not ("no such file /x", "cannot read /x: Permission denied").
absl::StatusOr<std::string> ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat("no such file ", path));
    return absl::InvalidArgumentError(absl::StrCat("cannot read ", path, ": ", std::strerror(err)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat("cannot read ", path));
  return text.str();
}

// One kubeconfig file being read: every error names the file, the line and the key.
class KubeConfigReader {
 public:
  KubeConfigReader(std::string path, YAML::Node root)
      : path_(std::move(path)),
        dir_(fs::path(path_).parent_path().string()),
        root_(std::move(root)) {}

  absl::StatusOr<KubeConfig> Read(const std::optional<std::string>& chosen_context) {
    if (!root_.IsMap()) return Error(root_, "", "not a kubeconfig: its top level is not a map");
    std::string context_name;
    if (chosen_context.has_value()) {
      context_name = *chosen_context;
    } else {
      const YAML::Node current = root_["current-context"];
      if (!current || current.IsNull() || (current.IsScalar() && current.Scalar().empty())) {
        return Error(root_, "current-context",
                     absl::StrCat("not set, so no context is chosen", Offer("contexts")));
      }
      SHOAL_ASSIGN_OR_RETURN(context_name, Text(current, "current-context"));
    }

    SHOAL_ASSIGN_OR_RETURN(Entry context, Find("contexts", "context", context_name));
    KubeConfig config;
    config.source = absl::StrCat(path_, " (context ", context_name, ")");
    SHOAL_ASSIGN_OR_RETURN(std::string cluster_name,
                           RequiredText(context.body, context.key, "cluster"));
    if (const YAML::Node ns = context.body["namespace"]; ns && !ns.IsNull()) {
      SHOAL_ASSIGN_OR_RETURN(config.namespace_, Text(ns, context.key + ".namespace"));
    }
    SHOAL_ASSIGN_OR_RETURN(Entry cluster, Find("clusters", "cluster", cluster_name));
    SHOAL_RETURN_IF_ERROR(ReadCluster(cluster, config));
    if (const YAML::Node user = context.body["user"];
        user && !user.IsNull() && !(user.IsScalar() && user.Scalar().empty())) {
      SHOAL_ASSIGN_OR_RETURN(std::string user_name, Text(user, context.key + ".user"));
      SHOAL_ASSIGN_OR_RETURN(Entry user_entry, Find("users", "user", user_name));
      SHOAL_RETURN_IF_ERROR(ReadUser(user_entry, config));
    }
    return config;
  }

 private:
  // One element of `contexts`, `clusters` or `users`: its body (the `context:` map) and the
  // body's key for messages ("contexts[2].context").
  struct Entry {
    YAML::Node body;
    std::string key;
  };

  absl::Status Error(const YAML::Node& node, absl::string_view key,
                     absl::string_view message) const {
    return ErrorAt(node.Mark(), key, message);
  }

  // An error about `field` of `map`, at the line of the field's key (a block map's own mark
  // is the line of its first key, one below).
  absl::Status FieldError(const YAML::Node& map, const std::string& field, absl::string_view key,
                          absl::string_view message) const {
    YAML::Mark mark = map.Mark();
    if (map.IsMap()) {
      for (auto it = map.begin(); it != map.end(); ++it) {
        if (it->first.IsScalar() && it->first.Scalar() == field) mark = it->first.Mark();
      }
    }
    return ErrorAt(mark, key, message);
  }

  absl::Status ErrorAt(const YAML::Mark& mark, absl::string_view key,
                       absl::string_view message) const {
    std::string where = path_;
    if (!mark.is_null()) absl::StrAppend(&where, ":", mark.line + 1);
    if (key.empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": ", message));
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", key, ": ", message));
  }

  // ", the file has contexts: a, b" or ", the file has no contexts".
  std::string Offer(const std::string& list) const {
    std::vector<std::string> names;
    const YAML::Node entries = root_[list];
    if (entries && entries.IsSequence()) {
      for (const YAML::Node& entry : entries) {
        if (entry.IsMap() && entry["name"] && entry["name"].IsScalar()) {
          names.push_back(absl::StrCat("\"", entry["name"].Scalar(), "\""));
        }
      }
    }
    if (names.empty()) return absl::StrCat(" (the file has no ", list, ")");
    return absl::StrCat(" (the file has ", list, " ", absl::StrJoin(names, ", "), ")");
  }

  absl::StatusOr<std::string> Text(const YAML::Node& node, const std::string& key) const {
    if (!node.IsScalar()) return Error(node, key, "must be a string");
    return node.Scalar();
  }

  absl::StatusOr<std::string> RequiredText(const YAML::Node& map, const std::string& map_key,
                                           const std::string& field) const {
    const YAML::Node node = map[field];
    const std::string key = absl::StrCat(map_key, ".", field);
    if (!node || node.IsNull()) return Error(map, key, "required");
    SHOAL_ASSIGN_OR_RETURN(std::string text, Text(node, key));
    if (text.empty()) return Error(node, key, "must not be empty");
    return text;
  }

  // The element of `list` named `name`, whose body is under `body_key`.
  absl::StatusOr<Entry> Find(const std::string& list, const std::string& body_key,
                             const std::string& name) const {
    const YAML::Node entries = root_[list];
    if (entries && !entries.IsNull() && !entries.IsSequence()) {
      return Error(entries, list, "must be a list");
    }
    if (entries && entries.IsSequence()) {
      for (size_t i = 0; i < entries.size(); ++i) {
        const YAML::Node entry = entries[i];
        const std::string entry_key = absl::StrCat(list, "[", i, "]");
        if (!entry.IsMap())
          return Error(entry, entry_key, "must be a map with name and " + body_key);
        const YAML::Node entry_name = entry["name"];
        if (!entry_name || !entry_name.IsScalar() || entry_name.Scalar() != name) continue;
        Entry found{entry[body_key], absl::StrCat(entry_key, ".", body_key)};
        if (!found.body || found.body.IsNull()) return Error(entry, found.key, "required");
        if (!found.body.IsMap()) return Error(found.body, found.key, "must be a map");
        return found;
      }
    }
    return Error(root_, list, absl::StrCat("no ", body_key, " named \"", name, "\"", Offer(list)));
  }

  std::string Resolve(const std::string& file) const {
    if (file.empty() || fs::path(file).is_absolute() || dir_.empty()) return file;
    return (fs::path(dir_) / file).lexically_normal().string();
  }

  // `field` (a file name) or `field`-data (base64 PEM) of `map`, checked: the file readable,
  // the data decodable and PEM. Never puts the material itself in a message.
  absl::StatusOr<PemSource> Pem(const YAML::Node& map, const std::string& map_key,
                                const std::string& field) const {
    PemSource source;
    const YAML::Node file = map[field];
    const YAML::Node data = map[field + "-data"];
    const bool has_file = file && !file.IsNull();
    const bool has_data = data && !data.IsNull();
    if (has_file && has_data) {
      return FieldError(map, field + "-data", absl::StrCat(map_key, ".", field, "-data"),
                        absl::StrCat("both ", field, " and ", field, "-data are set; keep one"));
    }
    if (has_file) {
      const std::string key = absl::StrCat(map_key, ".", field);
      SHOAL_ASSIGN_OR_RETURN(std::string name, Text(file, key));
      if (name.empty()) return FieldError(map, field, key, "must not be empty");
      source.file = Resolve(name);
      absl::StatusOr<std::string> contents = ReadWhole(source.file);
      if (!contents.ok()) return FieldError(map, field, key, contents.status().message());
      if (contents->find("-----BEGIN") == std::string::npos) {
        return FieldError(map, field, key, absl::StrCat(source.file, " holds no PEM block"));
      }
    } else if (has_data) {
      const std::string key = absl::StrCat(map_key, ".", field, "-data");
      SHOAL_ASSIGN_OR_RETURN(std::string encoded, Text(data, key));
      encoded.erase(std::remove_if(encoded.begin(), encoded.end(),
                                   [](unsigned char c) { return absl::ascii_isspace(c); }),
                    encoded.end());
      if (encoded.empty()) return FieldError(map, field + "-data", key, "must not be empty");
      if (!absl::Base64Unescape(encoded, &source.pem)) {
        return FieldError(map, field + "-data", key, "not valid base64");
      }
      if (source.pem.find("-----BEGIN") == std::string::npos) {
        return FieldError(map, field + "-data", key, "holds no PEM block once decoded from base64");
      }
    }
    return source;
  }

  absl::Status Refuse(const YAML::Node& map, const std::string& map_key, const std::string& field,
                      absl::string_view why) const {
    const YAML::Node node = map[field];
    if (!node || node.IsNull()) return absl::OkStatus();
    return FieldError(map, field, absl::StrCat(map_key, ".", field), why);
  }

  absl::Status ReadCluster(const Entry& cluster, KubeConfig& config) const {
    SHOAL_ASSIGN_OR_RETURN(config.server, RequiredText(cluster.body, cluster.key, "server"));
    if (!absl::StartsWith(config.server, "https://") &&
        !absl::StartsWith(config.server, "http://")) {
      return FieldError(cluster.body, "server", cluster.key + ".server",
                        absl::StrCat("must be an https:// URL, got \"", config.server, "\""));
    }
    while (absl::EndsWith(config.server, "/")) config.server.pop_back();
    SHOAL_ASSIGN_OR_RETURN(config.certificate_authority,
                           Pem(cluster.body, cluster.key, "certificate-authority"));
    if (const YAML::Node insecure = cluster.body["insecure-skip-tls-verify"];
        insecure && !insecure.IsNull()) {
      const std::string key = cluster.key + ".insecure-skip-tls-verify";
      bool value = false;
      if (!insecure.IsScalar() || !YAML::convert<bool>::decode(insecure, value)) {
        return FieldError(cluster.body, "insecure-skip-tls-verify", key, "must be true or false");
      }
      config.insecure_skip_tls_verify = value;
      if (value && !config.certificate_authority.empty()) {
        return FieldError(cluster.body, "insecure-skip-tls-verify", key,
                          "true together with a certificate-authority; keep one");
      }
    }
    SHOAL_RETURN_IF_ERROR(
        Refuse(cluster.body, cluster.key, "proxy-url", "not supported (set HTTPS_PROXY instead)"));
    SHOAL_RETURN_IF_ERROR(Refuse(cluster.body, cluster.key, "tls-server-name", "not supported"));
    return absl::OkStatus();
  }

  absl::Status ReadUser(const Entry& user, KubeConfig& config) const {
    if (const YAML::Node exec = user.body["exec"]; exec && !exec.IsNull()) {
      std::string command;
      if (exec.IsMap() && exec["command"] && exec["command"].IsScalar()) {
        command = absl::StrCat(" (command \"", exec["command"].Scalar(), "\")");
      }
      return FieldError(user.body, "exec", user.key + ".exec",
                        absl::StrCat("exec credential plugins are not supported", command,
                                     "; use a client certificate, token or tokenFile"));
    }
    if (const YAML::Node provider = user.body["auth-provider"]; provider && !provider.IsNull()) {
      std::string name;
      if (provider.IsMap() && provider["name"] && provider["name"].IsScalar()) {
        name = absl::StrCat(" \"", provider["name"].Scalar(), "\"");
      }
      return FieldError(
          user.body, "auth-provider", user.key + ".auth-provider",
          absl::StrCat("auth provider", name,
                       " is not supported; use a client certificate, token or tokenFile"));
    }
    SHOAL_RETURN_IF_ERROR(Refuse(user.body, user.key, "username",
                                 "basic authentication is not supported; use a client "
                                 "certificate, token or tokenFile"));
    SHOAL_RETURN_IF_ERROR(Refuse(user.body, user.key, "password",
                                 "basic authentication is not supported; use a client "
                                 "certificate, token or tokenFile"));
    SHOAL_RETURN_IF_ERROR(Refuse(user.body, user.key, "as", "impersonation is not supported"));
    SHOAL_RETURN_IF_ERROR(
        Refuse(user.body, user.key, "as-groups", "impersonation is not supported"));

    SHOAL_ASSIGN_OR_RETURN(config.client_certificate,
                           Pem(user.body, user.key, "client-certificate"));
    SHOAL_ASSIGN_OR_RETURN(config.client_key, Pem(user.body, user.key, "client-key"));
    if (config.client_certificate.empty() != config.client_key.empty()) {
      const bool key_missing = config.client_key.empty();
      return Error(user.body, user.key,
                   key_missing ? "client-certificate without client-key"
                               : "client-key without client-certificate");
    }
    // As kubectl: a token given inline wins over tokenFile.
    if (const YAML::Node token = user.body["token"]; token && !token.IsNull()) {
      SHOAL_ASSIGN_OR_RETURN(config.token, Text(token, user.key + ".token"));
      if (config.token.empty()) {
        return FieldError(user.body, "token", user.key + ".token", "must not be empty");
      }
    } else if (const YAML::Node token_file = user.body["tokenFile"];
               token_file && !token_file.IsNull()) {
      const std::string key = user.key + ".tokenFile";
      SHOAL_ASSIGN_OR_RETURN(std::string name, Text(token_file, key));
      if (name.empty()) return FieldError(user.body, "tokenFile", key, "must not be empty");
      config.token_file = Resolve(name);
      absl::StatusOr<std::string> contents = ReadWhole(config.token_file);
      if (!contents.ok()) {
        return FieldError(user.body, "tokenFile", key, contents.status().message());
      }
    }
    return absl::OkStatus();
  }

  const std::string path_;
  const std::string dir_;
  const YAML::Node root_;
};

}  // namespace

KubeConfigSearch KubeConfigSearch::FromEnvironment() {
  KubeConfigSearch search;
  search.kubeconfig_env = Env("KUBECONFIG");
  search.home = Env("HOME");
  search.service_host = Env("KUBERNETES_SERVICE_HOST");
  search.service_port = Env("KUBERNETES_SERVICE_PORT");
  return search;
}

absl::StatusOr<KubeConfig> ReadKubeConfigFile(const std::string& path,
                                              std::optional<std::string> context) {
  absl::StatusOr<std::string> text = ReadWhole(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", text.status().message()));
  }
  try {
    YAML::Node root = YAML::Load(*text);
    if (!root || root.IsNull()) return absl::InvalidArgumentError(absl::StrCat(path, ": empty"));
    return KubeConfigReader(path, std::move(root)).Read(context);
  } catch (const YAML::Exception& e) {
    std::string where = path;
    if (!e.mark.is_null()) absl::StrAppend(&where, ":", e.mark.line + 1);
    return absl::InvalidArgumentError(absl::StrCat(where, ": not a valid kubeconfig: ", e.msg));
  }
}

absl::StatusOr<KubeConfig> InClusterKubeConfig(const KubeConfigSearch& search) {
  if (!search.service_host.has_value() || search.service_host->empty() ||
      !search.service_port.has_value() || search.service_port->empty()) {
    return absl::NotFoundError(
        "not inside a pod (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not both set)");
  }
  const fs::path dir(search.service_account_dir);
  KubeConfig config;
  config.source = absl::StrCat("in-cluster service account (", dir.string(), ")");
  const std::string& host = *search.service_host;
  config.server =
      absl::StrCat("https://", host.find(':') != std::string::npos ? "[" + host + "]" : host, ":",
                   *search.service_port);
  config.token_file = (dir / "token").string();
  if (absl::StatusOr<std::string> token = ReadWhole(config.token_file); !token.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "in-cluster configuration (KUBERNETES_SERVICE_HOST is set): service account token: ",
        token.status().message()));
  }
  const std::string ca = (dir / "ca.crt").string();
  if (fs::exists(ca)) config.certificate_authority.file = ca;
  if (absl::StatusOr<std::string> ns = ReadWhole((dir / "namespace").string()); ns.ok()) {
    config.namespace_ = std::string(absl::StripAsciiWhitespace(*ns));
  }
  return config;
}

absl::StatusOr<KubeConfig> LoadKubeConfig(std::optional<std::string> explicit_path) {
  return LoadKubeConfig(std::move(explicit_path), KubeConfigSearch::FromEnvironment());
}

absl::StatusOr<KubeConfig> LoadKubeConfig(std::optional<std::string> explicit_path,
                                          const KubeConfigSearch& search) {
  if (explicit_path.has_value()) return ReadKubeConfigFile(*explicit_path);
  std::vector<std::string> looked;
  if (search.kubeconfig_env.has_value() && !search.kubeconfig_env->empty()) {
    for (absl::string_view file : absl::StrSplit(*search.kubeconfig_env, ':', absl::SkipEmpty())) {
      std::error_code error;
      if (fs::exists(std::string(file), error)) return ReadKubeConfigFile(std::string(file));
    }
    looked.push_back(
        absl::StrCat("$KUBECONFIG (", *search.kubeconfig_env, ") names no existing file"));
  } else {
    looked.push_back("$KUBECONFIG is not set");
  }
  if (search.home.has_value() && !search.home->empty()) {
    const std::string home_config = (fs::path(*search.home) / ".kube" / "config").string();
    std::error_code error;
    if (fs::exists(home_config, error)) return ReadKubeConfigFile(home_config);
    looked.push_back(absl::StrCat("no ", home_config));
  } else {
    looked.push_back("$HOME is not set, so no ~/.kube/config");
  }
  absl::StatusOr<KubeConfig> in_cluster = InClusterKubeConfig(search);
  if (in_cluster.ok() || !absl::IsNotFound(in_cluster.status())) return in_cluster;
  looked.push_back(std::string(in_cluster.status().message()));
  return absl::NotFoundError(absl::StrCat("no Kubernetes configuration found: no --kubeconfig, ",
                                          absl::StrJoin(looked, ", ")));
}

}  // namespace shoal::backends
