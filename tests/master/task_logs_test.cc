#include "master/task_logs.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

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

  // `data` from the next byte of `task`'s stream (attempt 0), as an agent sends it.
  std::string Out(const std::string& task, std::string_view data, bool is_stderr = false) {
    uint64_t& offset = next_[{task, 0, is_stderr}];
    std::string lines = At(task, offset, data, is_stderr);
    offset += data.size();
    return lines;
  }
  std::string At(const std::string& task, uint64_t offset, std::string_view data,
                 bool is_stderr = false) {
    std::string dir = task;
    dir[dir.find(':')] = '-';
    return logs_->Append({task, 0, is_stderr}, dir, offset, data, "node-a");
  }
  // A master killed now: what it did not flush is gone.
  void KillAndReopen() {
    logs_.reset();
    auto logs = TaskLogs::Open(dir_.string());
    ASSERT_TRUE(logs.ok()) << logs.status();
    logs_ = std::move(*logs);
  }
  std::string Raw(const std::string& rel) {
    auto text = ReadFile((dir_ / rel).string());
    return text.ok() ? *text : "<missing>";
  }

  std::filesystem::path dir_;
  std::unique_ptr<TaskLogs> logs_;
  std::map<TaskStreamId, uint64_t> next_;
};

TEST_F(TaskLogsTest, LinesSplitAcrossChunksComeOutWholeAndPrefixed) {
  EXPECT_EQ(Out("worker:0", "hel"), "");
  EXPECT_EQ(Out("worker:0", "lo\nwor"), "worker:0 | hello\n");
  EXPECT_EQ(Out("worker:0", "ld\na\nb\n"),
            "worker:0 | world\nworker:0 | a\nworker:0 | b\n");
  EXPECT_EQ(File("logs.txt"), "worker:0 | hello\nworker:0 | world\nworker:0 | a\nworker:0 | b\n");
  EXPECT_EQ(File("tasks/worker-0/stdout"), "hello\nworld\na\nb\n");
}

TEST_F(TaskLogsTest, StreamsOfOneTaskDoNotMixTheirPartialLines) {
  Out("worker:1", "out-");
  Out("worker:1", "err-", true);
  EXPECT_EQ(Out("worker:1", "line\n", true), "worker:1 | err-line\n");
  EXPECT_EQ(Out("worker:1", "line\n"), "worker:1 | out-line\n");
  EXPECT_EQ(File("tasks/worker-1/stderr"), "err-line\n");
}

TEST_F(TaskLogsTest, FinishedTaskGivesUpItsUnterminatedLastLine) {
  Out("ps:0", "last words");
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
  std::string lines = Out("w:0", chunk);
  EXPECT_EQ(lines, "w:0 | " + chunk + "\n");
  EXPECT_EQ(logs_->FinishTask("w:0"), "");
}

TEST_F(TaskLogsTest, OutputSentAgainIsWrittenOnce) {
  At("worker:0", 0, "a\nb\n");
  EXPECT_EQ(At("worker:0", 0, "a\nb\n"), "") << "all of it is here already";
  EXPECT_EQ(At("worker:0", 2, "b\nc\n"), "worker:0 | c\n") << "only what is new";
  EXPECT_EQ(File("logs.txt"), "worker:0 | a\nworker:0 | b\nworker:0 | c\n");
  EXPECT_EQ(File("tasks/worker-0/stdout"), "a\nb\nc\n");
}

TEST_F(TaskLogsTest, OutputTheAgentCouldNotKeepIsMarkedWhereItIsMissing) {
  At("worker:0", 0, "a\nhalf");
  EXPECT_EQ(At("worker:0", 100, "z\n"),
            "worker:0 | half\nworker:0 | [shoal: 94 bytes of this task's stdout were lost here]\n"
            "worker:0 | z\n");
}

