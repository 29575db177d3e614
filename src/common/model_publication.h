#pragma once

// A task's report that it published a model version (the SDK's `published` op,
// docs/sdk-protocol.md): what the agent accepts from a task and the master journals. Both check
// it with ParseModelPublication, the agent so that a bad report never leaves the node and the
// master because it trusts no agent's JSON.

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace shoal {

struct ModelPublication {
  // Bounds on what one report may carry, so that a task cannot grow the journal and every
  // status by much per publication.
  static constexpr size_t kMaxModelNameBytes = 255;
  static constexpr size_t kMaxRepositoryBytes = 4096;
  static constexpr size_t kMaxMetrics = 64;
  static constexpr size_t kMaxMetricNameBytes = 128;

  std::string model;
  uint64_t version = 0;
  std::string repository;
  std::optional<int64_t> step;
  std::map<std::string, double> metrics;
};

// The publication in a `published` request ({"op":"published", "model", "version",
// "repository", "step"?, "metrics"?}); InvalidArgument naming the field that is missing, of the
// wrong type or out of bounds. Ignores op, task and attempt.
absl::StatusOr<ModelPublication> ParseModelPublication(const nlohmann::json& request);

}  // namespace shoal
