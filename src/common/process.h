#pragma once

#include <sys/types.h>

#include <string>

namespace shoal {

// Whether `pid` is a live process: it exists and is not a zombie (a dead process its parent has
// not reaped yet still answers kill(pid, 0)). When `cmdline_contains` is given, the process's
// command line must contain it too, so that a recycled pid is not mistaken for ours.
bool ProcessRunning(pid_t pid, const std::string& cmdline_contains = "");

}  // namespace shoal
