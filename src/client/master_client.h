#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace shoal::client {

// A client's connection to one job's master. Keeps gRPC's headers out of the commands.
class MasterClient {
 public:
  // Reads the address from master.json and the token from the job directory.
  static absl::StatusOr<std::unique_ptr<MasterClient>> Connect(const std::string& job_dir);
  virtual ~MasterClient() = default;

  // The job's status in the JSON form of status.json.
  virtual absl::StatusOr<nlohmann::json> GetStatus(std::chrono::milliseconds timeout) = 0;
  virtual absl::Status Kill(const std::string& reason) = 0;
  // Streams status changes and (when `logs`) prefixed output lines from byte `log_offset` of
  // the job's logs.txt on, until the job has ended (OK), the master went away (Unavailable) or
  // Cancel was called (Cancelled). `on_log` gets each chunk's offset in logs.txt. The master
  // sends output only as fast as the callbacks return: a slow reader slows the stream, and
  // nothing is dropped.
  virtual absl::Status Watch(bool logs, uint64_t log_offset,
                             const std::function<void(const nlohmann::json&)>& on_status,
                             const std::function<void(uint64_t, const std::string&)>& on_log,
                             const std::function<void(const std::string&)>& on_notice) = 0;
  // Thread-safe: ends a Watch in progress.
  virtual void Cancel() = 0;
};

}  // namespace shoal::client
