#include "common/journal.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "nlohmann/json.hpp"

namespace shoal {
namespace {

std::filesystem::path TempDir() {
  return std::filesystem::temp_directory_path() / ("shoal-journal-" + std::to_string(::getpid()));
}

class RemoveTempDir : public ::testing::Environment {
 public:
  void TearDown() override { std::filesystem::remove_all(TempDir()); }
};
[[maybe_unused]] ::testing::Environment* const kRemoveTempDir =
    ::testing::AddGlobalTestEnvironment(new RemoveTempDir);

std::string TempPath(const char* name) {
  std::filesystem::create_directories(TempDir());
  return (TempDir() / name).string();
}

TEST(JournalTest, RecordsBecomeVisibleOnlyAfterSync) {
  std::string path = TempPath("a.jsonl");
  std::filesystem::remove(path);
  auto journal = Journal::Open(path);
  ASSERT_TRUE(journal.ok()) << journal.status();
  (*journal)->Append({{"type", "one"}});
  (*journal)->Append({{"type", "two"}});
  EXPECT_TRUE(Journal::ReadAll(path)->empty());
  ASSERT_TRUE((*journal)->Sync().ok());
  auto records = Journal::ReadAll(path);
  ASSERT_TRUE(records.ok());
  ASSERT_EQ(records->size(), 2u);
  EXPECT_EQ((*records)[1]["type"], "two");
}

TEST(JournalTest, ReaderIgnoresATornLastLine) {
  std::string path = TempPath("torn.jsonl");
  {
    std::ofstream out(path, std::ios::trunc);
    out << "{\"type\":\"complete\"}\n{\"type\":\"to";
  }
  auto records = Journal::ReadAll(path);
  ASSERT_TRUE(records.ok());
  ASSERT_EQ(records->size(), 1u);
  EXPECT_EQ((*records)[0]["type"], "complete");
}

TEST(JournalTest, MissingFileIsNotFound) {
  auto records = Journal::ReadAll("/nonexistent/shoal/events.jsonl");
  EXPECT_EQ(records.status().code(), absl::StatusCode::kNotFound);
}

TEST(JournalTest, ReopeningContinuesAfterCuttingATornLastLine) {
  std::string path = TempPath("torn-reopen.jsonl");
  {
    std::ofstream out(path);
    out << "{\"n\":1}\n{\"n\":2}\n{\"n\":3, \"trunc";  // a writer killed mid-record
  }
  {
    auto journal = Journal::Open(path);
    ASSERT_TRUE(journal.ok()) << journal.status();
    (*journal)->Append({{"n", 4}});
    ASSERT_TRUE((*journal)->Sync().ok());
  }
  auto records = Journal::ReadAll(path);
  ASSERT_TRUE(records.ok());
  ASSERT_EQ(records->size(), 3u);
  EXPECT_EQ((*records)[0]["n"], 1);
  EXPECT_EQ((*records)[1]["n"], 2);
  EXPECT_EQ((*records)[2]["n"], 4);
}

}  // namespace
}  // namespace shoal
