#include "serve/repository/version_settle_filter.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

namespace shoal::serve {
namespace {

using std::chrono::milliseconds;

RepositoryScan ScanOf(const std::vector<std::pair<int64_t, std::string>>& versions,
                      const std::string& model = "m") {
  RepositoryScan scan;
  ModelEntry entry;
  entry.name = model;
  entry.dir = "/repo/" + model;
  for (const auto& [v, fingerprint] : versions) {
    entry.versions.push_back({v, "/repo/" + model + "/" + std::to_string(v) + "/model.pt",
                              fingerprint});
  }
  scan.models.push_back(entry);
  return scan;
}

std::vector<int64_t> VersionsOf(const RepositoryScan& scan, const std::string& model = "m") {
  std::vector<int64_t> versions;
  for (const ModelEntry& m : scan.models) {
    if (m.name != model) continue;
    for (const VersionEntry& v : m.versions) versions.push_back(v.version);
  }
  return versions;
}

class VersionSettleFilterTest : public ::testing::Test {
 protected:
  FakeClock clock_;
  VersionSettleFilter filter_{&clock_, milliseconds(500)};
};

TEST_F(VersionSettleFilterTest, ANewVersionWaitsForTheSettleTime) {
  EXPECT_TRUE(VersionsOf(filter_.Settled(ScanOf({{1, "a 10 1"}}))).empty());
  clock_.Advance(milliseconds(499));
  EXPECT_TRUE(VersionsOf(filter_.Settled(ScanOf({{1, "a 10 1"}}))).empty());
  clock_.Advance(milliseconds(1));
  EXPECT_EQ(VersionsOf(filter_.Settled(ScanOf({{1, "a 10 1"}}))), std::vector<int64_t>{1});
}

TEST_F(VersionSettleFilterTest, AVersionMarkedCompleteIsSettledAtOnce) {
  RepositoryScan scan = ScanOf({{1, "model.pt 10 1"}, {2, "model.pt 10 2"}});
  scan.models[0].versions[1].marked_complete = true;
  EXPECT_EQ(VersionsOf(filter_.Settled(scan)), std::vector<int64_t>{2});
  clock_.Advance(milliseconds(500));
  EXPECT_EQ(VersionsOf(filter_.Settled(scan)), (std::vector<int64_t>{1, 2}));
}

TEST_F(VersionSettleFilterTest, AVersionStillBeingCopiedStartsItsWaitAgainOnEveryChange) {
  filter_.Settled(ScanOf({{2, "model.pt 100 1"}}));
  clock_.Advance(milliseconds(400));
  EXPECT_TRUE(VersionsOf(filter_.Settled(ScanOf({{2, "model.pt 200 2"}}))).empty());
  clock_.Advance(milliseconds(400));  // 800 ms since it appeared, 400 since it last changed
  EXPECT_TRUE(VersionsOf(filter_.Settled(ScanOf({{2, "model.pt 200 2"}}))).empty());
  clock_.Advance(milliseconds(100));
  EXPECT_EQ(VersionsOf(filter_.Settled(ScanOf({{2, "model.pt 200 2"}}))),
            std::vector<int64_t>{2});
}

TEST_F(VersionSettleFilterTest, SettledVersionsPassWhileANewerOneSettles) {
  filter_.AcceptAll(ScanOf({{1, "x"}}));
  EXPECT_EQ(VersionsOf(filter_.Settled(ScanOf({{1, "x"}, {2, "y"}}))), std::vector<int64_t>{1});
  clock_.Advance(milliseconds(500));
  EXPECT_EQ(VersionsOf(filter_.Settled(ScanOf({{1, "x"}, {2, "y"}}))),
            (std::vector<int64_t>{1, 2}));
}

TEST_F(VersionSettleFilterTest, TheStartupScanIsNotWaitedForAgain) {
  filter_.AcceptAll(ScanOf({{1, "x"}, {3, "z"}}));
  EXPECT_EQ(VersionsOf(filter_.Settled(ScanOf({{1, "x"}, {3, "z"}}))),
            (std::vector<int64_t>{1, 3}));
}

TEST_F(VersionSettleFilterTest, AStartupVersionThatChangesWaitsAgain) {
  filter_.AcceptAll(ScanOf({{1, "x"}}));
  EXPECT_TRUE(VersionsOf(filter_.Settled(ScanOf({{1, "x2"}}))).empty());
  clock_.Advance(milliseconds(500));
  EXPECT_EQ(VersionsOf(filter_.Settled(ScanOf({{1, "x2"}}))), std::vector<int64_t>{1});
}

TEST_F(VersionSettleFilterTest, AVersionRemovedAndPublishedAgainWaitsAgain) {
  filter_.AcceptAll(ScanOf({{4, "x"}}));
  filter_.Settled(ScanOf({}));  // removed: forgotten
  EXPECT_TRUE(VersionsOf(filter_.Settled(ScanOf({{4, "x"}}))).empty());
  clock_.Advance(milliseconds(500));
  EXPECT_EQ(VersionsOf(filter_.Settled(ScanOf({{4, "x"}}))), std::vector<int64_t>{4});
}

TEST_F(VersionSettleFilterTest, ModelsAreKeptWithoutTheirUnsettledVersions) {
  RepositoryScan settled = filter_.Settled(ScanOf({{1, "x"}}, "new_model"));
  ASSERT_EQ(settled.models.size(), 1u);
  EXPECT_EQ(settled.models[0].name, "new_model");
  EXPECT_TRUE(settled.models[0].versions.empty());
}

TEST_F(VersionSettleFilterTest, VersionsOfDifferentModelsSettleApart) {
  RepositoryScan both = ScanOf({{1, "x"}}, "a");
  both.models.push_back(ScanOf({{1, "x"}}, "b").models[0]);
  filter_.Settled(both);
  clock_.Advance(milliseconds(300));
  both.models[1].versions[0].fingerprint = "changed";
  filter_.Settled(both);
  clock_.Advance(milliseconds(200));
  RepositoryScan settled = filter_.Settled(both);
  EXPECT_EQ(VersionsOf(settled, "a"), std::vector<int64_t>{1});
  EXPECT_TRUE(VersionsOf(settled, "b").empty());
}

TEST(VersionSettleFilterZeroTest, AZeroSettleTimeLetsEveryVersionThroughAtOnce) {
  FakeClock clock;
  VersionSettleFilter filter(&clock, milliseconds(0));
  EXPECT_EQ(VersionsOf(filter.Settled(ScanOf({{7, "x"}}))), std::vector<int64_t>{7});
}

}  // namespace
}  // namespace shoal::serve
