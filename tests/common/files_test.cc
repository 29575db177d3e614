#include "common/files.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace shoal {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

class MakeTemporaryDirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = ::testing::TempDir() + "files_test_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  std::string root_;
};

TEST_F(MakeTemporaryDirectoryTest, MakesAPrivateDirectoryOfItsOwnUnderTheParent) {
  absl::StatusOr<std::string> first = MakeTemporaryDirectory("job-", root_);
  absl::StatusOr<std::string> second = MakeTemporaryDirectory("job-", root_);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_THAT(*first, StartsWith(root_ + "/job-"));
  EXPECT_EQ(first->size(), (root_ + "/job-XXXXXX").size());
  EXPECT_NE(*first, *second);
  struct stat st {};
  ASSERT_EQ(::stat(first->c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

TEST_F(MakeTemporaryDirectoryTest, WithoutAParentUsesTmpdir) {
  const char* before = std::getenv("TMPDIR");
  std::string saved = before ? before : "";
  ::setenv("TMPDIR", root_.c_str(), 1);
  EXPECT_EQ(TemporaryDirectoryRoot(), root_);
  absl::StatusOr<std::string> made = MakeTemporaryDirectory("x-");
  ::setenv("TMPDIR", "", 1);
  EXPECT_EQ(TemporaryDirectoryRoot(), "/tmp");  // an empty TMPDIR counts as none
  if (before) {
    ::setenv("TMPDIR", saved.c_str(), 1);
  } else {
    ::unsetenv("TMPDIR");
  }
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_THAT(*made, StartsWith(root_ + "/x-"));
}

TEST_F(MakeTemporaryDirectoryTest, AMissingParentIsNotFoundAndNamesTheDirectory) {
  absl::StatusOr<std::string> made = MakeTemporaryDirectory("x-", root_ + "/missing");
  ASSERT_FALSE(made.ok());
  EXPECT_TRUE(absl::IsNotFound(made.status())) << made.status();
  EXPECT_THAT(made.status().message(),
              HasSubstr("cannot create a directory " + root_ + "/missing/x-XXXXXX: "
                        "No such file or directory"));
  EXPECT_FALSE(std::filesystem::exists(root_ + "/missing"));
}

}  // namespace
}  // namespace shoal
