#include "master/resource_logs.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "nlohmann/json.hpp"

namespace shoal::master {
namespace {

namespace fs = std::filesystem;

class ResourceLogsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "resource-logs-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
  }
  void TearDown() override { fs::remove_all(root_); }

  std::vector<nlohmann::json> Read(const std::string& dir_name) {
    std::ifstream in(root_ / "tasks" / dir_name / "resources.jsonl");
    std::vector<nlohmann::json> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
    return lines;
  }

  static ResourceSample At(uint32_t attempt, int64_t ts, int64_t start, double cpu, uint64_t rss) {
    ResourceSample s;
    s.attempt = attempt;
    s.ts_unix_ms = ts;
    s.start_unix_ms = start;
    s.cpu_seconds_total = cpu;
    s.rss_bytes = rss;
    return s;
  }

  fs::path root_;
};

TEST(ResourceLineTest, HasTheFormTheDashboardReads) {
  ResourceSample s;
  s.attempt = 1;
  s.ts_unix_ms = 1'700'000'002'000;
  s.rss_bytes = 209'715'200;
  s.gpus = {{0, 87, 1'073'741'824}, {3, 5, 0}};
  EXPECT_EQ(ResourceLine(s, 123.456, 42),
            "{\"ts_ms\": 1700000002000, \"cpu_percent\": 123.5, \"rss_bytes\": 209715200, "
            "\"step\": 42, \"attempt\": 1, \"gpus\": [{\"index\": 0, \"util_percent\": 87, "
            "\"memory_bytes\": 1073741824}, {\"index\": 3, \"util_percent\": 5, "
            "\"memory_bytes\": 0}]}");
  s.gpus.clear();
  EXPECT_EQ(ResourceLine(s, 0, 0),
            "{\"ts_ms\": 1700000002000, \"cpu_percent\": 0.0, \"rss_bytes\": 209715200, "
            "\"step\": 0, \"attempt\": 1, \"gpus\": []}");
}

TEST(CpuPercentTest, IsOneHundredPerBusyCore) {
  EXPECT_DOUBLE_EQ(CpuPercent(1.0, 1000, 5.0, 3000), 200.0);
  EXPECT_DOUBLE_EQ(CpuPercent(1.0, 1000, 1.5, 2000), 50.0);
  EXPECT_EQ(CpuPercent(1.0, 1000, 2.0, 1000), 0);  // no time passed
  EXPECT_EQ(CpuPercent(5.0, 1000, 1.0, 2000), 0);  // the counter went back
}

TEST_F(ResourceLogsTest, EachAttemptIsASeriesOfItsOwn) {
  ResourceLogs logs(root_.string());
  const int64_t t0 = 1'700'000'000'000;
  logs.Add("worker-0", At(0, t0 + 2000, t0, 1.0, 100), 0);       // 1 s over 2 s since launch
  logs.Add("worker-0", At(0, t0 + 4000, t0, 4.0, 200), 7);       // 3 s over 2 s
  logs.Add("worker-0", At(0, t0 + 3000, t0, 3.0, 200), 7);       // late: dropped
  logs.Add("worker-0", At(1, t0 + 9000, t0 + 8000, 0.25, 50), 0);  // restarted: a new series
  logs.Add("ps-0", At(0, t0 + 2000, 0, 1.0, 10), 0);             // launch unknown: 0
  logs.Flush();
  std::vector<nlohmann::json> worker = Read("worker-0");
  ASSERT_EQ(worker.size(), 3u);
  EXPECT_EQ(worker[0]["cpu_percent"], 50.0);
  EXPECT_EQ(worker[1]["cpu_percent"], 150.0);
  EXPECT_EQ(worker[1]["step"], 7);
  EXPECT_EQ(worker[1]["rss_bytes"], 200);
  EXPECT_EQ(worker[1]["ts_ms"], t0 + 4000);
  EXPECT_EQ(worker[2]["attempt"], 1);
  EXPECT_EQ(worker[2]["cpu_percent"], 25.0);
  std::vector<nlohmann::json> ps = Read("ps-0");
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0]["cpu_percent"], 0.0);
}

TEST_F(ResourceLogsTest, KeepsEachFileWithinTheBudget) {
  constexpr uint64_t kBudget = 8 * 1024;
  {
    ResourceLogs logs(root_.string(), kBudget);
    for (int n = 0; n < 5000; ++n) {
      logs.Add("worker-0", At(0, 1'700'000'000'000 + 1000LL * (n + 1), 1'700'000'000'000, n, 1),
               static_cast<uint64_t>(n));
    }
  }  // the destructor writes what is queued
  EXPECT_LE(fs::file_size(root_ / "tasks" / "worker-0" / "resources.jsonl"), kBudget);
  std::vector<nlohmann::json> lines = Read("worker-0");
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.front()["step"], 0);
  EXPECT_EQ(lines.back()["step"], 4999);
}

}  // namespace
}  // namespace shoal::master
