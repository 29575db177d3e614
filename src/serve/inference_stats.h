#pragma once

#include <atomic>
#include <cstdint>

namespace shoal::serve {

// Counters of one model version, as GET /v2/models/{name}[/versions/{v}]/stats reports them
// (the fields of Triton's statistics extension). Updated from any thread without a lock.
struct InferenceStats {
  std::atomic<uint64_t> success_count{0};  // requests answered with outputs
  std::atomic<uint64_t> success_ns{0};     // their time from decoded request to outputs
  std::atomic<uint64_t> failure_count{0};  // requests that reached the model and failed
  std::atomic<uint64_t> failure_ns{0};
  std::atomic<uint64_t> queue_ns{0};          // summed over requests: enqueued to executed
  std::atomic<uint64_t> compute_ns{0};        // summed over executions: the model's forward
  std::atomic<uint64_t> inference_count{0};   // batch rows (requests, when not batching) run
  std::atomic<uint64_t> execution_count{0};   // forward calls; < inference_count when batching
  std::atomic<int64_t> last_inference_ms{0};  // Unix milliseconds of the last execution
};

}  // namespace shoal::serve
