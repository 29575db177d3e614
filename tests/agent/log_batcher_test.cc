// The agent's output batching: what a window gathers goes out as one chunk per task stream, in
// order, and nothing is lost or reordered by a flush, a size overflow or the destructor. No
// timing is asserted: windows are either far longer than the test (nothing may go out by
// itself) or waited for.
#include "agent/log_batcher.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace shoal::agent {
namespace {

using std::chrono::milliseconds;

struct Sent {
  std::string key;
  OutputStream stream;
  std::string data;
  bool operator==(const Sent&) const = default;
};

class Recorder {
 public:
  // slow: each send takes a while, as a gRPC write can, so that two flushes overlap.
  LogBatcher::Sink Sink(bool slow = false) {
    return [this, slow](const std::string& key, OutputStream stream, std::string data) {
      if (slow) std::this_thread::sleep_for(std::chrono::microseconds(200));
      std::lock_guard<std::mutex> lock(mu_);
      sent_.push_back({key, stream, std::move(data)});
      cv_.notify_all();
    };
  }
  std::vector<Sent> sent() {
    std::lock_guard<std::mutex> lock(mu_);
    return sent_;
  }
  bool WaitFor(size_t count, milliseconds limit) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, limit, [&] { return sent_.size() >= count; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Sent> sent_;
};

constexpr auto kOut = OutputStream::kStdout;
constexpr auto kErr = OutputStream::kStderr;
constexpr milliseconds kLongerThanAnyTest{600'000};

TEST(LogBatcherTest, AWindowsLinesGoOutAsOneChunkPerTaskStreamOnFlush) {
  Recorder recorder;
  LogBatcher batcher(kLongerThanAnyTest, 1 << 20, recorder.Sink());
  batcher.Add("worker:0", kOut, "epoch 1\n");
  batcher.Add("worker:1", kOut, "epoch 1\n");
  batcher.Add("worker:0", kErr, "warning\n");
  batcher.Add("worker:0", kOut, "epoch 2\n");
  batcher.Add("worker:1", kOut, "");  // nothing to send
  EXPECT_TRUE(recorder.sent().empty()) << "output went out before its window ended";
  batcher.Flush();
  EXPECT_EQ(recorder.sent(), (std::vector<Sent>{{"worker:0", kOut, "epoch 1\nepoch 2\n"},
                                                 {"worker:1", kOut, "epoch 1\n"},
                                                 {"worker:0", kErr, "warning\n"}}));
  batcher.Flush();  // nothing held: nothing sent
  EXPECT_EQ(recorder.sent().size(), 3u);
}

// The agent sends a flush's chunks, of every task, as one message: batch_end marks where a
// flush ends, once per flush that had output, after its last chunk.
TEST(LogBatcherTest, EachFlushWithOutputEndsWithOneBatchEnd) {
  std::vector<std::string> events;  // the sink and batch_end run under the batcher's send lock
  LogBatcher batcher(
      kLongerThanAnyTest, 1 << 20,
      [&](const std::string& key, OutputStream, std::string data) {
        events.push_back(key + " " + data);
      },
      [&] { events.push_back("end"); });
  batcher.Add("worker:0", kOut, "a\n");
  batcher.Add("worker:1", kOut, "b\n");
  batcher.Add("worker:2", kErr, "c\n");
  batcher.Flush();
  batcher.Flush();  // nothing held: no batch, no end
  batcher.Add("worker:1", kOut, "d\n");
  batcher.Flush();
  EXPECT_EQ(events, (std::vector<std::string>{"worker:0 a\n", "worker:1 b\n", "worker:2 c\n",
                                              "end", "worker:1 d\n", "end"}));
}

TEST(LogBatcherTest, WithoutAWindowEachAddIsABatchOfItsOwn) {
  std::vector<std::string> events;
  LogBatcher batcher(
      milliseconds(0), 1 << 20,
      [&](const std::string& key, OutputStream, std::string data) {
        events.push_back(key + " " + data);
      },
      [&] { events.push_back("end"); });
  batcher.Add("worker:0", kOut, "a\n");
  batcher.Add("worker:1", kOut, "b\n");
  EXPECT_EQ(events,
            (std::vector<std::string>{"worker:0 a\n", "end", "worker:1 b\n", "end"}));
}

TEST(LogBatcherTest, TheWindowEndingSendsWithoutAFlush) {
  Recorder recorder;
  LogBatcher batcher(milliseconds(20), 1 << 20, recorder.Sink());
  batcher.Add("worker:0", kOut, "one\n");
  ASSERT_TRUE(recorder.WaitFor(1, milliseconds(30'000))) << "the window never ended";
  batcher.Add("worker:0", kOut, "two\n");  // a new window after the first went out
  ASSERT_TRUE(recorder.WaitFor(2, milliseconds(30'000))) << "the second window never ended";
  EXPECT_EQ(recorder.sent(), (std::vector<Sent>{{"worker:0", kOut, "one\n"},
                                                 {"worker:0", kOut, "two\n"}}));
}

TEST(LogBatcherTest, HoldingTooMuchSendsEverythingAtOnceInOrder) {
  Recorder recorder;
  LogBatcher batcher(kLongerThanAnyTest, 10, recorder.Sink());
  batcher.Add("a:0", kOut, "12345");
  batcher.Add("b:0", kOut, "1234");
  EXPECT_TRUE(recorder.sent().empty());
  batcher.Add("a:0", kOut, "6");  // 10 bytes held
  EXPECT_EQ(recorder.sent(), (std::vector<Sent>{{"a:0", kOut, "123456"}, {"b:0", kOut, "1234"}}));
  batcher.Add("a:0", kOut, "7");
  batcher.Flush();
  EXPECT_EQ(recorder.sent().back(), (Sent{"a:0", kOut, "7"}));
}

TEST(LogBatcherTest, TheDestructorSendsWhatIsHeld) {
  Recorder recorder;
  {
    LogBatcher batcher(kLongerThanAnyTest, 1 << 20, recorder.Sink());
    batcher.Add("worker:0", kOut, "last words\n");
  }
  EXPECT_EQ(recorder.sent(), (std::vector<Sent>{{"worker:0", kOut, "last words\n"}}));
}

TEST(LogBatcherTest, AZeroWindowSendsEveryAddAtOnce) {
  Recorder recorder;
  LogBatcher batcher(milliseconds(0), 1 << 20, recorder.Sink());
  batcher.Add("worker:0", kOut, "one\n");
  EXPECT_EQ(recorder.sent(), (std::vector<Sent>{{"worker:0", kOut, "one\n"}}));
  batcher.Add("worker:0", kOut, "two\n");
  EXPECT_EQ(recorder.sent().size(), 2u);
}

// Writers and the batcher's own thread and explicit flushes all at once: every byte arrives
// once, and each stream's bytes in the order they were added.
TEST(LogBatcherTest, ConcurrentWritersAndFlushesLoseAndReorderNothing) {
  Recorder recorder;
  std::vector<std::string> expected(4);
  {
    LogBatcher batcher(milliseconds(1), 4096, recorder.Sink(/*slow=*/true));
    std::vector<std::thread> writers;
    for (int w = 0; w < 4; ++w) {
      writers.emplace_back([&, w] {
        for (int i = 0; i < 2000; ++i) {
          std::string line = std::to_string(i) + "\n";
          expected[w] += line;
          batcher.Add("worker:" + std::to_string(w), kOut, line);
          if (i % 97 == 0) batcher.Flush();
        }
      });
    }
    for (auto& t : writers) t.join();
  }
  std::vector<std::string> got(4);
  for (const auto& s : recorder.sent()) got[std::stoi(s.key.substr(7))] += s.data;
  EXPECT_EQ(got, expected);
}

}  // namespace
}  // namespace shoal::agent
