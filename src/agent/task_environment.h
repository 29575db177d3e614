#pragma once

#include <map>
#include <string>

namespace shoal::agent {

using Environment = std::map<std::string, std::string>;

// Everything the agent knows when it starts a task that decides the task's environment.
struct TaskEnvironmentInputs {
  // The agent's own environment (environ), which the task inherits: PATH, a virtualenv, HOME.
  Environment inherited;
  // Started by srun: the step's SLURM_* variables describe the agents, not the training world.
  bool hide_slurm_step_env = false;
  // TaskLaunch.env from the master: frameworks::BuildTaskEnvironment's, the role's env included.
  Environment from_master;
  // The agent's own files and socket for this task (docs/sdk-protocol.md).
  std::string cluster_spec_file;
  std::string agent_socket;
  std::string progress_file;  // "" when the agent could not make one
};

// The whole environment of a task, built in this order, a later step winning over an earlier:
//  1. `inherited`, less the agent's secret (SHOAL_AGENT_TOKEN) and every name Shoal reserves
//     for itself (spec::ReservedTaskVariables: values of an enclosing job, not this task's);
//     under srun also less the step's SLURM_* (SLURM_CONF kept), its SLURM_JOB_ID kept as
//     SHOAL_SLURM_JOB_ID.
//  2. `from_master`: Shoal's variables, the framework's, then the role's `env` (which holds no
//     reserved name: the parser refuses those).
//  3. SHOAL_CLUSTER_SPEC_FILE, SHOAL_AGENT_SOCKET and, when there is one, SHOAL_PROGRESS_FILE.
// Pure: same inputs, same output; pinned by tests/agent/golden/. docs/environment.md says the
// same to users.
Environment TaskEnvironment(const TaskEnvironmentInputs& in);

}  // namespace shoal::agent
