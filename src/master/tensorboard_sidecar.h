#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "spec/job_spec.h"

namespace shoal::master {

// The TensorBoard program a job's `tensorboard:` section runs: its `command`, else the one
// ./setup.sh installs (/var/cache/shoal/venvs/tensorboard/bin/tensorboard), else `tensorboard`
// on PATH. NotFound names what was looked for, so a job file can be refused before it starts.
absl::StatusOr<std::vector<std::string>> ResolveTensorBoardCommand(
    const spec::TensorBoardConfig& config);

// Where a job's TensorBoard reads: `logdir`, else <job dir>/tensorboard.
std::string TensorBoardLogdir(const spec::TensorBoardConfig& config, const std::string& job_dir);

// TensorBoard beside a job: started on loopback (it has no authentication) on a free port,
// its output in `log_path`; `on_url` is called once with the address TensorBoard prints when
// it serves, `on_failure` if it exits before that. Stopped (SIGTERM, then SIGKILL) when
// destroyed. Never part of the job's outcome.
class TensorBoardSidecar {
 public:
  static absl::StatusOr<std::unique_ptr<TensorBoardSidecar>> Start(
      const std::vector<std::string>& command, const std::string& logdir,
      const std::string& log_path, std::function<void(const std::string&)> on_url,
      std::function<void(const std::string&)> on_failure);
  ~TensorBoardSidecar();

 private:
  TensorBoardSidecar() = default;
  void Watch(int pidfd, std::string log_path, std::function<void(const std::string&)> on_url,
             std::function<void(const std::string&)> on_failure);

  pid_t pid_ = -1;
  std::thread watcher_;
};

}  // namespace shoal::master
