#include "backends/slurm/srun_command.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_join.h"

namespace shoal::backends {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

spec::JobSpec TwoRoles() {
  spec::JobSpec job;
  job.name = "j";
  spec::Role chief;
  chief.name = "chief";
  chief.instances = 1;
  chief.resources.cpus = 0.5;
  chief.resources.memory_bytes = 1ull << 30;
  spec::Role worker;
  worker.name = "worker";
  worker.instances = 3;
  worker.resources.cpus = 2;
  worker.resources.memory_bytes = 3ull << 30;
  worker.resources.gpus = 1;
  job.roles = {chief, worker};
  return job;
}

TEST(OnePlacePerTaskTest, OnePlacePerTaskSizedForIt) {
  auto places = OnePlacePerTask(TwoRoles());
  ASSERT_EQ(places.size(), 4u);
  EXPECT_EQ(places[0].name, "chief.0");
  EXPECT_EQ(places[0].for_task, "chief:0");
  EXPECT_DOUBLE_EQ(places[0].cpus, 1);  // Slurm grants whole CPUs
  EXPECT_FALSE(places[0].gpus_from_agent);
  EXPECT_EQ(places[3].name, "worker.2");
  EXPECT_EQ(places[3].for_task, "worker:2");
  EXPECT_EQ(places[3].memory_bytes, 3ull << 30);
  EXPECT_TRUE(places[3].gpus_from_agent);
  EXPECT_EQ(places[3].gpu_count, 1u);
  EXPECT_TRUE(places[3].gpus.empty());
}

TEST(SrunCommandTest, OneHeterogeneousComponentPerRole) {
  SlurmRequest request;
  request.partition = "gpu";
  request.account = "ml";
  request.time_limit = std::chrono::minutes(90);
  auto argv = SrunCommand(TwoRoles(), request, "srun", "shoal-j1", "/opt/shoal",
                          {"--master", "10.0.0.1:5000"});
  std::string line = absl::StrJoin(argv, " ");
  EXPECT_EQ(line,
            "srun --job-name=shoal-j1 --partition=gpu --account=ml --time=90 --ntasks=1 "
            "--cpus-per-task=1 --mem-per-cpu=1024M --kill-on-bad-exit=0 --no-kill /opt/shoal "
            "agent --master 10.0.0.1:5000 --slurm-place=chief:0,worker:1 : --job-name=shoal-j1 "
            "--partition=gpu --account=ml --time=90 --ntasks=3 --cpus-per-task=2 "
            "--mem-per-cpu=1536M --gpus-per-task=1 --kill-on-bad-exit=0 --no-kill /opt/shoal "
            "agent --master 10.0.0.1:5000 --slurm-place=chief:0,worker:1");
}

TEST(SrunCommandTest, LeavesOutWhatTheJobDoesNotAsk) {
  spec::JobSpec job;
  spec::Role r;
  r.name = "w";
  r.instances = 2;
  r.resources.cpus = 1;
  job.roles = {r};
  auto argv = SrunCommand(job, SlurmRequest{}, "/usr/bin/srun", "shoal-x", "shoal", {});
  EXPECT_EQ(absl::StrJoin(argv, " "),
            "/usr/bin/srun --job-name=shoal-x --ntasks=2 --cpus-per-task=1 --kill-on-bad-exit=0 "
            "--no-kill shoal agent --slurm-place=w:0");
}

TEST(SlurmComponentsTest, RolesAskingTheSameShareAComponent) {
  spec::JobSpec job;
  auto role = [](const std::string& name, uint32_t n, double cpus) {
    spec::Role r;
    r.name = name;
    r.instances = n;
    r.resources.cpus = cpus;
    return r;
  };
  // chief and worker ask the same (0.5 CPU is 1 on Slurm); ps asks more.
  job.roles = {role("chief", 1, 0.5), role("ps", 2, 4), role("worker", 3, 1)};
  auto components = SlurmComponents(job);
  ASSERT_EQ(components.size(), 2u);
  EXPECT_EQ(components[0].tasks, 4u);
  EXPECT_EQ(components[1].tasks, 2u);
  // Slurm numbers tasks component by component: chief 0, worker 1-3, ps 4-5.
  std::string map = SlurmPlaceMap(components);
  EXPECT_EQ(map, "chief:0,worker:1,ps:4");
  EXPECT_EQ(SlurmPlaceOf(map, 0).value(), "chief.0");
  EXPECT_EQ(SlurmPlaceOf(map, 3).value(), "worker.2");
  EXPECT_EQ(SlurmPlaceOf(map, 5).value(), "ps.1");
  auto argv = SrunCommand(job, SlurmRequest{}, "srun", "n", "shoal", {});
  EXPECT_EQ(std::count(argv.begin(), argv.end(), ":"), 1);
}

TEST(SlurmPlaceOfTest, RefusesAMalformedMap) {
  EXPECT_FALSE(SlurmPlaceOf("worker", 0).ok());
  EXPECT_FALSE(SlurmPlaceOf("worker:x", 0).ok());
  EXPECT_FALSE(SlurmPlaceOf("worker:2", 1).ok());
}

TEST(SlurmMinutesTest, RoundsUpToWholeMinutes) {
  EXPECT_EQ(SlurmMinutes(std::chrono::seconds(61)), 2u);
  EXPECT_EQ(SlurmMinutes(std::chrono::minutes(5)), 5u);
  EXPECT_EQ(SlurmMinutes(std::chrono::milliseconds(1)), 1u);
}

TEST(ClassifySrunLineTest, QueuedAndAllocated) {
  auto q = ClassifySrunLine("srun: job 42 queued and waiting for resources");
  ASSERT_TRUE(q);
  EXPECT_EQ(q->kind, SrunLineEvent::kQueued);
  EXPECT_EQ(q->slurm_job, 42u);
  auto a = ClassifySrunLine("srun: job 42 has been allocated resources");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->kind, SrunLineEvent::kAllocated);
}

