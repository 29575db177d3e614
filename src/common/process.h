#pragma once

#include <sys/types.h>

#include <map>
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

}  // namespace shoal
