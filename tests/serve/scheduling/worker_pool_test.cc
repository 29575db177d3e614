#include "serve/scheduling/worker_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

namespace shoal::serve {
namespace {

TEST(WorkerPoolTest, OneThreadRunsTasksInTheOrderPosted) {
  std::vector<int> order;
  {
    WorkerPool pool(1);
    for (int i = 0; i < 100; ++i) pool.Post([&order, i] { order.push_back(i); });
  }  // the destructor runs what is queued
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

TEST(WorkerPoolTest, TasksBeyondTheThreadsWaitInsteadOfBeingDropped) {
  WorkerPool pool(2);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> started{0}, finished{0};
  for (int i = 0; i < 6; ++i) {
    pool.Post([&, released] {
      started += 1;
      released.wait();
      finished += 1;
    });
  }
  // Two threads: two tasks block, the other four wait in the queue.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (started < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  EXPECT_EQ(started.load(), 2);
  release.set_value();
  pool.Stop();
  EXPECT_EQ(started.load(), 6);
  EXPECT_EQ(finished.load(), 6);
}

TEST(WorkerPoolTest, StopIsIdempotent) {
  WorkerPool pool(3);
  std::atomic<int> ran{0};
  pool.Post([&] { ran += 1; });
  pool.Stop();
  pool.Stop();
  EXPECT_EQ(ran.load(), 1);
}

}  // namespace
}  // namespace shoal::serve