TEST_F(TaskLogsTest, APartialLineIsInTheRawFileAtOnceButCommittedOnlyOnceItEnds) {
  Out("worker:0", "50%");
  EXPECT_EQ(File("tasks/worker-0/stdout"), "50%") << "a progress bar shows in the raw file";
  EXPECT_EQ(File("logs.txt"), "");
  EXPECT_TRUE(logs_->TakeCommitted().empty());
  Out("worker:0", " done\n");
  EXPECT_EQ(File("tasks/worker-0/stdout"), "50% done\n");
  auto committed = logs_->TakeCommitted();
  ASSERT_EQ(committed.size(), 1u);
  EXPECT_EQ(committed[0].stream, (TaskStreamId{"worker:0", 0, false}));
  EXPECT_EQ(committed[0].offset, 9u);
  EXPECT_EQ(committed[0].source, "node-a");
  EXPECT_TRUE(logs_->TakeCommitted().empty()) << "each position is reported once";
}

TEST_F(TaskLogsTest, APartialLineADeadMasterHeldIsNotWrittenTwiceToTheRawFile) {
  Out("worker:0", "a\n50");
  logs_->Flush();
  KillAndReopen();
  EXPECT_EQ(Raw("tasks/worker-0/stdout"), "a\n50");
  At("worker:0", 2, "50% done\n");  // the agent's kept output, from the last whole line
  EXPECT_EQ(File("tasks/worker-0/stdout"), "a\n50% done\n");
  EXPECT_EQ(File("logs.txt"), "worker:0 | a\nworker:0 | 50% done\n");
}

// The defect: a master killed between receiving output and writing it lost those lines.
TEST_F(TaskLogsTest, AMasterKilledBeforeItsFlushLosesNoLineAndDoublesNone) {
  Out("worker:0", "tick 0\ntick 1\n");
  Out("worker:1", "tick 0\n");
  logs_->Flush();
  Out("worker:0", "tick 2\nti");  // received, not flushed
  KillAndReopen();
  EXPECT_EQ(Raw("logs.txt"), "worker:0 | tick 0\nworker:0 | tick 1\nworker:1 | tick 0\n");
  // The agents send everything not acknowledged again, from wherever they kept it.
  At("worker:0", 7, "tick 1\ntick 2\nti");
  At("worker:1", 0, "tick 0\n");
  At("worker:0", 23, "ck 3\n");
  EXPECT_EQ(File("logs.txt"),
            "worker:0 | tick 0\nworker:0 | tick 1\nworker:1 | tick 0\n"
            "worker:0 | tick 2\nworker:0 | tick 3\n");
  EXPECT_EQ(Raw("tasks/worker-0/stdout"), "tick 0\ntick 1\ntick 2\ntick 3\n");
  EXPECT_EQ(Raw("tasks/worker-1/stdout"), "tick 0\n");
}

TEST_F(TaskLogsTest, AFlushCutShortIsUndoneAndItsOutputTakenAgain) {
  Out("worker:0", "one\n");
  logs_->Flush();
  Out("worker:0", "two\nthree\n");
  logs_->Flush();
  // As if the master died inside the second flush's write to logs.txt.
  std::filesystem::resize_file(dir_ / "logs.txt", std::string("worker:0 | one\nwork").size());
  KillAndReopen();
  EXPECT_EQ(logs_->cut_at_open(), 4u);
  EXPECT_EQ(Raw("logs.txt"), "worker:0 | one\n");
  EXPECT_EQ(Raw("tasks/worker-0/stdout"), "one\n") << "the raw file goes back with it";
  At("worker:0", 4, "two\nthree\n");
  EXPECT_EQ(File("logs.txt"), "worker:0 | one\nworker:0 | two\nworker:0 | three\n");
  EXPECT_EQ(Raw("tasks/worker-0/stdout"), "one\ntwo\nthree\n");
}

TEST_F(TaskLogsTest, AFlushCutShortRightAfterARecoveryKeepsWhatTheFirstMasterWrote) {
  Out("worker:0", "one\n");
  logs_->Flush();
  KillAndReopen();
  Out("worker:0", "two\n");
  logs_->Flush();
  std::filesystem::resize_file(dir_ / "logs.txt", std::string("worker:0 | one\nwo").size());
  KillAndReopen();
  EXPECT_EQ(Raw("logs.txt"), "worker:0 | one\n");
  EXPECT_EQ(Raw("tasks/worker-0/stdout"), "one\n");
}

