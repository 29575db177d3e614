#include "spec/task_variables.h"

#include <algorithm>
#include <iterator>
#include <optional>
#include <string>

namespace shoal::spec {

namespace {

struct Reserved {
  std::string_view name;
  std::string_view instead;  // the job file's own way to choose the value, if it has one
};

// Sorted by name. Kept in step with what frameworks::BuildTaskEnvironment and
// agent::TaskEnvironment set; tests/agent/task_environment_test.cc checks both ways.
constexpr Reserved kReserved[] = {
    {"SHOAL_AGENT_SOCKET", ""},
    {"SHOAL_CHECKPOINT_DIR", "checkpoint.dir"},
    {"SHOAL_CHECKPOINT_KEEP", "checkpoint.keep"},
    {"SHOAL_CLUSTER_SPEC_FILE", ""},
    {"SHOAL_GENERATION", ""},
    {"SHOAL_INDEX", ""},
    {"SHOAL_JOB_DIR", ""},
    {"SHOAL_JOB_ID", ""},
    {"SHOAL_JOB_NAME", "name"},
    {"SHOAL_MODEL_KEEP", "publish.keep"},
    {"SHOAL_MODEL_REPOSITORY", "publish.repository"},
    {"SHOAL_MPI_SECRET", ""},
    {"SHOAL_MPI_SLOTS_PER_WORKER", "mpi.slots_per_worker"},
    {"SHOAL_NODE", ""},
    {"SHOAL_PROGRESS_FILE", ""},
    {"SHOAL_RANK", ""},
    {"SHOAL_RESTART_COUNT", ""},
    {"SHOAL_ROLE", ""},
    {"SHOAL_ROLE_INSTANCES", ""},
    {"SHOAL_SLURM_JOB_ID", ""},
    {"SHOAL_TASK_PORT", ""},
    {"SHOAL_TENSORBOARD_LOGDIR", "tensorboard.logdir"},
    {"SHOAL_WORLD_SIZE", ""},
};

}  // namespace

const std::vector<std::string_view>& ReservedTaskVariables() {
  static const auto* names = [] {
    auto* v = new std::vector<std::string_view>;
    for (const Reserved& r : kReserved) v->push_back(r.name);
    return v;
  }();
  return *names;
}

std::optional<std::string> WhyReserved(std::string_view name) {
  auto it = std::lower_bound(std::begin(kReserved), std::end(kReserved), name,
                             [](const Reserved& r, std::string_view n) { return r.name < n; });
  if (it == std::end(kReserved) || it->name != name) return std::nullopt;
  std::string why = "reserved: Shoal sets " + std::string(name) +
                    " itself (docs/environment.md), so a role's env cannot change it";
  if (!it->instead.empty()) why += "; set " + std::string(it->instead) + " instead";
  return why;
}

}  // namespace shoal::spec
