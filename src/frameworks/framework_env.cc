#include "frameworks/framework_env.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

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
  if (!job.publish.repository.empty()) {
    env["SHOAL_MODEL_REPOSITORY"] = job.publish.repository;
    if (job.publish.keep > 0) env["SHOAL_MODEL_KEEP"] = std::to_string(job.publish.keep);
  }
  if (job.tensorboard.configured) {
    env["SHOAL_TENSORBOARD_LOGDIR"] =
        job.tensorboard.logdir.empty() ? plan.job_dir + "/tensorboard" : job.tensorboard.logdir;
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

std::string Endpoint(const TaskPlacement& t) { return t.address + ":" + std::to_string(t.port); }

// The task's rank and count within its role in the current world (elastic roles shrink).
uint32_t RoleRank(const TaskPlacement& t) { return t.role_world_size != 0 ? t.role_rank : t.index; }

// TensorFlow's task types that form the cluster. An evaluator runs beside it (it gets its own
// task entry, never a place in the cluster); other roles (tensorboard, a data service) are not
// TensorFlow servers at all and get no TF_CONFIG.
bool InTensorFlowCluster(const std::string& role) {
  return role == "chief" || role == "worker" || role == "ps" || role == "master";
}

// TF_CONFIG as tf.distribute's cluster resolver reads it (TFConfigClusterResolver), for
// MultiWorkerMirroredStrategy (chief/worker) and ParameterServerStrategy (chief, worker, ps).
void AddTensorFlowVariables(const ClusterPlan& plan, const TaskPlacement& task, Environment& env) {
  if (!InTensorFlowCluster(task.role) && task.role != "evaluator") return;
  nlohmann::ordered_json cluster = nlohmann::ordered_json::object();
  for (const auto& t : plan.tasks) {
    if (InTensorFlowCluster(t.role)) cluster[t.role].push_back(Endpoint(t));
  }
  nlohmann::ordered_json config = {
      {"cluster", cluster},
      {"task", {{"type", task.role}, {"index", RoleRank(task)}}},
  };
  env["TF_CONFIG"] = config.dump();
}

// What jax.distributed.initialize(coordinator_address, num_processes, process_id) takes: the
// coordinator is rank 0's reserved port. JAX reads JAX_COORDINATOR_ADDRESS itself; the other
// two are passed by the script (see docs/frameworks.md).
void AddJaxVariables(const ClusterPlan& plan, const TaskPlacement& task, Environment& env) {
  env["JAX_COORDINATOR_ADDRESS"] = Endpoint(plan.tasks.front());
  env["JAX_NUM_PROCESSES"] = std::to_string(plan.tasks.size());
  env["JAX_PROCESS_ID"] = std::to_string(task.global_rank);
}

// What PaddlePaddle's launcher (python -m paddle.distributed.launch, Paddle 3.x:
// launch/controllers/collective.py and ps.py) gives each process: collective mode for trainers,
// parameter-server mode when the job has a `pserver` (or `ps`) role. Checked against the
// launcher's own output; docs/environment.md lists what reads what.
void AddPaddleVariables(const ClusterPlan& plan, const TaskPlacement& task, Environment& env) {
  auto is_server = [](const std::string& role) { return role == "pserver" || role == "ps"; };
  std::vector<std::string> trainers, servers;
  uint32_t trainer_id = 0;
  for (const auto& t : plan.tasks) {
    bool me = t.role == task.role && t.index == task.index;
    if (is_server(t.role)) {
      servers.push_back(Endpoint(t));
    } else {
      if (me) trainer_id = static_cast<uint32_t>(trainers.size());
      trainers.push_back(Endpoint(t));
    }
  }
  auto join = [](const std::vector<std::string>& v) {
    std::string out;
    for (const auto& s : v) out += (out.empty() ? "" : ",") + s;
    return out;
  };
  env["PADDLE_TRAINERS_NUM"] = std::to_string(trainers.size());
  env["PADDLE_TRAINER_ENDPOINTS"] = join(trainers);
  env["PADDLE_NNODES"] = std::to_string(plan.num_nodes);
  if (servers.empty()) {
    env["PADDLE_TRAINER_ID"] = std::to_string(trainer_id);
    env["PADDLE_GLOBAL_RANK"] = std::to_string(trainer_id);
    env["PADDLE_GLOBAL_SIZE"] = std::to_string(trainers.size());
    env["PADDLE_CURRENT_ENDPOINT"] = Endpoint(task);
    env["PADDLE_LOCAL_RANK"] = std::to_string(task.local_rank);
    env["PADDLE_RANK_IN_NODE"] = std::to_string(task.local_rank);
    env["PADDLE_LOCAL_SIZE"] = std::to_string(task.local_world_size);
    // The TCP store: trainer 0 serves it on its own endpoint, as the launcher's --ips form does.
    env["PADDLE_MASTER"] = trainers.empty() ? "" : trainers.front();
    if (task.gpus.empty()) {
      env["PADDLE_DISTRI_BACKEND"] = "gloo";
    } else {
      // Device indices as the task sees them (CUDA_VISIBLE_DEVICES holds only its own).
      std::string ids;
      for (size_t i = 0; i < task.gpus.size(); ++i) ids += (i ? "," : "") + std::to_string(i);
      env["FLAGS_selected_gpus"] = ids;
    }
    return;
  }
  const char* role = is_server(task.role) ? "PSERVER" : "TRAINER";
  env["PADDLE_PSERVERS_IP_PORT_LIST"] = join(servers);
  env["TRAINING_ROLE"] = role;
  env["PADDLE_ROLE"] = role;
  env["PADDLE_TRAINING_ROLE"] = role;
  // A server finds its id as the index of POD_IP:PADDLE_PORT in the server list; a trainer
  // needs both too (fleet's role maker refuses to start without PADDLE_PORT).
  env["POD_IP"] = task.address;
  env["PADDLE_PORT"] = std::to_string(task.port);
  if (!is_server(task.role)) env["PADDLE_TRAINER_ID"] = std::to_string(trainer_id);
}

// What `horovodrun --gloo` gives each rank (horovod/runner/gloo_run.py), with the master's
// rendezvous store in place of horovodrun's, so no horovodrun and no ssh are needed. Machines
// are told apart by address: HOROVOD_HOSTNAME is only a label, the same for ranks on one
// machine and different across machines.
void AddHorovodVariables(const ClusterPlan& plan, const TaskPlacement& task, Environment& env) {
  // Cross rank: this machine's position among the machines that have a task with this local
  // rank (in node order); cross size: how many machines have one.
  std::map<uint32_t, std::vector<uint32_t>> nodes_with_local_rank;
  for (const auto& t : plan.tasks) {
    auto& nodes = nodes_with_local_rank[t.local_rank];
    if (std::find(nodes.begin(), nodes.end(), t.node_rank) == nodes.end()) {
      nodes.push_back(t.node_rank);
    }
  }
  auto& peers = nodes_with_local_rank[task.local_rank];
  std::sort(peers.begin(), peers.end());
  uint32_t cross_rank = static_cast<uint32_t>(
      std::find(peers.begin(), peers.end(), task.node_rank) - peers.begin());
  env["HOROVOD_RANK"] = std::to_string(task.global_rank);
  env["HOROVOD_SIZE"] = std::to_string(plan.tasks.size());
  env["HOROVOD_LOCAL_RANK"] = std::to_string(task.local_rank);
  env["HOROVOD_LOCAL_SIZE"] = std::to_string(task.local_world_size);
  env["HOROVOD_CROSS_RANK"] = std::to_string(cross_rank);
  env["HOROVOD_CROSS_SIZE"] = std::to_string(peers.size());
  env["HOROVOD_HOSTNAME"] = task.address;
  env["HOROVOD_CONTROLLER"] = "gloo";
  env["HOROVOD_CPU_OPERATIONS"] = "gloo";
  env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] = plan.rendezvous_host;
  env["HOROVOD_GLOO_RENDEZVOUS_PORT"] = std::to_string(plan.rendezvous_port);
  // gloo listens on the interface named here; unset, on the address the machine's hostname
  // resolves to. All on loopback: `lo`, as horovodrun does for a local job.
  bool all_loopback = std::all_of(plan.tasks.begin(), plan.tasks.end(), [](const TaskPlacement& t) {
    return t.address.rfind("127.", 0) == 0;
  });
  if (all_loopback) env["HOROVOD_GLOO_IFACE"] = "lo";
  env["PYTHONUNBUFFERED"] = "1";
}

