#pragma once

// The master's side of the training SDK: requests relayed by agents (checkpoint reports,
// resumption, data-shard leases) and the shard lease timer. docs/sdk-protocol.md.
// Runs on the master's loop.

#include <chrono>
#include <cstdint>
#include <functional>

#include "common/clock.h"
#include "master/journaled_state.h"

namespace shoal::v1 {
class AgentMessage;
}  // namespace shoal::v1

namespace shoal::master {

class SdkRelay {
 public:
  class Host {
   public:
    virtual ~Host() = default;
    virtual void Record(JournalRecord record) = 0;  // applied and journaled
    // Answers request `request_id` (0: no answer wanted) on the agent stream `session`.
    virtual void Reply(uint64_t session, uint64_t request_id, const nlohmann::json& reply) = 0;
    virtual uint64_t PostAfter(std::chrono::milliseconds delay, std::function<void()> task) = 0;
    // A task reported a checkpoint.
    virtual void Checkpointed() = 0;
  };

  SdkRelay(JournaledState* job, Host* host, Clock* clock) : job_(job), host_(host), clock_(clock) {}

  void OnRequest(uint64_t session, const v1::AgentMessage& message);
  // Keeps one timer at the earliest lease deadline.
  void ArmLeaseTimer();

 private:
  void JournalShardRecords(std::vector<nlohmann::json>& records);

  JournaledState* job_;
  Host* host_;
  Clock* clock_;
  bool lease_timer_armed_ = false;
};

}  // namespace shoal::master
