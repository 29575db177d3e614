#include "master/task_logs.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "common/files.h"

namespace shoal::master {
namespace {

class TaskLogsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("shoal-task-logs-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    auto logs = TaskLogs::Open(dir_.string());
    ASSERT_TRUE(logs.ok()) << logs.status();
    logs_ = std::move(*logs);
  }
  void TearDown() override {
    logs_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::string File(const std::string& rel) {
    logs_->Flush();
    auto text = ReadFile((dir_ / rel).string());
    return text.ok() ? *text : "<missing>";
  }

  std::filesystem::path dir_;
  std::unique_ptr<TaskLogs> logs_;
};

TEST_F(TaskLogsTest, LinesSplitAcrossChunksComeOutWholeAndPrefixed) {
  EXPECT_EQ(logs_->Append("worker:0", "worker-0", false, "hel"), "");
  EXPECT_EQ(logs_->Append("worker:0", "worker-0", false, "lo\nwor"), "worker:0 | hello\n");
  EXPECT_EQ(logs_->Append("worker:0", "worker-0", false, "ld\na\nb\n"),
            "worker:0 | world\nworker:0 | a\nworker:0 | b\n");
  EXPECT_EQ(File("logs.txt"), "worker:0 | hello\nworker:0 | world\nworker:0 | a\nworker:0 | b\n");
  EXPECT_EQ(File("tasks/worker-0/stdout"), "hello\nworld\na\nb\n");
}

TEST_F(TaskLogsTest, StreamsOfOneTaskDoNotMixTheirPartialLines) {
  logs_->Append("worker:1", "worker-1", false, "out-");
  logs_->Append("worker:1", "worker-1", true, "err-");
  EXPECT_EQ(logs_->Append("worker:1", "worker-1", true, "line\n"), "worker:1 | err-line\n");
  EXPECT_EQ(logs_->Append("worker:1", "worker-1", false, "line\n"), "worker:1 | out-line\n");
  EXPECT_EQ(File("tasks/worker-1/stderr"), "err-line\n");
}

TEST_F(TaskLogsTest, FinishedTaskGivesUpItsUnterminatedLastLine) {
  logs_->Append("ps:0", "ps-0", false, "last words");
  EXPECT_EQ(logs_->FinishTask("ps:0"), "ps:0 | last words\n");
  EXPECT_EQ(logs_->FinishTask("ps:0"), "");
  EXPECT_EQ(File("logs.txt"), "ps:0 | last words\n");
}

TEST_F(TaskLogsTest, TaskThatNeverPrintedHasNoFiles) {
  EXPECT_EQ(logs_->FinishTask("quiet:0"), "");
  EXPECT_FALSE(std::filesystem::exists(dir_ / "tasks" / "quiet-0"));
}

TEST_F(TaskLogsTest, EndlessLineIsCutInsteadOfGrowingWithoutBound) {
  std::string chunk(TaskLogs::kMaxLine + 10, 'x');
  std::string lines = logs_->Append("w:0", "w-0", false, chunk);
  EXPECT_EQ(lines, "w:0 | " + chunk + "\n");
  EXPECT_EQ(logs_->FinishTask("w:0"), "");
}

}  // namespace
}  // namespace shoal::master