// What `shoal mpi-launcher`, `mpi-worker` and `mpi-rsh` need (src/mpi); the Open MPI variables
// themselves are set by mpi-launcher, which knows where it wrote the hostfile.
void AddMpiVariables(const spec::JobSpec& job, const ClusterPlan& plan, const TaskPlacement& task,
                     Environment& env) {
  if (task.role != "launcher" && task.role != "worker") return;
  env["SHOAL_MPI_SECRET"] = plan.task_secret;
  env["SHOAL_MPI_SLOTS_PER_WORKER"] = std::to_string(job.mpi.slots_per_worker);
  env["PYTHONUNBUFFERED"] = "1";
}

}  // namespace

Environment LocalDirectories(const Environment& env) {
  Environment dirs;
  for (const char* name : {"SHOAL_JOB_DIR", "SHOAL_CHECKPOINT_DIR", "SHOAL_TENSORBOARD_LOGDIR"}) {
    auto it = env.find(name);
    if (it != env.end() && !it->second.empty() && it->second.front() == '/') {
      dirs[name] = it->second;
    }
  }
  return dirs;
}

std::vector<std::string> TaskArgv(const spec::JobSpec& job, const spec::Role& role,
                                  const std::string& shoal_binary) {
  std::vector<std::string> command = role.argv;
  if (command.empty() && !role.shell.empty()) command = {"/bin/sh", "-c", role.shell};
  if (job.framework != spec::Framework::kMpi) return command;
  if (role.name == "worker") return {shoal_binary, "mpi-worker"};
  if (role.name == "launcher") {
    std::vector<std::string> argv = {shoal_binary, "mpi-launcher", "--"};
    argv.insert(argv.end(), command.begin(), command.end());
    return argv;
  }
  return command;
}

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
    case spec::Framework::kTensorFlow:
      AddTensorFlowVariables(plan, task, env);
      break;
    case spec::Framework::kJax:
      AddJaxVariables(plan, task, env);
      break;
    case spec::Framework::kPaddle:
      AddPaddleVariables(plan, task, env);
      break;
    case spec::Framework::kHorovod:
      AddHorovodVariables(plan, task, env);
      break;
    case spec::Framework::kMpi:
      AddMpiVariables(job, plan, task, env);
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
