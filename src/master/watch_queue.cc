#include "master/watch_queue.h"

namespace shoal::master {

void WatchQueue::Push(std::string event, bool is_log) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || (is_log && events_.size() >= kMaxQueued)) return;
    events_.push_back(std::move(event));
  }
  if (on_ready_) on_ready_();
}

void WatchQueue::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  if (on_ready_) on_ready_();
}

WatchQueue::Next WatchQueue::TryPop(std::string* out, bool* more) {
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.empty()) return closed_ ? Next::kEnded : Next::kEmpty;
  *out = std::move(events_.front());
  events_.pop_front();
  *more = !events_.empty();
  return Next::kEvent;
}

}  // namespace shoal::master
