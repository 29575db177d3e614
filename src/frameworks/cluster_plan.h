#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shoal::frameworks {

// Where one task runs and how the others reach it. Built by the master's rendezvous.
struct TaskPlacement {
  std::string role;
  uint32_t index = 0;         // index within the role
  uint32_t global_rank = 0;   // rank over all tasks of the job, chief/master role first
  // Rank and count within the role in the current world. They differ from index / instances
  // only for an elastic role that runs with fewer tasks than `instances`. role_world_size 0:
  // use index and the role's instances.
  uint32_t role_rank = 0;
  uint32_t role_world_size = 0;
  std::string node;           // placement node name
  std::string address;        // host other tasks use to reach this task
  uint32_t port = 0;          // a port reserved for this task on its node
  uint32_t node_rank = 0;     // index of `node` among the job's nodes
  uint32_t local_rank = 0;    // index among the job's tasks on the same node
  uint32_t local_world_size = 1;
  std::vector<uint32_t> cpu_affinity;
  std::vector<std::string> gpus;
  uint32_t attempt = 0;       // SHOAL_RESTART_COUNT: how many times this task was restarted
};

// The whole job's placement, as every task sees it.
struct ClusterPlan {
  std::string job_id;
  std::string job_dir;
  uint32_t restart_count = 0;  // the rendezvous generation: group restarts and rescales
  std::string checkpoint_dir;
  uint32_t num_nodes = 1;
  // A key-value rendezvous the master serves for the framework (Horovod's gloo store): IPv4
  // address and port; port 0: none.
  std::string rendezvous_host;
  uint32_t rendezvous_port = 0;
  // Shared by the job's tasks to authenticate to each other (framework: mpi's remote shell);
  // derived from the job's token by the master. Never in the cluster spec JSON.
  std::string task_secret;
  std::vector<TaskPlacement> tasks;  // ordered by global rank
};

}  // namespace shoal::frameworks
