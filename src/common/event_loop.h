#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "common/clock.h"

namespace shoal {

// One thread that owns a daemon's state. Other threads (gRPC handlers, readers) Post work onto
// it instead of sharing the state under locks. Timers run on the injected clock: the real one in
// production; with a FakeClock a timer runs once FakeClock::Advance reaches its deadline, so
// tests move time instead of sleeping. After every batch of work the `after_batch` hook runs on
// the loop (the master uses it for journal group commit).
//
// Each batch takes the timers due at the time it is gathered, in deadline order (timers with
// the same deadline in the order they were set), then the posted work in posting order. So
// once Advance has returned, a task posted afterwards runs after every timer that advance made
// due: a test can Post a task and wait for it to know those timers have run.
class EventLoop {
 public:
  using Task = std::function<void()>;
  // `clock` must outlive the loop.
  explicit EventLoop(Clock* clock = SystemClock::Get());
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  void Start(Task after_batch = nullptr);
  // Runs remaining posted work, then joins. Safe to call twice.
  void Stop();

  void Post(Task task);
  // Runs `task` on the loop once the loop's clock has reached `delay` from now. Returns an id
  // for CancelTimer.
  uint64_t PostAfter(std::chrono::nanoseconds delay, Task task);
  void CancelTimer(uint64_t id);

  bool InLoopThread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  void Run();
  Clock* const clock_;
  uint64_t advance_listener_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Task> queue_;
  std::multimap<Clock::TimePoint, std::pair<uint64_t, Task>> timers_;
  uint64_t next_timer_id_ = 1;
  bool stopping_ = false;
  Task after_batch_;
  std::thread thread_;
};

}  // namespace shoal
