#include "common/clock.h"

namespace shoal {

Clock::TimePoint SystemClock::Now() const {
  return std::chrono::time_point_cast<Duration>(std::chrono::steady_clock::now());
}

int64_t SystemClock::UnixMillis() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t SystemClock::UnixMicros() const {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

SystemClock* SystemClock::Get() {
  static SystemClock clock;
  return &clock;
}

Clock::TimePoint FakeClock::Now() const {
  std::lock_guard<std::mutex> lock(mu_);
  return TimePoint(elapsed_);
}

int64_t FakeClock::UnixMillis() const {
  std::lock_guard<std::mutex> lock(mu_);
  return start_unix_ms_ + std::chrono::duration_cast<std::chrono::milliseconds>(elapsed_).count();
}

int64_t FakeClock::UnixMicros() const {
  std::lock_guard<std::mutex> lock(mu_);
  return start_unix_ms_ * 1000 +
         std::chrono::duration_cast<std::chrono::microseconds>(elapsed_).count();
}

uint64_t FakeClock::AddAdvanceListener(std::function<void()> on_advance) {
  std::lock_guard<std::mutex> lock(listeners_mu_);
  uint64_t id = next_listener_id_++;
  listeners_.emplace(id, std::move(on_advance));
  return id;
}

void FakeClock::RemoveAdvanceListener(uint64_t id) {
  std::lock_guard<std::mutex> lock(listeners_mu_);
  listeners_.erase(id);
}

void FakeClock::Advance(Duration d) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    elapsed_ += d;
  }
  std::lock_guard<std::mutex> lock(listeners_mu_);
  for (auto& [id, on_advance] : listeners_) on_advance();
}

}  // namespace shoal
