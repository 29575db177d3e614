#include "agent/log_batcher.h"

#include <utility>

namespace shoal::agent {

LogBatcher::LogBatcher(std::chrono::milliseconds window, size_t max_pending_bytes, Sink sink,
                       BatchEnd batch_end)
    : window_(window),
      max_pending_bytes_(max_pending_bytes),
      sink_(std::move(sink)),
      batch_end_(std::move(batch_end)) {
  if (window_.count() > 0) thread_ = std::thread([this] { Loop(); });
}

LogBatcher::~LogBatcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  Flush();
}

void LogBatcher::Add(const std::string& key, OutputStream stream, std::string_view data) {
  if (data.empty()) return;
  if (window_.count() <= 0) {
    std::lock_guard<std::mutex> send(send_mu_);
    sink_(key, stream, std::string(data));
    if (batch_end_) batch_end_();
    return;
  }
  bool over = false;
  bool opens_window = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    opens_window = pending_.empty();
    if (opens_window) first_pending_at_ = std::chrono::steady_clock::now();
    Pending* entry = nullptr;
    for (auto& p : pending_) {
      if (p.stream == stream && p.key == key) {
        entry = &p;
        break;
      }
    }
    if (entry == nullptr) entry = &pending_.emplace_back(Pending{key, stream, {}});
    entry->data.append(data);
    pending_bytes_ += data.size();
    over = pending_bytes_ >= max_pending_bytes_;
  }
  if (over) {
    Flush();
  } else if (opens_window) {
    cv_.notify_one();  // the thread sleeps until a window opens; later lines need not wake it
  }
}

void LogBatcher::Flush() {
  std::lock_guard<std::mutex> send(send_mu_);
  std::vector<Pending> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(pending_);
    pending_bytes_ = 0;
  }
  if (batch.empty()) return;
  for (auto& p : batch) sink_(p.key, p.stream, std::move(p.data));
  if (batch_end_) batch_end_();
}

void LogBatcher::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
    if (stopping_) break;
    // A flush in another thread may empty pending_ and a later Add restart the window: wait
    // for the window of whatever is held when the wait ends.
    auto due = first_pending_at_ + window_;
    if (cv_.wait_until(lock, due, [&] { return stopping_ || pending_.empty(); })) continue;
    if (std::chrono::steady_clock::now() < first_pending_at_ + window_) continue;
    lock.unlock();
    Flush();
    lock.lock();
  }
}

}  // namespace shoal::agent
