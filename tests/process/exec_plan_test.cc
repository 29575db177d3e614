#include "process/exec_plan.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "process/process_launcher.h"

namespace shoal::process {
namespace {

// A master starts TensorBoard on one thread while its backend starts agents on another; each
// child runs on its spawning thread's stack until exec, so concurrent spawns must not share one.
TEST(ExecPlanTest, ThreadsSpawnAtOnceAndEachChildRunsItsOwnCommand) {
  constexpr int kThreads = 4;
  constexpr int kSpawnsPerThread = 150;
  int dev_null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  ASSERT_GE(dev_null, 0);
  std::atomic<int> wrong{0};
  std::vector<std::string> failures(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, dev_null, &wrong, &failures] {
      ProcessSpec ok;
      ok.key = absl::StrCat("ok", t);
      ok.argv = {"/bin/sh", "-c", absl::StrCat("exit ", 10 + t)};
      ProcessSpec missing;
      missing.key = absl::StrCat("missing", t);
      missing.argv = {absl::StrCat("/nonexistent/shoal-exec-plan-test-", t)};
      auto ok_plan = ExecPlan::Build(ok);
      auto missing_plan = ExecPlan::Build(missing);
      if (!ok_plan.ok() || !missing_plan.ok()) {
        ++wrong;
        failures[t] = "cannot build the plans";
        return;
      }
      ChildSetup setup;
      setup.stdin_fd = setup.stdout_fd = setup.stderr_fd = dev_null;
      setup.die_with_parent = false;
      for (int i = 0; i < kSpawnsPerThread; ++i) {
        if (i % 3 == 2) {
          // The failure is written by the child into this thread's frame.
          auto child = SystemLauncher().Launch(*missing_plan, setup);
          if (child.ok() || !absl::IsNotFound(child.status())) {
            ++wrong;
            failures[t] = child.ok() ? "a missing binary started"
                                     : std::string(child.status().message());
          }
          continue;
        }
        auto child = SystemLauncher().Launch(*ok_plan, setup);
        if (!child.ok()) {
          ++wrong;
          failures[t] = std::string(child.status().message());
          continue;
        }
        int status = 0;
        while (::waitpid(child->pid, &status, 0) < 0 && errno == EINTR) {
        }
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 10 + t) {
          ++wrong;
          failures[t] = absl::StrCat("a child of thread ", t, " ended with status ", status);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  ::close(dev_null);
  EXPECT_EQ(wrong.load(), 0) << absl::StrJoin(failures, "; ");
}

}  // namespace
}  // namespace shoal::process
