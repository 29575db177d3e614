#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "backends/backend_provider.h"
#include "nlohmann/json.hpp"

namespace shoal::backends {

// The Slurm backend's flags (--partition, --account, --constraint, --time-limit), its `slurm:`
// job-file section, its checks before a job starts and its factory (docs/backends/slurm.md).
class SlurmProvider final : public BackendProvider {
 public:
  std::string Name() const override { return "slurm"; }
  std::vector<RunFlag> Flags() const override;
  std::optional<spec::JobSection> JobSection() const override;
  absl::StatusOr<Preflight> Check(const PreflightRequest& request) const override;
  absl::StatusOr<CreatedBackend> Create(const BackendContext& context) const override;
};

// The given Slurm flags checked with the `slurm:` section's rules, as submit.json's "slurm"
// settings (partition, account, constraint, time_limit_ms). InvalidArgument naming each bad
// flag, one per line: "invalid flag: --time-limit: must be at least 1m ...".
absl::StatusOr<nlohmann::json> SlurmFlagSettings(const std::map<std::string, std::string>& flags);

}  // namespace shoal::backends
