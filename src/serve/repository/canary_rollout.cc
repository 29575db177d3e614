#include "serve/repository/canary_rollout.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <future>
#include <limits>

#include "absl/strings/str_cat.h"
#include "serve/repository/served_version.h"
#include "serve/scheduling/completion_home.h"

namespace shoal::serve {
namespace {

constexpr double kFirstBucketNs = 10'000;  // 10 us
constexpr double kBucketGrowth = 1.25;

// "%.3g"-style numbers for the decision's reason.
std::string Num(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.3g", value);
  return text;
}

std::string Ms(uint64_t ns) { return absl::StrCat(Num(static_cast<double>(ns) / 1e6), " ms"); }

std::string Percent(double fraction) { return absl::StrCat(Num(fraction * 100), "%"); }

template <typename T>
double At(const Tensor& tensor, size_t i) {
  T value;
  std::memcpy(&value, tensor.data.data() + i * sizeof(T), sizeof(T));
  return static_cast<double>(value);
}

double Element(const Tensor& tensor, size_t i) {
  switch (tensor.datatype) {
    case DataType::kBool: return At<bool>(tensor, i);
    case DataType::kUint8: return At<uint8_t>(tensor, i);
    case DataType::kInt8: return At<int8_t>(tensor, i);
    case DataType::kInt16: return At<int16_t>(tensor, i);
    case DataType::kInt32: return At<int32_t>(tensor, i);
    case DataType::kInt64: return At<int64_t>(tensor, i);
    case DataType::kFp32: return At<float>(tensor, i);
    case DataType::kFp64: return At<double>(tensor, i);
  }
  return 0;
}

bool IsCallersMistake(const absl::Status& status) {
  return status.code() == absl::StatusCode::kInvalidArgument;
}

}  // namespace

void LatencyHistogram::Record(uint64_t ns) {
  int bucket = 0;
  if (ns > kFirstBucketNs) {
    bucket = static_cast<int>(
        std::ceil(std::log(static_cast<double>(ns) / kFirstBucketNs) / std::log(kBucketGrowth)));
    bucket = std::clamp(bucket, 0, kBuckets - 1);
  }
  buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
}

uint64_t LatencyHistogram::Count() const {
  uint64_t count = 0;
  for (const auto& bucket : buckets_) count += bucket.load(std::memory_order_relaxed);
  return count;
}

uint64_t LatencyHistogram::Quantile(double q) const {
  std::array<uint64_t, kBuckets> counts;
  uint64_t total = 0;
  for (int i = 0; i < kBuckets; ++i) {
    counts[i] = buckets_[i].load(std::memory_order_relaxed);
    total += counts[i];
  }
  if (total == 0) return 0;
  uint64_t target = static_cast<uint64_t>(std::ceil(q * static_cast<double>(total)));
  target = std::max<uint64_t>(target, 1);
  uint64_t seen = 0;
  for (int i = 0; i < kBuckets; ++i) {
    seen += counts[i];
    if (seen >= target) return static_cast<uint64_t>(kFirstBucketNs * std::pow(kBucketGrowth, i));
  }
  return static_cast<uint64_t>(kFirstBucketNs * std::pow(kBucketGrowth, kBuckets - 1));
}

std::optional<CanaryDecision> DecideCanary(const CanaryConfig& config,
                                           const CanarySnapshot& s) {
  auto roll_back = [](std::string reason) {
    return CanaryDecision{CanaryVerdict::kRollBack, std::move(reason)};
  };
  const auto budget = static_cast<uint64_t>(
      std::floor(config.max_error_rate * static_cast<double>(config.min_requests)));
  if (s.canary_errors > budget) {
    return roll_back(absl::StrCat(s.canary_errors, " of ", s.canary_requests,
                                  " canary requests failed, more than max_error_rate ",
                                  Num(config.max_error_rate), " allows over min_requests ",
                                  config.min_requests, " (", budget, ")"));
  }
  double elapsed_s = std::chrono::duration<double>(s.elapsed).count();
  if (elapsed_s < config.duration_s || s.canary_requests < config.min_requests) {
    return std::nullopt;
  }
  if (config.max_output_drift && s.drift_pairs == 0) return std::nullopt;
  double error_rate = static_cast<double>(s.canary_errors) / static_cast<double>(s.canary_requests);
  std::string errors = absl::StrCat("error rate ", Percent(error_rate), " (", s.canary_errors,
                                    " of ", s.canary_requests, ", max ",
                                    Percent(config.max_error_rate), ")");
  if (error_rate > config.max_error_rate) return roll_back(errors);
  std::string latency = absl::StrCat("p99 ", Ms(s.canary_p99_ns), " vs current ",
                                     Ms(s.current_p99_ns));
  if (config.max_p99_ratio > 0 && s.current_p99_ns > 0) {
    double ratio = static_cast<double>(s.canary_p99_ns) / static_cast<double>(s.current_p99_ns);
    latency = absl::StrCat(latency, " (x", Num(ratio), ", max x", Num(config.max_p99_ratio), ")");
    if (ratio > config.max_p99_ratio) return roll_back(latency);
  }
  std::string drift;
  if (config.max_output_drift) {
    drift = absl::StrCat(", mean output drift ", Num(s.mean_drift), " over ", s.drift_pairs,
                         " compared requests (max ", Num(*config.max_output_drift), ")");
    if (s.mean_drift > *config.max_output_drift) return roll_back(drift.substr(2));
  }
  return CanaryDecision{CanaryVerdict::kPromote,
                        absl::StrCat(s.canary_requests, " canary requests in ", Num(elapsed_s),
                                     " s: ", errors, ", ", latency, drift)};
}

bool RoutesToCanary(uint64_t n, double share) {
  return std::floor(static_cast<double>(n + 1) * share) > std::floor(static_cast<double>(n) * share);
}

double OutputDrift(const std::vector<Tensor>& canary, const std::vector<Tensor>& current) {
  double difference = 0, magnitude = 0;
  uint64_t elements = 0;
  for (const Tensor& reference : current) {
    auto it = std::find_if(canary.begin(), canary.end(),
                           [&](const Tensor& t) { return t.name == reference.name; });
    if (it == canary.end() || it->shape != reference.shape ||
        it->datatype != reference.datatype || it->data.size() != reference.data.size()) {
      return std::numeric_limits<double>::infinity();
    }
    size_t count = reference.data.size() / DataTypeSize(reference.datatype);
    for (size_t i = 0; i < count; ++i) {
      double b = Element(reference, i);
      difference += std::fabs(Element(*it, i) - b);
      magnitude += std::fabs(b);
    }
    elements += count;
  }
  if (magnitude > 0) return difference / magnitude;
  return elements == 0 ? 0 : difference / static_cast<double>(elements);
}

struct CanaryRollout::MirrorPair {
  std::mutex mu;
  int remaining = 2;
  absl::Status current_status;
  std::optional<std::vector<Tensor>> current_outputs;  // kept for the drift only
  absl::StatusOr<std::vector<Tensor>> canary_result;
  uint64_t canary_ns = 0;
};

CanaryRollout::CanaryRollout(CanaryConfig config, std::shared_ptr<ServedVersion> current,
                             std::shared_ptr<ServedVersion> canary, const Clock* clock)
    : config_(std::move(config)),
      current_(std::move(current)),
      canary_(std::move(canary)),
      clock_(clock),
      start_(clock->Now()),
      failure_budget_(static_cast<uint64_t>(
          std::floor(config_.max_error_rate * static_cast<double>(config_.min_requests)))) {}

uint64_t CanaryRollout::ElapsedNs(Clock::TimePoint start) const {
  return static_cast<uint64_t>(
      std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::nanoseconds>(
                               clock_->Now() - start).count()));
}

