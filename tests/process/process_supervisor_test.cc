#include "process/process_supervisor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "process/cgroup_fs.h"

namespace shoal::process {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

constexpr auto kDeadline = std::chrono::seconds(30);

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every temporary directory of this binary, removed when the last test has run.
std::vector<std::string>& TempDirs() {
  static std::vector<std::string> dirs;
  return dirs;
}
class RemoveTempDirs : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const auto& dir : TempDirs()) std::filesystem::remove_all(dir);
  }
};
[[maybe_unused]] ::testing::Environment* const kRemoveTempDirs =
    ::testing::AddGlobalTestEnvironment(new RemoveTempDirs);

std::string MakeTempDir() {
  std::string pattern = ::testing::TempDir() + "shoal_supervisor_XXXXXX";
  char* dir = ::mkdtemp(pattern.data());
  EXPECT_NE(dir, nullptr);
  TempDirs().push_back(pattern);
  return pattern;
}

// Waits until `pid` no longer runs: gone, or a zombie nobody has reaped yet (an orphan whose
// reaping by init is not ours to wait for). Event-driven through a pidfd, with a deadline.
bool WaitGone(pid_t pid) {
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return errno == ESRCH;
  pollfd pfd{fd, POLLIN, 0};
  int ready = ::poll(&pfd, 1, static_cast<int>(std::chrono::milliseconds(kDeadline).count()));
  ::close(fd);
  return ready == 1;
}

// Records everything the supervisor reports; the test thread waits on it with deadlines.
class Recorder {
 public:
  SupervisorCallbacks Callbacks() {
    SupervisorCallbacks callbacks;
    callbacks.on_output = [this](const std::string& key, OutputStream stream,
                                 std::string_view data) {
      std::lock_guard<std::mutex> lock(mu_);
      (stream == OutputStream::kStdout ? stdout_ : stderr_)[key].append(data);
      cv_.notify_all();
    };
    callbacks.on_exit = [this](const std::string& key, const ProcessExit& exit) {
      std::lock_guard<std::mutex> lock(mu_);
      exits_.emplace_back(key, exit);
      exit_times_[key] = Clock::now();
      stdout_at_exit_[key] = stdout_[key].size();
      cv_.notify_all();
    };
    callbacks.on_notice = [this](const std::string& notice) {
      std::lock_guard<std::mutex> lock(mu_);
      notices_.push_back(notice);
      cv_.notify_all();
    };
    return callbacks;
  }

  // Waits until `key` has exited and returns how; fails the test on timeout.
  ProcessExit WaitExit(const std::string& key) {
    std::unique_lock<std::mutex> lock(mu_);
    bool done = cv_.wait_for(lock, kDeadline, [&] { return FindExit(key) != nullptr; });
    EXPECT_TRUE(done) << "no exit reported for " << key;
    return done ? *FindExit(key) : ProcessExit{};
  }

  bool WaitExitCount(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kDeadline, [&] { return exits_.size() >= n; });
  }

  // Waits until stdout of `key` has at least `lines` newlines.
  std::string WaitStdoutLines(const std::string& key, size_t lines) {
    std::unique_lock<std::mutex> lock(mu_);
    bool done = cv_.wait_for(lock, kDeadline, [&] {
      return static_cast<size_t>(std::count(stdout_[key].begin(), stdout_[key].end(), '\n')) >=
             lines;
    });
    EXPECT_TRUE(done) << "stdout of " << key << " so far: " << stdout_[key];
    return stdout_[key];
  }

  std::string Stdout(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    return stdout_[key];
  }
  std::string Stderr(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    return stderr_[key];
  }
  size_t StdoutSizeAtExit(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    return stdout_at_exit_[key];
  }
  Clock::time_point ExitTime(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    return exit_times_[key];
  }
  std::vector<std::pair<std::string, ProcessExit>> Exits() {
    std::lock_guard<std::mutex> lock(mu_);
    return exits_;
  }
  std::vector<std::string> Notices() {
    std::lock_guard<std::mutex> lock(mu_);
    return notices_;
  }

 private:
  const ProcessExit* FindExit(const std::string& key) {
    for (const auto& [k, exit] : exits_) {
      if (k == key) return &exit;
    }
    return nullptr;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> stdout_, stderr_;
  std::map<std::string, size_t> stdout_at_exit_;
  std::vector<std::pair<std::string, ProcessExit>> exits_;
  std::map<std::string, Clock::time_point> exit_times_;
  std::vector<std::string> notices_;
};

