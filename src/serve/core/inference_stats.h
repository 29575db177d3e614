#pragma once

#include <array>
#include <atomic>
#include <cstdint>

namespace shoal::serve {

// Upper bounds, in microseconds, of the request latency histogram's buckets (docs/serving.md,
// "Metrics"); a last bucket, +Inf, takes the rest. From 100 us (a small model on a warm
// instance) to 10 s (a long queue).
inline constexpr std::array<uint64_t, 16> kLatencyBucketBoundsUs = {
    100,    250,    500,     1'000,   2'500,   5'000,     10'000,    25'000,
    50'000, 100'000, 250'000, 500'000, 1'000'000, 2'500'000, 5'000'000, 10'000'000};

// Counters of one model version, as GET /v2/models/{name}[/versions/{v}]/stats reports them
// (the fields of Triton's statistics extension) and GET /metrics. Updated from any thread
// without a lock.
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
  // Requests refused by the version's checks (400) before they were queued.
  std::atomic<uint64_t> invalid_count{0};
  std::atomic<int64_t> in_flight{0};  // requests inside Infer now
  // Latencies of the requests that ran (success or failure), per kLatencyBucketBoundsUs
  // bucket, the last for the rest; not cumulative.
  std::array<std::atomic<uint64_t>, kLatencyBucketBoundsUs.size() + 1> latency_buckets{};
  std::atomic<uint64_t> latency_sum_ns{0};

  void RecordLatency(uint64_t ns) {
    size_t bucket = 0;
    while (bucket < kLatencyBucketBoundsUs.size() && ns > kLatencyBucketBoundsUs[bucket] * 1000) {
      ++bucket;
    }
    latency_buckets[bucket] += 1;
    latency_sum_ns += ns;
  }
};

}  // namespace shoal::serve
