#include "process/resource_limits.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace shoal::process {
namespace {

using ::testing::HasSubstr;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ResourceLimits::Options TestOptions() {
  static std::atomic<int> counter{0};
  ResourceLimits::Options options;
  options.cgroup_name = "shoal";
  options.instance_id = absl::StrCat("limits-test-", ::getpid(), "-", counter++);
  return options;
}

pid_t SpawnSleep() {
  pid_t pid;
  char arg0[] = "sleep", arg1[] = "1000";
  char* argv[] = {arg0, arg1, nullptr};
  EXPECT_EQ(::posix_spawnp(&pid, "sleep", nullptr, nullptr, argv, environ), 0);
  return pid;
}

TEST(ResourceLimitsTest, ThisMachineEnforcesMemoryAndTracksProcesses) {
  auto limits = ResourceLimits::Detect(TestOptions());
  // Never skipped: the agent's memory limits depend on it. The message says what is missing.
  EXPECT_TRUE(limits->enforces_memory()) << limits->Describe();
  EXPECT_TRUE(limits->tracks_processes()) << limits->Describe();
  EXPECT_TRUE(limits->notices().empty()) << ::testing::PrintToString(limits->notices());
  std::printf("[ limits   ] %s\n", limits->Describe().c_str());
}

TEST(ResourceLimitsTest, PlainDirectoryMeansAdvisoryLimitsWithReasons) {
  ResourceLimits::Options options = TestOptions();
  char dir[] = "/tmp/shoal_no_cgroups_XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  options.cgroup_root = dir;
  auto limits = ResourceLimits::Detect(options);
  EXPECT_FALSE(limits->enforces_memory());
  EXPECT_FALSE(limits->tracks_processes());
  ASSERT_EQ(limits->notices().size(), 2u);
  EXPECT_THAT(limits->notices()[0],
              HasSubstr("memory limits are advisory: no writable memory cgroup (v2 or v1)"));
  EXPECT_THAT(limits->notices()[0], HasSubstr(absl::StrCat("no cgroup v1 memory hierarchy at ",
                                                           dir, "/memory")));
  EXPECT_THAT(limits->notices()[1], HasSubstr("setsid"));
  auto task = limits->CreateTask("t", 1 << 20);
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_EQ(*task, nullptr);
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "nothing may be created in a non-cgroup dir";
  limits.reset();
  std::filesystem::remove_all(dir);
}

TEST(ResourceLimitsTest, TaskCgroupLimitsJoinsKillsAndRemoves) {
  auto limits = ResourceLimits::Detect(TestOptions());
  ASSERT_TRUE(limits->enforces_memory()) << limits->Describe();
  auto task = limits->CreateTask("task-1-worker_0", 64ull << 20);
  ASSERT_TRUE(task.ok()) << task.status();
  ASSERT_NE(*task, nullptr);
  TaskCgroup& cgroup = **task;

  bool has_memory = false;
  for (const TaskCgroup::Dir& dir : cgroup.dirs()) {
    ASSERT_TRUE(std::filesystem::is_directory(dir.path)) << dir.path;
    if (!dir.memory) continue;
    has_memory = true;
    std::string limit = Slurp(dir.path + (dir.v2 ? "/memory.max" : "/memory.limit_in_bytes"));
    EXPECT_EQ(limit, absl::StrCat(64ull << 20, "\n")) << dir.path;
  }
  EXPECT_TRUE(has_memory);

  pid_t pid = SpawnSleep();
  ASSERT_TRUE(cgroup.AddProcess(pid).ok());
  EXPECT_THAT(cgroup.Procs(), ::testing::ElementsAre(pid));
  EXPECT_FALSE(cgroup.TryRemove()) << "a cgroup with a member cannot be removed";
  cgroup.KillAll();
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_FALSE(cgroup.OomKilled());
  EXPECT_TRUE(cgroup.TryRemove());
  for (const TaskCgroup::Dir& dir : cgroup.dirs()) EXPECT_FALSE(std::filesystem::exists(dir.path));
}

TEST(ResourceLimitsTest, KillAndRemoveWaitsForMembersToDie) {
  auto limits = ResourceLimits::Detect(TestOptions());
  ASSERT_TRUE(limits->tracks_processes()) << limits->Describe();
  auto task = limits->CreateTask("busy", 0);
  ASSERT_TRUE(task.ok() && *task != nullptr);
  pid_t pid = SpawnSleep();
  ASSERT_TRUE((*task)->AddProcess(pid).ok());
  // Our own unreaped child: rmdir succeeds once it is a zombie.
  EXPECT_TRUE(
      (*task)->KillAndRemove(std::chrono::steady_clock::now() + std::chrono::seconds(10)).ok());
  int status;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
}

TEST(ResourceLimitsTest, KillAndRemoveTakesCgroupsATaskMadeBelowItsOwn) {
  auto limits = ResourceLimits::Detect(TestOptions());
  ASSERT_TRUE(limits->tracks_processes()) << limits->Describe();
  auto task = limits->CreateTask("nests", 0);
  ASSERT_TRUE(task.ok() && *task != nullptr);
  std::vector<std::string> nested;
  for (const TaskCgroup::Dir& dir : (*task)->dirs()) {
    if (!dir.tracking) continue;
    // What a task running its own container runtime or systemd-run --scope would leave.
    nested.push_back(dir.path + "/inner");
    nested.push_back(dir.path + "/inner/deeper");
  }
  ASSERT_FALSE(nested.empty());
  for (const std::string& path : nested) ASSERT_EQ(::mkdir(path.c_str(), 0755), 0) << path;
  pid_t pid = SpawnSleep();
  {
    std::ofstream procs(nested.back() + "/cgroup.procs");
    procs << pid;
  }
  EXPECT_THAT((*task)->Procs(), ::testing::ElementsAre(pid));
  EXPECT_TRUE(
      (*task)->KillAndRemove(std::chrono::steady_clock::now() + std::chrono::seconds(10)).ok());
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  for (const TaskCgroup::Dir& dir : (*task)->dirs()) {
    EXPECT_FALSE(std::filesystem::exists(dir.path));
  }
}

TEST(ResourceLimitsTest, DestructorRemovesTheInstanceDirectories) {
  std::vector<std::string> instance_dirs;
  {
    auto limits = ResourceLimits::Detect(TestOptions());
    ASSERT_TRUE(limits->tracks_processes());
    auto task = limits->CreateTask("t", 1 << 30);
    ASSERT_TRUE(task.ok() && *task != nullptr);
    for (const TaskCgroup::Dir& dir : (*task)->dirs()) {
      instance_dirs.push_back(std::filesystem::path(dir.path).parent_path());
    }
    EXPECT_TRUE((*task)->TryRemove());
  }
  ASSERT_FALSE(instance_dirs.empty());
  for (const std::string& dir : instance_dirs) EXPECT_FALSE(std::filesystem::exists(dir)) << dir;
}

TEST(ResourceLimitsTest, WithoutV2TracksThroughV1Pids) {
  ResourceLimits::Options options = TestOptions();
  options.allow_v2 = false;
  auto limits = ResourceLimits::Detect(options);
  EXPECT_THAT(limits->Describe(), HasSubstr("memory limits: cgroup v1 memory at"));
  EXPECT_THAT(limits->Describe(), HasSubstr("process tracking: cgroup v1 pids at"));
}

}  // namespace
}  // namespace shoal::process
