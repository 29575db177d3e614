#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shoal::mpi {

// framework: mpi (docs/frameworks.md). The launcher task runs mpirun against a hostfile that
// names each worker task by an alias; mpirun hands every alias to `shoal mpi-rsh`, its remote
// shell, which asks the `shoal mpi-worker` in that task to start Open MPI's daemon. So each
// rank runs inside a worker task, with that task's CPUs, memory, GPUs and logs, on whichever
// machine the backend put it, and no ssh is needed anywhere.

// One worker task as the launcher reaches it.
struct MpiHost {
  uint32_t index = 0;
  std::string alias;    // the name in the hostfile
  std::string address;  // where its mpi-worker listens
  uint32_t port = 0;
};

// "shoal-worker-<index>": names no real machine, so mpirun never mistakes a worker for its own
// host and starts ranks in the launcher.
std::string HostAlias(uint32_t index);

// The worker tasks of the cluster spec JSON (SHOAL_CLUSTER_SPEC_FILE), by index.
absl::StatusOr<std::vector<MpiHost>> WorkerHosts(const std::string& cluster_json);

// The task `role`:`index` of the cluster spec, for a worker to find its own address and port.
absl::StatusOr<MpiHost> FindTask(const std::string& cluster_json, const std::string& role,
                                 uint32_t index);

// Open MPI's hostfile: "<alias> slots=<n>" per worker.
std::string Hostfile(const std::vector<MpiHost>& hosts, uint32_t slots_per_worker);

// The command the launcher execs: the job's command itself when it already starts with
// mpirun/mpiexec (it then picks the hostfile up from the environment), else
// `mpirun -np <ranks> --bind-to none <command>`: the ranks keep the CPUs of their worker task
// rather than Open MPI's own binding.
std::vector<std::string> LauncherArgv(const std::vector<std::string>& command, uint32_t ranks);

// What one mpi-rsh call asks of a worker: the remote command line, as ssh would pass it to the
// remote shell. One JSON line each way: {"secret", "command"}; then {"started": pid} or
// {"error": why}; finally {"exit": code}.
struct RshRequest {
  std::string secret;
  std::string command;
};
std::string EncodeRequest(const RshRequest& request);
absl::StatusOr<RshRequest> DecodeRequest(const std::string& line);

// Equal length and content, in time independent of where they differ.
bool SecretsEqual(const std::string& a, const std::string& b);

}  // namespace shoal::mpi
