#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "shoal/v1/shoal.pb.h"

namespace shoal::agent {

// What the agent's stream to the master still owes the master: messages that wait for a stream
// (the master is gone or not yet registered with), and the SDK calls relayed to a master that
// has not answered them.
//
// A call written to a stream is not yet a call the master handled: a master killed with
// SIGKILL loses what it had received and not handled (the bytes in its socket, the work queued
// on its loop), and the agent's write succeeded all the same. So every relayed call that carries
// a request id (lease, done, resumed; checkpointed and published too, which the master
// acknowledges although the task wants no reply) is kept until the master's reply names it, and
// written again on the next stream, to the master that replaced the dead one. A task therefore
// waits through a master's replacement instead of timing out, within the agent's grace.
//
// Not thread-safe: MasterLink calls it under its lock.
class MasterOutbox {
 public:
  // Output held while no stream takes it is dropped past this many bytes (Hold).
  static constexpr size_t kMaxHeldLogBytes = 8 << 20;

  // `message` went out on the current stream.
  void Written(const v1::AgentMessage& message);
  // `message` found no stream: kept for the next one, except heartbeats and resource samples
  // (about now: a late one is worth nothing) and output past kMaxHeldLogBytes.
  void Hold(const v1::AgentMessage& message);
  // The master's reply to relayed call `request_id` arrived: nothing more to resend for it.
  void Answered(uint64_t request_id);

  // What a new stream carries after the registration, in the order it was first sent: the
  // relayed calls written to earlier streams and not answered (in request order: they were
  // written before anything was held), then the held messages. The held ones leave the outbox;
  // report each one written with Written, and Hold again whatever a broken stream refused.
  std::vector<v1::AgentMessage> TakeForNewStream();

  size_t unanswered() const { return unanswered_.size(); }
  size_t held() const { return held_.size(); }

 private:
  // request id -> the call as relayed (written at least once, not answered).
  std::map<uint64_t, v1::AgentMessage> unanswered_;
  std::deque<v1::AgentMessage> held_;
  size_t held_log_bytes_ = 0;
};

}  // namespace shoal::agent
