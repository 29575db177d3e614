#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "machine/machine_inventory.h"
#include "spec/job_section.h"
#include "spec/job_spec.h"

namespace shoal::spec {

// A job file as read: its bytes, exactly, and the spec validated from those bytes. The client
// stores `text` as the job's spec.yaml, which the master parses and runs: what runs is what was
// checked, even if the file changes after it was read.
struct JobFile {
  std::string text;
  JobSpec spec;
};

// Reads the job file at `path` once (a regular file, or a pipe such as `<(generate-job)`) and
// validates those bytes, as ParseJobSpecFile does.
absl::StatusOr<JobFile> ReadJobFile(const std::string& path, const JobSections& sections);

// Reads and validates the job file at `path`. Relative working_dir values are resolved against
// the file's directory; messages and JobSpec::source_path name the file as `path` spells it.
// Any problem, an unreadable file included, is an InvalidArgument whose message holds one line
// per error found (all of them, not just the first) in the form
//   job.yaml:7: roles.worker.instances: must be an integer >= 1, got 0
// Nothing here throws.
//
// `sections` are the top-level sections read for their owners (a backend's `slurm:`): the
// composition root's list (cli/backends_registry.h), so that a job file means the same to every
// command. A key of a section not in the list is an unknown key.
absl::StatusOr<JobSpec> ParseJobSpecFile(const std::string& path, const JobSections& sections);

// Same, for a job file already in memory. `source_name` names it in messages and becomes
// JobSpec::source_path; `base_dir` resolves relative working_dir values (itself resolved against
// the current directory when relative; empty means the current directory).
absl::StatusOr<JobSpec> ParseJobSpec(const std::string& yaml_text, const std::string& source_name,
                                     const std::string& base_dir, const JobSections& sections);

// Refuses, with an InvalidArgument holding one line per problem, a job that can never fit
// `machine`: one task asking for more CPUs, memory or GPUs than the machine has, or the totals
// over all tasks (instances x per-task amount) above them. A total is only reported for a
// resource where no single task is already too big, since fixing that task comes first.
absl::Status CheckFitsMachine(const JobSpec& spec, const machine::MachineInventory& machine);

// Refuses, with an InvalidArgument naming the role with the most tasks and its `instances`
// line, a job whose tasks need more ports on one machine than that machine's agent can hand
// out: the local backend runs every task there and gives each one port. `available` is how
// many distinct ports the agent can find (the task port range, then the kernel's ephemeral
// range); `ranges` names those ranges for the message, e.g. "22768-32767 and 32768-60999".
absl::Status CheckPortsFit(const JobSpec& spec, uint64_t available, const std::string& ranges);

}  // namespace shoal::spec