ProcessSpec Spec(const std::string& key, std::vector<std::string> argv) {
  ProcessSpec spec;
  spec.key = key;
  spec.argv = std::move(argv);
  spec.env = {{"PATH", "/usr/bin:/bin"}};
  spec.working_dir = "/";
  return spec;
}

ProcessSpec Shell(const std::string& key, const std::string& script) {
  return Spec(key, {"sh", "-c", script});
}

// The directories of the cgroups `pid` sits in below a "shoal" directory, one per hierarchy.
std::vector<std::string> ShoalCgroupDirsOf(pid_t pid) {
  std::vector<std::string> dirs;
  std::string text = ReadWholeFile(absl::StrCat("/proc/", pid, "/cgroup"));
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3 || parts[2].find("/shoal/") == std::string::npos) continue;
    std::string first_controller = parts[1].substr(0, parts[1].find(','));
    std::string mount = first_controller.empty() ? "/sys/fs/cgroup/unified"
                                                 : "/sys/fs/cgroup/" + first_controller;
    dirs.push_back(mount + parts[2]);
  }
  return dirs;
}

std::vector<pid_t> ParsePids(const std::string& text) {
  std::vector<pid_t> pids;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
    int pid;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &pid)) pids.push_back(pid);
  }
  return pids;
}

class ProcessSupervisorTest : public ::testing::Test {
 protected:
  void SetUp() override { supervisor_ = MakeSupervisor(SupervisorOptions{}); }

  std::unique_ptr<ProcessSupervisor> MakeSupervisor(SupervisorOptions options) {
    auto supervisor = ProcessSupervisor::Create(std::move(options), recorder_.Callbacks());
    EXPECT_TRUE(supervisor.ok()) << supervisor.status();
    return supervisor.ok() ? std::move(*supervisor) : nullptr;
  }

  Recorder recorder_;
  std::unique_ptr<ProcessSupervisor> supervisor_;
};

TEST_F(ProcessSupervisorTest, ReportsExitCode) {
  ASSERT_TRUE(supervisor_->Launch(Shell("worker:0", "exit 3")).ok());
  ProcessExit exit = recorder_.WaitExit("worker:0");
  EXPECT_EQ(exit.exit_code, 3);
  EXPECT_EQ(exit.signal, 0);
  EXPECT_FALSE(exit.stopped_by_request);
  EXPECT_FALSE(exit.oom_killed);
  EXPECT_EQ(supervisor_->LiveCount(), 0u);
}

// The resource sampler measures what this lists: each live process with its cgroups.
TEST_F(ProcessSupervisorTest, ListsLiveProcessesWithTheirCgroupsUntilTheyExit) {
  auto pid = supervisor_->Launch(Spec("worker:0", {"sleep", "1000"}));
  ASSERT_TRUE(pid.ok()) << pid.status();
  std::vector<ProcessSupervisor::LiveProcess> live = supervisor_->LiveProcesses();
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].key, "worker:0");
  EXPECT_EQ(live[0].pid, *pid);
  for (const auto& dir : live[0].cgroup_dirs) {
    EXPECT_THAT(cgroup_fs::Read(dir.path + "/cgroup.procs").value_or(""),
                HasSubstr(std::to_string(*pid)))
        << dir.path;
  }
  supervisor_->Stop("worker:0", std::chrono::milliseconds(0));
  recorder_.WaitExit("worker:0");
  EXPECT_TRUE(supervisor_->LiveProcesses().empty());
}