TEST_F(TaskLogsTest, ATornPositionsRecordIsIgnored) {
  Out("worker:0", "one\n");
  logs_->Flush();
  {
    std::ofstream(dir_ / "logs.positions", std::ios::app) << R"({"start":15,"end":)";
  }
  KillAndReopen();
  At("worker:0", 0, "one\ntwo\n");
  EXPECT_EQ(File("logs.txt"), "worker:0 | one\nworker:0 | two\n");
}

TEST_F(TaskLogsTest, ADamagedPositionsFileCutsNothing) {
  Out("worker:0", "one\n");
  logs_->Flush();
  Out("worker:0", "two\n");
  logs_->Flush();
  {
    // Damage before the last record: not a torn append, so no record can be trusted.
    std::string text = Raw("logs.positions");
    size_t first_end = text.find('\n') + 1;
    std::ofstream(dir_ / "logs.positions")
        << text.substr(0, first_end) << "garbage\n" << text.substr(first_end);
  }
  KillAndReopen();
  EXPECT_EQ(logs_->cut_at_open(), 0u);
  EXPECT_EQ(Raw("logs.txt"), "worker:0 | one\nworker:0 | two\n");
  EXPECT_EQ(Raw("tasks/worker-0/stdout"), "one\ntwo\n");
}

TEST_F(TaskLogsTest, ANewAttemptStartsItsStreamsAtZero) {
  Out("worker:0", "first\n");
  logs_->Append({"worker:0", 1, false}, "worker-0", 0, "second\n", "node-b");
  EXPECT_EQ(File("logs.txt"), "worker:0 | first\nworker:0 | second\n");
  KillAndReopen();
  logs_->Append({"worker:0", 1, false}, "worker-0", 0, "second\nthird\n", "node-b");
  EXPECT_EQ(File("logs.txt"), "worker:0 | first\nworker:0 | second\nworker:0 | third\n");
}

TEST_F(TaskLogsTest, ThePositionsFileStaysSmallAndStillRecovers) {
  const std::string line(100, 'x');
  for (int i = 0; i < 20000; ++i) {
    Out("worker:" + std::to_string(i % 4), line + "\n");
    logs_->Flush();
  }
  EXPECT_LE(std::filesystem::file_size(dir_ / "logs.positions"), TaskLogs::kMaxPositionsBytes);
  const auto size = std::filesystem::file_size(dir_ / "logs.txt");
  KillAndReopen();
  EXPECT_EQ(logs_->cut_at_open(), 0u);
  At("worker:3", 0, line + "\n");  // an old line sent again
  EXPECT_EQ(File("logs.txt").size(), size);
}

TEST_F(TaskLogsTest, AFlushCutShortWhileThePositionsFileIsRewrittenIsUndoneToo) {
  const std::string line(100, 'x');
  uint64_t last_size = 0;
  for (int i = 0;; ++i) {
    ASSERT_LT(i, 100000) << "logs.positions was never rewritten";
    Out("worker:" + std::to_string(i % 4), line + "\n");
    logs_->Flush();
    uint64_t size = std::filesystem::file_size(dir_ / "logs.positions");
    if (size < last_size) break;  // this flush rewrote it
    last_size = size;
  }
  const auto full = std::filesystem::file_size(dir_ / "logs.txt");
  std::filesystem::resize_file(dir_ / "logs.txt", full - 10);
  KillAndReopen();
  EXPECT_EQ(logs_->cut_at_open(), line.size() + 12 - 10);
  // The agent sends the last line again, and only it is missing.
  for (int w = 0; w < 4; ++w) {
    const std::string task = "worker:" + std::to_string(w);
    uint64_t sent = next_[{task, 0, false}];
    At(task, sent - line.size() - 1, line + "\n");
  }
  const std::string text = File("logs.txt");
  EXPECT_EQ(text.size(), full);
  EXPECT_EQ(text.find("[shoal:"), std::string::npos) << "no gap where there is none";
}

}  // namespace
}  // namespace shoal::master
