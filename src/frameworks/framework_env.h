#pragma once

#include <map>
#include <string>
#include <vector>

#include "frameworks/cluster_plan.h"
#include "spec/job_spec.h"

namespace shoal::frameworks {

using Environment = std::map<std::string, std::string>;

// The environment a task gets from the master: SHOAL_* for every framework, plus what the job's
// framework's own launcher would set (for pytorch: the torchrun contract), then the role's `env`
// over them (the parser keeps reserved SHOAL_* names out of it). The agent puts this over the
// environment it inherited and adds its own (agent::TaskEnvironment). Pure: same inputs, same
// output. docs/environment.md lists every variable and says what wins.
Environment BuildTaskEnvironment(const spec::JobSpec& job, const ClusterPlan& plan,
                                 const TaskPlacement& task);

// The local directories a task's environment `env` (BuildTaskEnvironment's) tells it about,
// keyed by variable: SHOAL_JOB_DIR, SHOAL_CHECKPOINT_DIR, SHOAL_TENSORBOARD_LOGDIR, where they
// hold an absolute path. The agent creates them before exec, on the task's node (a script that
// only calls torch.save into SHOAL_CHECKPOINT_DIR must not fail for a missing parent). A URL
// (hdfs://...) is left to the SDK's storage, which creates it; a relative value (none comes from
// a parsed job file, whose paths are resolved and whose env cannot set these) is skipped.
Environment LocalDirectories(const Environment& env);

// What a task of `role` runs: its command (an argv, or /bin/sh -c for a shell string), except
// under framework: mpi, where Shoal's own binary runs the launcher's command through mpirun
// (`shoal mpi-launcher -- COMMAND`) and is the whole of each worker (`shoal mpi-worker`).
std::vector<std::string> TaskArgv(const spec::JobSpec& job, const spec::Role& role,
                                  const std::string& shoal_binary);

// {"job_id", "restart_count", "cluster": {role: ["host:port", ...]}, "tasks": [...]} as JSON
// text, the same for every task; the agent writes it to the file named in
// SHOAL_CLUSTER_SPEC_FILE. A task finds itself by SHOAL_ROLE and SHOAL_INDEX.
std::string ClusterSpecJson(const ClusterPlan& plan);

}  // namespace shoal::frameworks
