#include "master/watch_queue.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace shoal::master {
namespace {

// A logs.txt the test appends to, as the master does, and the feed over it.
class Feed {
 public:
  explicit Feed(const std::string& name)
      : path_((std::filesystem::path(::testing::TempDir()) / name).string()) {
    std::filesystem::remove(path_);
    std::ofstream(path_).close();
    auto feed = LogFeed::Open(path_);
    EXPECT_TRUE(feed.ok()) << feed.status();
    feed_ = *feed;
  }
  ~Feed() { std::filesystem::remove(path_); }
  // Appends and commits, as the master's flush after a batch does.
  uint64_t Append(const std::string& lines, bool commit = true) {
    std::ofstream(path_, std::ios::app) << lines;
    written_ += lines.size();
    if (commit) feed_->Commit(written_);
    return written_;
  }
  std::shared_ptr<LogFeed> feed() { return feed_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::shared_ptr<LogFeed> feed_;
  uint64_t written_ = 0;
};

struct Item {
  WatchQueue::Next kind;
  std::string data;
  uint64_t offset;
};

std::vector<Item> Drain(WatchQueue& queue) {
  std::vector<Item> items;
  while (true) {
    Item item{};
    bool more = false;
    item.kind = queue.TryPop(&item.data, &item.offset, &more);
    if (item.kind == WatchQueue::Next::kEmpty || item.kind == WatchQueue::Next::kEnded) break;
    items.push_back(item);
  }
  return items;
}

std::string Joined(const std::vector<Item>& items) {
  std::string all;
  for (const auto& i : items) all += (i.kind == WatchQueue::Next::kOutput ? "" : "[") + i.data +
                                     (i.kind == WatchQueue::Next::kOutput ? "" : "]");
  return all;
}

TEST(WatchQueueTest, EventsKeepTheirPlaceAmongTheOutputLines) {
  Feed f("order.txt");
  WatchQueue queue(f.feed(), 0, nullptr);
  uint64_t mark = f.Append("a | 1\n");
  queue.Push("notice", mark, false);
  mark = f.Append("a | 2\n", /*commit=*/false);
  // Its mark is past what is committed: it waits for the flush, and so do the lines after it.
  queue.Push("status", mark, true);
  EXPECT_EQ(Joined(Drain(queue)), "a | 1\n[notice]");
  f.feed()->Commit(mark);  // the batch's flush
  EXPECT_EQ(Joined(Drain(queue)), "a | 2\n[status]");
}

TEST(WatchQueueTest, OutputComesInBoundedReadsOfWholeLinesAtTheirOffsets) {
  Feed f("bounded.txt");
  std::string all;
  for (int i = 0; i < 20000; ++i) all += "worker:0 | line " + std::to_string(i) + " of many\n";
  ASSERT_GT(all.size(), 2 * LogFeed::kMaxRead);
  f.Append(all);
  WatchQueue queue(f.feed(), 0, nullptr);
  queue.Close();
  std::string got;
  for (const Item& item : Drain(queue)) {
    ASSERT_EQ(item.kind, WatchQueue::Next::kOutput);
    EXPECT_EQ(item.offset, got.size());  // contiguous
    EXPECT_LE(item.data.size(), LogFeed::kMaxRead);
    EXPECT_EQ(item.data.back(), '\n');
    got += item.data;
  }
  EXPECT_EQ(got, all);
  std::string out;
  uint64_t offset = 0;
  bool more = false;
  EXPECT_EQ(queue.TryPop(&out, &offset, &more), WatchQueue::Next::kEnded);
  EXPECT_TRUE(queue.Drained());
}

TEST(WatchQueueTest, AWatcherStartsWhereItAsks) {
  Feed f("offset.txt");
  uint64_t first = f.Append("a | earlier\n");
  f.Append("a | later\n");
  WatchQueue queue(f.feed(), first, nullptr);
  auto items = Drain(queue);
  ASSERT_EQ(items.size(), 1u);
  EXPECT_EQ(items[0].data, "a | later\n");
  EXPECT_EQ(items[0].offset, first);
}

TEST(WatchQueueTest, ItEndsOnlyOnceEverythingWasTaken) {
  Feed f("end.txt");
  WatchQueue queue(f.feed(), 0, nullptr);
  uint64_t mark = f.Append("a | last words\n");
  queue.Push("final status", mark, true);
  queue.Close();
  EXPECT_FALSE(queue.Drained());
  EXPECT_EQ(Joined(Drain(queue)), "a | last words\n[final status]");
  EXPECT_TRUE(queue.Drained());
}

TEST(WatchQueueTest, StatusesDoNotPileUpBehindASlowClient) {
  Feed f("statuses.txt");
  WatchQueue queue(nullptr, 0, nullptr);  // status only
  for (int i = 0; i < 100000; ++i) queue.Push("status " + std::to_string(i), 0, true);
  queue.Push("notice", 0, false);
  queue.Push("status last", 0, true);
  EXPECT_EQ(Joined(Drain(queue)), "[status 99999][notice][status last]");
}

TEST(WatchQueueTest, ATruncatedFileStopsTheOutputAndSaysSo) {
  Feed f("truncated.txt");
  f.Append("a | 1\na | 2\n");
  std::filesystem::resize_file(f.path(), 3);
  WatchQueue queue(f.feed(), 0, nullptr);
  uint64_t mark = 12;
  queue.Push("status", mark, true);
  queue.Close();
  auto items = Drain(queue);
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[0].kind, WatchQueue::Next::kOutputFailed);
  EXPECT_NE(items[0].data.find("truncated"), std::string::npos) << items[0].data;
  EXPECT_EQ(items[1].data, "status");  // the events still arrive
  EXPECT_TRUE(queue.Drained());
}

TEST(WatchBacklogTest, ALateWatcherGetsTheNoticesWithTheirMarks) {
  Feed f("backlog.txt");
  WatchBacklog backlog;
  uint64_t mark = f.Append("a | before\n");
  backlog.Add("TensorBoard at http://127.0.0.1:1/", mark);
  f.Append("a | after\n");
  WatchQueue with_logs(f.feed(), 0, nullptr);
  backlog.ReplayTo(with_logs);
  EXPECT_EQ(Joined(Drain(with_logs)),
            "a | before\n[TensorBoard at http://127.0.0.1:1/]a | after\n");
  WatchQueue status_only(nullptr, 0, nullptr);
  backlog.ReplayTo(status_only);
  EXPECT_EQ(Joined(Drain(status_only)), "[TensorBoard at http://127.0.0.1:1/]");
}

}  // namespace
}  // namespace shoal::master
