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
// it instead of sharing the state under locks. Timers use the steady clock. After every batch
// of work the `after_batch` hook runs on the loop (the master uses it for journal group commit).
class EventLoop {
 public:
  using Task = std::function<void()>;
  EventLoop() = default;
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  void Start(Task after_batch = nullptr);
  // Runs remaining posted work, then joins. Safe to call twice.
  void Stop();

  void Post(Task task);
  // Runs `task` on the loop no earlier than `delay` from now. Returns an id for CancelTimer.
  uint64_t PostAfter(std::chrono::nanoseconds delay, Task task);
  void CancelTimer(uint64_t id);

  bool InLoopThread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  void Run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Task> queue_;
  std::multimap<std::chrono::steady_clock::time_point, std::pair<uint64_t, Task>> timers_;
  uint64_t next_timer_id_ = 1;
  bool stopping_ = false;
  Task after_batch_;
  std::thread thread_;
};

}  // namespace shoal
