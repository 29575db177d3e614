#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>

namespace shoal {

// Time as the code under test sees it. Production uses SystemClock; tests use FakeClock.
class Clock {
 public:
  using Duration = std::chrono::nanoseconds;
  using TimePoint = std::chrono::time_point<std::chrono::steady_clock, Duration>;
  virtual ~Clock() = default;
  // Monotonic time, for deadlines and intervals.
  virtual TimePoint Now() const = 0;
  // Wall-clock milliseconds since the epoch, for records people read.
  virtual int64_t UnixMillis() const = 0;
  // The same in microseconds, for latencies measured across processes (the journal's ts_us).
  virtual int64_t UnixMicros() const = 0;
};

class SystemClock final : public Clock {
 public:
  TimePoint Now() const override;
  int64_t UnixMillis() const override;
  int64_t UnixMicros() const override;
  static SystemClock* Get();
};

// A clock that moves only when told to. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t unix_millis_at_start = 1'700'000'000'000)
      : start_unix_ms_(unix_millis_at_start) {}
  TimePoint Now() const override;
  int64_t UnixMillis() const override;
  int64_t UnixMicros() const override;
  void Advance(Duration d);

 private:
  mutable std::mutex mu_;
  Duration elapsed_{0};
  int64_t start_unix_ms_;
};

}  // namespace shoal
