#include "master/status_publisher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "common/files.h"
#include "master/job_status_json.h"
#include "shoal/v1/shoal.pb.h"
#include "spec/spec_parser.h"

namespace shoal::master {
namespace {

spec::JobSpec Job() {
  auto spec = spec::ParseJobSpec(R"(
name: published
roles:
  worker:
    instances: 2
    on_failure: restart-task
    command: ["/bin/true"]
)",
                                 "job.yaml", "/tmp", /*sections=*/{});
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

TEST(StatusPublisherTest, AFailedTaskThatWillRestartShowsAsPending) {
  spec::JobSpec spec = Job();
  JournaledState job("published-1", spec);
  job.phase = JobPhase::kRunning;
  TaskRecord* w0 = job.tasks.Find("worker", 0);
  w0->exit_code = 3;
  job.tasks.Transition(*w0, TaskState::kFailed, "exited with code 3; restarting in 1s");
  w0->restart_pending = true;
  job.failures.push_back({"worker", 0, 0, "exited with code 3", "restart-task", 1, 42});
  job.failures_total = 1;
  v1::JobStatus status = BuildJobStatus(job, {"published", 7, 0, 2});
  EXPECT_EQ(status.job_id(), "published-1");
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.created_unix_ms(), 7);
  EXPECT_EQ(status.world_size(), 2u);
  ASSERT_EQ(status.tasks_size(), 2);
  EXPECT_EQ(status.tasks(0).state(), v1::TASK_STATE_PENDING);
  EXPECT_EQ(status.tasks(0).exit_code(), 3);
  EXPECT_EQ(status.tasks(1).state(), v1::TASK_STATE_PENDING);
  ASSERT_EQ(status.failures_size(), 1);
  EXPECT_EQ(status.failures(0).action(), "restart-task");
  EXPECT_EQ(status.failures_total(), 1u);

  // Once the job stops, a failure is final.
  job.phase = JobPhase::kStopping;
  EXPECT_EQ(BuildJobStatus(job, {}).tasks(0).state(), v1::TASK_STATE_FAILED);
}

TEST(StatusPublisherTest, TheLastPublicationIsInTheStatusAndItsJsonForm) {
  spec::JobSpec spec = Job();
  JournaledState job("published-1", spec);
  nlohmann::json none = JobStatusToJson(BuildJobStatus(job, {}));
  ASSERT_TRUE(none.contains("last_publication"));
  EXPECT_TRUE(none["last_publication"].is_null());

  job.last_publication = PublicationEntry{
      {"worker:1", "mlp", 7, "/srv/models", 1200, {{"loss", 0.12}, {"accuracy", 0.875}}},
      1796460031092};
  v1::JobStatus status = BuildJobStatus(job, {});
  ASSERT_TRUE(status.has_last_publication());
  EXPECT_EQ(status.last_publication().version(), 7u);
  EXPECT_EQ(JobStatusToJson(status)["last_publication"],
            nlohmann::json::parse(R"({"task":"worker:1","model":"mlp","version":7,
              "repository":"/srv/models","step":1200,"metrics":{"accuracy":0.875,"loss":0.12},
              "unix_ms":1796460031092})"));
  // Without a step the JSON says so with null, not 0.
  job.last_publication->record.step.reset();
  EXPECT_TRUE(JobStatusToJson(BuildJobStatus(job, {}))["last_publication"]["step"].is_null());
}

TEST(StatusPublisherTest, TheEndIsPublishedAtOnceAndLateWatchersGetTheNotices) {
  auto dir = std::filesystem::path(::testing::TempDir()) / "status_publisher_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  FakeClock clock;
  EventLoop loop(&clock);  // not started: nothing is due later
  auto publisher = StatusPublisher::Open(dir.string(), &loop, &clock);
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  spec::JobSpec spec = Job();
  JournaledState job("published-2", spec);
  job.phase = JobPhase::kSucceeded;
  job.phase_reason = "every task of the success roles exited 0";
  (*publisher)->EmitNotice("tensorboard at http://h:6006");
  int built = 0;
  (*publisher)->AfterBatch(/*job_over=*/true, [&] {
    ++built;
    return BuildJobStatus(job, {"published", 1, 2, 2});
  });
  EXPECT_EQ(built, 1);
  auto written = ReadFile((dir / "status.json").string());
  ASSERT_TRUE(written.ok()) << written.status();
  auto j = nlohmann::json::parse(*written);
  EXPECT_EQ(j["state"], "succeeded");
  EXPECT_EQ(j["reason"], "every task of the success roles exited 0");
  v1::JobStatus snapshot;
  (*publisher)->FillStatus(&snapshot);
  EXPECT_EQ(snapshot.job_id(), "published-2");

  // Nothing changed: nothing is built again.
  (*publisher)->AfterBatch(true, [&] {
    ++built;
    return v1::JobStatus();
  });
  EXPECT_EQ(built, 1);

  int ready = 0;
  auto queue = (*publisher)->NewWatcher(/*logs=*/false, 0, [&] { ++ready; });
  (*publisher)->Attach(queue, /*job_over=*/true);
  std::vector<v1::WatchEvent> events;
  std::string bytes;
  uint64_t offset = 0;
  bool more = false;
  while (queue->TryPop(&bytes, &offset, &more) == WatchQueue::Next::kEvent) {
    v1::WatchEvent e;
    ASSERT_TRUE(e.ParseFromString(bytes));
    events.push_back(e);
  }
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].notice(), "tensorboard at http://h:6006");
  EXPECT_EQ(events[1].status().state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_TRUE((*publisher)->WaitForWatchers(std::chrono::milliseconds(0)));
}

}  // namespace
}  // namespace shoal::master
