// The failure-handling state machine, against explicit time points: no sleeps, no processes.
#include "master/failure_policy.h"

#include <gtest/gtest.h>

namespace shoal::master {
namespace {

using Action = PolicyDecision::Action;
using std::chrono::milliseconds;

spec::Role MakeRole(const std::string& name, uint32_t instances, spec::OnFailure on_failure,
                    uint32_t max_restarts = 3) {
  spec::Role r;
  r.name = name;
  r.instances = instances;
  r.argv = {"/bin/true"};
  r.on_failure = on_failure;
  r.restart = on_failure == spec::OnFailure::kFailJob ? spec::RestartMode::kNever
                                                      : spec::RestartMode::kOnFailure;
  r.max_restarts = max_restarts;
  return r;
}

TaskRecord Task(const std::string& role, uint32_t index) {
  TaskRecord t;
  t.role = role;
  t.index = index;
  return t;
}

class FailurePolicyTest : public ::testing::Test {
 protected:
  FakeClock clock_;
  spec::JobSpec job_;
};

TEST_F(FailurePolicyTest, FailJobIsFinal) {
  job_.roles = {MakeRole("worker", 2, spec::OnFailure::kFailJob)};
  FailurePolicy policy(job_);
  auto d = policy.OnFailure(Task("worker", 1), "exited with code 3", false, 1, clock_.Now());
  EXPECT_EQ(d.action, Action::kFail);
  EXPECT_EQ(d.reason, "exited with code 3");
}

TEST_F(FailurePolicyTest, RestartNeverIsFinalWhateverTheAction) {
  job_.roles = {MakeRole("worker", 2, spec::OnFailure::kRestartTask)};
  job_.roles[0].restart = spec::RestartMode::kNever;
  FailurePolicy policy(job_);
  EXPECT_EQ(policy.OnFailure(Task("worker", 0), "x", false, 1, clock_.Now()).action, Action::kFail);
}

TEST_F(FailurePolicyTest, RestartTaskBacksOffExponentiallyUpToMaxThenSpendsItsBudget) {
  job_.roles = {MakeRole("worker", 2, spec::OnFailure::kRestartTask, 5)};
  job_.backoff.initial = milliseconds(1000);
  job_.backoff.max = milliseconds(5000);
  FailurePolicy policy(job_);
  std::vector<int64_t> delays;
  for (int i = 0; i < 5; ++i) {
    auto d = policy.OnFailure(Task("worker", 1), "exited with code 3", false, 1, clock_.Now());
    ASSERT_EQ(d.action, Action::kRestartTask);
    EXPECT_EQ(d.restart_number, static_cast<uint32_t>(i + 1));
    delays.push_back(d.delay.count());
  }
  EXPECT_EQ(delays, (std::vector<int64_t>{1000, 2000, 4000, 5000, 5000}));
  auto last = policy.OnFailure(Task("worker", 1), "exited with code 3", false, 1, clock_.Now());
  EXPECT_EQ(last.action, Action::kFail);
  EXPECT_EQ(last.reason, "exited with code 3; its restart limit (5) is spent");
  // Budgets are per task under restart-task.
  EXPECT_EQ(policy.OnFailure(Task("worker", 0), "x", false, 1, clock_.Now()).action,
            Action::kRestartTask);
  EXPECT_EQ(policy.task_restarts("worker:1"), 5u);
  EXPECT_EQ(policy.task_restarts("worker:0"), 1u);
}

TEST_F(FailurePolicyTest, ZeroInitialBackoffRestartsAtOnce) {
  job_.roles = {MakeRole("worker", 2, spec::OnFailure::kRestartTask)};
  job_.backoff.initial = milliseconds(0);
  FailurePolicy policy(job_);
  auto d = policy.OnFailure(Task("worker", 0), "x", false, 1, clock_.Now());
  EXPECT_EQ(d.delay, milliseconds(0));
  EXPECT_EQ(d.reason, "x; restarting in 0.0s (restart 1 of 3)");
}

TEST_F(FailurePolicyTest, RestartGroupSharesOneBudgetAcrossTasks) {
  job_.roles = {MakeRole("worker", 3, spec::OnFailure::kRestartGroup, 2)};
  job_.backoff.initial = milliseconds(100);
  FailurePolicy policy(job_);
  auto a = policy.OnFailure(Task("worker", 0), "x", false, 2, clock_.Now());
  auto b = policy.OnFailure(Task("worker", 2), "y", false, 2, clock_.Now());
  auto c = policy.OnFailure(Task("worker", 1), "z", false, 2, clock_.Now());
  EXPECT_EQ(a.action, Action::kRestartGroup);
  EXPECT_EQ(a.delay, milliseconds(100));
  EXPECT_EQ(b.action, Action::kRestartGroup);
  EXPECT_EQ(b.delay, milliseconds(200));
  EXPECT_EQ(c.action, Action::kFail);
  EXPECT_EQ(c.reason, "z; the job's restart limit (2) is spent");
  EXPECT_EQ(policy.group_restarts(), 2u);
}

TEST_F(FailurePolicyTest, FailuresDuringAGroupRestartCostNothing) {
  job_.roles = {MakeRole("worker", 3, spec::OnFailure::kRestartGroup, 1)};
  FailurePolicy policy(job_);
  EXPECT_EQ(policy.OnFailure(Task("worker", 0), "x", false, 2, clock_.Now()).action,
            Action::kRestartGroup);
  // Its peers die of the broken collective while being stopped: the same incident.
  for (uint32_t i : {1u, 2u}) {
    EXPECT_EQ(policy.OnFailure(Task("worker", i), "y", true, 2, clock_.Now()).action,
              Action::kJoinGroupRestart);
  }
  EXPECT_EQ(policy.group_restarts(), 1u);
}

TEST_F(FailurePolicyTest, RestartTaskRolesStayOutOfTheGroup) {
  job_.roles = {MakeRole("ps", 1, spec::OnFailure::kRestartTask),
                MakeRole("worker", 2, spec::OnFailure::kRestartGroup)};
  FailurePolicy policy(job_);
  EXPECT_FALSE(policy.InGroup("ps"));
  EXPECT_TRUE(policy.InGroup("worker"));
  // A ps failure while the workers re-form is its own restart, not part of theirs.
  EXPECT_EQ(policy.OnFailure(Task("ps", 0), "x", true, 0, clock_.Now()).action,
            Action::kRestartTask);
}

TEST_F(FailurePolicyTest, ElasticShrinksWhileMinRemainsAndParksTheSlotForItsBackoff) {
  auto role = MakeRole("worker", 4, spec::OnFailure::kElastic, 10);
  role.min_instances = 2;
  role.max_instances = 4;
  job_.roles = {role};
  job_.backoff.initial = milliseconds(500);
  job_.backoff.max = milliseconds(10000);
  FailurePolicy policy(job_);
  auto t0 = clock_.Now();
  auto d = policy.OnFailure(Task("worker", 3), "was killed by signal 9 (SIGKILL)", false, 3, t0);
  EXPECT_EQ(d.action, Action::kShrinkGroup);
  EXPECT_EQ(d.delay, milliseconds(0));  // the survivors go on at once
  EXPECT_EQ(d.slot_back_at, t0 + milliseconds(500));
  EXPECT_TRUE(policy.IsParked("worker:3"));
  EXPECT_TRUE(policy.SlotsBack(t0).empty());
  EXPECT_EQ(policy.NextSlotBack(t0), t0 + milliseconds(500));
  clock_.Advance(milliseconds(500));
  EXPECT_EQ(policy.NextSlotBack(clock_.Now()), std::nullopt);  // due: nothing later to wait for
  EXPECT_EQ(policy.SlotsBack(clock_.Now()), std::vector<std::string>{"worker:3"});
  policy.Unpark("worker:3");
  EXPECT_FALSE(policy.IsParked("worker:3"));
  // The same slot failing again stays out twice as long.
  auto again = policy.OnFailure(Task("worker", 3), "x", false, 3, clock_.Now());
  EXPECT_EQ(again.slot_back_at, clock_.Now() + milliseconds(1000));
}

TEST_F(FailurePolicyTest, ElasticAtMinRestartsTheWholeGroupInstead) {
  auto role = MakeRole("worker", 3, spec::OnFailure::kElastic);
  role.min_instances = 2;
  role.max_instances = 3;
  job_.roles = {role};
  FailurePolicy policy(job_);
  // Only one would remain: below min, so the lost one must come back.
  auto d = policy.OnFailure(Task("worker", 0), "x", false, 1, clock_.Now());
  EXPECT_EQ(d.action, Action::kRestartGroup);
  EXPECT_FALSE(policy.IsParked("worker:0"));
}

TEST_F(FailurePolicyTest, ElasticCountsAgainstTheGroupBudget) {
  auto role = MakeRole("worker", 4, spec::OnFailure::kElastic, 2);
  role.min_instances = 1;
  role.max_instances = 4;
  job_.roles = {role};
  FailurePolicy policy(job_);
  EXPECT_EQ(policy.OnFailure(Task("worker", 0), "x", false, 3, clock_.Now()).action,
            Action::kShrinkGroup);
  EXPECT_EQ(policy.OnFailure(Task("worker", 1), "x", false, 2, clock_.Now()).action,
            Action::kShrinkGroup);
  EXPECT_EQ(policy.OnFailure(Task("worker", 2), "x", false, 1, clock_.Now()).action,
            Action::kFail);
}

TEST_F(FailurePolicyTest, AlwaysRestartsCleanExitsOfRestartTaskRolesOnly) {
  auto evaluator = MakeRole("evaluator", 1, spec::OnFailure::kRestartTask, 2);
  evaluator.restart = spec::RestartMode::kAlways;
  job_.roles = {evaluator, MakeRole("worker", 1, spec::OnFailure::kRestartTask)};
  FailurePolicy policy(job_);
  EXPECT_EQ(policy.OnCleanExit(Task("worker", 0)).action, Action::kNone);
  EXPECT_EQ(policy.OnCleanExit(Task("evaluator", 0)).action, Action::kRestartTask);
  EXPECT_EQ(policy.OnCleanExit(Task("evaluator", 0)).action, Action::kRestartTask);
  EXPECT_EQ(policy.OnCleanExit(Task("evaluator", 0)).action, Action::kNone);  // budget spent
}

}  // namespace
}  // namespace shoal::master
