#include "master/placement.h"

#include <gtest/gtest.h>

namespace shoal::master {
namespace {

spec::JobSpec Job(uint32_t workers, double cpus, uint32_t gpus = 0, uint64_t memory = 0) {
  spec::JobSpec job;
  job.name = "j";
  spec::Role r;
  r.name = "worker";
  r.instances = workers;
  r.argv = {"true"};
  r.resources.cpus = cpus;
  r.resources.gpus = gpus;
  r.resources.memory_bytes = memory;
  job.roles.push_back(r);
  job.success_roles = {"worker"};
  return job;
}

backends::NodeGrant Node(const std::string& name, double cpus, std::vector<uint32_t> cores,
                         std::vector<std::string> gpus = {}, uint64_t memory = 1ull << 40) {
  backends::NodeGrant g;
  g.name = name;
  g.address = "127.0.0.1";
  g.cpus = cpus;
  g.memory_bytes = memory;
  g.cores = std::move(cores);
  g.gpus = std::move(gpus);
  return g;
}

TEST(PlacementTest, PinsWholeCoreTasksToEveryCoreTheJobHolds) {
  auto job = Job(2, 1);
  JobState state(job);
  auto placed = PlaceTasks(job, state.tasks(), {Node("local", 2, {2, 3})});
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ((*placed)[0].cores, (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ((*placed)[1].cores, (std::vector<uint32_t>{2, 3}));
}

TEST(PlacementTest, NodeWithoutReservedCoresPinsNothing) {
  auto job = Job(2, 1);
  JobState state(job);
  auto placed = PlaceTasks(job, state.tasks(), {Node("local", 2, {})});
  ASSERT_TRUE(placed.ok());
  for (const auto& p : *placed) EXPECT_TRUE(p.cores.empty());
}

TEST(PlacementTest, FractionalCpusAreNotPinned) {
  auto job = Job(4, 0.5);
  JobState state(job);
  auto placed = PlaceTasks(job, state.tasks(), {Node("local", 2, {0, 1})});
  ASSERT_TRUE(placed.ok());
  for (const auto& p : *placed) EXPECT_TRUE(p.cores.empty());
}

TEST(PlacementTest, HandsOutDistinctGpus) {
  auto job = Job(2, 1, 1);
  JobState state(job);
  auto placed = PlaceTasks(job, state.tasks(), {Node("local", 2, {0, 1}, {"0", "1"})});
  ASSERT_TRUE(placed.ok());
  EXPECT_EQ((*placed)[0].gpus, std::vector<std::string>{"0"});
  EXPECT_EQ((*placed)[1].gpus, std::vector<std::string>{"1"});
}

TEST(PlacementTest, SpreadsOverNodesWhenOneIsFull) {
  auto job = Job(3, 1);
  JobState state(job);
  auto placed = PlaceTasks(job, state.tasks(), {Node("a", 2, {}), Node("b", 2, {})});
  ASSERT_TRUE(placed.ok());
  EXPECT_EQ((*placed)[0].node, "a");
  EXPECT_EQ((*placed)[1].node, "a");
  EXPECT_EQ((*placed)[2].node, "b");
}

TEST(PlacementTest, WholeGangOrNothingNamesTheTaskThatDoesNotFit) {
  auto job = Job(3, 1, 1);
  JobState state(job);
  auto placed = PlaceTasks(job, state.tasks(), {Node("a", 4, {}, {"0", "1"})});
  ASSERT_FALSE(placed.ok());
  EXPECT_NE(placed.status().message().find("worker:2"), std::string::npos);
}

TEST(PlacementTest, PlaceSizedForOneTaskTakesOnlyThatTask) {
  // Listed in reverse: first fit alone would put worker:0 on the place meant for worker:1.
  auto job = Job(2, 1, 1);
  JobState state(job);
  auto a = Node("worker.1", 1, {});
  a.for_task = "worker:1";
  a.gpus_from_agent = true;
  a.gpu_count = 1;
  auto b = Node("worker.0", 1, {});
  b.for_task = "worker:0";
  b.gpus_from_agent = true;
  b.gpu_count = 1;
  auto placed = PlaceTasks(job, state.tasks(), {a, b});
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ((*placed)[0].node, "worker.0");
  EXPECT_EQ((*placed)[1].node, "worker.1");
  // The devices are the agent's to report; none are made up here.
  EXPECT_TRUE((*placed)[0].gpus.empty());
}

TEST(PlacementTest, PlaceForAnotherTaskIsNoFit) {
  auto job = Job(1, 1);
  JobState state(job);
  auto a = Node("chief.0", 4, {});
  a.for_task = "chief:0";
  auto placed = PlaceTasks(job, state.tasks(), {a});
  EXPECT_FALSE(placed.ok());
}

}  // namespace
}  // namespace shoal::master
