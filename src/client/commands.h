#pragma once

#include <map>
#include <optional>
#include <string>

#include "spec/job_section.h"

namespace shoal::backends {
class BackendRegistry;
}  // namespace shoal::backends

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
  std::string backend = "local";     // a name in `backends`
  // The flags of `backend` that were given (backends::RunFlag::name to value), e.g.
  // {"--partition": "gpu"}; each overrides the job file's key of the same meaning.
  std::map<std::string, std::string> backend_flags;
  // The backends this binary offers (cli/backends_registry.h). Outlives the call.
  const backends::BackendRegistry* backends = nullptr;
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
// `sections`: the job-file sections of the backends (BackendRegistry::JobSections()).
int ServeTensorBoard(const std::string& jobs_root, const std::string& job,
                     const spec::JobSections& sections);
// Follows a job whose `shoal run` went away; if its master died, starts a new one that takes
// the job over from its journal first.
int ResumeJob(const std::string& jobs_root, const std::string& job, const std::string& shoal_binary,
              bool quiet);

}  // namespace shoal::client
