#pragma once

// The writer's side of the task's progress board (docs/sdk-protocol.md).

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace shoal::sdk {

namespace internal {

// The task's progress board (SHOAL_PROGRESS_FILE, docs/sdk-protocol.md): a step is a few
// stores into shared memory that the agent reads when it needs to, so reporting every step
// sends nothing and wakes no one. Mapped once per process; a forked child shares the mapping,
// which is the same task's.
class ProgressBoard {
 public:
  static ProgressBoard& Get() {
    static ProgressBoard* board = new ProgressBoard();  // never destroyed
    return *board;
  }
  // False when there is no board (not run by Shoal, or an agent without one).
  bool Write(uint64_t step) {
    if (words_ == nullptr) return false;
    // words_[1]: sequence, odd while a write is under way; [2]: step; [3]: report time. The
    // agent is another process: GCC/Clang atomics, since this header builds as C++17 too.
    uint64_t odd = __atomic_load_n(&words_[1], __ATOMIC_RELAXED) | 1;
    __atomic_store_n(&words_[1], odd, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    timespec now{};
    ::clock_gettime(CLOCK_MONOTONIC, &now);
    __atomic_store_n(&words_[2], step, __ATOMIC_RELAXED);
    __atomic_store_n(&words_[3],
                     static_cast<uint64_t>(now.tv_sec) * 1000000000ull +
                         static_cast<uint64_t>(now.tv_nsec),
                     __ATOMIC_RELAXED);
    __atomic_store_n(&words_[1], odd + 1, __ATOMIC_RELEASE);
    return true;
  }

 private:
  ProgressBoard() {
    const char* path = std::getenv("SHOAL_PROGRESS_FILE");
    if (path == nullptr || *path == '\0') return;
    int fd = ::open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return;
    void* map = ::mmap(nullptr, 64, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) return;
    if (std::memcmp(map, "SHOALPG1", 8) != 0) {
      ::munmap(map, 64);
      return;
    }
    words_ = static_cast<uint64_t*>(map);
  }
  uint64_t* words_ = nullptr;
};

}  // namespace internal

}  // namespace shoal::sdk
