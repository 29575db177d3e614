#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "serve/core/infer_request.h"
#include "serve/core/inference_stats.h"
#include "serve/core/tensor.h"
#include "serve/repository/model_config.h"
#include "serve/scheduling/batch_queue.h"
#include "serve/scheduling/compute_slots.h"

namespace shoal::serve {

class ModelBackend;
class ModelScheduler;

// An input or output as the model's metadata shows it and requests are checked against.
// Unknown datatype or shape (a model without a config file) are nullopt: any is accepted.
struct TensorSignature {
  std::string name;
  std::optional<DataType> datatype;
  std::optional<std::vector<int64_t>> shape;  // full shape, -1 where any size (batch first)
};

struct VersionLoadOptions {
  std::string model_name;
  int64_t version = 0;
  std::string model_path;
  ModelConfig config;           // the defaults when the model has no config file
  int threads_per_instance = 1;  // resolved: the config's, or the server's CPU share
  // The server's CPUs, shared by every version's instances (null: not limited).
  std::shared_ptr<ComputeSlots> compute_slots;
};

class ServedVersion;

// The version of `model` serving now (ModelManager::FindVersion without a version).
using MemberLookup =
    std::function<absl::StatusOr<std::shared_ptr<ServedVersion>>(const std::string& model)>;

struct EnsembleOptions {
  std::string model_name;
  EnsembleConfig config;
  // The members' versions serving now, in config order: their signatures are checked here.
  std::vector<std::shared_ptr<ServedVersion>> members;
  // How a request finds each member's version; called on every request, so that a member's
  // new version takes the ensemble's traffic too. Must stay callable while the version lives.
  MemberLookup lookup;
};

// One loaded, warmed-up version of a model: its instances and their scheduler, its signature
// and statistics. Thread-safe; shared by the requests using it (shared_ptr), so that it
// outlives all of them.
class ServedVersion {
 public:
  // Loads `instances` copies of the module with `backend`, checks the config against the
  // module's forward, and warms every instance up. InvalidArgument (load, signature) or the
  // warmup's error, each naming the file. `backend` and `clock` must outlive the version.
  static absl::StatusOr<std::unique_ptr<ServedVersion>> Load(const VersionLoadOptions& options,
                                                             ModelBackend* backend,
                                                             const Clock* clock);
  // An ensemble (version 1): a request runs on every member's serving version with the
  // decoded tensors, one member after the other, and their outputs are combined. InvalidArgument
  // naming the ensemble and members when the members' signatures are incompatible: different
  // inputs, different outputs, outputs not declared in their config, or of a datatype the
  // combiner does not take.
  static absl::StatusOr<std::unique_ptr<ServedVersion>> CreateEnsemble(
      const EnsembleOptions& options, const Clock* clock);
  ~ServedVersion();

  // Checks a request against the signature and runs it; blocks until the outputs are there.
  // InvalidArgument says what is wrong with the request (unknown, missing or repeated input,
  // datatype, shape, batch size, unknown requested output); other codes are the model's
  // failures (Internal) or shutdown (Unavailable). The outputs are those requested, in the
  // order requested, or all of them.
  absl::StatusOr<std::vector<Tensor>> Infer(InferRequest request);
  // Infer without waiting: `done` runs exactly once with what Infer would return, on this
  // thread when the request is refused and otherwise on an instance thread, where it must not
  // block. The caller keeps the version alive until `done` has run. An ensemble runs its
  // members on this thread (blocking it) before `done` runs here.
  void InferAsync(InferRequest request, InferenceDone done);
  bool is_ensemble() const { return !ensemble_.models.empty(); }

  const std::string& model_name() const { return model_name_; }
  int64_t version() const { return version_; }
  const std::vector<TensorSignature>& inputs() const { return inputs_; }
  // Empty when the model has no config file: its outputs are known only from responses.
  const std::vector<TensorSignature>& outputs() const { return outputs_; }
  int64_t max_batch_size() const { return config_.max_batch_size; }
  int instances() const { return config_.instances; }
  int threads_per_instance() const { return threads_per_instance_; }
  const InferenceStats& stats() const { return stats_; }
  // Empty unless an ensemble.
  const std::vector<std::string>& ensemble_members() const { return ensemble_.models; }
  // What model metadata shows as the platform: "ensemble" (Triton's name) or
  // "pytorch_libtorch".
  const char* platform() const {
    return ensemble_.models.empty() ? "pytorch_libtorch" : "ensemble";
  }

 private:
  ServedVersion() = default;
  // The request's inputs in the model's argument order, or what is wrong with them. Sets
  // `*rows` to the batch size when the model batches.
  absl::StatusOr<std::vector<Tensor>> ValidateInputs(std::vector<Tensor> inputs,
                                                     int64_t* rows) const;

  std::string model_name_;
  int64_t version_ = 0;
  ModelConfig config_;
  int threads_per_instance_ = 1;
  std::vector<TensorSignature> inputs_;   // as shown: config order, else forward's
  std::vector<std::string> argument_order_;  // input names in forward's positional order
  std::vector<TensorSignature> outputs_;
  const Clock* clock_ = nullptr;
  EnsembleConfig ensemble_;  // models empty: not an ensemble
  MemberLookup lookup_;
  absl::StatusOr<std::vector<Tensor>> InferEnsemble(InferRequest request);
  InferenceStats stats_;
  // Declared last, so destroyed first: its instances stop before what they use goes.
  std::unique_ptr<ModelScheduler> scheduler_;
};

}  // namespace shoal::serve
