// The supervisor over a FakeProcessLauncher: the operating system is faked, the supervisor (its
// epoll loop, pipes, exit fds, Stop's grace and kill) is the real one.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>

#include "process/fake_process_launcher.h"
#include "process/process_supervisor.h"

namespace shoal::process {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr auto kDeadline = std::chrono::seconds(30);

class Recorder {
 public:
  SupervisorCallbacks Callbacks() {
    SupervisorCallbacks callbacks;
    callbacks.on_output = [this](const std::string& key, OutputStream stream,
                                 std::string_view data) {
      std::lock_guard<std::mutex> lock(mu_);
      (stream == OutputStream::kStdout ? stdout_ : stderr_)[key].append(data);
    };
    callbacks.on_exit = [this](const std::string& key, const ProcessExit& exit) {
      std::lock_guard<std::mutex> lock(mu_);
      exits_[key] = exit;
      cv_.notify_all();
    };
    return callbacks;
  }
  std::optional<ProcessExit> WaitExit(const std::string& key) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, kDeadline, [&] { return exits_.count(key) != 0; })) {
      return std::nullopt;
    }
    return exits_[key];
  }
  std::string Stdout(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    return stdout_[key];
  }
  std::string Stderr(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    return stderr_[key];
  }
  size_t ExitCount() {
    std::lock_guard<std::mutex> lock(mu_);
    return exits_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> stdout_, stderr_;
  std::map<std::string, ProcessExit> exits_;
};

class SupervisorFakeOsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A plain directory for the cgroup root: a machine without cgroups, so that nothing real is
    // created for fake processes.
    std::string pattern = ::testing::TempDir() + "shoal_fake_os_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    cgroup_root_ = pattern;
    SupervisorOptions options;
    options.cgroup_root = cgroup_root_;
    options.launcher = &os_;
    auto supervisor = ProcessSupervisor::Create(options, recorder_.Callbacks());
    ASSERT_TRUE(supervisor.ok()) << supervisor.status();
    supervisor_ = std::move(*supervisor);
  }
  void TearDown() override {
    supervisor_.reset();
    std::filesystem::remove_all(cgroup_root_);
  }

  static ProcessSpec Spec(const std::string& key, const std::string& command) {
    ProcessSpec spec;
    spec.key = key;
    spec.argv = {command, "--epochs", "3"};
    spec.env = {{"RANK", "0"}};
    spec.working_dir = "/";
    return spec;
  }

  FakeProcessLauncher os_;  // outlives the supervisor
  Recorder recorder_;
  std::string cgroup_root_;
  std::unique_ptr<ProcessSupervisor> supervisor_;
};

TEST_F(SupervisorFakeOsTest, DeliversOutputAndTheExitCode) {
  os_.Install("/opt/train", [](FakeProcessLauncher& os, pid_t pid) {
    os.Write(pid, OutputStream::kStdout, "epoch 1\n");
    os.Write(pid, OutputStream::kStderr, "warning\n");
    os.Exit(pid, 3);
  });
  absl::StatusOr<int> pid = supervisor_->Launch(Spec("worker:0", "/opt/train"));
  ASSERT_TRUE(pid.ok()) << pid.status();
  std::optional<ProcessExit> exit = recorder_.WaitExit("worker:0");
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 3);
  EXPECT_EQ(exit->signal, 0);
  EXPECT_FALSE(exit->stopped_by_request);
  EXPECT_EQ(recorder_.Stdout("worker:0"), "epoch 1\n");
  EXPECT_EQ(recorder_.Stderr("worker:0"), "warning\n");
  EXPECT_EQ(supervisor_->LiveCount(), 0u);

  std::optional<FakeProcessLauncher::Process> launched = os_.Find(*pid);
  ASSERT_TRUE(launched.has_value());
  EXPECT_THAT(launched->argv, ElementsAre("/opt/train", "--epochs", "3"));
  EXPECT_THAT(launched->environment, ElementsAre("RANK=0"));
  // A task leads a session of its own and dies with its agent.
  EXPECT_EQ(launched->grouping, Grouping::kNewSession);
  EXPECT_TRUE(launched->die_with_parent);
  EXPECT_TRUE(launched->reaped);
}

// Stop: SIGTERM to the group; a task that ignores it gets SIGKILL once the grace has passed.
TEST_F(SupervisorFakeOsTest, StopSendsTermThenKillToATaskThatIgnoresTerm) {
  os_.Install("/opt/stubborn", [](FakeProcessLauncher& os, pid_t pid) {
    os.Ignore(pid, SIGTERM);
  });
  absl::StatusOr<int> pid = supervisor_->Launch(Spec("worker:1", "/opt/stubborn"));
  ASSERT_TRUE(pid.ok()) << pid.status();
  supervisor_->Stop("worker:1", std::chrono::milliseconds(20));
  std::optional<ProcessExit> exit = recorder_.WaitExit("worker:1");
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->signal, SIGKILL);
  EXPECT_TRUE(exit->stopped_by_request);
  std::vector<int> signals = os_.Find(*pid)->signals;
  ASSERT_GE(signals.size(), 2u);
  EXPECT_EQ(signals[0], SIGTERM);
  EXPECT_EQ(signals[1], SIGKILL);
}

TEST_F(SupervisorFakeOsTest, StopEndsATaskThatHonoursTerm) {
  os_.Install("/opt/polite", [](FakeProcessLauncher&, pid_t) {});
  absl::StatusOr<int> pid = supervisor_->Launch(Spec("worker:2", "/opt/polite"));
  ASSERT_TRUE(pid.ok()) << pid.status();
  supervisor_->Stop("worker:2", std::chrono::seconds(60));
  std::optional<ProcessExit> exit = recorder_.WaitExit("worker:2");
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->signal, SIGTERM);
  EXPECT_TRUE(exit->stopped_by_request);
}

TEST_F(SupervisorFakeOsTest, AFailedExecIsALaunchErrorWithNoExit) {
  absl::StatusOr<int> pid = supervisor_->Launch(Spec("worker:3", "/opt/missing"));
  ASSERT_FALSE(pid.ok());
  EXPECT_TRUE(absl::IsNotFound(pid.status())) << pid.status();
  EXPECT_THAT(pid.status().message(), HasSubstr("worker:3"));
  EXPECT_THAT(pid.status().message(), HasSubstr("/opt/missing"));
  EXPECT_EQ(supervisor_->LiveCount(), 0u);
  EXPECT_EQ(recorder_.ExitCount(), 0u);
}

// The destructor kills and reaps what still runs, through the launcher.
TEST_F(SupervisorFakeOsTest, DestroyingTheSupervisorKillsAndReapsLiveTasks) {
  os_.Install("/opt/forever", [](FakeProcessLauncher& os, pid_t pid) {
    os.Ignore(pid, SIGTERM);
  });
  absl::StatusOr<int> pid = supervisor_->Launch(Spec("worker:4", "/opt/forever"));
  ASSERT_TRUE(pid.ok()) << pid.status();
  supervisor_.reset();
  std::optional<FakeProcessLauncher::Process> p = os_.Find(*pid);
  ASSERT_TRUE(p.has_value());
  EXPECT_FALSE(p->running);
  EXPECT_TRUE(p->reaped);
  EXPECT_EQ(p->exit.signal, SIGKILL);
}

}  // namespace
}  // namespace shoal::process
