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

// Issue 23, defect 3: a script that only calls torch.save into SHOAL_CHECKPOINT_DIR failed
// because nothing created it. The agent creates what this returns.
TEST(FrameworkEnvTest, LocalDirectoriesAreTheCheckpointTensorBoardAndJobDirectories) {
  spec::JobSpec job;
  job.name = "golden";
  job.framework = spec::Framework::kPyTorch;
  job.roles = {MakeRole("worker", 1)};
  job.tensorboard.configured = true;
  ClusterPlan plan = MakePlan(job, 1);
  plan.checkpoint_dir = plan.job_dir + "/checkpoints";
  EXPECT_EQ(LocalDirectories(BuildTaskEnvironment(job, plan, plan.tasks[0])),
            (Environment{{"SHOAL_CHECKPOINT_DIR", plan.job_dir + "/checkpoints"},
                         {"SHOAL_JOB_DIR", plan.job_dir},
                         {"SHOAL_TENSORBOARD_LOGDIR", plan.job_dir + "/tensorboard"}}));
}

TEST(FrameworkEnvTest, APublishSectionGivesEveryTaskTheModelRepository) {
  spec::JobSpec job;
  job.name = "golden";
  job.roles = {MakeRole("worker", 2)};
  ClusterPlan plan = MakePlan(job, 2);
  Environment none = BuildTaskEnvironment(job, plan, plan.tasks[1]);
  EXPECT_EQ(none.count("SHOAL_MODEL_REPOSITORY"), 0u);
  job.publish = {"/srv/models", 3, true};
  for (const auto& task : plan.tasks) {
    Environment env = BuildTaskEnvironment(job, plan, task);
    EXPECT_EQ(env.at("SHOAL_MODEL_REPOSITORY"), "/srv/models");
    EXPECT_EQ(env.at("SHOAL_MODEL_KEEP"), "3");
  }
  job.publish.keep = 0;
  EXPECT_EQ(BuildTaskEnvironment(job, plan, plan.tasks[0]).count("SHOAL_MODEL_KEEP"), 0u);
}

TEST(FrameworkEnvTest, LocalDirectoriesLeaveAnHdfsCheckpointDirectoryToTheSdk) {
  spec::JobSpec job;
  job.name = "golden";
  job.roles = {MakeRole("worker", 1)};
  ClusterPlan plan = MakePlan(job, 1);
  plan.checkpoint_dir = "hdfs://namenode:8020/ckpt/golden";
  Environment dirs = LocalDirectories(BuildTaskEnvironment(job, plan, plan.tasks[0]));
  EXPECT_EQ(dirs, (Environment{{"SHOAL_JOB_DIR", plan.job_dir}}));
}