TEST_F(ProcessSupervisorTest, ReportsSigkillFromOutsideAsSignal9) {
  auto pid = supervisor_->Launch(Spec("victim", {"sleep", "1000"}));
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(supervisor_->LiveCount(), 1u);
  auto killed_at = Clock::now();
  ASSERT_EQ(::kill(*pid, SIGKILL), 0);
  ProcessExit exit = recorder_.WaitExit("victim");
  EXPECT_EQ(exit.signal, SIGKILL);
  EXPECT_FALSE(exit.stopped_by_request);
  EXPECT_FALSE(exit.oom_killed);
  // A sanity print, not an assertion: timing on a shared 2-core machine is not a contract.
  auto latency = std::chrono::duration_cast<std::chrono::microseconds>(
      recorder_.ExitTime("victim") - killed_at);
  std::printf("[ latency  ] kill(SIGKILL) -> on_exit: %lld us\n",
              static_cast<long long>(latency.count()));
}

TEST_F(ProcessSupervisorTest, CapturesOutputInOrderToCallbacksAndFiles) {
  std::string dir = MakeTempDir();
  ProcessSpec spec = Shell("talker", "echo one; echo two >&2; echo three; printf four >&2");
  spec.stdout_path = dir + "/logs/deeper/talker.out";  // directories are created
  spec.stderr_path = dir + "/logs/talker.err";
  ASSERT_TRUE(supervisor_->Launch(spec).ok());
  EXPECT_EQ(recorder_.WaitExit("talker").exit_code, 0);
  EXPECT_EQ(recorder_.Stdout("talker"), "one\nthree\n");
  EXPECT_EQ(recorder_.Stderr("talker"), "two\nfour");
  EXPECT_EQ(ReadWholeFile(spec.stdout_path), "one\nthree\n");
  EXPECT_EQ(ReadWholeFile(spec.stderr_path), "two\nfour");
}

TEST_F(ProcessSupervisorTest, OutputFilesAreAppendedTo) {
  std::string dir = MakeTempDir();
  ProcessSpec spec = Shell("appender", "echo first");
  spec.stdout_path = dir + "/out.log";
  ASSERT_TRUE(supervisor_->Launch(spec).ok());
  recorder_.WaitExit("appender");
  Recorder second;
  auto other = ProcessSupervisor::Create(SupervisorOptions{}, second.Callbacks());
  ASSERT_TRUE(other.ok());
  spec.argv = {"sh", "-c", "echo second"};
  ASSERT_TRUE((*other)->Launch(spec).ok());
  second.WaitExit("appender");
  EXPECT_EQ(ReadWholeFile(spec.stdout_path), "first\nsecond\n");
}

TEST_F(ProcessSupervisorTest, CapturesLargeOutputCompletelyBeforeOnExit) {
  std::string dir = MakeTempDir();
  ProcessSpec spec = Shell("big", "seq 1 800000; seq 1 1000 >&2");
  spec.stdout_path = dir + "/big.out";
  std::string expected;
  for (int i = 1; i <= 800000; ++i) absl::StrAppend(&expected, i, "\n");
  ASSERT_GT(expected.size(), 5'000'000u);
  ASSERT_TRUE(supervisor_->Launch(spec).ok());
  EXPECT_EQ(recorder_.WaitExit("big").exit_code, 0);
  EXPECT_EQ(recorder_.StdoutSizeAtExit("big"), expected.size());
  EXPECT_TRUE(recorder_.Stdout("big") == expected) << "stdout differs from seq 1 800000";
  EXPECT_TRUE(ReadWholeFile(spec.stdout_path) == expected) << "file differs from seq 1 800000";
  std::string err = recorder_.Stderr("big");
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1000);
}

