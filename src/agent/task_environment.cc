#include "agent/task_environment.h"

#include <string_view>

#include "spec/task_variables.h"

namespace shoal::agent {

namespace {

bool StartsWith(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

}  // namespace

Environment TaskEnvironment(const TaskEnvironmentInputs& in) {
  Environment env = in.inherited;
  env.erase("SHOAL_AGENT_TOKEN");
  for (std::string_view name : spec::ReservedTaskVariables()) env.erase(std::string(name));
  if (in.hide_slurm_step_env) {
    // srun describes the step of agents (SLURM_PROCID, SLURM_NTASKS, SLURM_JOB_ID...), not the
    // training world: frameworks that detect Slurm from these (PyTorch Lightning, JAX,
    // Horovod, mpi4py) would take ranks and peers from them that disagree with Shoal's, which
    // change with restarts and elastic resizes. The allocation's id stays reachable.
    if (auto it = env.find("SLURM_JOB_ID"); it != env.end()) {
      env["SHOAL_SLURM_JOB_ID"] = it->second;
    }
    for (auto it = env.begin(); it != env.end();) {
      bool slurm = (StartsWith(it->first, "SLURM_") || StartsWith(it->first, "SLURMD_")) &&
                   it->first != "SLURM_CONF";
      it = slurm ? env.erase(it) : std::next(it);
    }
  }
  for (const auto& [name, value] : in.from_master) env[name] = value;
  env["SHOAL_CLUSTER_SPEC_FILE"] = in.cluster_spec_file;
  env["SHOAL_AGENT_SOCKET"] = in.agent_socket;
  if (!in.progress_file.empty()) env["SHOAL_PROGRESS_FILE"] = in.progress_file;
  return env;
}

}  // namespace shoal::agent
