#pragma once

// The agent delivered once per node instead of once per pod (docs/design/0013, "Delivering the
// agent"): a DaemonSet whose init container installs the agent image's /opt/shoal into a
// directory of the node, which task pods then mount (kubernetes.agent_host_path). The manifest
// is a pure function, golden-tested; InstallAgent is what its init container runs.

#include <string>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace shoal::backends {

// What the DaemonSet's container runs once the agent is installed: nothing, cheaply.
inline constexpr char kDefaultPauseImage[] = "registry.k8s.io/pause:3.10";
inline constexpr char kAgentDaemonSetName[] = "shoal-agent";

struct AgentDaemonSetOptions {
  std::string agent_image;      // holds the agent at kAgentMountPath (tools/kubernetes/agent_image.py)
  std::string agent_host_path;  // where on each node; IsAgentHostPath
  std::string pause_image = kDefaultPauseImage;
  std::string ns;               // empty: left to kubectl (its -n or context)
};

// A DaemonSet (apps/v1) for `kubectl apply -f -`: on every node, tolerating every taint, its
// init container runs `shoal kubernetes agent-install` from the agent image into the host
// directory's parent, mounted DirectoryOrCreate; then a pause container holds the pod.
nlohmann::json AgentDaemonSet(const AgentDaemonSetOptions& options);

// Makes `to` an exact copy of the directory `from`, so that whoever opens `to` meanwhile sees
// either the whole old copy or the whole new one, never a mix: the new copy is written beside it
// (to.tmp-<unique>) and exchanged with the old one in one rename (RENAME_EXCHANGE; where the
// filesystem lacks it, two renames, with `to` briefly absent). The old copy is kept as
// to.previous, for pods started before that still run from it (the one before is removed). A
// `to` that already equals `from` is left alone. `what_happened` gets one line for the log.
absl::Status InstallAgent(const std::string& from, const std::string& to,
                          std::string* what_happened);

}  // namespace shoal::backends