TEST_F(ProcessSupervisorTest, EnvironmentIsExactlyTheGivenMap) {
  ProcessSpec spec = Spec("env", {"env"});
  spec.env = {{"PATH", "/usr/bin:/bin"}, {"A", "1"}, {"B", "two words"}, {"EMPTY", ""}};
  ASSERT_TRUE(supervisor_->Launch(spec).ok());
  EXPECT_EQ(recorder_.WaitExit("env").exit_code, 0);
  std::vector<std::string> lines =
      absl::StrSplit(recorder_.Stdout("env"), '\n', absl::SkipEmpty());
  std::sort(lines.begin(), lines.end());
  EXPECT_THAT(lines, ::testing::ElementsAre("A=1", "B=two words", "EMPTY=", "PATH=/usr/bin:/bin"));
}

TEST_F(ProcessSupervisorTest, FindsCommandThroughAgentPathWhenEnvHasNone) {
  ProcessSpec spec = Spec("env", {"env"});
  spec.env = {{"ONLY", "this"}};
  ASSERT_TRUE(supervisor_->Launch(spec).ok());
  EXPECT_EQ(recorder_.WaitExit("env").exit_code, 0);
  EXPECT_EQ(recorder_.Stdout("env"), "ONLY=this\n");
}

TEST_F(ProcessSupervisorTest, HonoursWorkingDirectory) {
  std::string dir = MakeTempDir();
  ProcessSpec spec = Spec("pwd", {"pwd", "-P"});
  spec.working_dir = dir;
  ASSERT_TRUE(supervisor_->Launch(spec).ok());
  EXPECT_EQ(recorder_.WaitExit("pwd").exit_code, 0);
  EXPECT_EQ(recorder_.Stdout("pwd"), std::filesystem::canonical(dir).string() + "\n");
}

TEST_F(ProcessSupervisorTest, MissingBinaryIsAClearErrorWithoutOnExit) {
  auto pid = supervisor_->Launch(Spec("ghost", {"shoal-no-such-binary-xyz", "--flag"}));
  ASSERT_FALSE(pid.ok());
  EXPECT_EQ(pid.status().code(), absl::StatusCode::kNotFound) << pid.status();
  EXPECT_THAT(pid.status().message(), HasSubstr("shoal-no-such-binary-xyz"));
  EXPECT_THAT(pid.status().message(), HasSubstr("No such file or directory"));
  EXPECT_THAT(pid.status().message(), HasSubstr("ghost"));
  EXPECT_EQ(supervisor_->LiveCount(), 0u);

  // Nothing is reported for it: a later process's exit is the only one.
  ASSERT_TRUE(supervisor_->Launch(Spec("marker", {"true"})).ok());
  recorder_.WaitExit("marker");
  auto exits = recorder_.Exits();
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].first, "marker");
  // The key is free again.
  EXPECT_TRUE(supervisor_->Launch(Spec("ghost", {"true"})).ok());
}

TEST_F(ProcessSupervisorTest, BadWorkingDirectoryIsAClearError) {
  ProcessSpec spec = Spec("lost", {"true"});
  spec.working_dir = "/nonexistent/shoal/dir";
  auto pid = supervisor_->Launch(spec);
  ASSERT_FALSE(pid.ok());
  EXPECT_THAT(pid.status().message(), HasSubstr("/nonexistent/shoal/dir"));
  EXPECT_THAT(pid.status().message(), HasSubstr("No such file or directory"));
  EXPECT_THAT(pid.status().message(), HasSubstr("'true'"));
}

TEST_F(ProcessSupervisorTest, NonExecutableFileIsPermissionDenied) {
  std::string dir = MakeTempDir();
  std::string path = dir + "/not-executable";
  std::ofstream(path) << "#!/bin/sh\nexit 0\n";
  ::chmod(path.c_str(), 0644);
  auto pid = supervisor_->Launch(Spec("noexec", {path}));
  ASSERT_FALSE(pid.ok());
  EXPECT_EQ(pid.status().code(), absl::StatusCode::kPermissionDenied) << pid.status();
  EXPECT_THAT(pid.status().message(), HasSubstr(path));
}

