#pragma once

// `shoal kubernetes ...`: what a cluster's administrator runs once, beside `shoal run`
// (docs/backends/kubernetes.md, "Installing the agent on the nodes").

#include <string>

namespace shoal::cli {

struct AgentDaemonSetFlags {
  std::string agent_image;
  std::string agent_host_path;
  std::string pause_image;
  std::string ns;
};

// Prints the DaemonSet that installs the agent on every node (kubectl apply -f -); 2 and a
// message naming the flag for a bad value.
int PrintAgentDaemonSet(const AgentDaemonSetFlags& flags);

// The DaemonSet's init container: installs the agent directory `from` at `to` (InstallAgent).
int RunAgentInstall(const std::string& from, const std::string& to);

}  // namespace shoal::cli
