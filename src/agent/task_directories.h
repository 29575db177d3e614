#pragma once

#include <map>
#include <string>

#include "absl/status/status.h"

namespace shoal::agent {

// Creates the local directories a task is told about (TaskLaunch.local_dirs: variable -> path)
// before it starts, with their missing parents, as `mkdir -p` does: new directories get 0777
// less the agent's umask, and an existing one keeps its mode and owner (it may be a shared
// checkpoint directory the user set up). Runs on the agent's launching thread, before the fork.
// Errors: FailedPrecondition naming the directory, the variable and the errno (a path that is
// not absolute, a component that is a file, a parent without write permission, ...).
absl::Status MakeTaskDirectories(const std::map<std::string, std::string>& dirs);

}  // namespace shoal::agent
