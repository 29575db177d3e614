#include "master/bounded_line_file.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace shoal::master {
namespace {

namespace fs = std::filesystem;

class BoundedLineFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "bounded-lines-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
    path_ = (root_ / "resources.jsonl").string();
  }
  void TearDown() override { fs::remove_all(root_); }

  static std::string Sample(int n) {
    return absl::StrCat("{\"ts_ms\": ", 1'700'000'000'000 + 2000LL * n,
                        ", \"cpu_percent\": 99.5, \"rss_bytes\": 209715200, \"step\": ", n,
                        ", \"attempt\": 0, \"gpus\": []}");
  }

  // Every line parsed; the sample numbers in order.
  std::vector<int> ReadSteps() {
    std::ifstream in(path_);
    std::vector<int> steps;
    for (std::string line; std::getline(in, line);) {
      nlohmann::json j = nlohmann::json::parse(line);  // throws (fails the test) if torn
      steps.push_back(j.at("step").get<int>());
    }
    return steps;
  }

  fs::path root_;
  std::string path_;
};

TEST_F(BoundedLineFileTest, StaysWithinItsBudgetAndSpansTheWholeSeries) {
  constexpr uint64_t kBudget = 16 * 1024;
  auto file = BoundedLineFile::Open(path_, kBudget);
  ASSERT_TRUE(file.ok()) << file.status();
  constexpr int kSamples = 20'000;  // about 2 MB of lines: 128 times the budget
  for (int n = 0; n < kSamples; ++n) {
    ASSERT_TRUE((*file)->Append(Sample(n)).ok());
    ASSERT_LE(fs::file_size(path_), kBudget) << "after sample " << n;
    ASSERT_EQ(fs::file_size(path_), (*file)->size());
  }
  EXPECT_GE((*file)->stride(), 128u);
  std::vector<int> steps = ReadSteps();
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps.front(), 0);
  EXPECT_EQ(steps.back(), kSamples - 1);
  // Still a series worth drawing: more than a quarter of the budget's lines, in order, spread
  // over the whole run (no gap wider than a few strides).
  EXPECT_GT(steps.size() * Sample(kSamples).size(), kBudget / 4);
  for (size_t i = 1; i < steps.size(); ++i) {
    ASSERT_LT(steps[i - 1], steps[i]);
    ASSERT_LE(steps[i] - steps[i - 1], static_cast<int>(2 * (*file)->stride()));
  }
  // The rewrites left no temporary file beside it.
  EXPECT_EQ(std::distance(fs::directory_iterator(root_), fs::directory_iterator{}), 1);
}

// A reader that opened the file before a rewrite still reads the whole old file: the rewrite
// replaces it (rename), it never truncates it in place.
TEST_F(BoundedLineFileTest, ARewriteReplacesTheFileAtomically) {
  constexpr uint64_t kBudget = 4096;
  auto file = BoundedLineFile::Open(path_, kBudget);
  ASSERT_TRUE(file.ok());
  int n = 0;
  while (fs::file_size(path_) + Sample(n).size() + 1 <= kBudget) {
    ASSERT_TRUE((*file)->Append(Sample(n++)).ok());
  }
  struct stat before;
  ASSERT_EQ(::stat(path_.c_str(), &before), 0);
  std::ifstream reader(path_);
  ASSERT_TRUE((*file)->Append(Sample(n++)).ok());  // does not fit: the file is thinned
  EXPECT_EQ((*file)->stride(), 2u);
  struct stat after;
  ASSERT_EQ(::stat(path_.c_str(), &after), 0);
  EXPECT_NE(before.st_ino, after.st_ino);
  std::stringstream old_contents;
  old_contents << reader.rdbuf();
  EXPECT_EQ(old_contents.str().size(), static_cast<size_t>(before.st_size));
  EXPECT_EQ(old_contents.str().back(), '\n');
  std::vector<int> steps = ReadSteps();
  EXPECT_EQ(steps.front(), 0);
  EXPECT_EQ(steps.back(), n - 1);
}

TEST_F(BoundedLineFileTest, ReopeningCutsAPartlyWrittenLastLineAndAppendsAfterIt) {
  std::ofstream(path_) << Sample(0) << "\n" << Sample(1) << "\n{\"ts_ms\": 17000";
  auto file = BoundedLineFile::Open(path_, 1 << 20);
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Append(Sample(2)).ok());
  EXPECT_EQ(ReadSteps(), (std::vector<int>{0, 1, 2}));
}

TEST_F(BoundedLineFileTest, RefusesALineTooLongForTheBudget) {
  auto file = BoundedLineFile::Open(path_, 4096);
  ASSERT_TRUE(file.ok());
  absl::Status st = (*file)->Append(std::string(2000, 'x'));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find(path_), std::string::npos) << st;
  EXPECT_EQ(fs::file_size(path_), 0u);
}

}  // namespace
}  // namespace shoal::master
