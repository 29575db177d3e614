#include "common/event_loop.h"

namespace shoal {

EventLoop::EventLoop(Clock* clock) : clock_(clock) {
  advance_listener_ = clock_->AddAdvanceListener([this] {
    // Taken and let go before the notify: the loop is then either still before its look at
    // Now() (and sees the new time) or already waiting (and gets the notify), never in between.
    { std::lock_guard<std::mutex> lock(mu_); }
    cv_.notify_one();
  });
}

EventLoop::~EventLoop() {
  Stop();
  clock_->RemoveAdvanceListener(advance_listener_);
}

void EventLoop::Start(Task after_batch) {
  after_batch_ = std::move(after_batch);
  thread_ = std::thread([this] { Run(); });
}

void EventLoop::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable() && !InLoopThread()) thread_.join();
}

void EventLoop::Post(Task task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
}

uint64_t EventLoop::PostAfter(std::chrono::nanoseconds delay, Task task) {
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = next_timer_id_++;
    timers_.emplace(clock_->Now() + delay, std::make_pair(id, std::move(task)));
  }
  cv_.notify_one();
  return id;
}

void EventLoop::CancelTimer(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = timers_.begin(); it != timers_.end(); ++it) {
    if (it->second.first == id) {
      timers_.erase(it);
      return;
    }
  }
}

void EventLoop::Run() {
  std::vector<Task> batch;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      for (;;) {
        auto now = clock_->Now();
        while (!timers_.empty() && timers_.begin()->first <= now) {
          batch.push_back(std::move(timers_.begin()->second.second));
          timers_.erase(timers_.begin());
        }
        if (!queue_.empty()) {
          for (auto& t : queue_) batch.push_back(std::move(t));
          queue_.clear();
        }
        if (!batch.empty()) break;
        if (stopping_) return;
        auto wake = timers_.empty() ? std::chrono::steady_clock::time_point::max()
                                    : clock_->WakeTime(timers_.begin()->first);
        if (wake == std::chrono::steady_clock::time_point::max()) {
          cv_.wait(lock);
        } else {
          cv_.wait_until(lock, wake);
        }
      }
    }
    for (auto& task : batch) task();
    batch.clear();
    if (after_batch_) after_batch_();
  }
}

}  // namespace shoal
