#include "common/event_loop.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <vector>

namespace shoal {
namespace {

TEST(EventLoopTest, RunsPostedWorkInOrderOnOneThread) {
  EventLoop loop;
  std::vector<int> seen;
  std::promise<void> done;
  loop.Start();
  for (int i = 0; i < 100; ++i) loop.Post([&seen, i] { seen.push_back(i); });
  loop.Post([&] { done.set_value(); });
  done.get_future().wait();
  loop.Stop();
  ASSERT_EQ(seen.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(seen[i], i);
}

TEST(EventLoopTest, CancelledTimerNeverRuns) {
  EventLoop loop;
  std::atomic<bool> fired{false};
  std::promise<void> done;
  loop.Start();
  uint64_t id = loop.PostAfter(std::chrono::milliseconds(20), [&] { fired = true; });
  loop.CancelTimer(id);
  loop.PostAfter(std::chrono::milliseconds(40), [&] { done.set_value(); });
  done.get_future().wait();
  loop.Stop();
  EXPECT_FALSE(fired);
}

TEST(EventLoopTest, AfterBatchHookRunsAfterWork) {
  EventLoop loop;
  std::atomic<int> work{0}, hooks_after_work{0};
  std::promise<void> done;
  loop.Start([&] {
    if (work.load() > 0) ++hooks_after_work;
  });
  loop.Post([&] { ++work; });
  loop.PostAfter(std::chrono::milliseconds(5), [&] { done.set_value(); });
  done.get_future().wait();
  loop.Stop();
  EXPECT_GE(hooks_after_work.load(), 1);
}

}  // namespace
}  // namespace shoal
