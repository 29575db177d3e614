#include "serve/frontends/prometheus_text.h"

#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shoal::serve {
namespace {

// Seconds as Prometheus expects them: plain decimal, no exponent for the values we produce.
std::string Seconds(uint64_t ns) { return absl::StrFormat("%.9f", static_cast<double>(ns) / 1e9); }

std::string Labels(const VersionMetrics& v, const std::string& extra = "") {
  return absl::StrCat("{model=\"", EscapeLabelValue(v.model), "\",version=\"", v.version, "\"",
                      extra, "}");
}

void Family(std::string& out, const std::vector<VersionMetrics>& versions, const char* name,
            const char* type, const char* help,
            const std::function<std::string(const VersionMetrics&)>& value) {
  absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
  for (const VersionMetrics& v : versions) {
    absl::StrAppend(&out, name, Labels(v), " ", value(v), "\n");
  }
}

}  // namespace

std::string EscapeLabelValue(const std::string& value) {
  std::string escaped;
  for (char c : value) {
    if (c == '\\') {
      escaped += "\\\\";
    } else if (c == '"') {
      escaped += "\\\"";
    } else if (c == '\n') {
      escaped += "\\n";
    } else {
      escaped += c;
    }
  }
  return escaped;
}

std::string FormatPrometheusText(const std::vector<VersionMetrics>& versions) {
  std::string out;
  Family(out, versions, "shoal_inference_request_success_total", "counter",
         "Inference requests answered with outputs.",
         [](const VersionMetrics& v) { return absl::StrCat(v.success_count); });
  Family(out, versions, "shoal_inference_request_failure_total", "counter",
         "Inference requests that reached the version and failed: refused as invalid (400) or "
         "failed in the model (500).",
         [](const VersionMetrics& v) { return absl::StrCat(v.failure_count); });
  Family(out, versions, "shoal_inference_count_total", "counter",
         "Inferences run: batch rows, or requests for a model that does not batch.",
         [](const VersionMetrics& v) { return absl::StrCat(v.inference_count); });
  Family(out, versions, "shoal_inference_exec_count_total", "counter",
         "Model executions (forward calls); fewer than inferences when requests are batched.",
         [](const VersionMetrics& v) { return absl::StrCat(v.execution_count); });
  Family(out, versions, "shoal_inference_queue_seconds_total", "counter",
         "Time requests waited in the queue for an instance, summed over requests.",
         [](const VersionMetrics& v) { return Seconds(v.queue_ns); });
  Family(out, versions, "shoal_inference_compute_seconds_total", "counter",
         "Time the model's forward ran, summed over executions.",
         [](const VersionMetrics& v) { return Seconds(v.compute_ns); });
  Family(out, versions, "shoal_inference_requests_in_flight", "gauge",
         "Requests the version is answering now (queued or running).",
         [](const VersionMetrics& v) { return absl::StrCat(v.in_flight); });

  constexpr char kHistogram[] = "shoal_inference_request_duration_seconds";
  absl::StrAppend(&out, "# HELP ", kHistogram,
                  " Latency of inference requests from a checked request to its outputs or "
                  "failure.\n# TYPE ",
                  kHistogram, " histogram\n");
  for (const VersionMetrics& v : versions) {
    uint64_t cumulative = 0;
    for (size_t i = 0; i <= kLatencyBucketBoundsUs.size(); ++i) {
      cumulative += i < v.latency_buckets.size() ? v.latency_buckets[i] : 0;
      std::string le = i < kLatencyBucketBoundsUs.size()
                           ? absl::StrFormat("%g", kLatencyBucketBoundsUs[i] / 1e6)
                           : "+Inf";
      absl::StrAppend(&out, kHistogram, "_bucket", Labels(v, absl::StrCat(",le=\"", le, "\"")),
                      " ", cumulative, "\n");
    }
    absl::StrAppend(&out, kHistogram, "_sum", Labels(v), " ", Seconds(v.latency_sum_ns), "\n");
    absl::StrAppend(&out, kHistogram, "_count", Labels(v), " ", cumulative, "\n");
  }
  return out;
}

std::string FormatRolloutPrometheusText(const std::vector<RolloutMetrics>& models) {
  std::string out;
  auto model_label = [](const RolloutMetrics& m, const std::string& extra = "") {
    return absl::StrCat("{model=\"", EscapeLabelValue(m.model), "\"", extra, "}");
  };
  absl::StrAppend(&out,
                  "# HELP shoal_serve_canary_decisions_total Canary versions promoted or rolled "
                  "back, automatically or by request.\n# TYPE shoal_serve_canary_decisions_total "
                  "counter\n");
  for (const RolloutMetrics& m : models) {
    absl::StrAppend(&out, "shoal_serve_canary_decisions_total",
                    model_label(m, ",decision=\"promoted\""), " ", m.promoted, "\n");
    absl::StrAppend(&out, "shoal_serve_canary_decisions_total",
                    model_label(m, ",decision=\"rolled_back\""), " ", m.rolled_back, "\n");
  }
  absl::StrAppend(&out,
                  "# HELP shoal_serve_canary_share The share of the model's unversioned requests "
                  "sent (or mirrored) to its canary now; 0 without a canary.\n# TYPE "
                  "shoal_serve_canary_share gauge\n");
  for (const RolloutMetrics& m : models) {
    absl::StrAppend(&out, "shoal_serve_canary_share", model_label(m), " ",
                    absl::StrFormat("%g", m.canary_share), "\n");
  }
  absl::StrAppend(&out,
                  "# HELP shoal_serve_canary_requests_total Unversioned requests routed while a "
                  "canary ran, by the role of the version they went to (mirrored copies count "
                  "for the canary).\n# TYPE shoal_serve_canary_requests_total counter\n");
  for (const RolloutMetrics& m : models) {
    absl::StrAppend(&out, "shoal_serve_canary_requests_total",
                    model_label(m, ",role=\"current\""), " ", m.routed_current, "\n");
    absl::StrAppend(&out, "shoal_serve_canary_requests_total",
                    model_label(m, ",role=\"canary\""), " ", m.routed_canary, "\n");
  }
  absl::StrAppend(&out,
                  "# HELP shoal_serve_canary_fallbacks_total Canary requests that failed and were "
                  "answered by the current version instead.\n# TYPE "
                  "shoal_serve_canary_fallbacks_total counter\n");
  for (const RolloutMetrics& m : models) {
    absl::StrAppend(&out, "shoal_serve_canary_fallbacks_total", model_label(m), " ", m.fallbacks,
                    "\n");
  }
  return out;
}

}  // namespace shoal::serve