TEST(FrameworkEnvTest, LocalDirectoriesFollowTheRoleEnvButSkipRelativePaths) {
  spec::JobSpec job;
  job.name = "golden";
  job.roles = {MakeRole("worker", 1)};
  job.roles[0].env["SHOAL_CHECKPOINT_DIR"] = "/data/ckpt";
  job.roles[0].env["SHOAL_TENSORBOARD_LOGDIR"] = "runs";
  ClusterPlan plan = MakePlan(job, 1);
  plan.checkpoint_dir = plan.job_dir + "/checkpoints";
  job.tensorboard.configured = true;
  Environment dirs = LocalDirectories(BuildTaskEnvironment(job, plan, plan.tasks[0]));
  EXPECT_EQ(dirs.at("SHOAL_CHECKPOINT_DIR"), "/data/ckpt");
  EXPECT_EQ(dirs.count("SHOAL_TENSORBOARD_LOGDIR"), 0u);
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

// --- tensorflow ---------------------------------------------------------------------------

spec::JobSpec Job(spec::Framework framework, std::vector<spec::Role> roles) {
  spec::JobSpec job;
  job.name = "golden";
  job.framework = framework;
  job.roles = std::move(roles);
  return job;
}

TEST(FrameworkEnvTest, TensorFlowSingleWorkerMatchesGolden) {
  auto job = Job(spec::Framework::kTensorFlow, {MakeRole("worker", 1)});
  ExpectGolden("tensorflow_single_worker", Render(job, MakePlan(job, 1)));
}

TEST(FrameworkEnvTest, TensorFlowChiefAndWorkersMatchesGolden) {
  auto job = Job(spec::Framework::kTensorFlow, {MakeRole("chief", 1), MakeRole("worker", 2)});
  ExpectGolden("tensorflow_chief_workers", Render(job, MakePlan(job, 3)));
}

TEST(FrameworkEnvTest, TensorFlowParameterServerTopologyOnSeveralNodesMatchesGolden) {
  auto job = Job(spec::Framework::kTensorFlow,
                 {MakeRole("chief", 1), MakeRole("worker", 2), MakeRole("ps", 1),
                  MakeRole("evaluator", 1), MakeRole("tensorboard", 1)});
  ClusterPlan plan = MakePlan(job, 2);
  ExpectGolden("tensorflow_chief_workers_ps_evaluator", Render(job, plan));
  // The exact TF_CONFIG, spelled out: the evaluator and tensorboard are not in the cluster.
  EXPECT_EQ(BuildTaskEnvironment(job, plan, plan.tasks[2]).at("TF_CONFIG"),
            R"({"cluster":{"chief":["10.0.0.1:29500"],"worker":["10.0.0.1:29501","10.0.0.2:29502"],)"
            R"("ps":["10.0.0.2:29503"]},"task":{"type":"worker","index":1}})");
  EXPECT_EQ(BuildTaskEnvironment(job, plan, plan.tasks[4]).at("TF_CONFIG"),
            R"({"cluster":{"chief":["10.0.0.1:29500"],"worker":["10.0.0.1:29501","10.0.0.2:29502"],)"
            R"("ps":["10.0.0.2:29503"]},"task":{"type":"evaluator","index":0}})");
  EXPECT_EQ(BuildTaskEnvironment(job, plan, plan.tasks[5]).count("TF_CONFIG"), 0u);
}

TEST(FrameworkEnvTest, TensorFlowElasticWorkerUsesItsCurrentRank) {
  auto job = Job(spec::Framework::kTensorFlow, {MakeRole("worker", 3)});
  ClusterPlan plan = MakePlan(job, 3);
  // worker:0 was lost; the two survivors are the world, renumbered.
  plan.tasks.erase(plan.tasks.begin());
  for (uint32_t r = 0; r < plan.tasks.size(); ++r) {
    plan.tasks[r].role_rank = r;
    plan.tasks[r].role_world_size = 2;
  }
  EXPECT_EQ(BuildTaskEnvironment(job, plan, plan.tasks[1]).at("TF_CONFIG"),
            R"({"cluster":{"worker":["10.0.0.1:29501","10.0.0.1:29502"]},)"
            R"("task":{"type":"worker","index":1}})");
}

// --- jax -----------------------------------------------------------------------------------

TEST(FrameworkEnvTest, JaxProcessesOnTwoNodesMatchGolden) {
  auto job = Job(spec::Framework::kJax, {MakeRole("worker", 4)});
  ClusterPlan plan = MakePlan(job, 2);
  ExpectGolden("jax_four_processes_two_nodes", Render(job, plan));
  Environment env = BuildTaskEnvironment(job, plan, plan.tasks[3]);
  EXPECT_EQ(env.at("JAX_COORDINATOR_ADDRESS"), "10.0.0.1:29500");
  EXPECT_EQ(env.at("JAX_NUM_PROCESSES"), "4");
  EXPECT_EQ(env.at("JAX_PROCESS_ID"), "3");
}

// --- paddle --------------------------------------------------------------------------------

TEST(FrameworkEnvTest, PaddleCollectiveTrainersMatchGolden) {
  auto job = Job(spec::Framework::kPaddle, {MakeRole("trainer", 3)});
  ClusterPlan plan = MakePlan(job, 2);
  ExpectGolden("paddle_collective_three_trainers", Render(job, plan));
  Environment env = BuildTaskEnvironment(job, plan, plan.tasks[2]);
  EXPECT_EQ(env.at("PADDLE_TRAINER_ID"), "2");
  EXPECT_EQ(env.at("PADDLE_TRAINERS_NUM"), "3");
  EXPECT_EQ(env.at("PADDLE_TRAINER_ENDPOINTS"),
            "10.0.0.1:29500,10.0.0.1:29501,10.0.0.2:29502");
  EXPECT_EQ(env.at("PADDLE_CURRENT_ENDPOINT"), "10.0.0.2:29502");
  EXPECT_EQ(env.at("PADDLE_MASTER"), "10.0.0.1:29500");
  EXPECT_EQ(env.at("PADDLE_LOCAL_RANK"), "0");
  EXPECT_EQ(env.count("TRAINING_ROLE"), 0u);
}

TEST(FrameworkEnvTest, PaddleParameterServerModeMatchesGolden) {
  auto job = Job(spec::Framework::kPaddle, {MakeRole("pserver", 2), MakeRole("trainer", 2)});
  ClusterPlan plan = MakePlan(job, 2);
  ExpectGolden("paddle_ps_two_servers_two_trainers", Render(job, plan));
  Environment server = BuildTaskEnvironment(job, plan, plan.tasks[1]);
  EXPECT_EQ(server.at("TRAINING_ROLE"), "PSERVER");
  EXPECT_EQ(server.at("PADDLE_PORT"), "29501");
  EXPECT_EQ(server.at("PADDLE_PSERVERS_IP_PORT_LIST"), "10.0.0.1:29500,10.0.0.1:29501");
  Environment trainer = BuildTaskEnvironment(job, plan, plan.tasks[3]);
  EXPECT_EQ(trainer.at("TRAINING_ROLE"), "TRAINER");
  EXPECT_EQ(trainer.at("PADDLE_TRAINER_ID"), "1");
  EXPECT_EQ(trainer.at("PADDLE_TRAINERS_NUM"), "2");
  EXPECT_EQ(trainer.at("PADDLE_PORT"), "29503");
  EXPECT_EQ(trainer.at("POD_IP"), "10.0.0.2");
}

// --- horovod -------------------------------------------------------------------------------

TEST(FrameworkEnvTest, HorovodRanksOnTwoNodesMatchGolden) {
  // Three ranks on node 0, two on node 1: local rank 2 exists on one machine only.
  auto job = Job(spec::Framework::kHorovod, {MakeRole("worker", 5)});
  ClusterPlan plan = MakePlan(job, 3);
  plan.rendezvous_host = "10.0.0.9";
  plan.rendezvous_port = 7140;
  ExpectGolden("horovod_five_ranks_two_nodes", Render(job, plan));
  Environment r2 = BuildTaskEnvironment(job, plan, plan.tasks[2]);
  EXPECT_EQ(r2.at("HOROVOD_LOCAL_RANK"), "2");
  EXPECT_EQ(r2.at("HOROVOD_LOCAL_SIZE"), "3");
  EXPECT_EQ(r2.at("HOROVOD_CROSS_RANK"), "0");
  EXPECT_EQ(r2.at("HOROVOD_CROSS_SIZE"), "1");
  Environment r4 = BuildTaskEnvironment(job, plan, plan.tasks[4]);
  EXPECT_EQ(r4.at("HOROVOD_RANK"), "4");
  EXPECT_EQ(r4.at("HOROVOD_LOCAL_RANK"), "1");
  EXPECT_EQ(r4.at("HOROVOD_LOCAL_SIZE"), "2");
  EXPECT_EQ(r4.at("HOROVOD_CROSS_RANK"), "1");
  EXPECT_EQ(r4.at("HOROVOD_CROSS_SIZE"), "2");
  EXPECT_EQ(r4.at("HOROVOD_HOSTNAME"), "10.0.0.2");
  EXPECT_EQ(r4.at("HOROVOD_GLOO_RENDEZVOUS_ADDR"), "10.0.0.9");
  EXPECT_EQ(r4.at("HOROVOD_GLOO_RENDEZVOUS_PORT"), "7140");
  // Across machines gloo must not listen on loopback: no interface is forced.
  EXPECT_EQ(r4.count("HOROVOD_GLOO_IFACE"), 0u);
}

TEST(FrameworkEnvTest, HorovodOnOneMachineUsesLoopback) {
  auto job = Job(spec::Framework::kHorovod, {MakeRole("worker", 2)});
  ClusterPlan plan = MakePlan(job, 2);
  for (auto& t : plan.tasks) t.address = "127.0.0.1";
  plan.rendezvous_host = "127.0.0.1";
  plan.rendezvous_port = 7140;
  Environment env = BuildTaskEnvironment(job, plan, plan.tasks[1]);
  EXPECT_EQ(env.at("HOROVOD_GLOO_IFACE"), "lo");
  EXPECT_EQ(env.at("HOROVOD_CONTROLLER"), "gloo");
  EXPECT_EQ(env.at("HOROVOD_CPU_OPERATIONS"), "gloo");
}


// --- mpi -----------------------------------------------------------------------------------

TEST(FrameworkEnvTest, MpiLauncherAndWorkersOnTwoNodesMatchGolden) {
  spec::Role launcher = MakeRole("launcher", 1);
  spec::Role worker = MakeRole("worker", 2);
  worker.argv.clear();
  auto job = Job(spec::Framework::kMpi, {launcher, worker});
  job.mpi.slots_per_worker = 2;
  ClusterPlan plan = MakePlan(job, 2);
  plan.task_secret = "0123abcd";
  ExpectGolden("mpi_launcher_two_workers_two_nodes", Render(job, plan));
  // The secret authenticates mpi-rsh to the workers; it never reaches the cluster spec file.
  EXPECT_EQ(ClusterSpecJson(plan).find("0123abcd"), std::string::npos);
}

TEST(FrameworkEnvTest, MpiWrapsTheLauncherCommandAndRunsShoalInWorkers) {
  spec::Role launcher = MakeRole("launcher", 1);
  spec::Role worker = MakeRole("worker", 2);
  worker.argv.clear();
  spec::Role other = MakeRole("tensorboard", 1);
  other.argv.clear();
  other.shell = "tensorboard --logdir runs";
  auto job = Job(spec::Framework::kMpi, {launcher, worker, other});
  EXPECT_EQ(TaskArgv(job, job.roles[0], "/opt/shoal"),
            (std::vector<std::string>{"/opt/shoal", "mpi-launcher", "--", "python3", "train.py"}));
  EXPECT_EQ(TaskArgv(job, job.roles[1], "/opt/shoal"),
            (std::vector<std::string>{"/opt/shoal", "mpi-worker"}));
  // Roles outside the MPI world run their own command.
  EXPECT_EQ(TaskArgv(job, job.roles[2], "/opt/shoal"),
            (std::vector<std::string>{"/bin/sh", "-c", "tensorboard --logdir runs"}));
  Environment env = BuildTaskEnvironment(job, MakePlan(job, 4), MakePlan(job, 4).tasks[3]);
  EXPECT_EQ(env.count("SHOAL_MPI_SECRET"), 0u);
}

TEST(FrameworkEnvTest, OtherFrameworksRunTheRoleCommandAsWritten) {
  spec::Role shell = MakeRole("worker", 1);
  shell.argv.clear();
  shell.shell = "python3 train.py --epochs 2";
  auto job = Job(spec::Framework::kPyTorch, {MakeRole("chief", 1), shell});
  EXPECT_EQ(TaskArgv(job, job.roles[0], "/opt/shoal"),
            (std::vector<std::string>{"python3", "train.py"}));
  EXPECT_EQ(TaskArgv(job, job.roles[1], "/opt/shoal"),
            (std::vector<std::string>{"/bin/sh", "-c", "python3 train.py --epochs 2"}));
}

}  // namespace
}  // namespace shoal::frameworks
