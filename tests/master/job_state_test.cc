#include "master/job_state.h"

#include <gtest/gtest.h>

namespace shoal::master {
namespace {

spec::Role MakeRole(const std::string& name, uint32_t instances, bool untracked = false) {
  spec::Role r;
  r.name = name;
  r.instances = instances;
  r.argv = {"true"};
  r.untracked = untracked;
  return r;
}

spec::JobSpec MakeJob(std::vector<spec::Role> roles, std::vector<std::string> success) {
  spec::JobSpec job;
  job.name = "j";
  job.roles = std::move(roles);
  job.success_roles = std::move(success);
  return job;
}

void Finish(JobState& s, const std::string& role, uint32_t i, int code, int sig = 0) {
  TaskRecord* t = s.Find(role, i);
  s.Transition(*t, TaskState::kStarting);
  s.Transition(*t, TaskState::kRunning);
  t->exit_code = code;
  t->signal = sig;
  s.Transition(*t, code == 0 && sig == 0 ? TaskState::kSucceeded : TaskState::kFailed,
               DescribeExit(code, sig));
}

TEST(JobStateTest, ChiefComesFirstInRankOrder) {
  JobState s(MakeJob({MakeRole("worker", 2), MakeRole("chief", 1)}, {"chief"}));
  ASSERT_EQ(s.tasks().size(), 3u);
  EXPECT_EQ(s.tasks()[0].Key(), "chief:0");
  EXPECT_EQ(s.tasks()[0].global_rank, 0u);
  EXPECT_EQ(s.tasks()[2].Key(), "worker:1");
  EXPECT_EQ(s.tasks()[2].global_rank, 2u);
}

TEST(JobStateTest, SucceedsOnlyWhenEverySuccessRoleTaskExitedZero) {
  JobState s(MakeJob({MakeRole("worker", 2)}, {"worker"}));
  Finish(s, "worker", 0, 0);
  EXPECT_FALSE(s.DecideOutcome().has_value());
  Finish(s, "worker", 1, 0);
  ASSERT_TRUE(s.DecideOutcome().has_value());
  EXPECT_EQ(s.DecideOutcome()->phase, JobPhase::kSucceeded);
}

TEST(JobStateTest, FirstTrackedFailureNamesTaskAndExitCode) {
  JobState s(MakeJob({MakeRole("worker", 3)}, {"worker"}));
  Finish(s, "worker", 2, 3);
  Finish(s, "worker", 0, 1);
  auto outcome = s.DecideOutcome();
  ASSERT_TRUE(outcome.has_value());
  EXPECT_EQ(outcome->phase, JobPhase::kFailed);
  EXPECT_EQ(outcome->reason, "worker:2 exited with code 3");
}

TEST(JobStateTest, SignalDeathIsDescribedWithItsName) {
  JobState s(MakeJob({MakeRole("worker", 1)}, {"worker"}));
  Finish(s, "worker", 0, 0, 9);
  EXPECT_EQ(s.DecideOutcome()->reason, "worker:0 was killed by signal 9 (SIGKILL)");
}

TEST(JobStateTest, UntrackedFailureDoesNotDecideTheJob) {
  JobState s(MakeJob({MakeRole("ps", 1, true), MakeRole("worker", 1)}, {"worker"}));
  Finish(s, "ps", 0, 1);
  EXPECT_FALSE(s.DecideOutcome().has_value());
  Finish(s, "worker", 0, 0);
  EXPECT_EQ(s.DecideOutcome()->phase, JobPhase::kSucceeded);
}

TEST(JobStateTest, ChiefSuccessDecidesWhileWorkersStillRun) {
  JobState s(MakeJob({MakeRole("chief", 1), MakeRole("worker", 2)}, {"chief"}));
  Finish(s, "chief", 0, 0);
  EXPECT_EQ(s.DecideOutcome()->phase, JobPhase::kSucceeded);
  EXPECT_FALSE(s.AllTerminal());
}

TEST(JobStateTest, TerminalStateIsFinal) {
  JobState s(MakeJob({MakeRole("worker", 1)}, {"worker"}));
  Finish(s, "worker", 0, 0);
  EXPECT_FALSE(s.Transition(*s.Find("worker", 0), TaskState::kKilled).has_value());
  EXPECT_EQ(s.Find("worker", 0)->state, TaskState::kSucceeded);
}

TEST(JobStateTest, TransitionRecordNamesBothStates) {
  JobState s(MakeJob({MakeRole("worker", 1)}, {"worker"}));
  auto record = s.Transition(*s.Find("worker", 0), TaskState::kStarting);
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ((*record)["from"], "pending");
  EXPECT_EQ((*record)["to"], "starting");
  EXPECT_EQ((*record)["task"], "worker:0");
}

TEST(JobStateTest, RoleStartedOnlyWhenAllItsTasksRun) {
  JobState s(MakeJob({MakeRole("ps", 2, true), MakeRole("worker", 1)}, {"worker"}));
  EXPECT_FALSE(s.RoleStarted("ps"));
  s.Transition(*s.Find("ps", 0), TaskState::kRunning);
  EXPECT_FALSE(s.RoleStarted("ps"));
  s.Transition(*s.Find("ps", 1), TaskState::kRunning);
  EXPECT_TRUE(s.RoleStarted("ps"));
}

TEST(JobStateTest, AFailureWithARestartPendingDoesNotDecideTheJob) {
  JobState s(MakeJob({MakeRole("worker", 2)}, {"worker"}));
  TaskRecord* t = s.Find("worker", 1);
  t->restart_pending = true;
  Finish(s, "worker", 1, 3);
  EXPECT_FALSE(s.DecideOutcome().has_value());
  auto record = s.Restart(*t);
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ((*record)["attempt"], 1);
  EXPECT_EQ(t->state, TaskState::kPending);
  EXPECT_EQ(t->attempt, 1u);
  EXPECT_FALSE(t->restart_pending);
  EXPECT_FALSE(s.AllStarted());
  EXPECT_FALSE(s.RoleStarted("worker"));
  Finish(s, "worker", 0, 0);
  EXPECT_FALSE(s.DecideOutcome().has_value());
  Finish(s, "worker", 1, 0);  // the second attempt succeeds
  ASSERT_TRUE(s.DecideOutcome().has_value());
  EXPECT_EQ(s.DecideOutcome()->phase, JobPhase::kSucceeded);
  EXPECT_TRUE(s.AllTerminal());
}

TEST(JobStateTest, RestartingASucceededTaskTakesBackItsSuccess) {
  JobState s(MakeJob({MakeRole("worker", 1)}, {"worker"}));
  Finish(s, "worker", 0, 0);
  ASSERT_TRUE(s.DecideOutcome().has_value());
  s.Restart(*s.Find("worker", 0));
  EXPECT_FALSE(s.DecideOutcome().has_value());
  EXPECT_FALSE(s.Restart(*s.Find("worker", 0)).has_value());  // not terminal: refused
}

TEST(JobStateTest, ASlotOutOfTheWorldDoesNotCountForSuccess) {
  JobState s(MakeJob({MakeRole("worker", 3)}, {"worker"}));
  TaskRecord* lost = s.Find("worker", 2);
  lost->restart_pending = true;
  Finish(s, "worker", 2, -1, 9);
  s.SetInWorld(*lost, false);
  Finish(s, "worker", 0, 0);
  Finish(s, "worker", 1, 0);
  ASSERT_TRUE(s.DecideOutcome().has_value());
  EXPECT_EQ(s.DecideOutcome()->phase, JobPhase::kSucceeded);
  s.SetInWorld(*lost, true);
  EXPECT_FALSE(s.DecideOutcome().has_value());
}

}  // namespace
}  // namespace shoal::master
