#include "machine/inventory.h"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "process/fake_process_launcher.h"

namespace shoal::machine {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// Removes this binary's temporary root once every test has run.
class RemoveTempRoot : public ::testing::Environment {
 public:
  void TearDown() override {
    std::filesystem::remove_all(std::filesystem::path(::testing::TempDir()) /
                                ("inventory_test_" + std::to_string(::getpid())));
  }
};
[[maybe_unused]] ::testing::Environment* const kRemoveTempRoot =
    ::testing::AddGlobalTestEnvironment(new RemoveTempRoot);

std::filesystem::path MakeTempDir(const std::string& name) {
  std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) /
                              ("inventory_test_" + std::to_string(::getpid())) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

void WriteText(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path);
  out << text;
}

// A fake nvidia-smi that runs `body` as a shell script.
std::string FakeNvidiaSmi(const std::filesystem::path& dir, const std::string& body) {
  std::filesystem::path script = dir / "nvidia-smi";
  WriteText(script, "#!/bin/sh\n" + body + "\n");
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  return script.string();
}

// A fake /proc and /sys tree with 16 GiB of MemTotal and the given /proc/self/cgroup.
std::filesystem::path FakeRoot(const std::string& name, const std::string& self_cgroup) {
  std::filesystem::path root = MakeTempDir(name);
  WriteText(root / "proc/meminfo", "MemTotal:       16777216 kB\nMemFree:         1000 kB\n");
  WriteText(root / "proc/self/cgroup", self_cgroup);
  return root;
}

InventoryOptions OptionsWithoutGpus() {
  InventoryOptions options;
  options.nvidia_smi = "/nonexistent/nvidia-smi";
  return options;
}

TEST(InventoryTest, DetectsCpusMemoryAndHostnameOfThisMachine) {
  MachineInventory inventory = DetectLocalInventory(OptionsWithoutGpus());
  EXPECT_GT(inventory.cpus, 0);
  EXPECT_GT(inventory.memory_bytes, 0u);
  EXPECT_FALSE(inventory.hostname.empty());
  EXPECT_THAT(inventory.gpus, IsEmpty());
}

TEST(InventoryTest, CountsCpusInTheAffinityMask) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_EQ(DetectLocalInventory(OptionsWithoutGpus()).cpus, CPU_COUNT(&set));
}

TEST(InventoryTest, DeclaresFakeGpusWithSequentialIds) {
  InventoryOptions options = OptionsWithoutGpus();
  options.fake_gpus = 3;
  EXPECT_THAT(DetectLocalInventory(options).gpus, ElementsAre("0", "1", "2"));
}

TEST(InventoryTest, FakeGpusWinOverNvidiaSmi) {
  std::filesystem::path dir = MakeTempDir("fake_wins");
  InventoryOptions options;
  options.nvidia_smi = FakeNvidiaSmi(dir, "echo 0; echo 1; echo 2; echo 3");
  options.fake_gpus = 0;
  EXPECT_THAT(DetectLocalInventory(options).gpus, IsEmpty());
}

TEST(InventoryTest, ReadsGpuIndicesFromNvidiaSmi) {
  std::filesystem::path dir = MakeTempDir("smi_ok");
  InventoryOptions options;
  options.nvidia_smi = FakeNvidiaSmi(
      dir, "[ \"$1\" = --query-gpu=index ] && [ \"$2\" = --format=csv,noheader ] || exit 3\n"
           "printf '0\\n1\\n 3 \\nWARNING: something\\n'");
  EXPECT_THAT(DetectLocalInventory(options).gpus, ElementsAre("0", "1", "3"));
}

TEST(InventoryTest, FindsNvidiaSmiOnPath) {
  std::filesystem::path dir = MakeTempDir("smi_path");
  FakeNvidiaSmi(dir, "echo 0");
  std::string old_path = std::getenv("PATH") ? std::getenv("PATH") : "";
  setenv("PATH", (dir.string() + ":" + old_path).c_str(), 1);
  MachineInventory inventory = DetectLocalInventory(InventoryOptions{});
  setenv("PATH", old_path.c_str(), 1);
  EXPECT_THAT(inventory.gpus, ElementsAre("0"));
}

TEST(InventoryTest, FailingNvidiaSmiMeansNoGpus) {
  std::filesystem::path dir = MakeTempDir("smi_fails");
  InventoryOptions options;
  options.nvidia_smi = FakeNvidiaSmi(dir, "echo 0; echo 'driver not loaded' >&2; exit 9");
  EXPECT_THAT(DetectLocalInventory(options).gpus, IsEmpty());
}

