#include "process/process.h"

#include <signal.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

extern char** environ;

namespace shoal {

std::map<std::string, std::string> InheritedEnvironment(const std::set<std::string>& excluded) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq == nullptr) continue;
    std::string name(*e, eq - *e);
    if (!excluded.count(name)) env[name] = eq + 1;
  }
  return env;
}

bool ProcessRunning(pid_t pid, const std::string& cmdline_contains) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno != EPERM) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  size_t close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return false;  // gone meanwhile
  char state = text[close + 2];
  if (state == 'Z' || state == 'X') return false;
  if (cmdline_contains.empty()) return true;
  std::ifstream cmd("/proc/" + std::to_string(pid) + "/cmdline");
  std::string args((std::istreambuf_iterator<char>(cmd)), std::istreambuf_iterator<char>());
  for (char& c : args) {
    if (c == '\0') c = ' ';
  }
  return args.find(cmdline_contains) != std::string::npos;
}

}  // namespace shoal
