#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace shoal::client {

// The jobs root: the --jobs-dir flag, else $SHOAL_JOBS_DIR, else ~/.shoal/jobs.
std::string ResolveJobsRoot(const std::string& flag_value);

// "<name>-<yyyymmdd-hhmmss>-<4 hex>": sortable by time, unique enough on one machine, and
// readable in `shoal list`.
std::string NewJobId(const std::string& job_name);

// 32 random bytes as hex, from the kernel's CSPRNG.
absl::StatusOr<std::string> NewToken();

// The directory of `job` under `root`: an exact id, or a prefix matching exactly one job.
// NotFound / InvalidArgument (ambiguous) name what was looked for.
absl::StatusOr<std::string> FindJob(const std::string& root, const std::string& job);

// Every job directory under root, oldest first.
std::vector<std::string> ListJobDirs(const std::string& root);

// What the job directory says about the master: its address and pid if master.json exists.
struct MasterInfo {
  std::string address;
  int pid = 0;
  bool alive = false;
};
std::optional<MasterInfo> ReadMasterInfo(const std::string& job_dir);

// status.json, or nullopt.
std::optional<nlohmann::json> ReadStatusFile(const std::string& job_dir);

// succeeded, failed or killed: the job is over and its status will not change.
bool IsTerminalState(const std::string& state);

// The freshest status: from the live master, else status.json. A status.json that is not
// terminal while its master is dead means the master died mid-job: its state reads `lost`.
// Never nullopt (a job without status.json reads `unknown`); optional for the callers' style.
std::optional<nlohmann::json> CurrentStatus(const std::string& job_dir);

}  // namespace shoal::client