TEST_F(ProcessSupervisorTest, DuplicateLiveKeyIsRejected) {
  ASSERT_TRUE(supervisor_->Launch(Spec("dup", {"sleep", "1000"})).ok());
  auto second = supervisor_->Launch(Spec("dup", {"true"}));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists);
  supervisor_->Stop("dup", std::chrono::milliseconds(0));
  EXPECT_TRUE(recorder_.WaitExit("dup").stopped_by_request);
}

// As torchrun's workers: with autogroup scheduling a session is a scheduling group, and a task
// left in the agent's session would share one group's CPU weight with its siblings and the agent.
TEST_F(ProcessSupervisorTest, EachTaskLeadsASessionAndAProcessGroupOfItsOwn) {
  auto first = supervisor_->Launch(Spec("worker:0", {"sleep", "1000"}));
  auto second = supervisor_->Launch(Spec("worker:1", {"sleep", "1000"}));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  for (pid_t pid : {*first, *second}) {
    EXPECT_EQ(::getsid(pid), pid) << "task " << pid << " is not a session leader";
    EXPECT_EQ(::getpgid(pid), pid) << "task " << pid << " does not lead its process group";
  }
  EXPECT_NE(::getsid(*first), ::getsid(0));
  supervisor_->StopAll(std::chrono::milliseconds(0));
  recorder_.WaitExit("worker:0");
  recorder_.WaitExit("worker:1");
}

TEST_F(ProcessSupervisorTest, PinsCpuAffinity) {
  ProcessSpec spec = Spec("pinned", {"sleep", "1000"});
  spec.cpu_affinity = {0};
  auto pid = supervisor_->Launch(spec);
  ASSERT_TRUE(pid.ok()) << pid.status();
  std::string status = ReadWholeFile(absl::StrCat("/proc/", *pid, "/status"));
  EXPECT_THAT(status, HasSubstr("Cpus_allowed_list:\t0\n"));
  supervisor_->Stop("pinned", std::chrono::milliseconds(0));
  recorder_.WaitExit("pinned");
}

TEST_F(ProcessSupervisorTest, MemoryLimitKillsTheProcessAndReportsOom) {
  ASSERT_THAT(supervisor_->LimitsDescription(), ::testing::Not(HasSubstr("advisory")))
      << "this machine must offer a writable memory cgroup (v2 with the memory controller, or "
         "v1 at /sys/fs/cgroup/memory): "
      << supervisor_->LimitsDescription();
  ProcessSpec spec = Spec("hog", {"python3", "-c",
                                  "b = bytearray(300 << 20)\n"
                                  "print('survived', len(b))"});
  spec.memory_limit_bytes = 64ull << 20;
  auto pid = supervisor_->Launch(spec);
  ASSERT_TRUE(pid.ok()) << pid.status();
  ProcessExit exit = recorder_.WaitExit("hog");
  EXPECT_TRUE(exit.oom_killed);
  EXPECT_EQ(exit.signal, SIGKILL);
  EXPECT_THAT(recorder_.Stdout("hog"), ::testing::Not(HasSubstr("survived")));
}

TEST_F(ProcessSupervisorTest, ProcessWithinItsMemoryLimitIsNotOomKilled) {
  ProcessSpec spec = Spec("modest", {"python3", "-c", "b = bytearray(8 << 20)"});
  spec.memory_limit_bytes = 256ull << 20;
  ASSERT_TRUE(supervisor_->Launch(spec).ok());
  ProcessExit exit = recorder_.WaitExit("modest");
  EXPECT_EQ(exit.exit_code, 0);
  EXPECT_FALSE(exit.oom_killed);
}

