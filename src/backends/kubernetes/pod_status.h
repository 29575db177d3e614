#pragma once

// What a pod's status means for Shoal, read from the API server's object: a pure function, so
// that every case (unschedulable, an image that cannot be pulled, OOM-killed, evicted,
// preempted, deleted) is tested on real objects' shapes without a cluster.

#include <cstdint>
#include <optional>
#include <string>

#include "nlohmann/json.hpp"

namespace shoal::backends {

struct PodObservation {
  enum class State {
    kWaiting,      // not scheduled yet (reason: the scheduler's words, if it gave any)
    kScheduled,    // bound to a node; its containers are starting or running
    kCannotStart,  // it will not start by itself: an image that cannot be pulled, a bad config,
                   // the agent's install failing (reason says which)
    kEnding,       // being deleted (by someone, or preempted), its agent still stopping
    kEnded,        // its agent's container ended, the pod failed, or the pod is gone
  };
  std::string name;
  std::string place;     // annotation shoal.io/place (role.index); empty: not Shoal's pod
  uint32_t attempt = 0;  // annotation shoal.io/attempt
  State state = State::kWaiting;
  std::string node;      // spec.nodeName once scheduled
  std::string reason;    // one line a user understands, for kWaiting (maybe empty) and after
  bool preempted = false;  // the scheduler or an eviction took it away (not the task's fault)
  bool running = false;       // phase Running: its containers started (images pulled)
  bool agent_exited = false;  // the agent's container ended by itself (its log says why)
};

// `deleted`: the object came with a DELETED watch event.
PodObservation ObservePod(const nlohmann::json& pod, bool deleted = false);

// A pod that will never mount its volumes: the kubelet says so only in events (FailedMount),
// while the pod's status stays ContainerCreating. Permanent when a hostPath is missing or of the
// wrong type (a node without Shoal's agent directory: agent_host_path) or once the kubelet has
// retried 4 times; the kubelet's first failures are often transient (a volume's source not
// registered yet).
struct MountFailure {
  std::string pod;
  std::string reason;  // one line: "pod NAME cannot mount its volumes: <the kubelet's message>"
};
std::optional<MountFailure> ObserveMountFailure(const nlohmann::json& event);

}  // namespace shoal::backends