TEST(ClassifySrunLineTest, RefusalKeepsSlurmsWords) {
  auto r = ClassifySrunLine(
      "srun: error: Unable to allocate resources: Requested node configuration is not available");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->kind, SrunLineEvent::kRefused);
  EXPECT_EQ(r->reason,
            "Slurm refused the job: Unable to allocate resources: Requested node configuration "
            "is not available");
  auto p = ClassifySrunLine("srun: error: Invalid partition name specified");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->kind, SrunLineEvent::kRefused);
  EXPECT_THAT(p->reason, HasSubstr("Invalid partition name specified"));
}

TEST(ClassifySrunLineTest, CancellationFromOutsideAndItsCause) {
  auto c = ClassifySrunLine(
      "slurmstepd: error: *** STEP 17.0 ON sn1 CANCELLED AT 2026-12-02T15:01:02 ***");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->kind, SrunLineEvent::kCancelled);
  EXPECT_EQ(c->slurm_job, 17u);
  EXPECT_EQ(c->reason, "Slurm job 17 was cancelled outside Shoal (scancel or an administrator)");
  auto t = ClassifySrunLine(
      "slurmstepd: error: *** JOB 18 ON sn2 CANCELLED AT 2026-12-02T15:01:02 DUE TO TIME LIMIT "
      "***");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->reason, "Slurm cancelled job 18 due to time limit");
}

TEST(ClassifySrunLineTest, EndedTasksByRank) {
  auto e = ClassifySrunLine("srun: error: sn2: tasks 1-2,4: Killed");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind, SrunLineEvent::kTaskEnded);
  EXPECT_THAT(e->task_ranks, ElementsAre(1, 2, 4));
  EXPECT_THAT(e->reason, HasSubstr("sn2"));
  auto one = ClassifySrunLine("srun: error: sn1: task 0: Exited with exit code 2");
  ASSERT_TRUE(one);
  EXPECT_THAT(one->task_ranks, ElementsAre(0));
}

TEST(ClassifySrunLineTest, OrdinaryLinesSayNothing) {
  EXPECT_FALSE(ClassifySrunLine("2026-12-02T15:00:00.000 info agent: registered"));
  EXPECT_FALSE(ClassifySrunLine("srun: Job step created"));
}

}  // namespace
}  // namespace shoal::backends
