#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <set>
#include <string>

namespace shoal {

// Whether `pid` is a live process: it exists and is not a zombie (a dead process its parent has
// not reaped yet still answers kill(pid, 0)). When `cmdline_contains` is given, the process's
// command line must contain it too, so that a recycled pid is not mistaken for ours.
bool ProcessRunning(pid_t pid, const std::string& cmdline_contains = "");

// This process's environment as a map, without the variables named in `excluded` (secrets
// that must not reach a child).
std::map<std::string, std::string> InheritedEnvironment(const std::set<std::string>& excluded);

// Keeps `object` alive until the process ends, on purpose. For objects that hold gRPC channels
// or servers in a command that leaves with _exit (src/cli/main.cc): destroying the last of them
// runs gRPC's global shutdown, which sleeps for its threads (1 ms, then 2 ms, ...), and measured
// 1-4 ms in the client and ~4 ms in the agent, whose exit the master waits for at every job's end.
template <typename T>
void KeepUntilExit(std::shared_ptr<T> object) {
  new std::shared_ptr<T>(std::move(object));  // never deleted
}

}  // namespace shoal
