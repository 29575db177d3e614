#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "serve/core/tensor.h"
#include "serve/repository/ensemble_combiner.h"

namespace shoal::serve {

// One input or output of a model as its config.yaml declares it.
struct TensorConfig {
  std::string name;
  DataType datatype = DataType::kFp32;
  // Without the batch dimension when the model batches (max_batch_size >= 1); -1 is any size.
  std::vector<int64_t> dims;
};

// What a warmup run fills an input with.
enum class WarmupFill { kZero, kOne, kRandom };

struct WarmupInput {
  std::string name;
  std::vector<int64_t> shape;  // the full shape the model receives, batch dimension included
  WarmupFill fill = WarmupFill::kZero;
};

// One warmup request, run `count` times on every instance before the version is ready.
struct WarmupSample {
  int count = 1;
  std::vector<WarmupInput> inputs;  // one per declared input, in the declared order
};

// `ensemble: {models: [a, b], combine: mean}`: the model answers with its members' outputs
// combined (docs/serving.md, "Ensembles").
struct EnsembleConfig {
  std::vector<std::string> models;  // at least 2, distinct
  Combiner combine = Combiner::kMean;
};

// Which of a model's complete version directories are loaded (docs/serving.md).
enum class VersionPolicy {
  kLatest,  // only the highest numbered version that loads; a newer one replaces it
  kAll,     // every version that loads
};

// `rollout: {canary: {...}}`: a new version found by the repository watcher first serves as a
// canary beside the current one, and is promoted or rolled back on what it did
// (docs/serving.md, "Canary rollout and rollback"; repository/canary_rollout.h).
struct CanaryConfig {
  double share = 0.1;           // of the unversioned requests (or mirrored copies), in (0, 1]
  double duration_s = 60;       // the shortest canary period
  int64_t min_requests = 100;   // canary requests before a promotion can be decided
  double max_error_rate = 0.01;  // failed canary requests / canary requests
  // The canary's p99 latency over the current version's; 0: latency not compared.
  double max_p99_ratio = 2.0;
  // Set: outputs of both versions on the same inputs are compared (relative L1 distance).
  std::optional<double> max_output_drift;
  // Copies of `share` of the requests go to the canary; the replies come from the current.
  bool mirror = false;
};

struct RolloutConfig {
  std::optional<CanaryConfig> canary;
};

// DIR/<model>/config.yaml. Every key is optional; the defaults are those of a model directory
// without a config file (docs/serving.md).
struct ModelConfig {
  // Empty: the inputs are the forward method's arguments, datatypes and shapes as requested.
  std::vector<TensorConfig> inputs;
  // Empty: outputs are named by the model (Dict[str, Tensor] keys) or output__0, output__1...
  std::vector<TensorConfig> outputs;
  // 0: no batching, every request runs alone. N >= 1: requests are batched on dimension 0 up
  // to N rows, and the dims above leave that dimension out.
  int64_t max_batch_size = 0;
  // How long the oldest queued request may wait for more to batch with. Default: 0, batch only
  // what is already queued when an instance is free.
  int64_t batch_delay_us = 0;
  // Model instances (each a loaded copy of the module on a thread of its own). Default: 1.
  int instances = 1;
  // Intra-op threads per instance; nullopt: the server's CPU share (docs/serving.md).
  std::optional<int> threads_per_instance;
  std::vector<WarmupSample> warmup;
  // Default: latest, as Triton's default (latest 1).
  VersionPolicy version_policy = VersionPolicy::kLatest;
  // New versions roll out as a canary when set (version_policy latest only).
  RolloutConfig rollout;
  // Set: the model is an ensemble, and no other key is allowed.
  std::optional<EnsembleConfig> ensemble;
};

inline constexpr char kModelConfigFileName[] = "config.yaml";

// Parses and validates a model config. Any problem is an InvalidArgument holding one line per
// problem, in file order, in the form
//   models/mlp/config.yaml:4: inputs[0].datatype: must be one of BOOL, ..., FP64, got 'FP3'
// `source_name` names the file in messages. Nothing here throws.
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& yaml_text,
                                             const std::string& source_name);

// The same for the file at `path` (named as `path` spells it); an unreadable file is an
// InvalidArgument too.
absl::StatusOr<ModelConfig> ReadModelConfigFile(const std::string& path);

}  // namespace shoal::serve
