// The master's way from admitted places to running tasks: agents registering, the rendezvous
// (rendezvous.h builds the plan), and launching roles in their dependency order. Part of class
// Master (master.h), on its loop; admission itself is admission.h.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "frameworks/framework_env.h"
#include "master/master.h"
#include "master/rendezvous.h"
#include "shoal/v1/shoal.pb.h"
#include "spdlog/spdlog.h"

namespace shoal::master {

backends::AgentStartOptions Master::AgentStartOptions() const {
  backends::AgentStartOptions start;
  start.master_address = address_;
  start.token = options_.token;
  start.job_id = options_.job_id;
  start.job_dir = options_.job_dir;
  start.shoal_binary = options_.shoal_binary;
  start.master_grace_ms = options_.agent_master_grace_ms;
  start.heartbeat_interval_ms = static_cast<uint32_t>(options_.heartbeat_interval.count());
  start.silent_after_ms = static_cast<uint32_t>(options_.heartbeat_interval.count() *
                                                options_.heartbeat_misses);
  for (const auto& p : admission_.placement()) start.ports_per_node[p.node]++;
  for (const auto& g : job_.grants) start.ports_per_node.try_emplace(g.name, 0);
  return start;
}

void Master::OnRegister(AgentSession& session, const v1::AgentMessage& message) {
  if (options_.recover && !recovery_started_) {
    // An agent redialled faster than the new master's Recover() got onto its loop: answer once
    // the job is rebuilt.
    loop_.PostAfter(std::chrono::milliseconds(1), [this, id = session.id, message] {
      if (AgentSession* s = agents_.Find(id)) OnRegister(*s, message);
    });
    return;
  }
  const v1::RegisterRequest& req = message.register_();
  v1::MasterMessage reply;
  auto* r = reply.mutable_register_reply();
  r->set_job_id(options_.job_id);
  auto refuse = [&](const std::string& why) {
    r->set_accepted(false);
    r->set_reason(why);
    agents_.Send(session, reply);
    Record(AgentRefused{req.node_name(), why});
    spdlog::warn("refused agent for node {}: {}", req.node_name(), why);
  };
  if (req.version() != v1::PROTOCOL_VERSION_CURRENT) {
    refuse(absl::StrCat("protocol version ", static_cast<int>(req.version()), " is not ",
                        static_cast<int>(v1::PROTOCOL_VERSION_CURRENT),
                        "; run an agent of the same Shoal release as the master"));
    return;
  }
  bool expected = job_.granted_nodes.count(req.node_name()) > 0;
  bool reattaching = awaiting_reattach_.count(req.node_name()) > 0;
  bool replacing = replacing_nodes_.count(req.node_name()) > 0;
  // A deferred place whose agent comes after the job started without it.
  bool joining = job_.rendezvous_done && !reattaching &&
                 job_.deferred_places.count(req.node_name()) > 0 &&
                 job_.node_addresses.count(req.node_name()) == 0;
  if (!expected || agents_.ForNode(req.node_name()) != nullptr ||
      (job_.rendezvous_done && !reattaching && !replacing && !joining)) {
    refuse(absl::StrCat("node '", req.node_name(), "' is not expected or already registered"));
    return;
  }
  if (!backend_->IsCurrentAgent(req.node_name(), req.inventory().hostname())) {
    refuse(absl::StrCat("the agent on ", req.inventory().hostname(), " is of an earlier pod of '",
                        req.node_name(), "', which was replaced"));
    return;
  }
  if (const backends::NodeGrant* g = admission_.GrantFor(req.node_name());
      g != nullptr && g->gpus_from_agent &&
      static_cast<uint32_t>(req.inventory().gpus_size()) < g->gpu_count) {
    refuse(absl::StrCat("node '", req.node_name(), "' was granted ", g->gpu_count,
                        " GPUs but its agent sees ", req.inventory().gpus_size()));
    BeginStopping(JobPhase::kFailed,
                  absl::StrCat("the agent for ", req.node_name(), " sees ",
                               req.inventory().gpus_size(), " GPUs; the job needs ", g->gpu_count,
                               " there"));
    return;
  }
  agents_.Register(session, req.node_name());
  session.free_ports.assign(req.free_ports().begin(), req.free_ports().end());
  session.address = req.inventory().address();
  r->set_accepted(true);
  agents_.Send(session, reply);
  Record(AgentRegistered{session.node, req.inventory().hostname(), session.address,
                         {req.inventory().gpus().begin(), req.inventory().gpus().end()},
                         session.free_ports.size()});
  if (reattaching) {
    ReconcileNode(session.node, message);
    return;
  }
  deferred_lost_.erase(session.node);
  if (replacing || joining) {
    // A new agent for a lost place, or the first for a deferred one: the world is unchanged,
    // so it gets the same cluster spec and the tasks that were waiting for it. Parked slots
    // there may come back now (growth waits for their place).
    replacing_nodes_.erase(session.node);
    if (joining) Notice(absl::StrCat(session.node, " has room now; its tasks join the group"));
    agents_.Send(session, ClusterSpecMessage());
    std::set<std::string> waiting;
    for (const auto& t : job_.tasks.tasks()) {
      if (t.node == session.node && t.state == TaskState::kPending && t.in_world) {
        waiting.insert(t.role);
      }
    }
    launched_roles_.erase(std::remove_if(launched_roles_.begin(), launched_roles_.end(),
                                         [&](const std::string& r) { return waiting.count(r) > 0; }),
                          launched_roles_.end());
    LaunchReadyRoles();
    restarts_.CheckGrowth();
    return;
  }
  if (ExpectedAgentsRegistered()) CompleteRendezvous();
}

bool Master::ExpectedAgentsRegistered() {
  if (job_.deferred_places.empty()) return agents_.registered() == job_.grants.size();
  for (const auto& g : job_.grants) {
    if (job_.deferred_places.count(g.name) == 0 && agents_.ForNode(g.name) == nullptr) {
      return false;
    }
  }
  return true;
}

void Master::RendezvousMayComplete() {
  if (job_.rendezvous_done || job_.grants.empty() || Ending()) return;
  if (ExpectedAgentsRegistered()) CompleteRendezvous();
}

bool Master::DeferSlotsWithoutPlace() {
  const std::vector<PlacedTask>& placement = admission_.placement();
  std::vector<TaskRecord>& tasks = job_.tasks.tasks();
  std::vector<size_t> deferred;
  std::map<std::string, uint32_t> present;  // role -> its tasks on places with an agent
  for (size_t i = 0; i < placement.size() && i < tasks.size(); ++i) {
    const std::string& node = placement[i].node;
    if (job_.deferred_places.count(node) == 0 || agents_.ForNode(node) != nullptr) {
      present[tasks[i].role]++;
      continue;
    }
    const spec::Role* role = options_.spec.FindRole(tasks[i].role);
    if (role == nullptr || role->on_failure != spec::OnFailure::kElastic ||
        role->min_instances == 0) {
      BeginStopping(JobPhase::kFailed,
                    absl::StrCat("the backend deferred the place ", node, " of ", tasks[i].Key(),
                                 ", but only an elastic role can start without some of its "
                                 "tasks"));
      return false;
    }
    deferred.push_back(i);
  }
  if (deferred.empty()) return true;
  for (const auto& role : options_.spec.roles) {
    if (role.on_failure != spec::OnFailure::kElastic || role.min_instances == 0) continue;
    if (present[role.name] < role.min_instances) {
      BeginStopping(JobPhase::kFailed,
                    absl::StrCat("the backend deferred the places of all but ",
                                 present[role.name], " of the ", role.name,
                                 " tasks; the role needs at least ", role.min_instances,
                                 " to start"));
      return false;
    }
  }
  for (size_t i : deferred) {
    Transition(tasks[i], TaskState::kKilled, SlotDeferred::kReason);
    Record(SlotDeferred{tasks[i].Key(), placement[i].node});
  }
  Notice(absl::StrCat("starting without ", deferred.size(),
                      " task(s) whose places wait for room in the cluster; they join when "
                      "their agents register"));
  return true;
}

void Master::CompleteRendezvous() {
  admission_.CancelRegisterTimer();
  job_.rendezvous_done = true;
  if (!DeferSlotsWithoutPlace()) return;
  std::map<std::string, std::vector<uint32_t>> free_ports;
  std::vector<PlacedTask> with_agent;  // deferred places' tasks get their ports when they join
  for (const auto& p : admission_.placement()) {
    AgentSession* s = agents_.ForNode(p.node);
    if (s == nullptr) continue;
    free_ports[p.node] = s->free_ports;
    with_agent.push_back(p);
  }
  auto ports = AssignTaskPorts(with_agent, free_ports, job_.node_addresses);
  if (!ports.ok()) {
    BeginStopping(JobPhase::kFailed, std::string(ports.status().message()));
    return;
  }
  // Each task keeps its port for the life of the job: a restarted task binds the port its
  // predecessor held, which the kernel freed when that process died.
  if (!FormWorld(job_.generation, /*journal=*/true, &*ports)) return;
  SetPhase(JobPhase::kStarting, "launching tasks");
  SendClusterSpec();
  LaunchReadyRoles();
  // Deferred places lost while the job waited for its other agents: their slots come back on
  // new ones.
  for (const std::string& node : std::set<std::string>(deferred_lost_)) ReplacePlace(node);
  deferred_lost_.clear();
}

std::optional<size_t> Master::FormWorld(uint32_t generation, bool journal,
                                        const std::map<std::string, uint32_t>* ports) {
  RendezvousInputs in;
  in.spec = &options_.spec;
  in.job_id = options_.job_id;
  in.job_dir = options_.job_dir;
  in.token = options_.token;
  in.generation = generation;
  in.tasks = &job_.tasks.tasks();
  in.placement = &admission_.placement();
  in.grants = &job_.grants;
  in.node_addresses = &job_.node_addresses;
  in.node_gpus = &job_.node_gpus;
  in.slot_ports = ports != nullptr ? ports : &job_.slot_ports;
  // A slot that joins after the first rendezvous (its place was deferred) takes a port its
  // place's agent offered that no task on that machine holds (places share one when their
  // agents reported the same address); the rendezvous record keeps it from then on.
  std::map<std::string, uint32_t> with_joined;
  const std::vector<PlacedTask>& placement = admission_.placement();
  const std::vector<TaskRecord>& tasks = job_.tasks.tasks();
  for (size_t i = 0; i < placement.size() && i < tasks.size(); ++i) {
    if (!tasks[i].in_world || in.slot_ports->count(tasks[i].Key()) > 0) continue;
    AgentSession* s = agents_.ForNode(placement[i].node);
    if (s == nullptr) continue;
    if (with_joined.empty()) with_joined = *in.slot_ports;
    const std::string machine = MachineOf(placement[i].node, job_.node_addresses);
    std::set<uint32_t> held;
    for (size_t j = 0; j < placement.size() && j < tasks.size(); ++j) {
      if (MachineOf(placement[j].node, job_.node_addresses) != machine) continue;
      if (auto it = with_joined.find(tasks[j].Key()); it != with_joined.end()) {
        held.insert(it->second);
      }
    }
    if (uint32_t port = FirstPortNotHeld(s->free_ports, held); port != 0) {
      with_joined[tasks[i].Key()] = port;
    }
  }
  if (!with_joined.empty()) in.slot_ports = &with_joined;
  if (horovod_rendezvous_) {
    in.rendezvous_host = horovod_rendezvous_->host();
    in.rendezvous_port = horovod_rendezvous_->port();
  }
  plan_ = BuildClusterPlan(in);
  if (journal) {
    Record(RendezvousRecord(plan_));
  } else {
    // A recovering master's world as its journal left it: the ranks are applied, not written.
    JournalEntry entry{RendezvousRecord(plan_), options_.clock->UnixMicros()};
    Apply(entry, job_, RecordSource::kLive, options_.clock->Now()).IgnoreError();
  }
  return plan_.tasks.size();
}

v1::MasterMessage Master::ClusterSpecMessage() const {
  v1::MasterMessage cluster;
  cluster.mutable_cluster()->set_json(frameworks::ClusterSpecJson(plan_));
  cluster.mutable_cluster()->set_generation(plan_.restart_count);
  return cluster;
}

void Master::SendClusterSpec() { agents_.SendToRegistered(ClusterSpecMessage()); }

void Master::Relaunch(const std::string& role) {
  if (!role.empty()) {
    for (auto& t : plan_.tasks) {
      if (t.role != role) continue;
      if (const TaskRecord* rec = job_.tasks.Find(t.role, t.index)) t.attempt = rec->attempt;
    }
    // LaunchReadyRoles launches the pending tasks of roles not marked launched.
    launched_roles_.erase(std::remove(launched_roles_.begin(), launched_roles_.end(), role),
                          launched_roles_.end());
    LaunchReadyRoles();
    return;
  }
  // The whole group, into the world just formed.
  SendClusterSpec();
  launched_roles_.clear();
  for (const auto& t : job_.tasks.tasks()) {
    // Roles outside the group keep running and count as launched.
    if (!job_.InGroup(t) &&
        std::find(launched_roles_.begin(), launched_roles_.end(), t.role) == launched_roles_.end()) {
      launched_roles_.push_back(t.role);
    }
  }
  LaunchReadyRoles();
}

void Master::LaunchReadyRoles() {
  if (Ending()) return;
  for (const auto& role : options_.spec.roles) {
    if (std::find(launched_roles_.begin(), launched_roles_.end(), role.name) !=
        launched_roles_.end()) {
      continue;
    }
    bool ready = std::all_of(role.depends_on.begin(), role.depends_on.end(),
                             [&](const std::string& dep) { return job_.tasks.RoleStarted(dep); });
    if (!ready) continue;
    launched_roles_.push_back(role.name);
    for (size_t i = 0; i < plan_.tasks.size(); ++i) {
      const frameworks::TaskPlacement& t = plan_.tasks[i];
      if (t.role != role.name) continue;
      TaskRecord* pending = job_.tasks.Find(t.role, t.index);
      if (pending == nullptr || pending->state != TaskState::kPending) continue;
      v1::MasterMessage msg;
      v1::TaskLaunch* launch = msg.mutable_launch();
      launch->mutable_task()->set_role(t.role);
      launch->mutable_task()->set_index(t.index);
      launch->mutable_task()->set_attempt(pending->attempt);
      launch->set_progress_timeout_ms(static_cast<uint32_t>(role.progress_timeout.count()));
      for (const auto& a : frameworks::TaskArgv(options_.spec, role, options_.shoal_binary)) {
        launch->add_argv(a);
      }
      frameworks::Environment env = frameworks::BuildTaskEnvironment(options_.spec, plan_, t);
      for (const auto& [k, v] : env) (*launch->mutable_env())[k] = v;
      for (const auto& [k, v] : frameworks::LocalDirectories(env)) {
        (*launch->mutable_local_dirs())[k] = v;
      }
      launch->set_working_dir(role.working_dir);
      for (uint32_t c : t.cpu_affinity) launch->add_cpu_affinity(c);
      launch->set_memory_limit_bytes(role.resources.memory_bytes);
      for (const auto& g : t.gpus) launch->add_gpus(g);
      TaskRecord* rec = pending;
      AgentSession* s = agents_.ForNode(t.node);
      // The place lost its agent: the task waits for the new one (launched when it registers),
      // or fails if the place cannot be replaced.
      if (s == nullptr && job_.rendezvous_done) continue;
      Transition(*rec, TaskState::kStarting);
      if (s == nullptr) {
        rec->exit_code = -1;
        restarts_.HandleTaskFailure(*rec, "could not be sent to its agent: the agent is gone");
      } else {
        agents_.Send(*s, msg);  // a lost agent shows up as its disconnection
      }
    }
  }
  EvaluateOutcome();
}

bool Master::Registered(const std::string& node) { return agents_.ForNode(node) != nullptr; }

bool Master::PlaceReady(const TaskRecord& task) {
  return !task.node.empty() && agents_.ForNode(task.node) != nullptr &&
         replacing_nodes_.count(task.node) == 0;
}

void Master::AgentsStarted() {
  loop_.PostAfter(options_.heartbeat_interval, [this] { CheckHeartbeats(); });
}

}  // namespace shoal::master
