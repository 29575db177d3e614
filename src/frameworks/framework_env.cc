#include "frameworks/framework_env.h"

#include <algorithm>
#include <cmath>

#include "nlohmann/json.hpp"

namespace shoal::frameworks {

namespace {

void AddShoalVariables(const spec::JobSpec& job, const ClusterPlan& plan, const TaskPlacement& task,
                       Environment& env) {
  const spec::Role* role = job.FindRole(task.role);
  env["SHOAL_JOB_ID"] = plan.job_id;
  env["SHOAL_JOB_NAME"] = job.name;
  env["SHOAL_JOB_DIR"] = plan.job_dir;
  env["SHOAL_ROLE"] = task.role;
  env["SHOAL_INDEX"] = std::to_string(task.index);
  env["SHOAL_ROLE_INSTANCES"] = std::to_string(
      task.role_world_size != 0 ? task.role_world_size : (role ? role->instances : 1));
  env["SHOAL_RANK"] = std::to_string(task.global_rank);
  env["SHOAL_WORLD_SIZE"] = std::to_string(plan.tasks.size());
  env["SHOAL_NODE"] = task.node;
  env["SHOAL_TASK_PORT"] = std::to_string(task.port);
  // The task's own attempt (restart-task restarts it alone); TORCHELASTIC_RESTART_COUNT below
  // counts the group's restarts, as torchrun does.
  env["SHOAL_RESTART_COUNT"] = std::to_string(task.attempt);
  env["SHOAL_GENERATION"] = std::to_string(plan.restart_count);
  if (!plan.checkpoint_dir.empty()) {
    env["SHOAL_CHECKPOINT_DIR"] = plan.checkpoint_dir;
    env["SHOAL_CHECKPOINT_KEEP"] = std::to_string(job.checkpoint.keep);
  }
  // Frameworks size their thread pools from this; without it every process takes every core.
  if (role != nullptr) {
    int threads = std::max(1, static_cast<int>(std::floor(role->resources.cpus)));
    env["OMP_NUM_THREADS"] = std::to_string(threads);
  }
}

// The variables torchrun's elastic agent gives each worker (torch/distributed/elastic/agent/
// server/local_elastic_agent.py), so a script written for torchrun runs unchanged.
void AddTorchrunVariables(const spec::JobSpec& job, const ClusterPlan& plan,
                          const TaskPlacement& task, Environment& env) {
  const TaskPlacement& rank0 = plan.tasks.front();
  const spec::Role* role = job.FindRole(task.role);
  uint32_t role_world =
      task.role_world_size != 0 ? task.role_world_size : (role ? role->instances : 1);
  uint32_t role_rank = task.role_world_size != 0 ? task.role_rank : task.index;
  env["MASTER_ADDR"] = rank0.address;
  env["MASTER_PORT"] = std::to_string(rank0.port);
  env["RANK"] = std::to_string(task.global_rank);
  env["WORLD_SIZE"] = std::to_string(plan.tasks.size());
  env["LOCAL_RANK"] = std::to_string(task.local_rank);
  env["LOCAL_WORLD_SIZE"] = std::to_string(task.local_world_size);
  env["GROUP_RANK"] = std::to_string(task.node_rank);
  env["GROUP_WORLD_SIZE"] = std::to_string(plan.num_nodes);
  env["ROLE_NAME"] = task.role;
  env["ROLE_RANK"] = std::to_string(role_rank);
  env["ROLE_WORLD_SIZE"] = std::to_string(role_world);
  env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(plan.restart_count);
  bool group_policy = role != nullptr && (role->on_failure == spec::OnFailure::kRestartGroup ||
                                          role->on_failure == spec::OnFailure::kElastic);
  env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(group_policy ? role->max_restarts : 0);
  env["TORCHELASTIC_RUN_ID"] = plan.job_id;
  env["TORCHELASTIC_USE_AGENT_STORE"] = "False";
}

}  // namespace

Environment BuildTaskEnvironment(const spec::JobSpec& job, const ClusterPlan& plan,
                                 const TaskPlacement& task) {
  Environment env;
  AddShoalVariables(job, plan, task, env);
  if (!task.gpus.empty()) {
    std::string ids;
    for (const auto& g : task.gpus) ids += (ids.empty() ? "" : ",") + g;
    env["CUDA_VISIBLE_DEVICES"] = ids;
  }
  switch (job.framework) {
    case spec::Framework::kPyTorch:
      AddTorchrunVariables(job, plan, task, env);
      break;
    case spec::Framework::kNone:
      break;
  }
  // The role's own env wins: a user who sets OMP_NUM_THREADS means it.
  if (const spec::Role* role = job.FindRole(task.role)) {
    for (const auto& [k, v] : role->env) env[k] = v;
  }
  return env;
}

std::string ClusterSpecJson(const ClusterPlan& plan) {
  nlohmann::ordered_json cluster = nlohmann::ordered_json::object();
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  for (const auto& t : plan.tasks) {
    cluster[t.role].push_back(t.address + ":" + std::to_string(t.port));
    ranks.push_back({{"role", t.role}, {"index", t.index}, {"rank", t.global_rank},
                     {"node", t.node}, {"address", t.address}, {"port", t.port}});
  }
  nlohmann::ordered_json doc = {
      {"job_id", plan.job_id},
      {"restart_count", plan.restart_count},
      {"cluster", cluster},
      {"tasks", ranks},
  };
  return doc.dump(2);
}

}  // namespace shoal::frameworks
