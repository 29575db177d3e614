// The progress board end to end inside one process: the C++ SDK's writer (sdk/cpp/shoal/sdk.h)
// and the agent's reader (ProgressSlot) agree on the layout, a half-done write is never taken,
// and the SDK server's hang watchdog, fed only by the board, fires once the steps stop.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>

#include "agent/progress_slot.h"
#include "agent/sdk_server.h"
#include "shoal/sdk.h"

namespace shoal::agent {
namespace {

int64_t MonotonicNs() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return int64_t{now.tv_sec} * 1000000000 + now.tv_nsec;
}

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("shoal-board-" + std::to_string(::getpid()) + "-" + name))
      .string();
}

// The writer's view of a board, for the cases the SDK never produces.
struct RawBoard {
  explicit RawBoard(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDWR);
    words = static_cast<uint64_t*>(
        ::mmap(nullptr, ProgressSlot::kSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    ::close(fd);
  }
  ~RawBoard() { ::munmap(words, ProgressSlot::kSize); }
  uint64_t* words;
};

TEST(ProgressBoardTest, WhatTheSdkWritesTheAgentReads) {
  std::string path = TempPath("sdk");
  auto slot = ProgressSlot::Create(path);
  ASSERT_TRUE(slot.ok()) << slot.status();
  EXPECT_FALSE((*slot)->Read().has_value());  // nothing reported yet

  // The SDK maps the board named by its environment on first use.
  ::setenv("SHOAL_PROGRESS_FILE", path.c_str(), 1);
  int64_t before = MonotonicNs();
  sdk::ReportProgress(41);
  sdk::ReportProgress(42);
  int64_t after = MonotonicNs();
  auto report = (*slot)->Read();
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->step, 42u);
  EXPECT_GE(report->monotonic_ns, before);
  EXPECT_LE(report->monotonic_ns, after);
  ::unsetenv("SHOAL_PROGRESS_FILE");

  slot->reset();
  EXPECT_FALSE(std::filesystem::exists(path)) << "the agent removes a task's board";
}

TEST(ProgressBoardTest, AWriteCaughtHalfDoneIsNotTaken) {
  std::string path = TempPath("torn");
  auto slot = ProgressSlot::Create(path);
  ASSERT_TRUE(slot.ok()) << slot.status();
  RawBoard raw(path);
  raw.words[1] = 2;  // a complete report: step 5
  raw.words[2] = 5;
  raw.words[3] = 1000;
  ASSERT_TRUE((*slot)->Read().has_value());
  EXPECT_EQ((*slot)->Read()->step, 5u);
  raw.words[1] = 3;  // the next write is under way
  raw.words[2] = 6;
  EXPECT_FALSE((*slot)->Read().has_value());
  raw.words[3] = 2000;
  raw.words[1] = 4;
  ASSERT_TRUE((*slot)->Read().has_value());
  EXPECT_EQ((*slot)->Read()->step, 6u);
}

TEST(ProgressBoardTest, ABoardThatCannotBeMadeSaysWhere) {
  auto slot = ProgressSlot::Create("/nonexistent-dir-for-shoal/board");
  ASSERT_FALSE(slot.ok());
  EXPECT_NE(std::string(slot.status().message()).find("/nonexistent-dir-for-shoal/board"),
            std::string::npos);
}

// The SDK server learns steps from the board alone (no socket message), reports them once per
// change for the heartbeat, and its watchdog fires after the steps stop.
TEST(ProgressBoardTest, SdkServerTakesStepsFromTheBoardAndSeesTheHang) {
  std::mutex mu;
  std::condition_variable cv;
  int stalled_count = 0;
  uint64_t stalled_step = 0;
  SdkServerCallbacks callbacks;
  callbacks.on_stalled = [&](const std::string& task, uint32_t attempt, uint64_t step,
                             std::chrono::milliseconds) {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(task, "worker:0");
    EXPECT_EQ(attempt, 3u);
    ++stalled_count;
    stalled_step = step;
    cv.notify_all();
  };
  auto server = SdkServer::Create("@" + TempPath("sock").substr(1), callbacks);
  ASSERT_TRUE(server.ok()) << server.status();
  std::string path = TempPath("server");
  std::string error;
  std::string board = (*server)->TaskLaunched("worker:0", 3, std::chrono::milliseconds(300),
                                              path, &error);
  ASSERT_EQ(board, path) << error;
  EXPECT_TRUE((*server)->TakeProgress().empty());

  RawBoard raw(path);
  auto write = [&](uint64_t step) {
    raw.words[1] |= 1;
    raw.words[2] = step;
    raw.words[3] = static_cast<uint64_t>(MonotonicNs());
    raw.words[1] += 1;
  };
  write(7);
  auto steps = (*server)->TakeProgress();
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].task, "worker:0");
  EXPECT_EQ(steps[0].attempt, 3u);
  EXPECT_EQ(steps[0].step, 7u);
  EXPECT_TRUE((*server)->TakeProgress().empty()) << "no new step, nothing to report";
  write(8);  // the last step: the task hangs after it
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(20), [&] { return stalled_count > 0; }))
        << "the watchdog never fired";
    EXPECT_EQ(stalled_step, 8u);
  }
  (*server)->TaskEnded("worker:0", 3);
  EXPECT_FALSE(std::filesystem::exists(path));
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(stalled_count, 1);
}

}  // namespace
}  // namespace shoal::agent
