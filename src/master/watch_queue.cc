#include "master/watch_queue.h"

namespace shoal::master {

void WatchQueue::Push(std::string event, bool is_log) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || (is_log && events_.size() >= kMaxQueued)) return;
    events_.push_back(std::move(event));
  }
  cv_.notify_one();
}

void WatchQueue::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

bool WatchQueue::Pop(std::vector<std::string>* out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !events_.empty() || closed_; });
  while (!events_.empty()) {
    out->push_back(std::move(events_.front()));
    events_.pop_front();
  }
  return !(closed_ && out->empty());
}

}  // namespace shoal::master
