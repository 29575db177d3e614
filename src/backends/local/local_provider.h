#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "backends/backend_provider.h"
#include "common/port_range.h"
#include "spec/job_spec.h"

namespace shoal::backends {

// The local backend (the default): no flags and no job-file section; before a job starts, it
// checks that the job could ever fit this machine and its ports.
class LocalProvider final : public BackendProvider {
 public:
  std::string Name() const override { return "local"; }
  absl::StatusOr<Preflight> Check(const PreflightRequest& request) const override;
  absl::StatusOr<CreatedBackend> Create(const BackendContext& context) const override;
};

// The local agent hands each task a port from SHOAL_TASK_PORTS (else the range below the
// kernel's ephemeral one), then from the ephemeral range: a job needing more than both hold
// would only fail once its agent started. `task_ports`: SHOAL_TASK_PORTS, when set.
absl::Status CheckLocalPortsFit(const spec::JobSpec& spec,
                                const std::optional<PortRange>& task_ports);

}  // namespace shoal::backends
