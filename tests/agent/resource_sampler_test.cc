#include "agent/resource_sampler.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "agent/nvml.h"
#include "master/resource_logs.h"

namespace shoal::agent {
namespace {

namespace fs = std::filesystem;

constexpr long kTicks = 100;   // clock ticks per second of the fake /proc
constexpr long kPage = 4096;

class ResourceSamplerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "resource-sampler-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
    fs::create_directories(root_ / "proc");
    fs::create_directories(root_ / "proc" / "self");  // not a pid: skipped
  }
  void TearDown() override { fs::remove_all(root_); }

  // A /proc/<pid>/stat as the kernel writes it (proc(5)); the name has spaces and parentheses
  // as a real one may.
  void WriteStat(int pid, int ppid, uint64_t utime, uint64_t stime, uint64_t cutime,
                 uint64_t rss_pages) {
    fs::create_directories(root_ / "proc" / std::to_string(pid));
    std::ofstream(root_ / "proc" / std::to_string(pid) / "stat")
        << pid << " (py (worker) 1) S " << ppid << " " << pid << " " << pid << " 0 -1 4194304 "
        << "10 0 0 0 " << utime << " " << stime << " " << cutime << " 0 20 0 1 0 12345 "
        << "100000000 " << rss_pages << " 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1\n";
  }

  ResourceSampler MakeSampler(Nvml* nvml = nullptr) {
    ResourceSamplerOptions options;
    options.proc_root = (root_ / "proc").string();
    options.clock = &clock_;
    options.clock_ticks_per_second = kTicks;
    options.page_size = kPage;
    options.nvml = nvml;
    return ResourceSampler(options);
  }

  fs::path root_;
  FakeClock clock_;
};

TEST_F(ResourceSamplerTest, SumsTheWholeProcessTreeAndNothingElse) {
  WriteStat(100, 1, 50, 10, 0, 1000);     // the task
  WriteStat(101, 100, 20, 5, 15, 2000);   // its child, which reaped a grandchild (cutime)
  WriteStat(102, 101, 30, 0, 0, 500);     // a grandchild
  WriteStat(200, 1, 9000, 9000, 0, 9999); // another process of the machine
  WriteStat(201, 200, 9000, 9000, 0, 9999);
  ResourceSampler sampler = MakeSampler();
  std::vector<TaskUsage> usage = sampler.Sample({{"worker:0", 100, {}, {}}});
  ASSERT_EQ(usage.size(), 1u);
  EXPECT_EQ(usage[0].key, "worker:0");
  EXPECT_EQ(usage[0].ts_unix_ms, clock_.UnixMillis());
  EXPECT_DOUBLE_EQ(usage[0].cpu_seconds_total, (50 + 10 + 20 + 5 + 15 + 30) / 100.0);
  EXPECT_EQ(usage[0].rss_bytes, uint64_t{(1000 + 2000 + 500) * kPage});
  EXPECT_TRUE(usage[0].gpus.empty());
}

TEST_F(ResourceSamplerTest, TwoSamplesGiveTheCpuPercentOfTheInterval) {
  WriteStat(100, 1, 100, 0, 0, 10);
  WriteStat(101, 100, 0, 0, 0, 10);
  ResourceSampler sampler = MakeSampler();
  TaskUsage first = sampler.Sample({{"worker:0", 100, {}, {}}}).at(0);
  // Two seconds later the task and its child have used 1.5 CPU seconds each: one and a half
  // cores over the interval, 150%.
  clock_.Advance(std::chrono::seconds(2));
  WriteStat(100, 1, 250, 0, 0, 10);
  WriteStat(101, 100, 100, 50, 0, 10);
  TaskUsage second = sampler.Sample({{"worker:0", 100, {}, {}}}).at(0);
  EXPECT_EQ(second.ts_unix_ms - first.ts_unix_ms, 2000);
  EXPECT_DOUBLE_EQ(second.cpu_seconds_total - first.cpu_seconds_total, 3.0);
  EXPECT_DOUBLE_EQ(master::CpuPercent(first.cpu_seconds_total, first.ts_unix_ms,
                                      second.cpu_seconds_total, second.ts_unix_ms),
                   150.0);
}

