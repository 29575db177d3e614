#include "common/event_loop.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"

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

// Timers on a FakeClock. Every check that a timer has or has not run posts a task after the
// clock moved and waits for it: the loop runs the timers that were due before it.
class FakeClockLoopTest : public ::testing::Test {
 protected:
  void SetUp() override { loop_.Start(); }
  void TearDown() override { loop_.Stop(); }

  // Returns once the loop has run everything due at the clock's present time.
  void Settle() {
    std::promise<void> done;
    loop_.Post([&] { done.set_value(); });
    done.get_future().wait();
  }
  // What the loop has recorded so far, read on the loop.
  std::vector<std::string> Seen() {
    Settle();
    std::promise<std::vector<std::string>> copy;
    loop_.Post([&] { copy.set_value(seen_); });
    return copy.get_future().get();
  }
  EventLoop::Task Record(std::string what) {
    return [this, what] { seen_.push_back(what); };
  }

  FakeClock clock_;
  EventLoop loop_{&clock_};
  std::vector<std::string> seen_;  // loop only
};

TEST_F(FakeClockLoopTest, TimerRunsOnlyOnceTheClockReachesItsDeadline) {
  loop_.PostAfter(std::chrono::seconds(10), Record("timer"));
  EXPECT_TRUE(Seen().empty());
  clock_.Advance(std::chrono::seconds(9));
  EXPECT_TRUE(Seen().empty()) << "ran 1 s early";
  clock_.Advance(std::chrono::seconds(1));
  EXPECT_EQ(Seen(), std::vector<std::string>{"timer"});
}

TEST_F(FakeClockLoopTest, DueTimersRunInDeadlineOrderThenInTheOrderTheyWereSet) {
  loop_.PostAfter(std::chrono::seconds(3), Record("3s"));
  loop_.PostAfter(std::chrono::seconds(1), Record("1s first"));
  loop_.PostAfter(std::chrono::seconds(2), Record("2s"));
  loop_.PostAfter(std::chrono::seconds(1), Record("1s second"));
  loop_.PostAfter(std::chrono::seconds(4), Record("4s"));
  clock_.Advance(std::chrono::seconds(3));
  EXPECT_EQ(Seen(), (std::vector<std::string>{"1s first", "1s second", "2s", "3s"}));
}

TEST_F(FakeClockLoopTest, PostedWorkRunsWithoutTheClockMovingAndTimersWaitForIt) {
  loop_.PostAfter(std::chrono::nanoseconds(1), Record("timer in 1 ns"));
  loop_.PostAfter(std::chrono::nanoseconds(0), Record("timer due now"));
  loop_.Post(Record("posted"));
  EXPECT_EQ(Seen(), (std::vector<std::string>{"timer due now", "posted"}));
  clock_.Advance(std::chrono::nanoseconds(1));
  EXPECT_EQ(Seen(), (std::vector<std::string>{"timer due now", "posted", "timer in 1 ns"}));
}

TEST_F(FakeClockLoopTest, DelaysCountFromTheTimeTheTimerIsSet) {
  clock_.Advance(std::chrono::seconds(100));
  loop_.PostAfter(std::chrono::seconds(5), Record("timer"));
  clock_.Advance(std::chrono::seconds(4));
  EXPECT_TRUE(Seen().empty());
  clock_.Advance(std::chrono::seconds(1));
  EXPECT_EQ(Seen(), std::vector<std::string>{"timer"});
}

TEST_F(FakeClockLoopTest, CancelledTimerNeverRuns) {
  uint64_t cancelled = loop_.PostAfter(std::chrono::seconds(1), Record("cancelled"));
  loop_.PostAfter(std::chrono::seconds(2), Record("kept"));
  loop_.CancelTimer(cancelled);
  clock_.Advance(std::chrono::seconds(5));
  EXPECT_EQ(Seen(), std::vector<std::string>{"kept"});
}

// Nothing is posted after the advance: the advance alone must wake the waiting loop.
TEST_F(FakeClockLoopTest, AdvanceAloneWakesALoopWaitingForATimer) {
  auto fired = std::make_shared<std::promise<void>>();  // the timer may outlive a failed test
  loop_.PostAfter(std::chrono::seconds(30), [fired] { fired->set_value(); });
  Settle();  // the loop is now waiting for the timer
  clock_.Advance(std::chrono::seconds(30));
  EXPECT_EQ(fired->get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "the timer did not run after the clock reached it";
}

// A timer that sets the next one (as the master's heartbeat check does) runs once per advance
// that reaches it, from the time it ran.
TEST_F(FakeClockLoopTest, ATimerSetByATimerCountsFromTheTimeItRan) {
  std::function<void()> tick = [&] {
    seen_.push_back("tick");
    loop_.PostAfter(std::chrono::seconds(1), tick);
  };
  loop_.PostAfter(std::chrono::seconds(1), tick);
  clock_.Advance(std::chrono::seconds(10));
  EXPECT_EQ(Seen().size(), 1u);
  clock_.Advance(std::chrono::seconds(1));
  EXPECT_EQ(Seen().size(), 2u);
}

}  // namespace
}  // namespace shoal