TEST_F(ProcessSupervisorTest, StopEndsAProcessWithSigterm) {
  ASSERT_TRUE(supervisor_->Launch(Spec("sleeper", {"sleep", "1000"})).ok());
  supervisor_->Stop("sleeper", std::chrono::seconds(20));
  ProcessExit exit = recorder_.WaitExit("sleeper");
  EXPECT_EQ(exit.signal, SIGTERM);
  EXPECT_TRUE(exit.stopped_by_request);
}

TEST_F(ProcessSupervisorTest, StopSigkillsAProcessThatIgnoresSigtermAfterGrace) {
  // The trap is inherited by the exec'd sleep as "ignored".
  ASSERT_TRUE(
      supervisor_->Launch(Shell("stubborn", "trap '' TERM; echo ready; exec sleep 1000")).ok());
  recorder_.WaitStdoutLines("stubborn", 1);
  auto stopped_at = Clock::now();
  supervisor_->Stop("stubborn", std::chrono::milliseconds(200));
  ProcessExit exit = recorder_.WaitExit("stubborn");
  EXPECT_EQ(exit.signal, SIGKILL);
  EXPECT_TRUE(exit.stopped_by_request);
  EXPECT_GE(recorder_.ExitTime("stubborn") - stopped_at, std::chrono::milliseconds(200));
}

TEST_F(ProcessSupervisorTest, StopKillsAGrandchildThatCalledSetsid) {
  auto leader = supervisor_->Launch(
      Shell("escaper", "setsid sh -c 'echo $$; exec sleep 1000' & exec sleep 1000"));
  ASSERT_TRUE(leader.ok()) << leader.status();
  std::vector<pid_t> pids = ParsePids(recorder_.WaitStdoutLines("escaper", 1));
  ASSERT_EQ(pids.size(), 1u);
  pid_t grandchild = pids[0];
  ASSERT_EQ(::getsid(grandchild), grandchild) << "the grandchild did not get its own session";
  ASSERT_NE(::getpgid(grandchild), *leader);

  supervisor_->Stop("escaper", std::chrono::milliseconds(100));
  ProcessExit exit = recorder_.WaitExit("escaper");
  EXPECT_TRUE(exit.stopped_by_request);
  EXPECT_TRUE(WaitGone(grandchild))
      << "setsid'd grandchild " << grandchild << " survived Stop";
}

TEST_F(ProcessSupervisorTest, WithV1CgroupsOnlyStopStillKillsASetsidGrandchild) {
  Recorder recorder;
  SupervisorOptions options;
  options.allow_cgroup_v2 = false;
  auto supervisor = ProcessSupervisor::Create(options, recorder.Callbacks());
  ASSERT_TRUE(supervisor.ok()) << supervisor.status();
  ASSERT_THAT((*supervisor)->LimitsDescription(), HasSubstr("process tracking: cgroup v1"));
  ASSERT_TRUE((*supervisor)
                  ->Launch(Shell("escaper",
                                 "setsid sh -c 'echo $$; exec sleep 1000' & exec sleep 1000"))
                  .ok());
  std::vector<pid_t> pids = ParsePids(recorder.WaitStdoutLines("escaper", 1));
  ASSERT_EQ(pids.size(), 1u);
  (*supervisor)->Stop("escaper", std::chrono::milliseconds(100));
  recorder.WaitExit("escaper");
  EXPECT_TRUE(WaitGone(pids[0]));
}

TEST_F(ProcessSupervisorTest, TaskEndingNormallyTakesItsLeftoversWithIt) {
  // The leader exits only once its setsid'd grandchild has reported (through a fifo) that it
  // runs in its own session.
  ProcessSpec spec = Shell("parent",
                           "mkfifo started; setsid sh -c 'echo $$ > started; exec sleep 1000' & "
                           "read g < started; echo $g; sleep 1000 & echo $!; exit 0");
  spec.working_dir = MakeTempDir();
  ASSERT_TRUE(supervisor_->Launch(spec).ok());
  EXPECT_EQ(recorder_.WaitExit("parent").exit_code, 0);
  std::vector<pid_t> pids = ParsePids(recorder_.Stdout("parent"));
  ASSERT_EQ(pids.size(), 2u) << recorder_.Stdout("parent");
  for (pid_t pid : pids) {
    EXPECT_TRUE(WaitGone(pid)) << pid << " outlived its task";
  }
}

