#include "master/rendezvous.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "openssl/evp.h"
#include "openssl/hmac.h"

namespace shoal::master {

std::string TaskSecret(const std::string& token, const std::string& job_id) {
  std::string data = "shoal-task-secret:" + job_id;
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac, &len);
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) hex += absl::StrFormat("%02x", mac[i]);
  return hex;
}

absl::StatusOr<std::map<std::string, uint32_t>> AssignTaskPorts(
    const std::vector<PlacedTask>& placement,
    const std::map<std::string, std::vector<uint32_t>>& free_ports,
    const std::map<std::string, std::string>& node_addresses) {
  std::map<std::string, uint32_t> ports;
  std::map<std::string, std::set<uint32_t>> held;  // machine -> ports its tasks hold
  for (const auto& p : placement) {
    auto offered = free_ports.find(p.node);
    std::set<uint32_t>& on_machine = held[MachineOf(p.node, node_addresses)];
    uint32_t port = offered == free_ports.end() ? 0 : FirstPortNotHeld(offered->second, on_machine);
    if (port == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("the agent on ", p.node, " reported too few free ports"));
    }
    on_machine.insert(port);
    ports[absl::StrCat(p.role, ":", p.index)] = port;
  }
  return ports;
}

std::string MachineOf(const std::string& place,
                      const std::map<std::string, std::string>& node_addresses) {
  auto it = node_addresses.find(place);
  return it == node_addresses.end() || it->second.empty() ? place : it->second;
}

uint32_t FirstPortNotHeld(const std::vector<uint32_t>& offered, const std::set<uint32_t>& held) {
  for (uint32_t port : offered) {
    if (held.count(port) == 0) return port;
  }
  return 0;
}

frameworks::ClusterPlan BuildClusterPlan(const RendezvousInputs& in) {
  const spec::JobSpec& spec = *in.spec;
  frameworks::ClusterPlan plan;
  plan.job_id = in.job_id;
  plan.job_dir = in.job_dir;
  plan.restart_count = in.generation;
  plan.checkpoint_dir =
      spec.checkpoint.dir.empty() ? in.job_dir + "/checkpoints" : spec.checkpoint.dir;
  // Local ranks and node ranks count machines, not places: a backend may put several places
  // (one per task, on Slurm) on one machine, and tasks there share its devices and memory.
  // A place's machine is the address its agent reported; before that, the place itself.
  auto address_of = [&](const std::string& place) -> std::string {
    auto it = in.node_addresses->find(place);
    return it == in.node_addresses->end() ? "" : it->second;
  };
  auto host_of = [&](const std::string& place) { return MachineOf(place, *in.node_addresses); };
  auto grant_of = [&](const std::string& node) -> const backends::NodeGrant* {
    for (const auto& g : *in.grants) {
      if (g.name == node) return &g;
    }
    return nullptr;
  };
  std::map<std::string, uint32_t> node_rank, per_node_count, per_node_next, role_count, role_next;
  for (const auto& g : *in.grants) node_rank.try_emplace(host_of(g.name), node_rank.size());
  plan.num_nodes = static_cast<uint32_t>(node_rank.size());
  if (spec.framework == spec::Framework::kMpi) plan.task_secret = TaskSecret(in.token, in.job_id);
  if (!in.rendezvous_host.empty()) {
    plan.rendezvous_host = in.rendezvous_host;
    plan.rendezvous_port = in.rendezvous_port;
  }
  const std::vector<TaskRecord>& tasks = *in.tasks;
  const std::vector<PlacedTask>& placement = *in.placement;
  for (size_t i = 0; i < placement.size(); ++i) {
    if (!tasks[i].in_world) continue;
    per_node_count[host_of(placement[i].node)]++;
    role_count[tasks[i].role]++;
  }
  uint32_t rank = 0;
  for (size_t i = 0; i < placement.size(); ++i) {
    const PlacedTask& p = placement[i];
    const TaskRecord& rec = tasks[i];
    if (!rec.in_world) continue;
    frameworks::TaskPlacement t;
    t.role = p.role;
    t.index = p.index;
    t.global_rank = rank++;
    t.node = p.node;
    t.address = address_of(p.node);
    auto port = in.slot_ports->find(rec.Key());
    t.port = port == in.slot_ports->end() ? 0 : port->second;
    std::string host = host_of(p.node);
    t.node_rank = node_rank[host];
    t.local_rank = per_node_next[host]++;
    t.local_world_size = per_node_count[host];
    t.role_rank = role_next[p.role]++;
    t.role_world_size = role_count[p.role];
    t.cpu_affinity = p.cores;
    t.gpus = p.gpus;
    if (const backends::NodeGrant* g = grant_of(p.node); g != nullptr && g->gpus_from_agent) {
      // The devices the resource manager bound to this place's agent.
      static const std::vector<std::string> kNone;
      auto seen = in.node_gpus->find(p.node);
      const std::vector<std::string>& have = seen == in.node_gpus->end() ? kNone : seen->second;
      const spec::Role* role = spec.FindRole(p.role);
      uint32_t want = role ? role->resources.gpus : 0;
      t.gpus.assign(have.begin(), have.begin() + std::min<size_t>(want, have.size()));
    }
    t.attempt = rec.attempt;
    plan.tasks.push_back(std::move(t));
  }
  return plan;
}

Rendezvous RendezvousRecord(const frameworks::ClusterPlan& plan) {
  Rendezvous r;
  r.generation = plan.restart_count;
  r.world_size = plan.tasks.size();
  for (const auto& t : plan.tasks) {
    r.ranks.push_back({absl::StrCat(t.role, ":", t.index), t.global_rank, t.node, t.address,
                       t.port});
  }
  return r;
}

}  // namespace shoal::master
