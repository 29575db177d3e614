#include "cli/backends_registry.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "backends/kubernetes/kubernetes_provider.h"
#include "backends/local/local_provider.h"
#include "backends/slurm/slurm_provider.h"
#include "backends/spark/spark_provider.h"
#include "backends/yarn/yarn_provider.h"

namespace shoal::cli {
namespace {

// Two backends claiming one name, flag or section: a build that cannot work at all.
void Register(backends::BackendRegistry& registry,
              std::unique_ptr<backends::BackendProvider> provider) {
  if (absl::Status st = registry.Add(std::move(provider)); !st.ok()) {
    std::fprintf(stderr, "shoal: %s\n", std::string(st.message()).c_str());
    std::abort();
  }
}

backends::BackendRegistry Build() {
  backends::BackendRegistry registry;
  // One line per backend, in the order --help and messages list them.
  Register(registry, std::make_unique<backends::LocalProvider>());
  Register(registry, std::make_unique<backends::SlurmProvider>());
  Register(registry, std::make_unique<backends::YarnProvider>());
  Register(registry, std::make_unique<backends::KubernetesProvider>());
  Register(registry, std::make_unique<backends::SparkProvider>());
  return registry;
}

}  // namespace

const backends::BackendRegistry& BuiltInBackends() {
  static const backends::BackendRegistry* const registry = new backends::BackendRegistry(Build());
  return *registry;
}

}  // namespace shoal::cli