TEST_F(ProcessSupervisorTest, DestructorLeavesNoProcessOrCgroupBehind) {
  std::vector<pid_t> pids;
  std::vector<std::string> cgroup_dirs;
  for (int i = 0; i < 3; ++i) {
    std::string key = absl::StrCat("task:", i);
    auto leader = supervisor_->Launch(
        Shell(key, "sleep 1000 & echo $!; setsid sh -c 'echo $$; exec sleep 1000' & "
                   "exec sleep 1000"));
    ASSERT_TRUE(leader.ok()) << leader.status();
    pids.push_back(*leader);
    for (pid_t pid : ParsePids(recorder_.WaitStdoutLines(key, 2))) pids.push_back(pid);
    for (const std::string& dir : ShoalCgroupDirsOf(*leader)) cgroup_dirs.push_back(dir);
  }
  ASSERT_EQ(pids.size(), 9u);
  EXPECT_FALSE(cgroup_dirs.empty()) << "the tasks were not placed in any cgroup";
  supervisor_.reset();
  for (pid_t pid : pids) {
    EXPECT_TRUE(WaitGone(pid)) << pid << " survived";
  }
  for (const std::string& dir : cgroup_dirs) {
    EXPECT_FALSE(std::filesystem::exists(dir)) << dir << " was not removed";
    // The instance directory (the parent) goes too.
    EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(dir).parent_path()));
  }
  EXPECT_TRUE(recorder_.Exits().empty()) << "no on_exit during destruction";
}

TEST_F(ProcessSupervisorTest, StopAllLeavesNoProcessBehind) {
  std::vector<pid_t> pids;
  for (int i = 0; i < 4; ++i) {
    std::string key = absl::StrCat("rank:", i);
    std::string script = i % 2 == 0
                             ? "trap '' TERM; sleep 1000 & echo $!; "
                               "setsid sh -c 'echo $$; exec sleep 1000' & exec sleep 1000"
                             : "sleep 1000 & echo $!; "
                               "setsid sh -c 'echo $$; exec sleep 1000' & exec sleep 1000";
    auto leader = supervisor_->Launch(Shell(key, script));
    ASSERT_TRUE(leader.ok()) << leader.status();
    pids.push_back(*leader);
    for (pid_t pid : ParsePids(recorder_.WaitStdoutLines(key, 2))) pids.push_back(pid);
  }
  supervisor_->StopAll(std::chrono::milliseconds(100));
  ASSERT_TRUE(recorder_.WaitExitCount(4));
  EXPECT_EQ(supervisor_->LiveCount(), 0u);
  for (const auto& [key, exit] : recorder_.Exits()) EXPECT_TRUE(exit.stopped_by_request) << key;
  for (pid_t pid : pids) {
    EXPECT_TRUE(WaitGone(pid)) << pid << " survived StopAll";
  }
}

