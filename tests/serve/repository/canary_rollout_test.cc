// The canary's rules on figures (DecideCanary), its request split, its latency quantiles and
// the output drift; the rollout itself on real versions is in model_manager_test.cc.
#include "serve/repository/canary_rollout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

namespace shoal::serve {
namespace {

using ::testing::HasSubstr;

CanaryConfig Policy() {
  CanaryConfig c;
  c.share = 0.05;
  c.duration_s = 30;
  c.min_requests = 200;
  c.max_error_rate = 0.01;
  c.max_p99_ratio = 1.5;
  return c;
}

CanarySnapshot Healthy() {
  CanarySnapshot s;
  s.elapsed = std::chrono::seconds(31);
  s.canary_requests = 250;
  s.current_requests = 5000;
  s.canary_p99_ns = 2'000'000;
  s.current_p99_ns = 1'800'000;
  return s;
}

TEST(DecideCanaryTest, UndecidedUntilTheDurationAndTheMinimumRequestsAreBoth) {
  CanarySnapshot early = Healthy();
  early.elapsed = std::chrono::seconds(29);
  EXPECT_FALSE(DecideCanary(Policy(), early).has_value());
  CanarySnapshot few = Healthy();
  few.canary_requests = 199;
  EXPECT_FALSE(DecideCanary(Policy(), few).has_value());
  std::optional<CanaryDecision> decision = DecideCanary(Policy(), Healthy());
  ASSERT_TRUE(decision.has_value());
  EXPECT_EQ(decision->verdict, CanaryVerdict::kPromote);
  EXPECT_THAT(decision->reason, HasSubstr("250 canary requests in 31 s: error rate 0% (0 of 250"));
  EXPECT_THAT(decision->reason, HasSubstr("p99 2 ms vs current 1.8 ms (x1.11, max x1.5)"));
}

TEST(DecideCanaryTest, RolledBackAtOnceWhenFailuresExceedTheBudgetOfTheMinimum) {
  // 0.01 x 200 allows 2 failures; the third decides, after 3 requests and 1 second.
  CanarySnapshot s;
  s.elapsed = std::chrono::seconds(1);
  s.canary_requests = 3;
  s.canary_errors = 2;
  EXPECT_FALSE(DecideCanary(Policy(), s).has_value());
  s.canary_errors = 3;
  std::optional<CanaryDecision> decision = DecideCanary(Policy(), s);
  ASSERT_TRUE(decision.has_value());
  EXPECT_EQ(decision->verdict, CanaryVerdict::kRollBack);
  EXPECT_EQ(decision->reason,
            "3 of 3 canary requests failed, more than max_error_rate 0.01 allows over "
            "min_requests 200 (2)");
  CanaryConfig strict = Policy();
  strict.max_error_rate = 0;
  s.canary_errors = 1;
  EXPECT_EQ(DecideCanary(strict, s)->verdict, CanaryVerdict::kRollBack);
}

TEST(DecideCanaryTest, RolledBackAtTheEndForItsErrorRateLatencyOrDrift) {
  // The failure budget of the minimum also bounds the rate over it: within it, promoted.
  CanaryConfig lenient = Policy();
  lenient.min_requests = 10;
  lenient.max_error_rate = 0.25;  // 2 failures allowed
  CanarySnapshot errors = Healthy();
  errors.canary_requests = 10;
  errors.canary_errors = 2;
  EXPECT_EQ(DecideCanary(lenient, errors)->verdict, CanaryVerdict::kPromote);
  errors.canary_errors = 3;
  EXPECT_EQ(DecideCanary(lenient, errors)->verdict, CanaryVerdict::kRollBack);

  CanarySnapshot slow = Healthy();
  slow.canary_p99_ns = 3'000'000;
  slow.current_p99_ns = 1'000'000;
  std::optional<CanaryDecision> decision = DecideCanary(Policy(), slow);
  EXPECT_EQ(decision->verdict, CanaryVerdict::kRollBack);
  EXPECT_EQ(decision->reason, "p99 3 ms vs current 1 ms (x3, max x1.5)");
  CanaryConfig no_latency = Policy();
  no_latency.max_p99_ratio = 0;
  EXPECT_EQ(DecideCanary(no_latency, slow)->verdict, CanaryVerdict::kPromote);

  CanaryConfig drift = Policy();
  drift.max_output_drift = 0.05;
  CanarySnapshot drifting = Healthy();
  EXPECT_FALSE(DecideCanary(drift, drifting).has_value()) << "no pair compared yet";
  drifting.drift_pairs = 12;
  drifting.mean_drift = 0.2;
  decision = DecideCanary(drift, drifting);
  EXPECT_EQ(decision->verdict, CanaryVerdict::kRollBack);
  EXPECT_EQ(decision->reason, "mean output drift 0.2 over 12 compared requests (max 0.05)");
  drifting.mean_drift = 0.01;
  EXPECT_EQ(DecideCanary(drift, drifting)->verdict, CanaryVerdict::kPromote);
}

TEST(RoutesToCanaryTest, TheShareHoldsExactlyAndEvenly) {
  int canary = 0;
  for (uint64_t n = 0; n < 19; ++n) canary += RoutesToCanary(n, 0.05);
  EXPECT_EQ(canary, 0);
  canary = 0;
  for (uint64_t n = 0; n < 1000; ++n) canary += RoutesToCanary(n, 0.05);
  EXPECT_EQ(canary, 50);
  // Evenly: never two canary requests within 1 / share of each other.
  int last = -100;
  for (uint64_t n = 0; n < 1000; ++n) {
    if (!RoutesToCanary(n, 0.05)) continue;
    EXPECT_GE(static_cast<int>(n) - last, 20);
    last = static_cast<int>(n);
  }
  canary = 0;
  for (uint64_t n = 0; n < 100; ++n) canary += RoutesToCanary(n, 1.0);
  EXPECT_EQ(canary, 100);
  canary = 0;
  for (uint64_t n = 0; n < 3000; ++n) canary += RoutesToCanary(n, 1.0 / 3);
  EXPECT_EQ(canary, 1000);
}

TEST(LatencyHistogramTest, QuantilesAreBucketBoundsWithinAQuarter) {
  LatencyHistogram histogram;
  EXPECT_EQ(histogram.Quantile(0.99), 0u);
  for (int i = 0; i < 99; ++i) histogram.Record(1'000'000);  // 1 ms
  histogram.Record(100'000'000);                             // 100 ms
  EXPECT_EQ(histogram.Count(), 100u);
  uint64_t p99 = histogram.Quantile(0.99);
  EXPECT_GE(p99, 1'000'000u);
  EXPECT_LT(p99, 1'250'001u);
  uint64_t p100 = histogram.Quantile(1.0);
  EXPECT_GE(p100, 100'000'000u);
  EXPECT_LT(p100, 125'000'001u);
  histogram.Record(1);  // below the first bound
  EXPECT_EQ(histogram.Count(), 101u);
}

Tensor Floats(const std::string& name, std::vector<int64_t> shape, std::vector<float> values) {
  Tensor t;
  t.name = name;
  t.shape = std::move(shape);
  t.data.resize(values.size() * sizeof(float));
  std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

TEST(OutputDriftTest, RelativeL1AndInfinityForAnotherShape) {
  std::vector<Tensor> current = {Floats("y", {1, 2}, {1, 3})};
  EXPECT_DOUBLE_EQ(OutputDrift({Floats("y", {1, 2}, {1, 3})}, current), 0);
  EXPECT_DOUBLE_EQ(OutputDrift({Floats("y", {1, 2}, {2, 2})}, current), 0.5);  // (1 + 1) / 4
  EXPECT_TRUE(std::isinf(OutputDrift({Floats("y", {2, 1}, {1, 3})}, current)));
  EXPECT_TRUE(std::isinf(OutputDrift({Floats("z", {1, 2}, {1, 3})}, current)));
  EXPECT_DOUBLE_EQ(OutputDrift({Floats("y", {2}, {1, 1})}, {Floats("y", {2}, {0, 0})}), 1);
}

}  // namespace
}  // namespace shoal::serve
