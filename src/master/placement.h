#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "master/job_state.h"
#include "spec/job_spec.h"

namespace shoal::master {

struct PlacedTask {
  std::string role;
  uint32_t index = 0;
  std::string node;
  std::vector<uint32_t> cores;   // the job's cores on the node, to pin to; empty: not pinned
  std::vector<std::string> gpus;
};

// Assigns every task (in the order of `tasks`, i.e. rank order) to a granted node, first fit by
// CPUs, memory and GPUs, and hands out the node's GPUs. A task asking for whole CPUs is pinned
// to the cores the job holds on its node (shared by the job's tasks, kept from other jobs). All or nothing: an
// error names the first task that does not fit.
absl::StatusOr<std::vector<PlacedTask>> PlaceTasks(const spec::JobSpec& job,
                                                   const std::vector<TaskRecord>& tasks,
                                                   const std::vector<backends::NodeGrant>& nodes);

}  // namespace shoal::master