// The GPU query runs through the process launcher: with the operating system faked, the script
// on disk (which would report GPU 9) never runs, and what the fake program prints is parsed.
TEST(InventoryTest, QueriesNvidiaSmiThroughTheLauncher) {
  std::string smi = FakeNvidiaSmi(MakeTempDir("smi_through_launcher"), "echo 9");
  process::FakeProcessLauncher os;
  os.Install(smi, [](process::FakeProcessLauncher& os, pid_t pid) {
    os.Write(pid, process::OutputStream::kStdout, "0\n1\n");
    os.Exit(pid, 0);
  });
  InventoryOptions options;
  options.nvidia_smi = smi;
  options.launcher = &os;
  EXPECT_THAT(DetectLocalInventory(options).gpus, ElementsAre("0", "1"));
  std::vector<process::FakeProcessLauncher::Process> launches = os.Launches();
  ASSERT_EQ(launches.size(), 1u);
  EXPECT_THAT(launches[0].argv, ElementsAre(smi, "--query-gpu=index", "--format=csv,noheader"));
  EXPECT_EQ(launches[0].grouping, process::Grouping::kCallersGroup);
  EXPECT_TRUE(launches[0].reaped);
}

TEST(InventoryTest, NvidiaSmiKilledBySignalMeansNoGpus) {
  std::string smi = FakeNvidiaSmi(MakeTempDir("smi_signalled"), "echo 0");
  process::FakeProcessLauncher os;
  os.Install(smi, [](process::FakeProcessLauncher& os, pid_t pid) {
    os.Write(pid, process::OutputStream::kStdout, "0\n");
    os.Signal(pid, SIGSEGV, process::SignalTarget::kProcess);
  });
  InventoryOptions options;
  options.nvidia_smi = smi;
  options.launcher = &os;
  EXPECT_THAT(DetectLocalInventory(options).gpus, IsEmpty());
}

TEST(InventoryTest, MissingNvidiaSmiMeansNoGpus) {
  InventoryOptions options;
  options.nvidia_smi = "shoal-no-such-nvidia-smi";
  EXPECT_THAT(DetectLocalInventory(options).gpus, IsEmpty());
}

TEST(InventoryTest, ReadsMemTotalWhenNoCgroupLimits) {
  InventoryOptions options = OptionsWithoutGpus();
  options.root_dir = FakeRoot("no_limit", "0::/job\n").string();
  WriteText(options.root_dir + "/sys/fs/cgroup/job/memory.max", "max\n");
  EXPECT_EQ(DetectLocalInventory(options).memory_bytes, 16ull << 30);
}

TEST(InventoryTest, CgroupV2MemoryMaxBelowMemTotalWins) {
  InventoryOptions options = OptionsWithoutGpus();
  options.root_dir = FakeRoot("v2", "0::/user.slice/job\n").string();
  WriteText(options.root_dir + "/sys/fs/cgroup/user.slice/job/memory.max", "4294967296\n");
  EXPECT_EQ(DetectLocalInventory(options).memory_bytes, 4ull << 30);
}

TEST(InventoryTest, CgroupV2ParentLimitBindsTheChild) {
  InventoryOptions options = OptionsWithoutGpus();
  options.root_dir = FakeRoot("v2_parent", "0::/outer/inner\n").string();
  WriteText(options.root_dir + "/sys/fs/cgroup/outer/memory.max", "2147483648\n");
  WriteText(options.root_dir + "/sys/fs/cgroup/outer/inner/memory.max", "max\n");
  EXPECT_EQ(DetectLocalInventory(options).memory_bytes, 2ull << 30);
}

TEST(InventoryTest, CgroupV1LimitBelowMemTotalWins) {
  InventoryOptions options = OptionsWithoutGpus();
  options.root_dir =
      FakeRoot("v1", "5:cpu,cpuacct:/docker/x\n4:memory:/docker/x\n0::/\n").string();
  WriteText(options.root_dir + "/sys/fs/cgroup/memory/docker/x/memory.limit_in_bytes",
            "1073741824\n");
  EXPECT_EQ(DetectLocalInventory(options).memory_bytes, 1ull << 30);
}

TEST(InventoryTest, CgroupV1UnlimitedKeepsMemTotal) {
  InventoryOptions options = OptionsWithoutGpus();
  options.root_dir = FakeRoot("v1_unlimited", "4:memory:/\n").string();
  WriteText(options.root_dir + "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "9223372036854771712\n");
  EXPECT_EQ(DetectLocalInventory(options).memory_bytes, 16ull << 30);
}

TEST(InventoryTest, CgroupLimitAboveMemTotalIsIgnored) {
  InventoryOptions options = OptionsWithoutGpus();
  options.root_dir = FakeRoot("v2_big", "0::/job\n").string();
  WriteText(options.root_dir + "/sys/fs/cgroup/job/memory.max", "68719476736\n");
  EXPECT_EQ(DetectLocalInventory(options).memory_bytes, 16ull << 30);
}

}  // namespace
}  // namespace shoal::machine
