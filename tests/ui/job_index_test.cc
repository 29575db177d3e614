#include "ui/job_index.h"

#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "ui_test_support.h"

namespace shoal::ui {
namespace {

using testing::TempDir;
using testing::WriteJob;

JobIndex MakeIndex(const std::string& root, int64_t* now, bool alive = false) {
  return JobIndex(root, [now] { return *now; }, [alive](const std::string&) { return alive; });
}

TEST(JobIndexTest, PagesAreNewestFirstAndCoverEveryJobOnce) {
  TempDir root;
  for (int i = 0; i < 23; ++i) {
    WriteJob(root.path(), absl::StrCat("job-", 100 + i), "succeeded", 1000 + i, 2000 + i);
  }
  int64_t now = 10'000;
  JobIndex index = MakeIndex(root.path(), &now);
  std::vector<std::string> seen;
  for (int page = 1; page <= 3; ++page) {
    JobQuery query;
    query.page = page;
    query.per_page = 10;
    JobPage result = index.Query(query);
    EXPECT_EQ(result.total, 23);
    EXPECT_EQ(result.jobs.size(), page < 3 ? 10u : 3u);
    for (const auto& job : result.jobs) seen.push_back(job.job_id);
  }
  ASSERT_EQ(seen.size(), 23u);
  EXPECT_EQ(seen.front(), "job-122");
  EXPECT_EQ(seen.back(), "job-100");
  std::set<std::string> unique(seen.begin(), seen.end());
  EXPECT_EQ(unique.size(), 23u);
  JobQuery past_end;
  past_end.page = 4;
  past_end.per_page = 10;
  EXPECT_TRUE(index.Query(past_end).jobs.empty());
}

TEST(JobIndexTest, FiltersByStateAndTextAndCountsStatesAfterTheTextFilter) {
  TempDir root;
  WriteJob(root.path(), "alpha-1", "succeeded", 1, 2);
  WriteJob(root.path(), "alpha-2", "failed", 3, 4, 2, 0, "worker:0 exited with code 3");
  WriteJob(root.path(), "beta-1", "failed", 5, 6);
  int64_t now = 100;
  JobIndex index = MakeIndex(root.path(), &now);
  JobQuery query;
  query.text = "ALPHA";
  JobPage result = index.Query(query);
  EXPECT_EQ(result.total, 2);
  EXPECT_EQ(result.states["succeeded"], 1);
  EXPECT_EQ(result.states["failed"], 1);
  query.states = {"failed"};
  result = index.Query(query);
  ASSERT_EQ(result.total, 1);
  EXPECT_EQ(result.jobs[0].job_id, "alpha-2");
  EXPECT_EQ(result.states["failed"], 1);  // the state filter does not change the counts
  JobQuery by_reason;
  by_reason.text = "code 3";
  EXPECT_EQ(index.Query(by_reason).total, 1);
}

TEST(JobIndexTest, SortsByEveryKeyBothWays) {
  TempDir root;
  WriteJob(root.path(), "b-job", "succeeded", 10, 100, 1, 5);
  WriteJob(root.path(), "a-job", "failed", 20, 25, 1, 1);
  WriteJob(root.path(), "c-job", "killed", 30, 1000, 1, 0);
  int64_t now = 5000;
  JobIndex index = MakeIndex(root.path(), &now);
  auto order = [&](const std::string& sort) {
    JobQuery query;
    query.sort = sort;
    std::string out;
    for (const auto& job : index.Query(query).jobs) out += job.job_id.substr(0, 1);
    return out;
  };
  EXPECT_EQ(order("created"), "bac");
  EXPECT_EQ(order("-created"), "cab");
  EXPECT_EQ(order("name"), "abc");
  EXPECT_EQ(order("-duration"), "cba");
  EXPECT_EQ(order("-restarts"), "bac");
  EXPECT_EQ(order("state"), "acb");
}

TEST(JobIndexTest, ALiveStatusWithADeadMasterReadsLost) {
  TempDir root;
  WriteJob(root.path(), "run-1", "running", 1, 0);
  int64_t now = 100;
  JobIndex dead = MakeIndex(root.path(), &now, /*alive=*/false);
  JobPage page = dead.Query(JobQuery{});
  ASSERT_EQ(page.jobs.size(), 1u);
  EXPECT_EQ(page.jobs[0].state, "lost");
  EXPECT_NE(page.jobs[0].reason.find("master"), std::string::npos);
  JobIndex alive = MakeIndex(root.path(), &now, /*alive=*/true);
  EXPECT_EQ(alive.Query(JobQuery{}).jobs[0].state, "running");
}

TEST(JobIndexTest, SeesNewAndChangedJobsAndForgetsDeletedOnes) {
  TempDir root;
  WriteJob(root.path(), "one-1", "running", 1, 0);
  int64_t now = 100;
  JobIndex index = MakeIndex(root.path(), &now, /*alive=*/true);
  EXPECT_EQ(index.Query(JobQuery{}).total, 1);
  WriteJob(root.path(), "two-1", "succeeded", 2, 3);
  WriteJob(root.path(), "one-1", "succeeded", 1, 50, 2, 0, "every task exited 0");
  std::filesystem::remove_all(root.path() + "/two-1");
  now += 2000;  // past the refresh interval
  JobPage page = index.Query(JobQuery{});
  ASSERT_EQ(page.total, 1);
  EXPECT_EQ(page.jobs[0].state, "succeeded");
  EXPECT_EQ(page.jobs[0].reason, "every task exited 0");
}

TEST(JobIndexTest, DirectoriesDeletedWhileListedNeverBreakTheList) {
  TempDir root;
  for (int i = 0; i < 200; ++i) WriteJob(root.path(), absl::StrCat("j-", i), "succeeded", i, i + 1);
  int64_t now = 1;
  JobIndex index = MakeIndex(root.path(), &now);
  std::atomic<bool> done{false};
  std::thread deleter([&] {
    for (int i = 0; i < 200; i += 2) std::filesystem::remove_all(absl::StrCat(root.path(), "/j-", i));
    done = true;
  });
  int rounds = 0;
  while (!done || rounds < 3) {
    index.Refresh();
    JobPage page = index.Query(JobQuery{}, /*max_age_ms=*/1'000'000);
    EXPECT_LE(page.total, 200);
    EXPECT_GE(page.total, 100);
    for (const auto& job : page.jobs) EXPECT_FALSE(job.job_id.empty());
    ++rounds;
  }
  deleter.join();
  index.Refresh();
  EXPECT_EQ(index.Query(JobQuery{}, 1'000'000).total, 100);
}

TEST(JobIndexTest, AJobWithoutStatusYetOrWithADamagedOneIsShownAsUnknown) {
  TempDir root;
  ASSERT_TRUE(MakeDirs(root.path() + "/new-1").ok());
  ASSERT_TRUE(WriteFileAtomically(root.path() + "/new-1/spec.yaml", "x").ok());
  WriteJob(root.path(), "bad-1", "succeeded", 1, 2);
  ASSERT_TRUE(WriteFileAtomically(root.path() + "/bad-1/status.json", "{\"state\": ").ok());
  ASSERT_TRUE(MakeDirs(root.path() + "/not-a-job").ok());
  int64_t now = 1;
  JobIndex index = MakeIndex(root.path(), &now, /*alive=*/true);
  JobPage page = index.Query(JobQuery{});
  ASSERT_EQ(page.total, 2);
  for (const auto& job : page.jobs) {
    EXPECT_EQ(job.state, "unknown") << job.job_id;
    EXPECT_FALSE(job.reason.empty());
  }
}

TEST(JobIndexTest, BadQueriesNameTheField) {
  JobQuery query;
  query.states = {"runing"};
  auto status = ValidateJobQuery(query);
  EXPECT_TRUE(absl::IsInvalidArgument(status));
  EXPECT_NE(status.message().find("runing"), std::string::npos);
  query = JobQuery{};
  query.sort = "-size";
  EXPECT_NE(ValidateJobQuery(query).message().find("sort"), std::string::npos);
  query = JobQuery{};
  query.per_page = 501;
  EXPECT_NE(ValidateJobQuery(query).message().find("per_page"), std::string::npos);
  query = JobQuery{};
  query.page = 0;
  EXPECT_NE(ValidateJobQuery(query).message().find("page"), std::string::npos);
  EXPECT_TRUE(ValidateJobQuery(JobQuery{}).ok());
}

}  // namespace
}  // namespace shoal::ui
