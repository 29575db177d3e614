#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shoal::backends {

// What one job holds on this machine.
struct Reservation {
  std::string job_id;
  // The job's master and its agent: a reservation is held while either lives (a master that
  // died leaves its agent and tasks running until a new master takes over).
  int owner_pid = 0;
  int agent_pid = 0;
  double cpus = 0;
  uint64_t memory_bytes = 0;
  std::vector<uint32_t> cores;
  std::vector<std::string> gpus;
};

// The machine-wide record of what running jobs hold, shared by every master on this machine
// through files under `dir` and an flock, so two jobs never take the same cores, GPUs or more
// memory than there is.
class ResourceLedger {
 public:
  explicit ResourceLedger(std::string dir) : dir_(std::move(dir)) {}

  // Under the ledger lock: calls `decide` with the live reservations of other jobs; if it
  // returns a reservation, records it. Returns what `decide` returned.
  absl::StatusOr<Reservation> ReserveIf(
      const std::function<absl::StatusOr<Reservation>(const std::vector<Reservation>&)>& decide);
  absl::Status Remove(const std::string& job_id);
  // Records `reservation` as it is, whatever others hold (the job's own hold, taken over or
  // updated).
  absl::Status Put(const Reservation& reservation);

 private:
  std::vector<Reservation> ReadLive();
  std::string dir_;
};

}  // namespace shoal::backends
