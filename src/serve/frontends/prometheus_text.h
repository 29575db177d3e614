#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "serve/core/inference_stats.h"
#include "serve/repository/canary_rollout.h"

namespace shoal::serve {

// The figures of one serving version at one moment, as GET /metrics shows them.
struct VersionMetrics {
  std::string model;
  int64_t version = 0;
  uint64_t success_count = 0;
  uint64_t failure_count = 0;
  uint64_t inference_count = 0;  // rows run
  uint64_t execution_count = 0;  // forward calls
  uint64_t queue_ns = 0;
  uint64_t compute_ns = 0;
  int64_t in_flight = 0;
  // Requests per latency bucket, not cumulative: kLatencyBucketBoundsUs.size() + 1 entries,
  // the last one for latencies above every bound.
  std::vector<uint64_t> latency_buckets;
  uint64_t latency_sum_ns = 0;
};

// The Prometheus text exposition format (version 0.0.4) of `versions`: every metric family
// once, with its HELP and TYPE lines, then one sample per version labelled
// {model="..",version=".."}. Families are listed even when `versions` is empty.
std::string FormatPrometheusText(const std::vector<VersionMetrics>& versions);

// The canary families (shoal_serve_canary_*), labelled {model=".."}; listed even when empty.
std::string FormatRolloutPrometheusText(const std::vector<RolloutMetrics>& models);

// `value` escaped for a label value: backslash, double quote and newline.
std::string EscapeLabelValue(const std::string& value);

}  // namespace shoal::serve
