#pragma once

#include <chrono>
#include <string>

#include "absl/strings/string_view.h"
#include "spec/job_section.h"
#include "spec/job_spec.h"

namespace shoal::backends {

// Where the job runs on Slurm (`slurm:` in the job file); flags of `shoal run` override each.
struct SlurmConfig : spec::SectionValue {
  std::string partition;                    // empty: the cluster's default partition
  std::string account;                      // empty: the user's default account
  std::chrono::milliseconds time_limit{0};  // 0: the partition's limit
  std::string constraint;                   // node features, Slurm's --constraint syntax
};

// The `slurm:` section of the job file, for the parser (spec::JobSections).
spec::JobSection SlurmJobSection();

// The job file's `slurm:` section, or the defaults when it has none.
const SlurmConfig& SlurmConfigOf(const spec::JobSpec& job);

// The rules the section and the flags share. Slurm names: letters, digits and -_.,:= (a
// constraint also takes &|[]*()!); anything else would reach srun's argument parser and fail
// there with a less helpful message.
inline constexpr char kSlurmNameRule[] = "must be a Slurm name (letters, digits, -_.,:=)";
inline constexpr char kSlurmConstraintExtra[] = "&|[]*()!";
bool IsSlurmName(absl::string_view text, absl::string_view extra);
// Slurm counts whole minutes.
inline constexpr std::chrono::milliseconds kMinSlurmTimeLimit{60000};
inline constexpr char kSlurmTimeLimitRule[] = "must be at least 1m (Slurm counts whole minutes)";

}  // namespace shoal::backends
