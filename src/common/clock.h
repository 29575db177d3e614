#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
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

  // For a thread that sleeps until a deadline on this clock (EventLoop's timers): the
  // steady_clock time at which `deadline` arrives by itself, or steady_clock::time_point::max()
  // on a clock that moves only when told; a sleeper on such a clock is woken by its advance
  // listeners instead.
  virtual std::chrono::steady_clock::time_point WakeTime(TimePoint deadline) const = 0;
  // Runs `on_advance` on the advancing thread after every move of a clock that moves only when
  // told (FakeClock::Advance), so that a sleeper looks at Now() again. Real time passes by
  // itself: SystemClock never calls it. `on_advance` must not add or remove listeners.
  // Returns an id for RemoveAdvanceListener, which returns only once no call of that listener
  // is in progress: after it, the listener's captures may go.
  virtual uint64_t AddAdvanceListener(std::function<void()> on_advance) = 0;
  virtual void RemoveAdvanceListener(uint64_t id) = 0;
};

class SystemClock final : public Clock {
 public:
  TimePoint Now() const override;
  int64_t UnixMillis() const override;
  int64_t UnixMicros() const override;
  std::chrono::steady_clock::time_point WakeTime(TimePoint deadline) const override {
    return deadline;
  }
  uint64_t AddAdvanceListener(std::function<void()>) override { return 0; }
  void RemoveAdvanceListener(uint64_t) override {}
  static SystemClock* Get();
};

// A clock that moves only when told to. Thread-safe. An EventLoop on it runs a timer once
// Advance has moved the clock to the timer's deadline, never by itself.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t unix_millis_at_start = 1'700'000'000'000)
      : start_unix_ms_(unix_millis_at_start) {}
  TimePoint Now() const override;
  int64_t UnixMillis() const override;
  int64_t UnixMicros() const override;
  std::chrono::steady_clock::time_point WakeTime(TimePoint) const override {
    return std::chrono::steady_clock::time_point::max();
  }
  uint64_t AddAdvanceListener(std::function<void()> on_advance) override;
  void RemoveAdvanceListener(uint64_t id) override;
  // Moves the time on by `d`, then runs every advance listener (each EventLoop on this clock
  // wakes up and runs the timers now due, on its own thread).
  void Advance(Duration d);

 private:
  mutable std::mutex mu_;
  Duration elapsed_{0};
  int64_t start_unix_ms_;
  // Held while the listeners run (so that removing one waits for its call), never together
  // with mu_: a listener takes its sleeper's lock, under which the sleeper reads Now().
  std::mutex listeners_mu_;
  std::map<uint64_t, std::function<void()>> listeners_;
  uint64_t next_listener_id_ = 1;
};

}  // namespace shoal
