#include "backends/local/local_provider.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "machine/free_ports.h"
#include "backends/local/local_backend.h"
#include "machine/inventory.h"
#include "spec/spec_parser.h"

namespace shoal::backends {

absl::Status CheckLocalPortsFit(const spec::JobSpec& spec,
                                const std::optional<PortRange>& task_ports) {
  PortRange ephemeral = machine::EphemeralPortRange();
  PortRange task = task_ports ? *task_ports : machine::TaskPortRange(ephemeral);
  auto size = [](const PortRange& r) -> uint64_t {
    return r.low == 0 || r.low > r.high ? 0 : r.high - r.low + 1;
  };
  uint64_t overlap = 0;
  if (size(task) > 0 && size(ephemeral) > 0) {
    uint32_t low = std::max(task.low, ephemeral.low), high = std::min(task.high, ephemeral.high);
    if (low <= high) overlap = high - low + 1;
  }
  std::string ranges = absl::StrCat(ephemeral.low, "-", ephemeral.high,
                                    ", the kernel's ephemeral range");
  if (size(task) > 0) {
    ranges = absl::StrCat(task.low, "-", task.high, " for tasks and ", ranges);
  }
  return spec::CheckPortsFit(spec, size(task) + size(ephemeral) - overlap, ranges);
}

absl::StatusOr<Preflight> LocalProvider::Check(const PreflightRequest& request) const {
  machine::InventoryOptions inv_options;
  inv_options.fake_gpus = request.fake_gpus;
  machine::MachineInventory machine = machine::DetectLocalInventory(inv_options);
  if (auto st = spec::CheckFitsMachine(*request.job, machine); !st.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the job can never run on this machine:\n", st.message()));
  }
  if (auto st = CheckLocalPortsFit(*request.job, request.task_ports); !st.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the job can never run on this machine:\n", st.message()));
  }
  Preflight out;
  out.listen_host = request.listen_host;
  return out;
}

absl::StatusOr<CreatedBackend> LocalProvider::Create(const BackendContext& context) const {
  const nlohmann::json& submit = *context.submit;
  machine::InventoryOptions inv;
  if (submit.contains("fake_gpus")) inv.fake_gpus = submit["fake_gpus"].get<uint32_t>();
  LocalBackendOptions local;
  local.machine = machine::DetectLocalInventory(inv);
  local.ledger_dir = submit.value("jobs_root", context.job_dir + "/..") + "/.ledger";
  local.agent_work_dir = context.job_dir + "/agents/local";
  local.fake_gpus = inv.fake_gpus;
  CreatedBackend out;
  out.listen_host = context.listen_host;
  out.backend = std::make_unique<LocalBackend>(local);
  return out;
}

}  // namespace shoal::backends
