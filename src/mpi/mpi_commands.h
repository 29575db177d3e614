#pragma once

#include <string>
#include <vector>

namespace shoal::mpi {

// The three processes behind framework: mpi, each the whole of a `shoal` subcommand that the
// master puts in a task's argv (never typed by users). They read the task's environment
// (SHOAL_CLUSTER_SPEC_FILE, SHOAL_MPI_SECRET, SHOAL_MPI_SLOTS_PER_WORKER) and return the exit
// code; messages go to stderr, which is the task's log.

// Writes the hostfile beside the cluster spec, points Open MPI at it and at `shoal mpi-rsh`,
// then execs mpirun (LauncherArgv). Returns only if that fails.
int RunMpiLauncher(const std::string& shoal_binary, const std::vector<std::string>& command);

// Listens on this task's address and port for mpi-rsh calls carrying the job's secret and runs
// each command (Open MPI's daemon) under /bin/sh in its own process group, killed when its
// caller goes away. Runs until SIGTERM.
int RunMpiWorker();

// Open MPI's remote shell: `mpi-rsh <alias> <command words...>` runs the command in the worker
// task the alias names and exits with its code (255 when it cannot, as ssh does).
int RunMpiRsh(const std::vector<std::string>& args);

}  // namespace shoal::mpi
