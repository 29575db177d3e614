#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace shoal::spec {

enum class Framework { kNone, kPyTorch };

struct Resources {
  double cpus = 1.0;            // may be fractional; whole cores are pinned when they fit
  uint64_t memory_bytes = 0;    // 0: no limit requested
  uint32_t gpus = 0;
};

struct Role {
  std::string name;
  uint32_t instances = 1;
  // Exactly one of these is set: an argv list, or a shell string run through /bin/sh -c.
  std::vector<std::string> argv;
  std::string shell;
  std::map<std::string, std::string> env;
  // The parser always fills it with an absolute path: `working_dir` resolved against the job
  // file's directory, or that directory itself. Empty only in specs built by hand, where it
  // means the job directory's task folder.
  std::string working_dir;
  Resources resources;
  bool untracked = false;       // stopped once the tracked roles finish; never decides outcome
  std::vector<std::string> depends_on;  // start only after these roles are all running
  int line = 0;                 // line of the role's key in the job file, for messages

  // 1-based lines of the `resources` keys, so that checks made after parsing (CheckFitsMachine)
  // point at the key to edit. 0 where the key was not written; messages then use `line`.
  struct ResourceLines {
    int cpus = 0;
    int memory = 0;
    int gpus = 0;
  };
  ResourceLines resource_lines;
};

struct JobSpec {
  std::string name;
  Framework framework = Framework::kNone;
  // Roles in the order they appear in the file.
  std::vector<Role> roles;
  // Roles whose tasks must all exit 0 for the job to succeed. Filled by the parser: the
  // `success.roles` list, else {"chief"} when a chief role exists, else every tracked role.
  std::vector<std::string> success_roles;
  std::string source_path;      // the file it was read from

  const Role* FindRole(const std::string& name) const;
  uint32_t TotalTasks() const;
};

const char* FrameworkName(Framework f);

}  // namespace shoal::spec
