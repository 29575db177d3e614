// The operating system's launcher: real processes, real signals, real exit statuses.
#include "process/process_launcher.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"

namespace shoal::process {
namespace {

using ::testing::HasSubstr;

constexpr int kDeadlineMs = 30'000;

ExecPlan Plan(std::vector<std::string> argv) {
  ProcessSpec spec;
  spec.key = "test";
  spec.argv = std::move(argv);
  spec.env = {{"PATH", "/usr/bin:/bin"}};
  absl::StatusOr<ExecPlan> plan = ExecPlan::Build(spec);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

ChildSetup Detached() {
  ChildSetup setup;
  setup.die_with_parent = false;
  return setup;
}

// Fields 5 (process group) and 6 (session) of /proc/<pid>/stat.
std::pair<pid_t, pid_t> GroupAndSession(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> fields = absl::StrSplit(text.substr(text.rfind(')') + 2), ' ');
  return {std::stoi(fields[2]), std::stoi(fields[3])};
}

TEST(SystemLauncherTest, ObservesTheExitCode) {
  absl::StatusOr<LaunchedProcess> child =
      SystemLauncher().Launch(Plan({"sh", "-c", "exit 7"}), Detached());
  ASSERT_TRUE(child.ok()) << child.status();
  // The exit fd becomes readable once it has exited.
  pollfd pfd{child->exit_fd.get(), POLLIN, 0};
  ASSERT_EQ(::poll(&pfd, 1, kDeadlineMs), 1);
  std::optional<ProcessExit> exit = SystemLauncher().Wait(child->pid);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 7);
  EXPECT_EQ(exit->signal, 0);
  EXPECT_EQ(ShellExitCode(*exit), 7);
  // Reaped: nothing is left to wait for.
  EXPECT_FALSE(SystemLauncher().Wait(child->pid).has_value());
}

TEST(SystemLauncherTest, ASignalToTheGroupEndsIt) {
  absl::StatusOr<LaunchedProcess> child =
      SystemLauncher().Launch(Plan({"sleep", "60"}), Detached());
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_FALSE(SystemLauncher().Poll(child->pid).has_value());  // still running
  SystemLauncher().Signal(child->pid, SIGTERM, SignalTarget::kProcessGroup);
  std::optional<ProcessExit> exit = SystemLauncher().Wait(child->pid);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->signal, SIGTERM);
  EXPECT_EQ(ShellExitCode(*exit), 128 + SIGTERM);
}

TEST(SystemLauncherTest, PollReapsAnEndedChild) {
  absl::StatusOr<LaunchedProcess> child =
      SystemLauncher().Launch(Plan({"sh", "-c", "exit 3"}), Detached());
  ASSERT_TRUE(child.ok()) << child.status();
  pollfd pfd{child->exit_fd.get(), POLLIN, 0};
  ASSERT_EQ(::poll(&pfd, 1, kDeadlineMs), 1);
  std::optional<ProcessExit> exit = SystemLauncher().Poll(child->pid);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 3);
}

TEST(SystemLauncherTest, PlacesTheChildInASessionAGroupOrTheCallersGroup) {
  struct Case {
    Grouping grouping;
    bool own_group;
    bool own_session;
  };
  for (Case c : {Case{Grouping::kNewSession, true, true},
                 Case{Grouping::kNewProcessGroup, true, false},
                 Case{Grouping::kCallersGroup, false, false}}) {
    ChildSetup setup = Detached();
    setup.grouping = c.grouping;
    absl::StatusOr<LaunchedProcess> child = SystemLauncher().Launch(Plan({"sleep", "60"}), setup);
    ASSERT_TRUE(child.ok()) << child.status();
    auto [group, session] = GroupAndSession(child->pid);
    EXPECT_EQ(group == child->pid, c.own_group) << static_cast<int>(c.grouping);
    EXPECT_EQ(session == child->pid, c.own_session) << static_cast<int>(c.grouping);
    if (!c.own_group) {
      EXPECT_EQ(group, ::getpgrp());
    }
    SystemLauncher().Signal(child->pid, SIGKILL, SignalTarget::kProcess);
    SystemLauncher().Wait(child->pid);
  }
}

TEST(SystemLauncherTest, HandsOverExtraFdsAtTheirNumbers) {
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  ChildSetup setup = Detached();
  setup.extra_fds[3] = fds[1];
  absl::StatusOr<LaunchedProcess> child =
      SystemLauncher().Launch(Plan({"sh", "-c", "echo ready >&3"}), setup);
  ::close(fds[1]);
  ASSERT_TRUE(child.ok()) << child.status();
  std::string got;
  char buf[64];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) got.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  EXPECT_EQ(got, "ready\n");
  std::optional<ProcessExit> exit = SystemLauncher().Wait(child->pid);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 0);
}

// A signal the caller ignores stays ignored in the child unless the setup resets it.
TEST(SystemLauncherTest, ResetsOnlyTheSignalsItIsAskedTo) {
  struct sigaction ignore {}, old{};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGUSR1, &ignore, &old), 0);
  ExecPlan plan = Plan({"sh", "-c", "kill -USR1 $$; exit 5"});
  ChildSetup keep = Detached();
  keep.default_signals = std::vector<int>{SIGPIPE};
  absl::StatusOr<LaunchedProcess> kept = SystemLauncher().Launch(plan, keep);
  ChildSetup reset_all = Detached();  // default_signals: every signal
  absl::StatusOr<LaunchedProcess> reset = SystemLauncher().Launch(plan, reset_all);
  ::sigaction(SIGUSR1, &old, nullptr);
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_TRUE(reset.ok()) << reset.status();
  std::optional<ProcessExit> kept_exit = SystemLauncher().Wait(kept->pid);
  std::optional<ProcessExit> reset_exit = SystemLauncher().Wait(reset->pid);
  ASSERT_TRUE(kept_exit.has_value());
  ASSERT_TRUE(reset_exit.has_value());
  EXPECT_EQ(kept_exit->exit_code, 5);
  EXPECT_EQ(reset_exit->signal, SIGUSR1);
}

TEST(SystemLauncherTest, AMissingCommandIsNotFoundAndNamesIt) {
  absl::StatusOr<LaunchedProcess> child =
      SystemLauncher().Launch(Plan({"/nonexistent/shoal-launcher-test"}), Detached());
  ASSERT_FALSE(child.ok());
  EXPECT_TRUE(absl::IsNotFound(child.status())) << child.status();
  EXPECT_THAT(child.status().message(), HasSubstr("/nonexistent/shoal-launcher-test"));
}

TEST(SystemLauncherTest, RefusesAnExtraFdOverStdio) {
  ChildSetup setup = Detached();
  setup.extra_fds[1] = STDERR_FILENO;
  absl::StatusOr<LaunchedProcess> child = SystemLauncher().Launch(Plan({"true"}), setup);
  ASSERT_FALSE(child.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(child.status())) << child.status();
}

// Success replaces this process (the e2e tests of `shoal tensorboard` and the MPI launcher see
// it); failure comes back as a Status naming the program.
TEST(ExecInPlaceTest, AMissingProgramComesBackAsNotFound) {
  absl::Status status = ExecInPlace({"shoal-exec-in-place-test-no-such-program"});
  EXPECT_TRUE(absl::IsNotFound(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("cannot run shoal-exec-in-place-test-no-such-program"));
  EXPECT_TRUE(absl::IsInvalidArgument(ExecInPlace({})));
}

}  // namespace
}  // namespace shoal::process
