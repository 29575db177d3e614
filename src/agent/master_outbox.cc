#include "agent/master_outbox.h"

#include <algorithm>
#include <utility>

namespace shoal::agent {
namespace {

// A relayed SDK call the master answers: request id 0 wants no answer (an older agent's reports).
uint64_t AnsweredRequestId(const v1::AgentMessage& message) {
  return message.kind_case() == v1::AgentMessage::kSdk ? message.sdk().request_id() : 0;
}

}  // namespace

void MasterOutbox::Keep(const v1::LogChunk& chunk) {
  if (chunk.data().empty()) return;
  StreamKey key{chunk.task().role(), chunk.task().index(), chunk.task().attempt(),
                static_cast<int>(chunk.stream())};
  kept_[key].push_back({next_seq_++, chunk});
  kept_log_bytes_ += chunk.data().size();
  while (kept_log_bytes_ > kMaxKeptLogBytes) {
    // The oldest chunk goes: a master away this long has lost the start of the output anyway.
    auto oldest = std::min_element(kept_.begin(), kept_.end(), [](const auto& a, const auto& b) {
      return a.second.front().seq < b.second.front().seq;
    });
    kept_log_bytes_ -= oldest->second.front().chunk.data().size();
    oldest->second.pop_front();
    if (oldest->second.empty()) kept_.erase(oldest);
  }
}

void MasterOutbox::Written(const v1::AgentMessage& message) {
  if (uint64_t id = AnsweredRequestId(message); id != 0) unanswered_[id] = message;
  if (message.kind_case() == v1::AgentMessage::kLogs) {
    for (const auto& chunk : message.logs().chunks()) Keep(chunk);
  } else if (message.kind_case() == v1::AgentMessage::kLog) {
    Keep(message.log());
  }
}

void MasterOutbox::Hold(const v1::AgentMessage& message) {
  switch (message.kind_case()) {
    case v1::AgentMessage::kHeartbeat:
    case v1::AgentMessage::kResources:
      return;
    case v1::AgentMessage::kLogs:
    case v1::AgentMessage::kLog:
      Written(message);  // kept like output written and not committed: it goes out again
      return;
    default:
      break;
  }
  // A call already written once keeps its place among the unanswered ones.
  if (uint64_t id = AnsweredRequestId(message); id != 0 && unanswered_.count(id) > 0) return;
  held_.push_back(message);
}

void MasterOutbox::Answered(uint64_t request_id) { unanswered_.erase(request_id); }

void MasterOutbox::Committed(const v1::LogsCommitted& committed) {
  for (const auto& p : committed.positions()) {
    auto it = kept_.find(StreamKey{p.task().role(), p.task().index(), p.task().attempt(),
                                   static_cast<int>(p.stream())});
    if (it == kept_.end()) continue;
    auto& chunks = it->second;
    while (!chunks.empty() &&
           chunks.front().chunk.offset() + chunks.front().chunk.data().size() <= p.offset()) {
      kept_log_bytes_ -= chunks.front().chunk.data().size();
      chunks.pop_front();
    }
    if (chunks.empty()) kept_.erase(it);
  }
}

std::vector<v1::AgentMessage> MasterOutbox::TakeForNewStream() {
  std::vector<v1::AgentMessage> out;
  out.reserve(unanswered_.size() + held_.size() + 1);
  for (const auto& [id, message] : unanswered_) out.push_back(message);
  std::vector<KeptChunk> chunks;
  for (auto& [key, stream] : kept_) {
    for (auto& c : stream) chunks.push_back(std::move(c));
  }
  kept_.clear();
  kept_log_bytes_ = 0;
  std::sort(chunks.begin(), chunks.end(),
            [](const KeptChunk& a, const KeptChunk& b) { return a.seq < b.seq; });
  size_t batch_bytes = 0;
  for (auto& c : chunks) {
    if (out.empty() || out.back().kind_case() != v1::AgentMessage::kLogs ||
        batch_bytes >= kResentBatchBytes) {
      out.emplace_back().mutable_logs();
      batch_bytes = 0;
    }
    batch_bytes += c.chunk.data().size();
    *out.back().mutable_logs()->add_chunks() = std::move(c.chunk);
  }
  for (auto& message : held_) out.push_back(std::move(message));
  held_.clear();
  return out;
}

}  // namespace shoal::agent
