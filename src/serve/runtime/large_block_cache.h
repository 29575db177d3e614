#pragma once
// Standard C++ only: compiled into shoal_serve (its tests) and into the TorchScript module,
// whose CPU allocator it backs (torch_backend.cc).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

namespace shoal::serve {

// Keeps the large blocks a model's batches allocate and free, for the next batch.
//
// `shoal serve` pins glibc's mmap threshold at 256 KiB (serve_command.cc: gRPC's large
// buffers must go back to the system), so without this every tensor of 256 KiB or more is a
// fresh mmap whose pages fault in on first touch and an munmap when freed: an LSTM batch of 68
// rows allocates several such tensors per time step, and the page faults, zeroing and unmaps
// took a quarter of the server's CPU per request. Batches of one model repeat the same sizes,
// so a block freed is almost always the one the next batch asks for. Thread-safe.
class LargeBlockCache {
 public:
  struct Limits {
    size_t min_block = 256 << 10;   // smaller blocks: glibc's arenas already reuse them
    size_t max_block = 32 << 20;    // larger ones are rare and too big to hold on to
    size_t max_cached = 128 << 20;  // free blocks kept, in all
  };

  LargeBlockCache() : LargeBlockCache(Limits{}) {}
  explicit LargeBlockCache(Limits limits) : limits_(limits) {}
  ~LargeBlockCache();
  LargeBlockCache(const LargeBlockCache&) = delete;
  LargeBlockCache& operator=(const LargeBlockCache&) = delete;

  // `bytes` of memory aligned to 64 bytes, or nullptr when the system has none (or bytes is 0).
  void* Allocate(size_t bytes);
  // Gives back a block Allocate returned; nullptr is ignored.
  void Free(void* block);
  // Frees every cached block when nothing was allocated from the cache since the last call:
  // a server that went idle returns the memory. Returns the bytes freed.
  size_t TrimIfIdle();

  size_t cached_bytes() const;
  uint64_t hits() const { return hits_.load(std::memory_order_relaxed); }

 private:
  const Limits limits_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;  // usable size -> block
  size_t cached_bytes_ = 0;
  std::atomic<uint64_t> hits_{0};
  std::atomic<uint64_t> large_allocations_{0};
  uint64_t large_allocations_at_trim_ = 0;
};

}  // namespace shoal::serve
