#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "serve/core/infer_request.h"
#include "serve/core/tensor.h"
#include "serve/repository/model_config.h"

namespace shoal::serve {

class ServedVersion;

// Request latencies in log-spaced buckets 25 % wide (10 us to ~90 s), fine enough to compare
// two versions' p99 under a ratio such as 1.5. Updated from any thread without a lock.
class LatencyHistogram {
 public:
  static constexpr int kBuckets = 72;
  void Record(uint64_t ns);
  uint64_t Count() const;
  // The upper bound, in ns, of the bucket holding the q-quantile (0 < q <= 1); 0 when empty.
  uint64_t Quantile(double q) const;

 private:
  std::array<std::atomic<uint64_t>, kBuckets> buckets_{};
};

// What a canary and the current version did since the canary started.
struct CanarySnapshot {
  Clock::Duration elapsed{0};
  uint64_t canary_requests = 0;  // answered by the canary (or, mirrored, run on it), counted
  uint64_t canary_errors = 0;
  uint64_t current_requests = 0;
  uint64_t current_errors = 0;
  uint64_t canary_p99_ns = 0;   // 0 until it has answered a request
  uint64_t current_p99_ns = 0;
  uint64_t drift_pairs = 0;     // requests run on both versions and compared
  double mean_drift = 0;
  uint64_t fallbacks = 0;  // failed canary requests answered by the current version instead
};

enum class CanaryVerdict { kPromote, kRollBack };

struct CanaryDecision {
  CanaryVerdict verdict = CanaryVerdict::kPromote;
  std::string reason;  // for people: which rule, with the numbers
};

// The rules (docs/serving.md, "Canary rollout and rollback"), on a snapshot: nullopt while
// undecided.
//  - Rolled back at once when the canary has failed more requests than max_error_rate allows
//    over min_requests (the first clear failure: a broken version is out within a few requests).
//  - Otherwise decided once duration_s has passed and the canary has run min_requests:
//    rolled back when its error rate is above max_error_rate, its p99 above max_p99_ratio
//    times the current version's, or its mean output drift above max_output_drift;
//    promoted otherwise.
std::optional<CanaryDecision> DecideCanary(const CanaryConfig& config,
                                           const CanarySnapshot& snapshot);

// Whether the rollout's request number `n` (from 0) goes to the canary: exactly
// floor(n * share) of the first n requests do, evenly spread, so that the share holds for a
// few requests as for many, without a random number per request.
bool RoutesToCanary(uint64_t n, double share);

// The relative L1 distance of two sets of outputs, sum |canary - current| / sum |current|,
// over the tensors of `current` (by name). Infinity when the canary lacks one or its shape or
// datatype differs; when every current element is 0, the mean absolute difference instead.
double OutputDrift(const std::vector<Tensor>& canary, const std::vector<Tensor>& current);

// `done` for a request routed by a rollout: the version whose outputs these are (the canary
// or the current one), and the outputs.
using RoutedDone =
    std::function<void(ServedVersion* answered, absl::StatusOr<std::vector<Tensor>> outputs)>;

// GET /metrics: a model with a rollout policy, a pin or a past canary decision (docs/serving.md, "Canary
// rollout and rollback").
struct RolloutMetrics {
  std::string model;
  uint64_t promoted = 0;     // canary decisions so far, automatic and by request
  uint64_t rolled_back = 0;
  double canary_share = 0;   // of the unversioned requests now; 0 without a canary
  // Unversioned requests routed while canaries ran, by the role of the version they went to.
  uint64_t routed_current = 0;
  uint64_t routed_canary = 0;
  uint64_t fallbacks = 0;  // failed canary requests answered by the current version instead
};

// A canary beside the current version of one model: routes the model's unversioned requests
// between the two (or mirrors copies to the canary), and counts what each did for
// DecideCanary. Thread-safe.
//
// A canary request that fails is run again on the current version, whose answer the caller
// gets: while the canary runs, its failures cost the callers time, not errors. It counts as
// the canary's failure unless the current version refuses the request as well (InvalidArgument
// from both: the caller's mistake).
class CanaryRollout {
 public:
  CanaryRollout(CanaryConfig config, std::shared_ptr<ServedVersion> current,
                std::shared_ptr<ServedVersion> canary, const Clock* clock);

  // Runs an unversioned request. `done` runs exactly once, on an instance thread or this one.
  // The caller keeps the rollout alive until `done` has run; copies run past that (mirrored
  // requests, drift comparisons) are counted by pending() instead.
  void InferAsync(InferRequest request, RoutedDone done);
  // The same, waiting.
  std::pair<ServedVersion*, absl::StatusOr<std::vector<Tensor>>> Infer(InferRequest request);

  CanarySnapshot Snapshot() const;
  std::optional<CanaryDecision> Evaluate() const { return DecideCanary(config_, Snapshot()); }
  // From now on every request goes to the current version only.
  void Stop() { stopped_.store(true, std::memory_order_relaxed); }
  bool stopped() const { return stopped_.load(std::memory_order_relaxed); }
  // Copies still running on either version; the rollout must live until this is 0.
  int64_t pending() const { return pending_.load(); }

  const std::shared_ptr<ServedVersion>& current() const { return current_; }
  const std::shared_ptr<ServedVersion>& canary() const { return canary_; }
  const CanaryConfig& config() const { return config_; }
  // Requests routed to each side so far (mirrored copies count as canary requests).
  uint64_t routed_to_current() const { return routed_current_.load(); }
  uint64_t routed_to_canary() const { return routed_canary_.load(); }

 private:
  struct MirrorPair;
  uint64_t ElapsedNs(Clock::TimePoint start) const;
  void RecordCurrent(const absl::Status& status, uint64_t ns);
  void RecordCanary(bool failed, uint64_t ns);
  void RecordDrift(double drift);
  void RunOnCurrent(InferRequest request, RoutedDone done);
  void RunOnCanary(InferRequest request, RoutedDone done);
  void RunMirrored(InferRequest request, RoutedDone done);
  // Runs `request` on the current version only to compare its outputs with `canary_outputs`.
  void CompareOnCurrent(InferRequest request, std::vector<Tensor> canary_outputs);
  void FinishMirror(const std::shared_ptr<MirrorPair>& pair);

  const CanaryConfig config_;
  const std::shared_ptr<ServedVersion> current_;
  const std::shared_ptr<ServedVersion> canary_;
  const Clock* const clock_;
  const Clock::TimePoint start_;
  const uint64_t failure_budget_;  // DecideCanary's: failures past it roll back at once
  std::atomic<bool> stopped_{false};
  std::atomic<uint64_t> next_request_{0};
  std::atomic<int64_t> pending_{0};
  std::atomic<uint64_t> routed_current_{0}, routed_canary_{0};
  std::atomic<uint64_t> canary_requests_{0}, canary_errors_{0};
  std::atomic<uint64_t> current_requests_{0}, current_errors_{0};
  std::atomic<uint64_t> fallbacks_{0};
  LatencyHistogram canary_latency_, current_latency_;
  mutable absl::Mutex drift_mu_;
  uint64_t drift_pairs_ ABSL_GUARDED_BY(drift_mu_) = 0;
  double drift_sum_ ABSL_GUARDED_BY(drift_mu_) = 0;
};

}  // namespace shoal::serve
