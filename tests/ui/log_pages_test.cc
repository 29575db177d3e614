#include "ui/log_pages.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "ui_test_support.h"

namespace shoal::ui {
namespace {

// n lines alternating between worker:0 and worker:1: "worker:<i%2> | line <i>".
std::string Lines(int n) {
  std::string out;
  for (int i = 0; i < n; ++i) absl::StrAppend(&out, "worker:", i % 2, " | line ", i, "\n");
  return out;
}

class LogPagesTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& text) {
    std::string path = dir_.path() + "/logs.txt";
    EXPECT_TRUE(WriteFileAtomically(path, text).ok());
    return path;
  }
  testing::TempDir dir_;
};

TEST_F(LogPagesTest, TheLastPageThenOlderPagesCoverEveryLineOnceInOrder) {
  std::string path = Write(Lines(10'000));  // many 64 KiB chunks
  LogPageRequest request;
  request.limit = 700;
  std::vector<std::string> all;
  auto page = ReadLogPage(path, request);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->end_offset, page->file_size);
  while (true) {
    std::vector<std::string> texts;
    for (const auto& line : page->lines) texts.push_back(line.text);
    all.insert(all.begin(), texts.begin(), texts.end());
    if (!page->more_before) break;
    request.before = page->start_offset;
    page = ReadLogPage(path, request);
    ASSERT_TRUE(page.ok());
  }
  ASSERT_EQ(all.size(), 10'000u);
  for (int i = 0; i < 10'000; ++i) ASSERT_EQ(all[i], absl::StrCat("line ", i));
}

TEST_F(LogPagesTest, ForwardPagesFromAnOffsetAndOffsetsPointAtTheirLines) {
  std::string text = Lines(1000);
  std::string path = Write(text);
  LogPageRequest request;
  request.after = 0;
  request.limit = 300;
  int seen = 0;
  while (true) {
    auto page = ReadLogPage(path, request);
    ASSERT_TRUE(page.ok());
    for (const auto& line : page->lines) {
      EXPECT_EQ(line.text, absl::StrCat("line ", seen));
      EXPECT_EQ(text.substr(line.offset, line.task.size() + 3 + line.text.size()),
                absl::StrCat(line.task, " | ", line.text));
      ++seen;
    }
    if (page->end_offset == page->file_size) break;
    request.after = page->end_offset;
  }
  EXPECT_EQ(seen, 1000);
}

TEST_F(LogPagesTest, ATaskFilterKeepsOnlyThatTaskAndStripsItsPrefix) {
  std::string path = Write(Lines(100));
  LogPageRequest request;
  request.task = "worker:1";
  request.limit = 10;
  auto page = ReadLogPage(path, request);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->lines.size(), 10u);
  EXPECT_EQ(page->lines.back().text, "line 99");
  EXPECT_EQ(page->lines.front().text, "line 81");
  for (const auto& line : page->lines) EXPECT_EQ(line.task, "worker:1");
}

TEST_F(LogPagesTest, AFilteredScanStopsAtItsBoundAndSaysWhereToGoOn) {
  std::string text;
  absl::StrAppend(&text, "worker:7 | rare\n");
  text += Lines(50'000);  // ~1 MB without worker:7
  std::string path = Write(text);
  LogPageRequest request;
  request.task = "worker:7";
  request.max_scan_bytes = 256 << 10;
  auto page = ReadLogPage(path, request);
  ASSERT_TRUE(page.ok());
  EXPECT_TRUE(page->lines.empty());
  EXPECT_TRUE(page->more_before);
  EXPECT_GT(page->start_offset, 0);
  int rounds = 0;
  while (page->lines.empty() && page->more_before && ++rounds < 100) {
    request.before = page->start_offset;
    page = ReadLogPage(path, request);
    ASSERT_TRUE(page.ok());
  }
  ASSERT_EQ(page->lines.size(), 1u);
  EXPECT_EQ(page->lines[0].text, "rare");
  EXPECT_EQ(page->lines[0].offset, 0);
  EXPECT_GT(rounds, 2);
}

TEST_F(LogPagesTest, ALineStillBeingWrittenWaitsForItsNewline) {
  std::string path = Write("worker:0 | done\nworker:0 | half");
  auto page = ReadLogPage(path, LogPageRequest{});
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->lines.size(), 1u);
  EXPECT_EQ(page->lines[0].text, "done");
  EXPECT_EQ(page->end_offset, 16);
  LogPageRequest forward;
  forward.after = 0;
  page = ReadLogPage(path, forward);
  ASSERT_EQ(page->lines.size(), 1u);
  EXPECT_EQ(page->end_offset, 16);
}

TEST_F(LogPagesTest, EmptyLinesLinesWithoutAPrefixAndHtmlAreKeptAsText) {
  std::string path = Write("\nplain text\nworker:0 | <script>alert(1)</script>\n");
  auto page = ReadLogPage(path, LogPageRequest{});
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->lines.size(), 3u);
  EXPECT_EQ(page->lines[0].text, "");
  EXPECT_EQ(page->lines[1].task, "");
  EXPECT_EQ(page->lines[1].text, "plain text");
  EXPECT_EQ(page->lines[2].text, "<script>alert(1)</script>");
}

TEST_F(LogPagesTest, BadRequestsAreRefusedByName) {
  std::string path = Write(Lines(3));
  LogPageRequest both;
  both.before = 1;
  both.after = 1;
  EXPECT_TRUE(absl::IsInvalidArgument(ReadLogPage(path, both).status()));
  LogPageRequest past;
  past.after = 1 << 20;
  auto status = ReadLogPage(path, past).status();
  EXPECT_TRUE(absl::IsInvalidArgument(status));
  EXPECT_NE(status.message().find("after"), std::string::npos);
  LogPageRequest zero;
  zero.limit = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(ReadLogPage(path, zero).status()));
  EXPECT_TRUE(absl::IsNotFound(ReadLogPage(dir_.path() + "/none.txt", LogPageRequest{}).status()));
}

}  // namespace
}  // namespace shoal::ui
