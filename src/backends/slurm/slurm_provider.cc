#include "backends/slurm/slurm_provider.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backends/slurm/slurm_backend.h"
#include "backends/slurm/slurm_section.h"
#include "backends/slurm/srun_command.h"
#include "common/byte_size.h"
#include "common/duration.h"

namespace shoal::backends {
namespace {

// Slurm 22.05 never puts two components of a heterogeneous job on one node, so a job with
// more distinct per-task requests than the partition has nodes would stay queued forever
// (Slurm's reason: None). Refused here instead; when sinfo cannot tell, srun decides.
absl::Status CheckComponentsFitPartition(const spec::JobSpec& job, const std::string& partition) {
  std::vector<SlurmComponent> components = SlurmComponents(job);
  if (components.size() < 2) return absl::OkStatus();
  auto nodes = SlurmBackend::PartitionNodeCount(partition);
  if (!nodes.ok() || components.size() <= *nodes) return absl::OkStatus();
  std::vector<std::string> requests;
  for (const auto& c : components) {
    std::vector<std::string> roles;
    for (const auto& part : c.roles) roles.push_back(part.role);
    requests.push_back(absl::StrCat(absl::StrJoin(roles, "+"), ": ", c.per_task.cpus, " CPUs, ",
                                    FormatByteSize(c.per_task.memory_bytes), ", ",
                                    c.per_task.gpus, " GPUs"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "its roles ask ", components.size(), " different per-task resources (",
      absl::StrJoin(requests, "; "), "), so Slurm runs it as a heterogeneous job of ",
      components.size(), " components, which never share a node, and partition ",
      partition.empty() ? "(the default)" : "'" + partition + "'", " has ", *nodes,
      " node(s); give roles the same resources (cpus, memory, gpus) so that they share a "
      "component"));
}

}  // namespace

std::vector<RunFlag> SlurmProvider::Flags() const {
  return {{"--partition", "Slurm partition (slurm.partition)"},
          {"--account", "Slurm account (slurm.account)"},
          {"--constraint", "Slurm node features (slurm.constraint)"},
          {"--time-limit", "Slurm time limit, e.g. 2h (slurm.time_limit)"}};
}

std::optional<spec::JobSection> SlurmProvider::JobSection() const { return SlurmJobSection(); }

absl::StatusOr<nlohmann::json> SlurmFlagSettings(const std::map<std::string, std::string>& flags) {
  nlohmann::json settings = nlohmann::json::object();
  std::vector<std::string> problems;
  auto given = [&](const char* flag) -> const std::string* {
    auto it = flags.find(flag);
    return it == flags.end() ? nullptr : &it->second;
  };
  struct Name {
    const char* flag;
    const char* setting;
    const char* extra;
  };
  for (const Name& n : {Name{"--partition", "partition", ""}, Name{"--account", "account", ""},
                        Name{"--constraint", "constraint", kSlurmConstraintExtra}}) {
    const std::string* value = given(n.flag);
    if (value == nullptr) continue;
    if (IsSlurmName(*value, n.extra)) {
      settings[n.setting] = *value;
    } else {
      problems.push_back(
          absl::StrCat(n.flag, ": ", kSlurmNameRule, ", got ", spec::DescribeText(*value)));
    }
  }
  if (const std::string* value = given("--time-limit")) {
    std::optional<std::chrono::milliseconds> limit = ParseDuration(*value);
    if (!limit) {
      problems.push_back(absl::StrCat("--time-limit: must be a duration such as 500ms, 30s or "
                                      "2m, got ",
                                      spec::DescribeText(*value)));
    } else if (*limit < kMinSlurmTimeLimit) {
      problems.push_back(absl::StrCat("--time-limit: ", kSlurmTimeLimitRule, ", got ",
                                      spec::DescribeText(*value)));
    } else {
      settings["time_limit_ms"] = limit->count();
    }
  }
  if (!problems.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid flag: ", absl::StrJoin(problems, "\n")));
  }
  return settings;
}

absl::StatusOr<Preflight> SlurmProvider::Check(const PreflightRequest& request) const {
  Preflight out;
  // Checked first, before anything exists, with the job file's own rules: a mistyped flag is
  // named as such, also on a machine that cannot reach Slurm at all.
  absl::StatusOr<nlohmann::json> settings = SlurmFlagSettings(request.flags);
  if (!settings.ok()) return settings.status();
  out.settings = *std::move(settings);
  out.listen_host = request.listen_host;
  if (out.listen_host.empty()) {
    // Where agents on the compute nodes can reach the master; asking Slurm also checks,
    // before anything exists, that this machine can submit to it at all.
    auto address = SlurmBackend::AddressTowardsController();
    if (!address.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--backend slurm: ", address.status().message(),
          "; is this a machine that can submit Slurm jobs (srun, scontrol, SLURM_CONF)? Give the "
          "address agents reach it at with --listen"));
    }
    out.listen_host = *address;
  }
  std::string partition =
      out.settings.value("partition", SlurmConfigOf(*request.job).partition);
  if (auto st = CheckComponentsFitPartition(*request.job, partition); !st.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the job can never run on this Slurm partition: ", st.message()));
  }
  return out;
}

absl::StatusOr<CreatedBackend> SlurmProvider::Create(const BackendContext& context) const {
  const SlurmConfig& section = SlurmConfigOf(*context.job);
  const nlohmann::json& flags = *context.settings;
  SlurmBackendOptions slurm;
  // Flags given to `shoal run` win over the job file's `slurm:` section.
  slurm.request.partition = flags.value("partition", section.partition);
  slurm.request.account = flags.value("account", section.account);
  slurm.request.constraint = flags.value("constraint", section.constraint);
  slurm.request.time_limit =
      std::chrono::milliseconds(flags.value("time_limit_ms", section.time_limit.count()));
  slurm.state_dir = context.job_dir + "/agents/slurm";
  slurm.agent_work_dir =
      "/tmp/shoal-agents/" + context.submit->value("job_id", std::string("job"));
  CreatedBackend out;
  out.listen_host = context.listen_host;
  if (out.listen_host.empty()) {
    // Agents on the compute nodes must reach the master: listen where this machine talks
    // to the Slurm controller (the token guards it; see docs/backends/slurm.md).
    auto address = SlurmBackend::AddressTowardsController();
    if (!address.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          address.status().message(),
          "; give the address agents can reach this machine at with --listen"));
    }
    out.listen_host = *address;
  }
  out.backend = std::make_unique<SlurmBackend>(std::move(slurm));
  return out;
}

}  // namespace shoal::backends