void CanaryRollout::RecordCurrent(const absl::Status& status, uint64_t ns) {
  if (IsCallersMistake(status)) return;
  current_requests_ += 1;
  if (!status.ok()) current_errors_ += 1;
  current_latency_.Record(ns);
}

void CanaryRollout::RecordCanary(bool failed, uint64_t ns) {
  canary_requests_ += 1;
  // Past the failure budget the decision is made: no more requests go to the canary from this
  // one on, without waiting for the rollout thread to apply it.
  if (failed && canary_errors_.fetch_add(1) + 1 > failure_budget_) Stop();
  canary_latency_.Record(ns);
}

void CanaryRollout::RecordDrift(double drift) {
  absl::MutexLock lock(&drift_mu_);
  drift_pairs_ += 1;
  drift_sum_ += drift;
}

CanarySnapshot CanaryRollout::Snapshot() const {
  CanarySnapshot s;
  s.elapsed = clock_->Now() - start_;
  s.canary_requests = canary_requests_.load();
  s.canary_errors = canary_errors_.load();
  s.current_requests = current_requests_.load();
  s.current_errors = current_errors_.load();
  s.canary_p99_ns = canary_latency_.Quantile(0.99);
  s.current_p99_ns = current_latency_.Quantile(0.99);
  s.fallbacks = fallbacks_.load();
  absl::MutexLock lock(&drift_mu_);
  s.drift_pairs = drift_pairs_;
  s.mean_drift = drift_pairs_ ? drift_sum_ / static_cast<double>(drift_pairs_) : 0;
  return s;
}

void CanaryRollout::InferAsync(InferRequest request, RoutedDone done) {
  if (stopped() || !RoutesToCanary(next_request_.fetch_add(1, std::memory_order_relaxed),
                                   config_.share)) {
    return RunOnCurrent(std::move(request), std::move(done));
  }
  if (config_.mirror) return RunMirrored(std::move(request), std::move(done));
  RunOnCanary(std::move(request), std::move(done));
}

std::pair<ServedVersion*, absl::StatusOr<std::vector<Tensor>>> CanaryRollout::Infer(
    InferRequest request) {
  using Result = std::pair<ServedVersion*, absl::StatusOr<std::vector<Tensor>>>;
  auto promise = std::make_shared<std::promise<Result>>();
  std::future<Result> future = promise->get_future();
  {
    // This thread waits below, so it cannot be where the request completes.
    CompletionHome::Suspend on_instance_thread;
    InferAsync(std::move(request),
               [promise](ServedVersion* answered, absl::StatusOr<std::vector<Tensor>> outputs) {
                 promise->set_value(Result(answered, std::move(outputs)));
               });
  }
  return future.get();
}

