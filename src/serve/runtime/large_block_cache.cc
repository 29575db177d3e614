#include "serve/runtime/large_block_cache.h"

#include <malloc.h>

#include <cstdlib>
#include <vector>

namespace shoal::serve {
namespace {

constexpr size_t kAlignment = 64;  // what libtorch's own CPU allocator aligns to (AVX-512)

void* AlignedAllocate(size_t bytes) {
  void* block = nullptr;
  if (posix_memalign(&block, kAlignment, bytes) != 0) return nullptr;
  return block;
}

}  // namespace

LargeBlockCache::~LargeBlockCache() {
  for (auto& [size, block] : free_) std::free(block);
}

void* LargeBlockCache::Allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  if (bytes < limits_.min_block || bytes > limits_.max_block) return AlignedAllocate(bytes);
  large_allocations_.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The smallest cached block that fits, unless it would waste more than a quarter.
    auto it = free_.lower_bound(bytes);
    if (it != free_.end() && it->first <= bytes + bytes / 4) {
      void* block = it->second;
      cached_bytes_ -= it->first;
      free_.erase(it);
      hits_.fetch_add(1, std::memory_order_relaxed);
      return block;
    }
  }
  return AlignedAllocate(bytes);
}

void LargeBlockCache::Free(void* block) {
  if (block == nullptr) return;
  size_t size = malloc_usable_size(block);
  if (size >= limits_.min_block && size <= limits_.max_block + limits_.max_block / 4) {
    std::lock_guard<std::mutex> lock(mu_);
    if (cached_bytes_ + size <= limits_.max_cached) {
      free_.emplace(size, block);
      cached_bytes_ += size;
      return;
    }
  }
  std::free(block);
}

size_t LargeBlockCache::TrimIfIdle() {
  std::vector<void*> freed;
  size_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t now = large_allocations_.load(std::memory_order_relaxed);
    bool idle = now == large_allocations_at_trim_;
    large_allocations_at_trim_ = now;
    if (!idle) return 0;
    for (auto& [size, block] : free_) freed.push_back(block);
    free_.clear();
    bytes = cached_bytes_;
    cached_bytes_ = 0;
  }
  for (void* block : freed) std::free(block);
  return bytes;
}

size_t LargeBlockCache::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_bytes_;
}

}  // namespace shoal::serve
