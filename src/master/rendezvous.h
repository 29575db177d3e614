#pragma once

// Rendezvous: who is in the world, with which rank, on which place and port. Pure functions of
// the job's facts (no clock, no I/O): the master journals what they return and sends the plan
// to the agents. tests/master/rendezvous_test.cc holds them to golden files.

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "frameworks/cluster_plan.h"
#include "master/job_state.h"
#include "master/journal_records.h"
#include "master/placement.h"
#include "spec/job_spec.h"

namespace shoal::master {

struct RendezvousInputs {
  const spec::JobSpec* spec = nullptr;
  std::string job_id;
  std::string job_dir;
  std::string token;  // the job's token, from which an MPI job's task secret derives
  uint32_t generation = 0;
  const std::vector<TaskRecord>* tasks = nullptr;      // in JobState's order
  const std::vector<PlacedTask>* placement = nullptr;  // parallel to `tasks`
  const std::vector<backends::NodeGrant>* grants = nullptr;
  const std::map<std::string, std::string>* node_addresses = nullptr;  // as agents reported
  const std::map<std::string, std::vector<std::string>>* node_gpus = nullptr;
  const std::map<std::string, uint32_t>* slot_ports = nullptr;  // task key -> port
  // Horovod's gloo key-value store; empty host otherwise.
  std::string rendezvous_host;
  uint16_t rendezvous_port = 0;
};

// The plan of the tasks in the world (in_world), ranked in JobState's order: global ranks
// 0..n-1, node ranks and local ranks counted per machine (the address a place's agent
// reported; before that, the place), role ranks per role.
frameworks::ClusterPlan BuildClusterPlan(const RendezvousInputs& in);

// The journal's record of a plan.
Rendezvous RendezvousRecord(const frameworks::ClusterPlan& plan);

// Each placed task's port: the next port its place's agent offered that no task placed before
// it on the same machine holds, in placement order. Places share a machine when their agents
// reported the same address (`node_addresses`; a place without one is a machine of its own):
// their agents probed for free ports independently and may have offered the same one. A task
// keeps its port for the life of the job (a restarted task binds the port its predecessor
// held). FailedPrecondition naming the place when an agent offered too few.
absl::StatusOr<std::map<std::string, uint32_t>> AssignTaskPorts(
    const std::vector<PlacedTask>& placement,
    const std::map<std::string, std::vector<uint32_t>>& free_ports,
    const std::map<std::string, std::string>& node_addresses = {});

// The machine a place is on, for sharing ports, GPUs and ranks: the address its agent
// reported; before that (or without one), the place itself.
std::string MachineOf(const std::string& place,
                      const std::map<std::string, std::string>& node_addresses);

// The first of `offered` not in `held`; 0 when every one is.
uint32_t FirstPortNotHeld(const std::vector<uint32_t>& offered, const std::set<uint32_t>& held);

// HMAC-SHA256(token, "shoal-task-secret:" + job id) in hex: a secret the tasks share that a
// recovering master derives again, and that reveals nothing of the token to the tasks.
std::string TaskSecret(const std::string& token, const std::string& job_id);

}  // namespace shoal::master
