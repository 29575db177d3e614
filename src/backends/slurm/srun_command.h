#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "spec/job_spec.h"

namespace shoal::backends {

// What a job asks of Slurm beyond its roles; the job file's `slurm:` section with the flags of
// `shoal run` laid over it.
struct SlurmRequest {
  std::string partition;
  std::string account;
  std::string constraint;
  std::chrono::milliseconds time_limit{0};
};

// Tasks asking for the same CPUs, memory and GPUs go into one Slurm job component; a job whose
// roles all ask the same is a plain Slurm job, others are heterogeneous jobs with one component
// per distinct request (Slurm 22.05 never puts two components on one node, so fewer components
// means more ways to fit). Slurm numbers tasks across components in this order.
struct SlurmComponent {
  spec::Resources per_task;
  struct Part {
    std::string role;
    uint32_t instances = 0;
    uint32_t first_rank = 0;  // Slurm's SLURM_PROCID of the role's task 0
  };
  std::vector<Part> roles;
  uint32_t tasks = 0;
};
std::vector<SlurmComponent> SlurmComponents(const spec::JobSpec& job);

// "chief:0,worker:1,ps:4": every role with the Slurm rank of its task 0. An agent finds its
// place from it and SLURM_PROCID (the last role whose first rank is <= its own).
std::string SlurmPlaceMap(const std::vector<SlurmComponent>& components);
// The place ("worker.2") of the Slurm task `rank`, from a place map; an error names what is
// wrong with the map or the rank.
absl::StatusOr<std::string> SlurmPlaceOf(const std::string& place_map, uint32_t rank);

// The srun command line that allocates the whole gang and starts one agent per Slurm task,
// each component with its own CPUs, memory and GPUs per task, all held at once and released
// when srun ends. `agent_args` follow `shoal agent` in every component, then
// `--slurm-place=<place map>`.
std::vector<std::string> SrunCommand(const spec::JobSpec& job, const SlurmRequest& request,
                                     const std::string& srun, const std::string& job_name,
                                     const std::string& shoal_binary,
                                     const std::vector<std::string>& agent_args);

// What one line of srun's output says about the allocation, if anything.
struct SrunLineEvent {
  enum Kind { kQueued, kAllocated, kRefused, kCancelled, kTaskEnded };
  Kind kind;
  std::string reason;       // in words a user understands, Slurm's own where it gave any
  uint64_t slurm_job = 0;   // when the line names it
  std::vector<uint32_t> task_ranks;  // kTaskEnded: the Slurm tasks (ranks in the step)
};
std::optional<SrunLineEvent> ClassifySrunLine(const std::string& line);

// Slurm's minutes for a time limit (rounded up; at least 1).
uint64_t SlurmMinutes(std::chrono::milliseconds limit);

}  // namespace shoal::backends
