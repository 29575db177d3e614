#include "agent/task_environment.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <string_view>

#include "common/files.h"
#include "frameworks/framework_env.h"
#include "spec/task_variables.h"

namespace shoal::agent {
namespace {

// Golden files hold the exact environment a task gets. To accept an intended change, run the
// test with SHOAL_UPDATE_GOLDEN=1 and review the diff.
std::string GoldenPath(const std::string& name) {
  return std::string(SHOAL_SOURCE_DIR) + "/tests/agent/golden/" + name + ".env";
}

std::string Render(const Environment& env) {
  std::ostringstream out;
  for (const auto& [k, v] : env) out << k << "=" << v << "\n";
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

// The agent's environment as `shoal run` leaves it, with what an enclosing Shoal task would
// have given it (its progress file, its TensorBoard directory): stale for this task.
TaskEnvironmentInputs LocalInputs() {
  TaskEnvironmentInputs in;
  in.inherited = {{"HOME", "/home/ada"},
                  {"PATH", "/venv/bin:/usr/bin:/bin"},
                  {"OMP_NUM_THREADS", "64"},
                  {"SHOAL_AGENT_TOKEN", "agent-secret"},
                  {"SHOAL_TASK_PORTS", "20000-20999"},
                  {"SHOAL_PROGRESS_FILE", "/outer/progress-worker-0.0"},
                  {"SHOAL_TENSORBOARD_LOGDIR", "/outer/tensorboard"}};
  in.from_master = {{"SHOAL_JOB_ID", "golden-20260101-000000-abcd"},
                    {"SHOAL_ROLE", "worker"},
                    {"SHOAL_INDEX", "0"},
                    {"SHOAL_RANK", "0"},
                    {"SHOAL_WORLD_SIZE", "2"},
                    {"OMP_NUM_THREADS", "2"},
                    {"MY_SETTING", "from the role's env"}};
  in.cluster_spec_file = "/jobs/golden/agents/local/cluster.json";
  in.agent_socket = "@shoal-agent-golden";
  in.progress_file = "/dev/shm/shoal-golden/progress-worker-0.0";
  return in;
}

TEST(TaskEnvironmentTest, LocalTaskMatchesGolden) {
  ExpectGolden("local_task", Render(TaskEnvironment(LocalInputs())));
}

// Under srun the step's SLURM_* are hidden, SLURM_CONF kept, the allocation's id kept as
// SHOAL_SLURM_JOB_ID; without a progress board the task gets no SHOAL_PROGRESS_FILE at all,
// not the one it inherited.
TEST(TaskEnvironmentTest, SlurmTaskWithoutProgressBoardMatchesGolden) {
  TaskEnvironmentInputs in = LocalInputs();
  in.hide_slurm_step_env = true;
  in.inherited["SLURM_JOB_ID"] = "4242";
  in.inherited["SLURM_PROCID"] = "1";
  in.inherited["SLURM_NTASKS"] = "2";
  in.inherited["SLURMD_NODENAME"] = "node7";
  in.inherited["SLURM_CONF"] = "/etc/slurm/slurm.conf";
  in.inherited["SHOAL_SLURM_JOB_ID"] = "1";
  in.progress_file = "";
  ExpectGolden("slurm_task_without_progress_board", Render(TaskEnvironment(in)));
}

// Issue 24: the agent's additions came after the role's env in code and before it in the docs.
// The agent's own variables always win; the role's env wins over what the task inherited.
TEST(TaskEnvironmentTest, AgentVariablesWinOverEverythingBeforeThem) {
  TaskEnvironmentInputs in = LocalInputs();
  in.from_master["SHOAL_AGENT_SOCKET"] = "/tmp/elsewhere";
  Environment env = TaskEnvironment(in);
  EXPECT_EQ(env.at("SHOAL_AGENT_SOCKET"), "@shoal-agent-golden");
  EXPECT_EQ(env.at("OMP_NUM_THREADS"), "2");
  EXPECT_EQ(env.count("SHOAL_AGENT_TOKEN"), 0u);
}

// spec::ReservedTaskVariables, which the parser refuses in a role's env, is exactly the SHOAL_*
// names Shoal sets for a task: the master's (every framework, every optional part) and the
// agent's.
TEST(TaskEnvironmentTest, ReservedNamesAreExactlyTheShoalVariablesShoalSets) {
  std::set<std::string> set_by_shoal;
  auto collect = [&](const std::map<std::string, std::string>& env) {
    for (const auto& [name, value] : env) {
      if (name.rfind("SHOAL_", 0) == 0) set_by_shoal.insert(name);
    }
  };
  for (spec::Framework framework :
       {spec::Framework::kNone, spec::Framework::kPyTorch, spec::Framework::kTensorFlow,
        spec::Framework::kJax, spec::Framework::kPaddle, spec::Framework::kHorovod,
        spec::Framework::kMpi}) {
    spec::JobSpec job;
    job.name = "names";
    job.framework = framework;
    job.tensorboard.configured = true;
    job.publish = {"/models", 2, true};
    spec::Role role;
    role.name = "worker";
    role.argv = {"x"};
    job.roles = {role};
    role.name = "launcher";
    job.roles.push_back(role);
    frameworks::ClusterPlan plan;
    plan.job_id = "names-1";
    plan.job_dir = "/jobs/names-1";
    plan.checkpoint_dir = "/jobs/names-1/checkpoints";
    for (const char* name : {"worker", "launcher"}) {
      frameworks::TaskPlacement task;
      task.role = name;
      task.global_rank = static_cast<uint32_t>(plan.tasks.size());
      task.node = "local";
      task.address = "127.0.0.1";
      plan.tasks.push_back(task);
    }
    for (const auto& task : plan.tasks) collect(frameworks::BuildTaskEnvironment(job, plan, task));
  }
  TaskEnvironmentInputs in;
  in.hide_slurm_step_env = true;
  in.inherited = {{"SLURM_JOB_ID", "1"}};
  in.cluster_spec_file = "/c";
  in.agent_socket = "@s";
  in.progress_file = "/p";
  collect(TaskEnvironment(in));

  std::set<std::string> reserved;
  for (std::string_view name : spec::ReservedTaskVariables()) reserved.emplace(name);
  EXPECT_EQ(reserved, set_by_shoal);
}

}  // namespace
}  // namespace shoal::agent
