#include "frameworks/framework_env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/files.h"

namespace shoal::frameworks {
namespace {

// Golden files hold the exact environment each task gets. To accept an intended change, run the
// test with SHOAL_UPDATE_GOLDEN=1 and review the diff.
std::string GoldenPath(const std::string& name) {
  return std::string(SHOAL_SOURCE_DIR) + "/tests/frameworks/golden/" + name + ".env";
}

std::string Render(const spec::JobSpec& job, const ClusterPlan& plan) {
  std::ostringstream out;
  for (const auto& task : plan.tasks) {
    out << "# " << task.role << ":" << task.index << "\n";
    for (const auto& [k, v] : BuildTaskEnvironment(job, plan, task)) out << k << "=" << v << "\n";
  }
  return out.str();
}

void ExpectGolden(const std::string& name, const std::string& actual) {
  if (std::getenv("SHOAL_UPDATE_GOLDEN")) {
    ASSERT_TRUE(WriteFileAtomically(GoldenPath(name), actual).ok());
  }
  auto expected = ReadFile(GoldenPath(name));
  ASSERT_TRUE(expected.ok()) << "missing golden file " << GoldenPath(name)
                             << "; run with SHOAL_UPDATE_GOLDEN=1 to create it";
  EXPECT_EQ(*expected, actual) << "environment differs from " << GoldenPath(name);
}

spec::Role MakeRole(const std::string& name, uint32_t instances, double cpus = 1) {
  spec::Role r;
  r.name = name;
  r.instances = instances;
  r.argv = {"python3", "train.py"};
  r.resources.cpus = cpus;
  return r;
}

// Places tasks in order over `nodes` nodes, `per_node` tasks each, ports from 29500.
ClusterPlan MakePlan(const spec::JobSpec& job, uint32_t per_node) {
  ClusterPlan plan;
  plan.job_id = "golden-20260101-000000-abcd";
  plan.job_dir = "/jobs/golden-20260101-000000-abcd";
  uint32_t rank = 0;
  for (const auto& role : job.roles) {
    for (uint32_t i = 0; i < role.instances; ++i, ++rank) {
      TaskPlacement t;
      t.role = role.name;
      t.index = i;
      t.global_rank = rank;
      t.node_rank = rank / per_node;
      t.node = "node" + std::to_string(t.node_rank);
      t.address = "10.0.0." + std::to_string(t.node_rank + 1);
      t.port = 29500 + rank;
      t.local_rank = rank % per_node;
      plan.tasks.push_back(t);
    }
  }
  plan.num_nodes = (rank + per_node - 1) / per_node;
  for (auto& t : plan.tasks) {
    uint32_t on_node = 0;
    for (const auto& o : plan.tasks) on_node += (o.node == t.node);
    t.local_world_size = on_node;
  }
  return plan;
}

TEST(FrameworkEnvTest, PyTorchSingleWorkerMatchesGolden) {
  spec::JobSpec job;
  job.name = "golden";
  job.framework = spec::Framework::kPyTorch;
  job.roles = {MakeRole("worker", 1)};
  ExpectGolden("pytorch_single_worker", Render(job, MakePlan(job, 1)));
}

TEST(FrameworkEnvTest, PyTorchChiefAndWorkersOnTwoNodesMatchesGolden) {
  spec::JobSpec job;
  job.name = "golden";
  job.framework = spec::Framework::kPyTorch;
  job.roles = {MakeRole("chief", 1, 2), MakeRole("worker", 3, 0.5)};
  ExpectGolden("pytorch_chief_workers_two_nodes", Render(job, MakePlan(job, 2)));
}

TEST(FrameworkEnvTest, NoneFrameworkGetsOnlyShoalVariables) {
  spec::JobSpec job;
  job.name = "golden";
  job.roles = {MakeRole("worker", 2)};
  ClusterPlan plan = MakePlan(job, 2);
  Environment env = BuildTaskEnvironment(job, plan, plan.tasks[1]);
  EXPECT_EQ(env.count("MASTER_ADDR"), 0u);
  EXPECT_EQ(env.at("SHOAL_ROLE"), "worker");
  EXPECT_EQ(env.at("SHOAL_INDEX"), "1");
  ExpectGolden("none_two_workers", Render(job, plan));
}

TEST(FrameworkEnvTest, RoleEnvOverridesShoalDefaults) {
  spec::JobSpec job;
  job.name = "golden";
  job.framework = spec::Framework::kPyTorch;
  job.roles = {MakeRole("worker", 1)};
  job.roles[0].env["OMP_NUM_THREADS"] = "7";
  ClusterPlan plan = MakePlan(job, 1);
  EXPECT_EQ(BuildTaskEnvironment(job, plan, plan.tasks[0]).at("OMP_NUM_THREADS"), "7");
}

TEST(FrameworkEnvTest, GpusBecomeCudaVisibleDevices) {
  spec::JobSpec job;
  job.name = "golden";
  job.roles = {MakeRole("worker", 1)};
  ClusterPlan plan = MakePlan(job, 1);
  plan.tasks[0].gpus = {"2", "3"};
  EXPECT_EQ(BuildTaskEnvironment(job, plan, plan.tasks[0]).at("CUDA_VISIBLE_DEVICES"), "2,3");
}

TEST(FrameworkEnvTest, ClusterSpecListsEveryTaskByRole) {
  spec::JobSpec job;
  job.name = "golden";
  job.roles = {MakeRole("chief", 1), MakeRole("worker", 2)};
  ClusterPlan plan = MakePlan(job, 3);
  ExpectGolden("cluster_spec_chief_workers", ClusterSpecJson(plan) + "\n");
}

}  // namespace
}  // namespace shoal::frameworks
