#pragma once

#include <optional>
#include <string>

namespace shoal::client {

// Exit codes of the CLI, documented in `shoal --help` and the README.
inline constexpr int kExitOk = 0;
inline constexpr int kExitJobFailed = 1;
inline constexpr int kExitUsage = 2;  // invalid job file, bad flags, unknown job
inline constexpr int kExitInterrupted = 130;
// SIGHUP (the terminal went away): the client detached; the job keeps running.
inline constexpr int kExitHangup = 129;
// stdout was closed (`| head`, a pager that quit): the client detached; the job keeps running.
inline constexpr int kExitOutputClosed = 141;

struct RunOptions {
  std::string job_file;
  std::string jobs_root;             // resolved
  bool detach = false;
  bool quiet = false;                // no live status line, only task output and the outcome
  std::optional<uint32_t> fake_gpus;
  std::string listen_host;           // empty: the backend's default (local: 127.0.0.1)
  std::string shoal_binary;          // this executable, to start the master
  std::string backend = "local";     // local | slurm | yarn
  // Slurm flags; each overrides the job file's `slurm:` key of the same name when given.
  std::optional<std::string> partition, account, constraint, time_limit;
  // YARN: the ResourceManager's web address (default $SHOAL_YARN_RM_WEB); queue and node label
  // override the job file's `yarn:` keys when given.
  std::string yarn_rm;
  std::optional<std::string> queue, node_label;
};

// Validates, creates the job directory, starts the master and (unless detached) follows the
// job to its end. Returns the CLI exit code.
int RunJob(const RunOptions& options);

int ShowStatus(const std::string& jobs_root, const std::string& job, bool json);
int ListJobs(const std::string& jobs_root, bool json);
int ShowLogs(const std::string& jobs_root, const std::string& job, const std::string& task,
             bool follow);
int KillJob(const std::string& jobs_root, const std::string& job);
// Serves the job's TensorBoard logs on loopback (running or ended); replaces this process.
int ServeTensorBoard(const std::string& jobs_root, const std::string& job);
// Follows a job whose `shoal run` went away; if its master died, starts a new one that takes
// the job over from its journal first.
int ResumeJob(const std::string& jobs_root, const std::string& job, const std::string& shoal_binary,
              bool quiet);

}  // namespace shoal::client
