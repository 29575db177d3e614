// The rendezvous builder held to golden files: ranks, places, ports and the journal record of a
// world. After an intended change, rerun with SHOAL_UPDATE_GOLDEN=1 and review the diff.
#include "master/rendezvous.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>

#include "absl/strings/str_join.h"
#include "common/files.h"
#include "master/journaled_state.h"
#include "spec/spec_parser.h"

namespace shoal::master {
namespace {

std::string GoldenPath(const std::string& name) {
  return std::string(SHOAL_SOURCE_DIR) + "/tests/master/golden/" + name + ".txt";
}

void ExpectGolden(const std::string& name, const std::string& actual) {
  if (std::getenv("SHOAL_UPDATE_GOLDEN")) {
    ASSERT_TRUE(WriteFileAtomically(GoldenPath(name), actual).ok());
  }
  auto expected = ReadFile(GoldenPath(name));
  ASSERT_TRUE(expected.ok()) << "missing golden file " << GoldenPath(name)
                             << "; run with SHOAL_UPDATE_GOLDEN=1 to create it";
  EXPECT_EQ(*expected, actual) << "the plan differs from " << GoldenPath(name);
}

std::string Render(const frameworks::ClusterPlan& plan) {
  std::ostringstream out;
  out << "job_id=" << plan.job_id << " job_dir=" << plan.job_dir
      << " restart_count=" << plan.restart_count << " num_nodes=" << plan.num_nodes << "\n"
      << "checkpoint_dir=" << plan.checkpoint_dir << "\n"
      << "task_secret=" << plan.task_secret << "\n"
      << "rendezvous=" << plan.rendezvous_host << ":" << plan.rendezvous_port << "\n";
  for (const auto& t : plan.tasks) {
    out << t.role << ":" << t.index << " rank=" << t.global_rank << " node=" << t.node
        << " address=" << t.address << " port=" << t.port << " node_rank=" << t.node_rank
        << " local=" << t.local_rank << "/" << t.local_world_size << " role=" << t.role_rank
        << "/" << t.role_world_size << " cpus=[" << absl::StrJoin(t.cpu_affinity, ",")
        << "] gpus=[" << absl::StrJoin(t.gpus, ",") << "] attempt=" << t.attempt << "\n";
  }
  out << "record " << ToJson(JournalRecord(RendezvousRecord(plan))).dump() << "\n";
  return out.str();
}

spec::JobSpec Parse(const std::string& yaml) {
  auto spec = spec::ParseJobSpec(yaml, "job.yaml", "/tmp", /*sections=*/{});
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

TEST(RendezvousTest, OneMachineChiefAndWorkers) {
  spec::JobSpec spec = Parse(R"(
name: golden
roles:
  worker:
    instances: 2
    command: ["python3", "train.py"]
  chief:
    instances: 1
    command: ["python3", "train.py"]
)");
  JournaledState job("golden-20260101-000000-abcd", spec);
  backends::NodeGrant local;
  local.name = "local";
  local.address = "127.0.0.1";
  local.cpus = 4;
  local.memory_bytes = uint64_t{16} << 30;
  local.cores = {0, 1, 2, 3};
  job.grants = {local};
  job.node_addresses["local"] = "127.0.0.1";
  auto placement = PlaceTasks(spec, job.tasks.tasks(), job.grants);
  ASSERT_TRUE(placement.ok()) << placement.status();
  auto ports = AssignTaskPorts(*placement, {{"local", {20000, 20001, 20002, 20003}}});
  ASSERT_TRUE(ports.ok());
  RendezvousInputs in;
  in.spec = &spec;
  in.job_id = job.job_id;
  in.job_dir = "/jobs/golden";
  in.token = "secret";
  in.tasks = &job.tasks.tasks();
  in.placement = &*placement;
  in.grants = &job.grants;
  in.node_addresses = &job.node_addresses;
  in.node_gpus = &job.node_gpus;
  in.slot_ports = &*ports;
  ExpectGolden("rendezvous_local", Render(BuildClusterPlan(in)));
}

// Slurm-like: one place per task, two of them on one machine, GPUs bound by the resource
// manager; an elastic slot out of the world; MPI's task secret; a later generation.
TEST(RendezvousTest, PlacesSharingMachinesWithAgentGpusAndASlotOut) {
  spec::JobSpec spec = Parse(R"(
name: golden
on_failure: elastic
checkpoint: {dir: /ckpt}
roles:
  worker:
    instances: {min: 2, max: 3}
    resources: {gpus: 1}
    command: ["python3", "train.py"]
)");
  spec.framework = spec::Framework::kMpi;
  JournaledState job("golden-20260101-000000-abcd", spec);
  for (int i = 0; i < 3; ++i) {
    backends::NodeGrant g;
    g.name = "place" + std::to_string(i);
    g.address = i < 2 ? "nodeA" : "nodeB";
    g.for_task = "worker:" + std::to_string(i);
    g.cpus = 1;
    g.memory_bytes = uint64_t{4} << 30;
    g.gpus_from_agent = true;
    g.gpu_count = 1;
    job.grants.push_back(g);
  }
  job.node_addresses = {{"place0", "10.0.0.1"}, {"place1", "10.0.0.1"}, {"place2", "10.0.0.2"}};
  job.node_gpus = {{"place0", {"0"}}, {"place1", {"1"}}, {"place2", {"0"}}};
  auto placement = PlaceTasks(spec, job.tasks.tasks(), job.grants);
  ASSERT_TRUE(placement.ok()) << placement.status();
  // worker:1 failed and is left out of this generation.
  TaskRecord* w1 = job.tasks.Find("worker", 1);
  job.tasks.Transition(*w1, TaskState::kFailed, "exited with code 1");
  job.tasks.SetInWorld(*w1, false);
  job.tasks.Find("worker", 0)->attempt = 2;
  job.slot_ports = {{"worker:0", 21000}, {"worker:1", 21001}, {"worker:2", 22000}};
  RendezvousInputs in;
  in.spec = &spec;
  in.job_id = job.job_id;
  in.job_dir = "/jobs/golden";
  in.token = "secret";
  in.generation = 2;
  in.tasks = &job.tasks.tasks();
  in.placement = &*placement;
  in.grants = &job.grants;
  in.node_addresses = &job.node_addresses;
  in.node_gpus = &job.node_gpus;
  in.slot_ports = &job.slot_ports;
  ExpectGolden("rendezvous_places", Render(BuildClusterPlan(in)));
}

TEST(RendezvousTest, TooFewFreePortsNamesThePlace) {
  std::vector<PlacedTask> placement(2);
  placement[0].role = placement[1].role = "worker";
  placement[1].index = 1;
  placement[0].node = placement[1].node = "n1";
  auto ports = AssignTaskPorts(placement, {{"n1", {20000}}});
  EXPECT_EQ(ports.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ports.status().message(), "the agent on n1 reported too few free ports");
  auto none = AssignTaskPorts(placement, {});
  EXPECT_EQ(none.status().message(), "the agent on n1 reported too few free ports");
}

TEST(RendezvousTest, PlacesOnOneMachineNeverShareAPortTheirAgentsBothOffered) {
  // Two places on 10.0.0.1 whose agents both found 24808 free first, and one on 10.0.0.2.
  std::vector<PlacedTask> placement(4);
  for (size_t i = 0; i < placement.size(); ++i) {
    placement[i].role = "worker";
    placement[i].index = static_cast<uint32_t>(i);
  }
  placement[0].node = "a";
  placement[1].node = "b";
  placement[2].node = "b";
  placement[3].node = "c";
  std::map<std::string, std::vector<uint32_t>> offered = {
      {"a", {24808, 24809}}, {"b", {24808, 24809, 24810, 24811}}, {"c", {24808, 24809}}};
  std::map<std::string, std::string> addresses = {
      {"a", "10.0.0.1"}, {"b", "10.0.0.1"}, {"c", "10.0.0.2"}};
  auto ports = AssignTaskPorts(placement, offered, addresses);
  ASSERT_TRUE(ports.ok()) << ports.status();
  EXPECT_EQ(*ports, (std::map<std::string, uint32_t>{{"worker:0", 24808},
                                                      {"worker:1", 24809},
                                                      {"worker:2", 24810},
                                                      {"worker:3", 24808}}));
  // Without addresses each place is a machine of its own: its agent's first picks, in order.
  auto apart = AssignTaskPorts(placement, offered);
  ASSERT_TRUE(apart.ok()) << apart.status();
  EXPECT_EQ(apart->at("worker:1"), 24808u);
  EXPECT_EQ(apart->at("worker:2"), 24809u);
  // The spares run out: named like any shortage.
  offered["b"] = {24808, 24809};
  auto short_of_spares = AssignTaskPorts(placement, offered, addresses);
  EXPECT_EQ(short_of_spares.status().message(), "the agent on b reported too few free ports");
}

TEST(RendezvousTest, TaskSecretIsTheHmacOfTheJob) {
  // HMAC-SHA256("secret", "shoal-task-secret:job-1"), as `openssl dgst -sha256 -hmac` gives it.
  EXPECT_EQ(TaskSecret("secret", "job-1"),
            "572b06cf955b33b2c8f1ad41037130a00bd70efd99b415a692f0c45e90855051");
  EXPECT_NE(TaskSecret("secret", "job-1"), TaskSecret("secret", "job-2"));
}

}  // namespace
}  // namespace shoal::master
