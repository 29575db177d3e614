#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "shoal/v1/shoal.pb.h"

namespace shoal::agent {

// What the agent's stream to the master still owes the master: messages that wait for a stream
// (the master is gone or not yet registered with), the SDK calls relayed to a master that has
// not answered them, and the task output the master has not yet written to the job's files.
//
// A message written to a stream is not yet a message the master handled: a master killed with
// SIGKILL loses what it had received and not handled (the bytes in its socket, the work queued
// on its loop, the output not yet flushed to logs.txt), and the agent's write succeeded all the
// same. So every relayed call that carries a request id (lease, done, resumed; checkpointed and
// published too, which the master acknowledges although the task wants no reply) is kept until
// the master's reply names it, and every output chunk until the master says its files hold the
// chunk's stream past it (LogsCommitted). Both are written again on the next stream, to the
// master that replaced the dead one, which skips output it already has by the chunks' offsets.
// A task therefore waits through a master's replacement instead of timing out, within the
// agent's grace, and no line of its output is lost or doubled.
//
// Not thread-safe: MasterLink calls it under its lock.
class MasterOutbox {
 public:
  // Output kept past this many bytes loses its oldest chunks (the master marks the gap).
  static constexpr size_t kMaxKeptLogBytes = 8 << 20;
  // Output written again to a new stream goes in messages of about this size.
  static constexpr size_t kResentBatchBytes = 256 << 10;

  // `message` went out on the current stream.
  void Written(const v1::AgentMessage& message);
  // `message` found no stream: kept for the next one, except heartbeats and resource samples
  // (about now: a late one is worth nothing).
  void Hold(const v1::AgentMessage& message);
  // The master's reply to relayed call `request_id` arrived: nothing more to resend for it.
  void Answered(uint64_t request_id);
  // The master's files hold these streams up to these offsets: the output below them can go.
  void Committed(const v1::LogsCommitted& committed);

  // What a new stream carries after the registration, in the order it was first sent: the
  // relayed calls written to earlier streams and not answered (in request order: they were
  // written before anything was held), the output the master has not committed, then the held
  // messages. The output and held ones leave the outbox; report each one written with Written,
  // and Hold again whatever a broken stream refused.
  std::vector<v1::AgentMessage> TakeForNewStream();

  size_t unanswered() const { return unanswered_.size(); }
  size_t held() const { return held_.size(); }
  size_t kept_log_bytes() const { return kept_log_bytes_; }

 private:
  // role, index, attempt, stream
  using StreamKey = std::tuple<std::string, uint32_t, uint32_t, int>;
  struct KeptChunk {
    uint64_t seq;  // order of arrival across streams
    v1::LogChunk chunk;
  };
  void Keep(const v1::LogChunk& chunk);

  // request id -> the call as relayed (written at least once, not answered).
  std::map<uint64_t, v1::AgentMessage> unanswered_;
  std::deque<v1::AgentMessage> held_;
  std::map<StreamKey, std::deque<KeptChunk>> kept_;
  size_t kept_log_bytes_ = 0;
  uint64_t next_seq_ = 0;
};

}  // namespace shoal::agent
