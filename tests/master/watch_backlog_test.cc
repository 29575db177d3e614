#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "master/watch_queue.h"

namespace shoal::master {
namespace {

std::vector<std::string> Drain(WatchQueue& queue) {
  std::vector<std::string> events;
  std::string event;
  bool more = false;
  while (queue.TryPop(&event, &more) == WatchQueue::Next::kEvent) events.push_back(event);
  return events;
}

TEST(WatchBacklogTest, ALateWatcherGetsWhatEarlierOnesWereSentInOrder) {
  WatchBacklog backlog(1 << 20);
  backlog.Add("log: first", true);
  backlog.Add("notice: TensorBoard at http://127.0.0.1:1/", false);
  backlog.Add("log: second", true);

  WatchQueue with_logs(true, nullptr);
  backlog.ReplayTo(with_logs, "notice: omitted");
  EXPECT_EQ(Drain(with_logs),
            (std::vector<std::string>{"log: first", "notice: TensorBoard at http://127.0.0.1:1/",
                                      "log: second"}));

  // A watcher of status alone still learns of notices, and of no output.
  WatchQueue status_only(false, nullptr);
  backlog.ReplayTo(status_only, "notice: omitted");
  EXPECT_EQ(Drain(status_only),
            (std::vector<std::string>{"notice: TensorBoard at http://127.0.0.1:1/"}));
  EXPECT_EQ(backlog.omitted_output_bytes(), 0u);
}

TEST(WatchBacklogTest, PastItsBoundTheOldestOutputGoesAndIsSaidToBeOmitted) {
  WatchBacklog backlog(10);
  backlog.Add("aaaa", true);
  backlog.Add("notice", false);  // never dropped, nor counted against the bound
  backlog.Add("bbbb", true);
  backlog.Add("cccc", true);  // 12 bytes of output: "aaaa" goes
  EXPECT_EQ(backlog.omitted_output_bytes(), 4u);

  WatchQueue with_logs(true, nullptr);
  backlog.ReplayTo(with_logs, "omitted");
  EXPECT_EQ(Drain(with_logs), (std::vector<std::string>{"omitted", "notice", "bbbb", "cccc"}));

  // One chunk larger than the bound is not kept at all; what was there before it goes too.
  backlog.Add("0123456789ab", true);
  WatchQueue again(true, nullptr);
  backlog.ReplayTo(again, "omitted");
  EXPECT_EQ(Drain(again), (std::vector<std::string>{"omitted", "notice"}));
  EXPECT_EQ(backlog.omitted_output_bytes(), 4u + 8u + 12u);
}

}  // namespace
}  // namespace shoal::master
