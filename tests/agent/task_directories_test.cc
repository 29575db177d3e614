#include "agent/task_directories.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

namespace shoal::agent {
namespace {

namespace fs = std::filesystem;

class TaskDirectoriesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "task-dirs-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
  }
  void TearDown() override { fs::remove_all(root_); }

  fs::path root_;
};

// Issue 23, defect 3: SHOAL_CHECKPOINT_DIR named a directory nobody had made, so a script that
// only calls torch.save into it failed (and restart-group burned its restarts on that).
TEST_F(TaskDirectoriesTest, CreatesEachDirectoryWithItsMissingParents) {
  std::string checkpoints = (root_ / "job" / "checkpoints").string();
  std::string logs = (root_ / "runs" / "a" / "b").string();
  ASSERT_TRUE(MakeTaskDirectories({{"SHOAL_CHECKPOINT_DIR", checkpoints},
                                   {"SHOAL_TENSORBOARD_LOGDIR", logs}})
                  .ok());
  EXPECT_TRUE(fs::is_directory(checkpoints));
  EXPECT_TRUE(fs::is_directory(logs));
  // A second task of the job on the same node finds them made.
  EXPECT_TRUE(MakeTaskDirectories({{"SHOAL_CHECKPOINT_DIR", checkpoints + "/"}}).ok());
}

TEST_F(TaskDirectoriesTest, LeavesTheModeOfAnExistingDirectoryAlone) {
  fs::path shared = root_ / "shared";
  ASSERT_EQ(::mkdir(shared.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(shared.c_str(), 02770), 0);
  ASSERT_TRUE(MakeTaskDirectories({{"SHOAL_CHECKPOINT_DIR", shared.string()}}).ok());
  struct stat st;
  ASSERT_EQ(::stat(shared.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 02770u);
}

TEST_F(TaskDirectoriesTest, AFileInThePathFailsNamingTheDirectoryVariableAndErrno) {
  fs::path file = root_ / "not-a-dir";
  std::ofstream(file) << "x";
  std::string wanted = (file / "checkpoints").string();
  absl::Status st = MakeTaskDirectories({{"SHOAL_CHECKPOINT_DIR", wanted}});
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(st.message(), "cannot create the directory '" + wanted +
                              "' named in SHOAL_CHECKPOINT_DIR: Not a directory (ENOTDIR 20)");
  EXPECT_TRUE(fs::is_regular_file(file));
}

TEST_F(TaskDirectoriesTest, APathThatIsAFileFails) {
  fs::path file = root_ / "ckpt";
  std::ofstream(file) << "x";
  absl::Status st = MakeTaskDirectories({{"SHOAL_CHECKPOINT_DIR", file.string()}});
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("ENOTDIR"), std::string::npos) << st.message();
}

TEST_F(TaskDirectoriesTest, ARelativePathFails) {
  absl::Status st = MakeTaskDirectories({{"SHOAL_TENSORBOARD_LOGDIR", "runs"}});
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(st.message(),
            "cannot create the directory 'runs' named in SHOAL_TENSORBOARD_LOGDIR: not an "
            "absolute path");
}

}  // namespace
}  // namespace shoal::agent
