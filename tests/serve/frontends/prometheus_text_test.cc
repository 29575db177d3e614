#include "serve/frontends/prometheus_text.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace shoal::serve {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

VersionMetrics Sample() {
  VersionMetrics v;
  v.model = "mlp";
  v.version = 2;
  v.success_count = 7;
  v.failure_count = 1;
  v.inference_count = 12;
  v.execution_count = 5;
  v.queue_ns = 1'500'000;      // 1.5 ms
  v.compute_ns = 2'000'000'000;  // 2 s
  v.in_flight = 3;
  v.latency_buckets.assign(kLatencyBucketBoundsUs.size() + 1, 0);
  v.latency_buckets[0] = 2;   // <= 100 us
  v.latency_buckets[3] = 5;   // <= 1 ms
  v.latency_buckets[16] = 1;  // above 10 s
  v.latency_sum_ns = 10'000'250'000;
  return v;
}

TEST(PrometheusTextTest, EveryCounterAndGaugeHasHelpTypeAndALabelledSample) {
  std::string text = FormatPrometheusText({Sample()});
  const std::string labels = "{model=\"mlp\",version=\"2\"}";
  EXPECT_THAT(text, HasSubstr("# TYPE shoal_inference_request_success_total counter\n"
                              "shoal_inference_request_success_total" + labels + " 7\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE shoal_inference_request_failure_total counter\n"
                              "shoal_inference_request_failure_total" + labels + " 1\n"));
  EXPECT_THAT(text, HasSubstr("shoal_inference_count_total" + labels + " 12\n"));
  EXPECT_THAT(text, HasSubstr("shoal_inference_exec_count_total" + labels + " 5\n"));
  EXPECT_THAT(text, HasSubstr("shoal_inference_queue_seconds_total" + labels + " 0.001500000\n"));
  EXPECT_THAT(text,
              HasSubstr("shoal_inference_compute_seconds_total" + labels + " 2.000000000\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE shoal_inference_requests_in_flight gauge\n"
                              "shoal_inference_requests_in_flight" + labels + " 3\n"));
  EXPECT_THAT(text, HasSubstr("# HELP shoal_inference_request_success_total "));
}

TEST(PrometheusTextTest, TheHistogramIsCumulativeWithSumAndCount) {
  std::string text = FormatPrometheusText({Sample()});
  const std::string b = "shoal_inference_request_duration_seconds_bucket{model=\"mlp\",version=\"2\",le=";
  EXPECT_THAT(text, HasSubstr("# TYPE shoal_inference_request_duration_seconds histogram\n"));
  EXPECT_THAT(text, HasSubstr(b + "\"0.0001\"} 2\n" + b + "\"0.00025\"} 2\n" + b +
                              "\"0.0005\"} 2\n" + b + "\"0.001\"} 7\n" + b + "\"0.0025\"} 7\n"));
  EXPECT_THAT(text, HasSubstr(b + "\"10\"} 7\n" + b + "\"+Inf\"} 8\n"));
  EXPECT_THAT(text, HasSubstr("shoal_inference_request_duration_seconds_sum{model=\"mlp\","
                              "version=\"2\"} 10.000250000\n"
                              "shoal_inference_request_duration_seconds_count{model=\"mlp\","
                              "version=\"2\"} 8\n"));
}

TEST(PrometheusTextTest, EachFamilyIsDeclaredOnceWithOneSamplePerVersion) {
  VersionMetrics other = Sample();
  other.model = "identity";
  other.version = 1;
  other.success_count = 4;
  std::string text = FormatPrometheusText({Sample(), other});
  EXPECT_THAT(text, HasSubstr("# TYPE shoal_inference_request_success_total counter\n"
                              "shoal_inference_request_success_total{model=\"mlp\",version=\"2\"} 7\n"
                              "shoal_inference_request_success_total{model=\"identity\",version=\"1\"} 4\n"));
  size_t first = text.find("# TYPE shoal_inference_count_total");
  EXPECT_EQ(text.find("# TYPE shoal_inference_count_total", first + 1), std::string::npos);
}

TEST(PrometheusTextTest, WithoutVersionsOnlyTheFamiliesAreListed) {
  std::string text = FormatPrometheusText({});
  EXPECT_THAT(text, HasSubstr("# TYPE shoal_inference_request_success_total counter\n"));
  EXPECT_THAT(text, Not(HasSubstr("{")));
  EXPECT_EQ(text.back(), '\n');
}

TEST(PrometheusTextTest, LabelValuesAreEscaped) {
  EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  VersionMetrics v = Sample();
  v.model = "we\"ird";
  EXPECT_THAT(FormatPrometheusText({v}), HasSubstr("{model=\"we\\\"ird\",version=\"2\"}"));
}

}  // namespace
}  // namespace shoal::serve