TEST_F(ResourceSamplerTest, ATaskWhoseProcessIsGoneMeasuresZero) {
  ResourceSampler sampler = MakeSampler();
  std::vector<TaskUsage> usage = sampler.Sample({{"worker:0", 4242, {}, {}}});
  ASSERT_EQ(usage.size(), 1u);
  EXPECT_EQ(usage[0].cpu_seconds_total, 0);
  EXPECT_EQ(usage[0].rss_bytes, 0u);
}

TEST_F(ResourceSamplerTest, PrefersTheTasksV2CgroupForCpuAndMemory) {
  WriteStat(100, 1, 100, 0, 0, 10);
  fs::path cgroup = root_ / "cgroup" / "worker-0";
  fs::create_directories(cgroup);
  std::ofstream(cgroup / "cpu.stat") << "usage_usec 3500000\nuser_usec 3000000\nsystem_usec 500000\n";
  std::ofstream(cgroup / "memory.current") << "123456789\n";
  std::ofstream(cgroup / "cgroup.procs") << "100\n";
  process::TaskCgroup::Dir dir{cgroup.string(), /*v2=*/true, /*memory=*/true, /*tracking=*/true};
  ResourceSampler sampler = MakeSampler();
  TaskUsage usage = sampler.Sample({{"worker:0", 100, {dir}, {}}}).at(0);
  EXPECT_DOUBLE_EQ(usage.cpu_seconds_total, 3.5);
  EXPECT_EQ(usage.rss_bytes, 123456789u);
}

// A v1 tracking cgroup has no cpu.stat: its member processes are summed, those that left the
// task's process tree (a daemon reparented to init) included.
TEST_F(ResourceSamplerTest, SumsTheProcessesOfAV1TrackingCgroup) {
  WriteStat(100, 1, 100, 0, 0, 10);
  WriteStat(300, 1, 40, 60, 0, 30);  // escaped the tree, still in the cgroup
  WriteStat(400, 100, 7, 7, 0, 7);   // a child that is not in the cgroup: not counted
  fs::path cgroup = root_ / "cgroup" / "worker-0";
  fs::create_directories(cgroup);
  std::ofstream(cgroup / "cgroup.procs") << "100\n300\n";
  process::TaskCgroup::Dir dir{cgroup.string(), /*v2=*/false, /*memory=*/false, /*tracking=*/true};
  ResourceSampler sampler = MakeSampler();
  TaskUsage usage = sampler.Sample({{"worker:0", 100, {dir}, {}}}).at(0);
  EXPECT_DOUBLE_EQ(usage.cpu_seconds_total, 2.0);
  EXPECT_EQ(usage.rss_bytes, uint64_t{40 * kPage});
}

TEST(NvmlTest, AMissingLibraryGivesNoNvml) {
  EXPECT_EQ(Nvml::Load("/nonexistent/libnvidia-ml.so.1"), nullptr);
}

TEST(NvmlTest, ALibraryWithoutNvmlsFunctionsGivesNoNvml) {
  EXPECT_EQ(Nvml::Load("libc.so.6"), nullptr);
}

TEST_F(ResourceSamplerTest, WithoutNvmlATaskWithGpusHasNoGpuFields) {
  WriteStat(100, 1, 100, 0, 0, 10);
  std::unique_ptr<Nvml> nvml = Nvml::Load("/nonexistent/libnvidia-ml.so.1");
  ResourceSampler sampler = MakeSampler(nvml.get());
  TaskUsage usage = sampler.Sample({{"worker:0", 100, {}, {0, 1}}}).at(0);
  EXPECT_TRUE(usage.gpus.empty());
  EXPECT_DOUBLE_EQ(usage.cpu_seconds_total, 1.0);
}

}  // namespace
}  // namespace shoal::agent
