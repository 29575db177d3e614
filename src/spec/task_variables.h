#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace shoal::spec {

// The variables Shoal itself sets in a task's environment (docs/environment.md, first table):
// the task's identity and world, its directories, the agent's socket and files, the MPI
// secret. They are Shoal's contract with the task and its SDK, so a role's `env` may not set
// them: the parser refuses the job file, naming the line. The frameworks' own variables (RANK,
// MASTER_ADDR, TF_CONFIG, OMP_NUM_THREADS, ...) are not among them: a role's `env` may override
// those. Sorted by name.
const std::vector<std::string_view>& ReservedTaskVariables();

// Why a role's `env` may not set `name`, as the end of the parser's message (the way to get
// what was meant, where the job file has one); nullopt where it may.
std::optional<std::string> WhyReserved(std::string_view name);

}  // namespace shoal::spec
