#include "master/watch_queue.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/files.h"

namespace shoal::master {

absl::StatusOr<std::shared_ptr<LogFeed>> LogFeed::Open(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus("open " + path, errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus("stat " + path, errno);
  return std::shared_ptr<LogFeed>(new LogFeed(std::move(fd), static_cast<uint64_t>(st.st_size)));
}

absl::StatusOr<std::string> LogFeed::Read(uint64_t offset, uint64_t limit) const {
  if (limit <= offset) return std::string();
  size_t want = static_cast<size_t>(std::min<uint64_t>(limit - offset, kMaxRead));
  std::string data(want, '\0');
  size_t got = 0;
  while (got < want) {
    ssize_t n = ::pread(fd_.get(), data.data() + got, want - got, static_cast<off_t>(offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("read logs.txt", errno);
    if (n == 0) {
      return absl::DataLossError(
          absl::StrCat("logs.txt ends at byte ", offset + got, ", before the ", limit,
                       " bytes written to it (was it truncated?)"));
    }
    got += static_cast<size_t>(n);
  }
  if (want < limit - offset) {
    // Cut at the last whole line; the rest follows in the next read.
    size_t nl = data.rfind('\n');
    if (nl != std::string::npos) data.resize(nl + 1);
  }
  return data;
}

void WatchQueue::Push(std::string event, uint64_t log_mark, bool is_status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    if (is_status && !events_.empty() && events_.back().is_status) {
      events_.back() = {std::move(event), log_mark, true};
    } else if (!is_status && events_.size() >= kMaxQueued) {
      return;
    } else {
      events_.push_back({std::move(event), log_mark, is_status});
    }
  }
  if (on_ready_) on_ready_();
}

void WatchQueue::NewOutput() {
  if (logs_ && on_ready_) on_ready_();
}

void WatchQueue::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  if (on_ready_) on_ready_();
}

bool WatchQueue::HasMoreLocked(uint64_t committed) const {
  return !events_.empty() || (logs_ && !output_failed_ && log_offset_ < committed);
}

WatchQueue::Next WatchQueue::TryPop(std::string* out, uint64_t* offset, bool* more) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool sends_output = logs_ && !output_failed_;
  const uint64_t committed = sends_output ? logs_->committed() : 0;
  uint64_t limit = committed;
  if (!events_.empty()) {
    // Once closed, every mark is committed; a mark past the end (a flush that failed) must
    // not hold the last events back.
    const uint64_t mark = events_.front().log_mark;
    if (!sends_output || mark <= log_offset_ || (closed_ && log_offset_ >= committed)) {
      *out = std::move(events_.front().event);
      events_.pop_front();
      *more = HasMoreLocked(committed);
      return Next::kEvent;
    }
    limit = std::min(limit, mark);
  }
  if (sends_output && log_offset_ < limit) {
    auto lines = logs_->Read(log_offset_, limit);
    if (lines.ok()) {
      *offset = log_offset_;
      log_offset_ += lines->size();
      *out = std::move(*lines);
      *more = HasMoreLocked(committed);
      return Next::kOutput;
    }
    // Told once, as a notice of its own; the status and notices still reach the client.
    output_failed_ = true;
    *out = std::string(lines.status().message());
    *offset = log_offset_;
    *more = HasMoreLocked(committed);
    return Next::kOutputFailed;
  }
  if (closed_ && events_.empty() && (!sends_output || log_offset_ >= committed)) {
    return Next::kEnded;
  }
  return Next::kEmpty;
}

bool WatchQueue::Drained() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!closed_ || !events_.empty()) return false;
  return !logs_ || output_failed_ || log_offset_ >= logs_->committed();
}

void WatchBacklog::ReplayTo(WatchQueue& queue) const {
  for (const auto& [event, mark] : notices_) queue.Push(event, mark, false);
}

}  // namespace shoal::master
