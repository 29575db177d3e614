#pragma once

// Reports to the node's agent: progress and checkpoints (fire-and-forget), and the resume
// that the master waits for after a group restart. No-ops when SHOAL_AGENT_SOCKET is unset
// (not started by Shoal).

#include <cstdint>

#include "shoal/agent_client.h"
#include "shoal/progress_board.h"

namespace shoal::sdk {

// Reports that training step `step` completed (fire-and-forget). Under a Shoal agent with a
// progress board this is a few stores to shared memory; otherwise one send on the process's
// cached connection. Arms the role's hang watchdog and extends this task's shard leases.
inline void ReportProgress(uint64_t step) {
  if (internal::ProgressBoard::Get().Write(step)) return;
  internal::AgentClient::Get().Report("progress", step);
}

// Reports that the checkpoint of `step` is durable (fire-and-forget). Call after SaveCheckpoint.
inline void ReportCheckpointed(uint64_t step) {
  internal::AgentClient::Get().Report("checkpointed", step);
}

// Reports that the task resumed from the checkpoint of `step` (0: none) and waits up to
// kReplyTimeoutMs for the agent's answer. Ok without an agent (not started by Shoal).
inline ReportResult ReportResumed(uint64_t step) {
  return internal::AgentClient::Get().Request("resumed", step);
}

}  // namespace shoal::sdk
