#pragma once

// Whether a gang of pods fits the cluster's free capacity now, as a pure function of the
// API server's Node and Pod objects: the check Shoal's gang admission makes while it holds the
// admission lease (docs/design/0013-kubernetes-backend.md, "Gang admission").

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace shoal::backends {

// What a pod asks of a node: cpus in millicores, memory in bytes, GPUs, and one pod slot.
struct PodRequest {
  int64_t milli_cpus = 0;
  int64_t memory_bytes = 0;
  int64_t gpus = 0;
  bool operator==(const PodRequest&) const = default;
};

// A Kubernetes quantity ("1500m", "2Gi", "128Mi", "1", "0.5", "1e3", "512M") in its base unit
// scaled by `scale` (1000 for millicores); nullopt when it is not one.
std::optional<int64_t> ParseQuantity(absl::string_view text, int64_t scale = 1);

// A pod's effective request: the larger of its containers' sum and its largest init container,
// as the scheduler counts it.
PodRequest RequestOf(const nlohmann::json& pod);

struct GangFit {
  bool fits = false;
  // Where each gang pod would go (by the gang's order), when it fits.
  std::vector<std::string> nodes;
  // When it does not: what the gang needs and what is free, in one line.
  std::string reason;
};

// Can every pod of `gang` be placed on `nodes` (Node objects) given `bound` (the cluster's pods
// bound to a node and not ended)? Honours each node's allocatable cpu, memory, nvidia.com/gpu
// and pods, `unschedulable`, NoSchedule/NoExecute taints against the gang pod's tolerations,
// and its nodeSelector. Bound pods of lower priority than the gang's (spec.priority) count as
// free: the scheduler preempts them for it. First fit, largest pods first.
GangFit FitGang(const std::vector<nlohmann::json>& nodes, const std::vector<nlohmann::json>& bound,
                const std::vector<nlohmann::json>& gang);

}  // namespace shoal::backends