TEST_F(ProcessSupervisorTest, FiftyConcurrentProcessesAreEachReportedExactlyOnce) {
  constexpr int kThreads = 5;
  constexpr int kPerThread = 10;
  std::vector<std::thread> threads;
  std::atomic<int> launch_errors{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        int n = t * kPerThread + i;
        auto pid = supervisor_->Launch(
            Shell(absl::StrCat("short:", n), absl::StrCat("echo ", n, "; exit ", n % 7)));
        if (!pid.ok()) ++launch_errors;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  ASSERT_EQ(launch_errors.load(), 0);
  ASSERT_TRUE(recorder_.WaitExitCount(kThreads * kPerThread));
  EXPECT_EQ(supervisor_->LiveCount(), 0u);  // decremented before each on_exit
  std::map<std::string, int> seen;
  for (const auto& [key, exit] : recorder_.Exits()) {
    ++seen[key];
    int n;
    ASSERT_TRUE(absl::SimpleAtoi(key.substr(std::string("short:").size()), &n));
    EXPECT_EQ(exit.exit_code, n % 7) << key;
    EXPECT_EQ(recorder_.Stdout(key), absl::StrCat(n, "\n")) << key;
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(kThreads * kPerThread));
  for (const auto& [key, count] : seen) EXPECT_EQ(count, 1) << key;
}

TEST_F(ProcessSupervisorTest, CallbacksMayLaunchAgain) {
  std::atomic<int> restarts{0};
  Recorder recorder;
  SupervisorCallbacks callbacks = recorder.Callbacks();
  ProcessSupervisor* self = nullptr;
  auto record_exit = callbacks.on_exit;
  callbacks.on_exit = [&](const std::string& key, const ProcessExit& exit) {
    record_exit(key, exit);
    if (restarts.fetch_add(1) < 2) {
      EXPECT_TRUE(self->Launch(Shell(key, "exit 0")).ok());  // the key is free in on_exit
    }
  };
  auto supervisor = ProcessSupervisor::Create(SupervisorOptions{}, std::move(callbacks));
  ASSERT_TRUE(supervisor.ok());
  self = supervisor->get();
  ASSERT_TRUE(self->Launch(Shell("again", "exit 0")).ok());
  ASSERT_TRUE(recorder.WaitExitCount(3));
}

TEST(ProcessSupervisorWithoutCgroupsTest, SaysOnceThatMemoryLimitsAreAdvisoryAndStillRuns) {
  std::string empty_root = MakeTempDir();
  Recorder recorder;
  SupervisorOptions options;
  options.cgroup_root = empty_root;
  auto supervisor = ProcessSupervisor::Create(options, recorder.Callbacks());
  ASSERT_TRUE(supervisor.ok()) << supervisor.status();
  EXPECT_THAT((*supervisor)->LimitsDescription(), HasSubstr("advisory"));
  ProcessSpec spec = Shell("unlimited", "echo ok");
  spec.memory_limit_bytes = 64ull << 20;
  ASSERT_TRUE((*supervisor)->Launch(spec).ok());
  ASSERT_TRUE((*supervisor)->Launch(Shell("unlimited2", "echo ok")).ok());
  EXPECT_EQ(recorder.WaitExit("unlimited").exit_code, 0);
  EXPECT_EQ(recorder.WaitExit("unlimited2").exit_code, 0);
  int advisory = 0;
  for (const std::string& notice : recorder.Notices()) {
    if (notice.find("memory limits are advisory: no writable memory cgroup (v2 or v1)") == 0) {
      ++advisory;
    }
  }
  EXPECT_EQ(advisory, 1) << ::testing::PrintToString(recorder.Notices());
}

// In a Kubernetes pod the container's own limits bound the task: no cgroup is no news there.
TEST(ProcessSupervisorWithoutCgroupsTest, SaysNothingInAContainerThatBoundsItsTasks) {
  std::string empty_root = MakeTempDir();
  Recorder recorder;
  SupervisorOptions options;
  options.cgroup_root = empty_root;
  options.quiet_without_cgroups = true;
  auto supervisor = ProcessSupervisor::Create(options, recorder.Callbacks());
  ASSERT_TRUE(supervisor.ok()) << supervisor.status();
  ASSERT_TRUE((*supervisor)->Launch(Shell("task", "echo ok")).ok());
  EXPECT_EQ(recorder.WaitExit("task").exit_code, 0);
  EXPECT_TRUE(recorder.Notices().empty()) << ::testing::PrintToString(recorder.Notices());
}

TEST(ProcessSupervisorCreateTest, RejectsBadInstanceId) {
  SupervisorOptions options;
  options.instance_id = "../escape";
  EXPECT_EQ(ProcessSupervisor::Create(options, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shoal::process
