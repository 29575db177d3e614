#include "serve/runtime/large_block_cache.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

namespace shoal::serve {
namespace {

constexpr size_t kMiB = 1 << 20;

TEST(LargeBlockCacheTest, AFreedLargeBlockIsWhatTheNextSameSizedAllocationGets) {
  LargeBlockCache cache;
  void* first = cache.Allocate(3 * kMiB);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u);
  std::memset(first, 1, 3 * kMiB);
  cache.Free(first);
  EXPECT_GE(cache.cached_bytes(), 3 * kMiB);
  void* second = cache.Allocate(3 * kMiB);
  EXPECT_EQ(second, first);
  EXPECT_EQ(cache.hits(), 1u);
  EXPECT_EQ(cache.cached_bytes(), 0u);
  cache.Free(second);
}

TEST(LargeBlockCacheTest, ABlockMuchLargerThanAskedForIsNotHandedOut) {
  LargeBlockCache cache;
  void* big = cache.Allocate(8 * kMiB);
  cache.Free(big);
  void* small = cache.Allocate(1 * kMiB);  // 8 MiB would waste most of it
  EXPECT_EQ(cache.hits(), 0u);
  cache.Free(small);
}

TEST(LargeBlockCacheTest, SmallAndHugeBlocksAreNeverKept) {
  LargeBlockCache::Limits limits;
  limits.min_block = 256 << 10;
  limits.max_block = 4 * kMiB;
  LargeBlockCache cache(limits);
  cache.Free(cache.Allocate(1024));
  cache.Free(cache.Allocate(16 * kMiB));
  EXPECT_EQ(cache.cached_bytes(), 0u);
}

TEST(LargeBlockCacheTest, KeepsNoMoreThanItsLimitInAll) {
  LargeBlockCache::Limits limits;
  limits.max_cached = 5 * kMiB;
  LargeBlockCache cache(limits);
  void* blocks[4];
  for (void*& block : blocks) block = cache.Allocate(2 * kMiB);
  for (void* block : blocks) cache.Free(block);
  EXPECT_LE(cache.cached_bytes(), 5 * kMiB);
  EXPECT_GE(cache.cached_bytes(), 4 * kMiB);  // two of them
}

TEST(LargeBlockCacheTest, AnIdlePeriodGivesTheCachedBlocksBack) {
  LargeBlockCache cache;
  cache.Free(cache.Allocate(2 * kMiB));
  // Allocations since the last trim: busy, nothing is freed.
  EXPECT_EQ(cache.TrimIfIdle(), 0u);
  EXPECT_GT(cache.cached_bytes(), 0u);
  // Nothing allocated since: idle.
  EXPECT_GE(cache.TrimIfIdle(), 2 * kMiB);
  EXPECT_EQ(cache.cached_bytes(), 0u);
}

}  // namespace
}  // namespace shoal::serve
