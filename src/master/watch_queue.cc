#include "master/watch_queue.h"

#include <algorithm>

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

void WatchBacklog::Add(const std::string& event, bool is_log) {
  entries_.push_back({event, is_log});
  if (!is_log) return;
  output_bytes_ += event.size();
  while (output_bytes_ > max_output_bytes_) {
    // Notices are rare, so the oldest output chunk is near the front.
    auto oldest = std::find_if(entries_.begin(), entries_.end(),
                               [](const Entry& e) { return e.is_log; });
    output_bytes_ -= oldest->event.size();
    omitted_output_bytes_ += oldest->event.size();
    entries_.erase(oldest);
  }
}

void WatchBacklog::ReplayTo(WatchQueue& queue, const std::string& omitted_notice) const {
  if (queue.wants_logs() && omitted_output_bytes_ > 0) queue.Push(omitted_notice, false);
  for (const auto& e : entries_) {
    if (e.is_log && !queue.wants_logs()) continue;
    queue.Push(e.event, e.is_log);
  }
}

}  // namespace shoal::master
