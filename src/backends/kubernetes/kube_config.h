#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace shoal::backends {

// PEM material (a CA bundle, a client certificate or key) given either as a file, read by
// the TLS library on each connection (so a rotated file is picked up), or as the bytes
// themselves (a kubeconfig's *-data fields, already base64-decoded). At most one is set.
struct PemSource {
  std::string file;
  std::string pem;

  bool empty() const { return file.empty() && pem.empty(); }
};

// Where and how to reach one API server, as one kubeconfig context (or the in-cluster
// service account) says. Holds credentials: never log it, nor put its fields but `server`,
// `source` and file names in a message.
struct KubeConfig {
  // https://host:port (or http:// for a plain test server), without a trailing '/'.
  std::string server;
  // Empty: the system's trust store.
  PemSource certificate_authority;
  // Both set or both empty.
  PemSource client_certificate;
  PemSource client_key;
  // A bearer token, or a file holding one, re-read on every request (in-cluster tokens are
  // rotated by the kubelet). At most one is set.
  std::string token;
  std::string token_file;
  bool insecure_skip_tls_verify = false;
  // The context's namespace; empty when it names none (kubectl then uses "default").
  std::string namespace_;
  // Where this came from, for messages: "/home/u/.kube/config (context test)" or
  // "in-cluster service account (/var/run/secrets/kubernetes.io/serviceaccount)".
  std::string source;
};

// The places LoadKubeConfig looks, after an explicit file. FromEnvironment() gives the real
// ones; tests give temporary ones.
struct KubeConfigSearch {
  // $KUBECONFIG: a ':'-separated list of files; the first that exists is used.
  std::optional<std::string> kubeconfig_env;
  // $HOME, for ~/.kube/config.
  std::optional<std::string> home;
  // $KUBERNETES_SERVICE_HOST and $KUBERNETES_SERVICE_PORT, set in every pod.
  std::optional<std::string> service_host;
  std::optional<std::string> service_port;
  // Where a pod's service account is mounted: token, ca.crt, namespace.
  std::string service_account_dir = "/var/run/secrets/kubernetes.io/serviceaccount";

  static KubeConfigSearch FromEnvironment();
};

// The configuration `shoal` uses, as kubectl finds it: `explicit_path` (--kubeconfig) when
// given, else the first existing file of $KUBECONFIG, else ~/.kube/config when it exists, else
// the in-cluster service account. A kubeconfig file gives its current-context.
// InvalidArgument for a file that cannot be read or is wrong, naming the file, the line and
// the key ("/x/config:9: users[0].user.client-certificate: no such file /y/admin.crt");
// NotFound when there is no configuration in any of these places (the message lists them).
absl::StatusOr<KubeConfig> LoadKubeConfig(std::optional<std::string> explicit_path);
absl::StatusOr<KubeConfig> LoadKubeConfig(std::optional<std::string> explicit_path,
                                          const KubeConfigSearch& search);

// One kubeconfig file, with `context` or else its current-context. Relative file names in it
// are relative to its folder; *-data fields are base64. Supports client certificates, token
// and tokenFile; refuses exec plugins, auth providers and basic authentication by name.
// Errors as LoadKubeConfig.
absl::StatusOr<KubeConfig> ReadKubeConfigFile(const std::string& path,
                                              std::optional<std::string> context = std::nullopt);

// The pod's own service account: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT with
// the token, CA and namespace under `search.service_account_dir`. NotFound outside a pod
// (either variable unset); InvalidArgument when the variables are set but the token is not
// there.
absl::StatusOr<KubeConfig> InClusterKubeConfig(const KubeConfigSearch& search);

}  // namespace shoal::backends
