#include "backends/local/resource_ledger.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "process/process.h"
#include "nlohmann/json.hpp"

namespace shoal::backends {
namespace {


class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ >= 0) ::flock(fd_, LOCK_EX);
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);  // closing drops the flock
  }
  bool ok() const { return fd_ >= 0; }

 private:
  int fd_;
};

nlohmann::json ToJson(const Reservation& r) {
  return {{"job_id", r.job_id}, {"owner_pid", r.owner_pid}, {"agent_pid", r.agent_pid},
          {"cpus", r.cpus},
          {"memory_bytes", r.memory_bytes}, {"cores", r.cores}, {"gpus", r.gpus}};
}

}  // namespace

std::vector<Reservation> ResourceLedger::ReadLive() {
  std::vector<Reservation> live;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    if (entry.path().extension() != ".json") continue;
    auto text = ReadFile(entry.path().string());
    if (!text.ok()) continue;
    auto j = nlohmann::json::parse(*text, nullptr, false);
    if (j.is_discarded()) continue;
    Reservation r;
    r.job_id = j.value("job_id", "");
    r.owner_pid = j.value("owner_pid", 0);
    r.agent_pid = j.value("agent_pid", 0);
    r.cpus = j.value("cpus", 0.0);
    r.memory_bytes = j.value("memory_bytes", uint64_t{0});
    r.cores = j.value("cores", std::vector<uint32_t>{});
    r.gpus = j.value("gpus", std::vector<std::string>{});
    if (!ProcessRunning(r.owner_pid) && (r.agent_pid <= 0 || !ProcessRunning(r.agent_pid))) {
      std::filesystem::remove(entry.path(), ec);  // its master is gone: the hold is stale
      continue;
    }
    live.push_back(std::move(r));
  }
  return live;
}

absl::StatusOr<Reservation> ResourceLedger::ReserveIf(
    const std::function<absl::StatusOr<Reservation>(const std::vector<Reservation>&)>& decide) {
  if (auto st = MakeDirs(dir_); !st.ok()) return st;
  FileLock lock(dir_ + "/lock");
  if (!lock.ok()) return ErrnoStatus(absl::StrCat("lock ", dir_, "/lock"), errno);
  auto decision = decide(ReadLive());
  if (!decision.ok()) return decision;
  // Like Put: a hold lives only as long as its processes, so no fsync.
  if (auto st = ReplaceFile(absl::StrCat(dir_, "/", decision->job_id, ".json"),
                            ToJson(*decision).dump());
      !st.ok()) {
    return st;
  }
  return decision;
}

absl::Status ResourceLedger::Put(const Reservation& reservation) {
  if (auto st = MakeDirs(dir_); !st.ok()) return st;
  FileLock lock(dir_ + "/lock");
  if (!lock.ok()) return ErrnoStatus(absl::StrCat("lock ", dir_, "/lock"), errno);
  // Holds live only as long as their processes: a machine crash loses nothing worth keeping.
  return ReplaceFile(absl::StrCat(dir_, "/", reservation.job_id, ".json"),
                     ToJson(reservation).dump());
}

absl::Status ResourceLedger::Remove(const std::string& job_id) {
  FileLock lock(dir_ + "/lock");
  std::error_code ec;
  std::filesystem::remove(absl::StrCat(dir_, "/", job_id, ".json"), ec);
  return absl::OkStatus();
}


}  // namespace shoal::backends
