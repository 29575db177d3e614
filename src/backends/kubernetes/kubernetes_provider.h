#pragma once

#include "backends/backend_provider.h"

namespace shoal::backends {

// The Kubernetes backend's flags (--kubeconfig, --namespace, --image, --agent-image), its
// `kubernetes:` job-file section, its checks before a job starts (the kubeconfig, the API
// server, the namespace and the right to create pods, secrets and configmaps there, an image
// for every role) and its factory (docs/backends/kubernetes.md).
class KubernetesProvider final : public BackendProvider {
 public:
  std::string Name() const override { return "kubernetes"; }
  std::vector<RunFlag> Flags() const override;
  std::optional<spec::JobSection> JobSection() const override;
  absl::StatusOr<Preflight> Check(const PreflightRequest& request) const override;
  absl::StatusOr<CreatedBackend> Create(const BackendContext& context) const override;
};

}  // namespace shoal::backends
