#include "agent/master_outbox.h"

#include <utility>

namespace shoal::agent {
namespace {

// A relayed SDK call the master answers: request id 0 wants no answer (an older agent's reports).
uint64_t AnsweredRequestId(const v1::AgentMessage& message) {
  return message.kind_case() == v1::AgentMessage::kSdk ? message.sdk().request_id() : 0;
}

}  // namespace

void MasterOutbox::Written(const v1::AgentMessage& message) {
  if (uint64_t id = AnsweredRequestId(message); id != 0) unanswered_[id] = message;
}

void MasterOutbox::Hold(const v1::AgentMessage& message) {
  if (message.kind_case() == v1::AgentMessage::kHeartbeat ||
      message.kind_case() == v1::AgentMessage::kResources) {
    return;
  }
  // A call already written once keeps its place among the unanswered ones.
  if (uint64_t id = AnsweredRequestId(message); id != 0 && unanswered_.count(id) > 0) return;
  if (message.kind_case() == v1::AgentMessage::kLog) {
    if (held_log_bytes_ > kMaxHeldLogBytes) return;
    held_log_bytes_ += message.log().data().size();
  }
  held_.push_back(message);
}

void MasterOutbox::Answered(uint64_t request_id) { unanswered_.erase(request_id); }

std::vector<v1::AgentMessage> MasterOutbox::TakeForNewStream() {
  std::vector<v1::AgentMessage> out;
  out.reserve(unanswered_.size() + held_.size());
  for (const auto& [id, message] : unanswered_) out.push_back(message);
  for (auto& message : held_) out.push_back(std::move(message));
  held_.clear();
  held_log_bytes_ = 0;
  return out;
}

}  // namespace shoal::agent