// In the callbacks below, `done` may let the caller release the rollout: it runs last.

void CanaryRollout::RunOnCurrent(InferRequest request, RoutedDone done) {
  routed_current_ += 1;
  Clock::TimePoint start = clock_->Now();
  current_->InferAsync(std::move(request), [this, start, done = std::move(done)](
                                               absl::StatusOr<std::vector<Tensor>> outputs) mutable {
    RecordCurrent(outputs.status(), ElapsedNs(start));
    RoutedDone finish = std::move(done);
    ServedVersion* answered = current_.get();
    finish(answered, std::move(outputs));
  });
}

void CanaryRollout::RunOnCanary(InferRequest request, RoutedDone done) {
  routed_canary_ += 1;
  // Kept for the fallback and the drift comparison: only the canary's share is copied.
  auto copy = std::make_shared<InferRequest>(request);
  Clock::TimePoint start = clock_->Now();
  canary_->InferAsync(std::move(request), [this, start, copy, done = std::move(done)](
                                              absl::StatusOr<std::vector<Tensor>> outputs) mutable {
    uint64_t canary_ns = ElapsedNs(start);
    if (outputs.ok()) {
      RecordCanary(/*failed=*/false, canary_ns);
      if (config_.max_output_drift) CompareOnCurrent(std::move(*copy), *outputs);
      RoutedDone finish = std::move(done);
      ServedVersion* answered = canary_.get();
      finish(answered, std::move(outputs));
      return;
    }
    absl::Status canary_status = outputs.status();
    Clock::TimePoint fallback_start = clock_->Now();
    current_->InferAsync(
        std::move(*copy), [this, canary_ns, canary_status, fallback_start, done = std::move(done)](
                              absl::StatusOr<std::vector<Tensor>> fallback) mutable {
          bool callers_mistake =
              IsCallersMistake(canary_status) && IsCallersMistake(fallback.status());
          if (!callers_mistake) {
            RecordCanary(/*failed=*/true, canary_ns);
            fallbacks_ += 1;
          }
          RecordCurrent(fallback.status(), ElapsedNs(fallback_start));
          RoutedDone finish = std::move(done);
          ServedVersion* answered = current_.get();
          finish(answered, std::move(fallback));
        });
  });
}

void CanaryRollout::CompareOnCurrent(InferRequest request, std::vector<Tensor> canary_outputs) {
  pending_ += 1;
  current_->InferAsync(std::move(request), [this, canary_outputs = std::move(canary_outputs)](
                                               absl::StatusOr<std::vector<Tensor>> outputs) {
    if (outputs.ok()) RecordDrift(OutputDrift(canary_outputs, *outputs));
    pending_ -= 1;  // last: the rollout may go once no copy is pending
  });
}

void CanaryRollout::RunMirrored(InferRequest request, RoutedDone done) {
  routed_canary_ += 1;
  routed_current_ += 1;
  auto pair = std::make_shared<MirrorPair>();
  pending_ += 1;  // the pair outlives the caller's `done` when the canary is slower
  InferRequest copy = request;
  Clock::TimePoint start = clock_->Now();
  canary_->InferAsync(std::move(copy), [this, pair, start](
                                           absl::StatusOr<std::vector<Tensor>> outputs) {
    {
      std::lock_guard<std::mutex> lock(pair->mu);
      pair->canary_ns = ElapsedNs(start);
      pair->canary_result = std::move(outputs);
    }
    FinishMirror(pair);
  });
  current_->InferAsync(std::move(request), [this, pair, start, done = std::move(done)](
                                               absl::StatusOr<std::vector<Tensor>> outputs) mutable {
    RecordCurrent(outputs.status(), ElapsedNs(start));
    {
      std::lock_guard<std::mutex> lock(pair->mu);
      pair->current_status = outputs.status();
      if (outputs.ok() && config_.max_output_drift) pair->current_outputs = *outputs;
    }
    RoutedDone finish = std::move(done);
    ServedVersion* answered = current_.get();
    FinishMirror(pair);  // the caller holds the rollout until `finish` has run
    finish(answered, std::move(outputs));
  });
}

void CanaryRollout::FinishMirror(const std::shared_ptr<MirrorPair>& pair) {
  {
    std::lock_guard<std::mutex> lock(pair->mu);
    if (--pair->remaining > 0) return;
  }
  const absl::StatusOr<std::vector<Tensor>>& canary = pair->canary_result;
  if (canary.ok()) {
    RecordCanary(/*failed=*/false, pair->canary_ns);
    if (config_.max_output_drift && pair->current_outputs) {
      RecordDrift(OutputDrift(*canary, *pair->current_outputs));
    }
  } else if (!(IsCallersMistake(canary.status()) && IsCallersMistake(pair->current_status))) {
    RecordCanary(/*failed=*/true, pair->canary_ns);
  }
  pending_ -= 1;  // last: the rollout may go once no copy is pending
}

}  // namespace shoal::serve
