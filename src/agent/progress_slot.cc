#include "agent/progress_slot.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/unique_fd.h"

namespace shoal::agent {
namespace {

constexpr size_t kSequenceOffset = 8;
constexpr size_t kStepOffset = 16;
constexpr size_t kTimeOffset = 24;

uint64_t LoadAcquire(const void* base, size_t offset) {
  // The writer is another process: the word is read through an atomic view of shared memory.
  auto* word = reinterpret_cast<uint64_t*>(static_cast<char*>(const_cast<void*>(base)) + offset);
  return std::atomic_ref<uint64_t>(*word).load(std::memory_order_acquire);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ProgressSlot>> ProgressSlot::Create(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) {
    return absl::UnavailableError(
        absl::StrCat("cannot create the progress file ", path, ": ", std::strerror(errno)));
  }
  void* map = MAP_FAILED;
  if (::ftruncate(fd.get(), kSize) == 0 && ::pwrite(fd.get(), kMagic, 8, 0) == 8) {
    map = ::mmap(nullptr, kSize, PROT_READ, MAP_SHARED, fd.get(), 0);
  }
  if (map == MAP_FAILED) {
    int error = errno;
    ::unlink(path.c_str());  // a failed board leaves nothing behind
    return absl::UnavailableError(
        absl::StrCat("cannot set up the progress file ", path, ": ", std::strerror(error)));
  }
  return std::unique_ptr<ProgressSlot>(new ProgressSlot(path, map));
}

ProgressSlot::~ProgressSlot() {
  ::munmap(map_, kSize);
  ::unlink(path_.c_str());
}

std::optional<ProgressSlot::Report> ProgressSlot::Read() const {
  for (int attempt = 0; attempt < 8; ++attempt) {
    uint64_t before = LoadAcquire(map_, kSequenceOffset);
    if (before == 0) return std::nullopt;  // nothing reported yet
    if (before % 2 != 0) continue;         // a write is under way
    Report report;
    report.step = LoadAcquire(map_, kStepOffset);
    report.monotonic_ns = static_cast<int64_t>(LoadAcquire(map_, kTimeOffset));
    if (LoadAcquire(map_, kSequenceOffset) == before) return report;
  }
  return std::nullopt;
}

}  // namespace shoal::agent
