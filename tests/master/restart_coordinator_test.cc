#include "master/restart_coordinator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "spec/spec_parser.h"

namespace shoal::master {
namespace {

using ::testing::ElementsAre;
using std::chrono::milliseconds;
using std::chrono::seconds;

spec::JobSpec ElasticJob() {
  auto spec = spec::ParseJobSpec(R"(
name: elastic
on_failure: elastic
roles:
  worker:
    instances: {min: 2, max: 4}
    command: ["/bin/true"]
  ps:
    instances: 1
    on_failure: restart-task
    command: ["/bin/true"]
)",
                                 "job.yaml", "/tmp", /*sections=*/{});
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

// worker:1, worker:2 and worker:3 failed and left the world; only worker:0 is in it.
JobState ShrunkToOne(const spec::JobSpec& spec) {
  JobState state(spec);
  for (uint32_t i = 1; i < 4; ++i) {
    TaskRecord* t = state.Find("worker", i);
    state.Transition(*t, TaskState::kFailed, "exited with code 1");
    state.SetInWorld(*t, false);
  }
  return state;
}

TEST(RestartCoordinatorTest, ARoleBelowMinWaitsForItsEarliestParkedSlots) {
  spec::JobSpec spec = ElasticJob();
  JobState state = ShrunkToOne(spec);
  Clock::TimePoint now{seconds(100)};
  std::map<std::string, Clock::TimePoint> parked = {{"worker:1", now + seconds(5)},
                                                    {"worker:2", now + seconds(2)},
                                                    {"worker:3", now + seconds(9)}};
  // One more slot is needed for min 2: the earliest, worker:2 in 2 s.
  EXPECT_EQ(GroupRelaunchDelay(spec, state.tasks(), parked, now, milliseconds(0)),
            milliseconds(2000));
  // A longer backoff of the group itself wins.
  EXPECT_EQ(GroupRelaunchDelay(spec, state.tasks(), parked, now, milliseconds(7000)),
            milliseconds(7000));
  // Slots already back cost no wait.
  EXPECT_EQ(GroupRelaunchDelay(spec, state.tasks(), parked, now + seconds(3), milliseconds(0)),
            milliseconds(0));
}

TEST(RestartCoordinatorTest, SlotsRejoinWhenDueOrWhileTheirRoleIsBelowMin) {
  spec::JobSpec spec = ElasticJob();
  JobState state = ShrunkToOne(spec);
  Clock::TimePoint now{seconds(100)};
  std::map<std::string, Clock::TimePoint> parked = {{"worker:1", now + seconds(5)},
                                                    {"worker:2", now - seconds(1)},
                                                    {"worker:3", now + seconds(9)}};
  auto ready = [](const TaskRecord&) { return true; };
  // worker:1 (not due) rejoins to bring the role up to min; worker:2 is due; worker:3 waits.
  EXPECT_THAT(SlotsToRejoin(spec, state.tasks(), parked, now, ready),
              ElementsAre("worker:1", "worker:2"));
  // Every slot's time has come.
  EXPECT_THAT(SlotsToRejoin(spec, state.tasks(), parked, now + seconds(10), ready),
              ElementsAre("worker:1", "worker:2", "worker:3"));
  // A slot out of the world that is not parked (its restart was decided otherwise) rejoins.
  EXPECT_THAT(SlotsToRejoin(spec, state.tasks(), {}, now, ready),
              ElementsAre("worker:1", "worker:2", "worker:3"));
}

// A slot whose place has no agent yet (a replacement pod waiting for room) would hold the
// group's rendezvous: it waits, unless its role needs it to reach min.
TEST(RestartCoordinatorTest, ADueSlotWaitsForItsPlaceUnlessItsRoleIsBelowMin) {
  spec::JobSpec spec = ElasticJob();
  JobState state = ShrunkToOne(spec);
  Clock::TimePoint now{seconds(100)};
  std::map<std::string, Clock::TimePoint> parked = {{"worker:1", now - seconds(1)},
                                                    {"worker:2", now - seconds(1)},
                                                    {"worker:3", now - seconds(1)}};
  auto only_worker_3_ready = [](const TaskRecord& t) { return t.Key() == "worker:3"; };
  // worker:1 rejoins for min (its place or not); worker:2 waits for its place; worker:3 is ready.
  EXPECT_THAT(SlotsToRejoin(spec, state.tasks(), parked, now, only_worker_3_ready),
              ElementsAre("worker:1", "worker:3"));
  auto none_ready = [](const TaskRecord&) { return false; };
  EXPECT_THAT(SlotsToRejoin(spec, state.tasks(), parked, now, none_ready), ElementsAre("worker:1"));
}

}  // namespace
}  // namespace shoal::master
