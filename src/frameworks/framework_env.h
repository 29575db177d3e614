#pragma once

#include <map>
#include <string>

#include "frameworks/cluster_plan.h"
#include "spec/job_spec.h"

namespace shoal::frameworks {

using Environment = std::map<std::string, std::string>;

// The environment a task gets from Shoal, on top of the agent's own and below the role's `env`:
// SHOAL_* for every framework, plus what the job's framework's own launcher would set
// (for pytorch: the torchrun contract). Pure: same inputs, same output. docs/environment.md
// lists every variable.
Environment BuildTaskEnvironment(const spec::JobSpec& job, const ClusterPlan& plan,
                                 const TaskPlacement& task);

// {"cluster": {role: ["host:port", ...]}, "task": {...}, "job_id": ...} as JSON text; written by
// the agent to a file whose path is in SHOAL_CLUSTER_SPEC_FILE.
std::string ClusterSpecJson(const ClusterPlan& plan, const TaskPlacement& task);

}  // namespace shoal::frameworks
