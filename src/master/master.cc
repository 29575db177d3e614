#include "master/master.h"

#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <cstdlib>
#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/byte_size.h"
#include "common/files.h"
#include "openssl/evp.h"
#include "openssl/hmac.h"
#include "frameworks/framework_env.h"
#include "master/job_status_json.h"
#include "master/master_service.h"
#include "master/shard_table.h"
#include "master/task_logs.h"
#include "master/watch_queue.h"
#include "shoal/v1/shoal.grpc.pb.h"
#include "spdlog/spdlog.h"

namespace shoal::master {
namespace {

// Whether a socket without SO_REUSEPORT could bind host:port now (nothing listens there).
bool CanBind(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(), &hints,
                    &found) != 0 ||
      found == nullptr) {
    return true;  // not ours to judge: the bind itself will say what is wrong
  }
  bool bindable = false;
  int fd = ::socket(found->ai_family, found->ai_socktype | SOCK_CLOEXEC, found->ai_protocol);
  if (fd >= 0) {
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // as gRPC binds
    bindable = ::bind(fd, found->ai_addr, found->ai_addrlen) == 0;
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return bindable;
}

// HMAC-SHA256(token, "shoal-task-secret:" + job id) in hex: a secret the tasks share that a
// recovering master derives again, and that reveals nothing of the token to the tasks.
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

v1::TaskState ToProto(TaskState s) {
  switch (s) {
    case TaskState::kPending: return v1::TASK_STATE_PENDING;
    case TaskState::kStarting: return v1::TASK_STATE_STARTING;
    case TaskState::kRunning: return v1::TASK_STATE_RUNNING;
    case TaskState::kSucceeded: return v1::TASK_STATE_SUCCEEDED;
    case TaskState::kFailed: return v1::TASK_STATE_FAILED;
    case TaskState::kKilled: return v1::TASK_STATE_KILLED;
  }
  return v1::TASK_STATE_UNSPECIFIED;
}

v1::JobState ToProto(JobPhase p) {
  switch (p) {
    case JobPhase::kQueued: return v1::JOB_STATE_QUEUED;
    case JobPhase::kStarting: return v1::JOB_STATE_STARTING;
    case JobPhase::kRunning: return v1::JOB_STATE_RUNNING;
    case JobPhase::kStopping: return v1::JOB_STATE_STOPPING;
    case JobPhase::kSucceeded: return v1::JOB_STATE_SUCCEEDED;
    case JobPhase::kFailed: return v1::JOB_STATE_FAILED;
    case JobPhase::kKilled: return v1::JOB_STATE_KILLED;
  }
  return v1::JOB_STATE_UNSPECIFIED;
}

// " (memory: 2GiB)" for a role with a memory limit, "" otherwise.
std::string MemoryLimitText(const spec::JobSpec& spec, const std::string& role) {
  const spec::Role* r = spec.FindRole(role);
  if (r == nullptr || r->resources.memory_bytes == 0) return "";
  return absl::StrCat(" (memory: ", FormatByteSize(r->resources.memory_bytes), ")");
}

std::string TaskDirName(const std::string& role, uint32_t index) {
  return absl::StrCat(role, "-", index);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Master>> Master::Create(MasterOptions options,
                                                       std::unique_ptr<backends::Backend> backend) {
  if (options.token.empty()) return absl::InvalidArgumentError("the master needs a token");
  auto master = std::unique_ptr<Master>(new Master(std::move(options), std::move(backend)));
  auto journal = Journal::Open(master->options_.job_dir + "/events.jsonl");
  if (!journal.ok()) return journal.status();
  master->journal_ = std::move(*journal);
  auto logs = TaskLogs::Open(master->options_.job_dir);
  if (!logs.ok()) return logs.status();
  master->logs_ = std::move(*logs);
  auto feed = LogFeed::Open(master->options_.job_dir + "/logs.txt");
  if (!feed.ok()) return feed.status();
  master->log_feed_ = std::move(*feed);
  if (master->options_.recover) {
    // Read before anything is appended: the previous master's record of the job.
    auto records = Journal::ReadAll(master->options_.job_dir + "/events.jsonl");
    if (!records.ok()) return records.status();
    if (records->empty()) {
      // The previous master died before it made anything durable: nothing ran, start afresh.
      master->options_.recover = false;
    } else if (auto st = master->Replay(*records); !st.ok()) {
      return st;
    }
  }
  if (master->options_.spec.dataset.configured) {
    master->shards_ = std::make_unique<ShardTable>(master->options_.spec.dataset);
  }
  return master;
}

Master::Master(MasterOptions options, std::unique_ptr<backends::Backend> backend)
    : options_(std::move(options)),
      backend_(std::move(backend)),
      loop_(options_.clock),
      state_(options_.spec),
      policy_(options_.spec) {
  created_unix_ms_ = options_.clock->UnixMillis();
}

Master::~Master() {
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  loop_.Stop();
  // After the loop: nothing sends on a stream any more.
  if (service_) service_->Stop();
}

absl::Status Master::Start() {
  if (options_.listen_port != 0 && options_.listen_patience.count() > 0 &&
      !CanBind(options_.listen_host, options_.listen_port)) {
    spdlog::info("port {} is still held, by the previous master if it is still exiting; "
                 "waiting up to {:.1f}s for it",
                 options_.listen_port, options_.listen_patience.count() / 1000.0);
    const auto give_up_at = std::chrono::steady_clock::now() + options_.listen_patience;
    while (!CanBind(options_.listen_host, options_.listen_port) &&
           std::chrono::steady_clock::now() < give_up_at) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  service_ = std::make_unique<MasterService>(this);
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(absl::StrCat(options_.listen_host, ":", options_.listen_port),
                           grpc::InsecureServerCredentials(), &bound_port);
  service_->Register(&builder);
  builder.SetMaxReceiveMessageSize(64 << 20);
  // Agent streams carry small messages at a steady rate: bandwidth-delay probing would add a
  // ping and a window update to many of them for no gain.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  // gRPC sets SO_REUSEPORT by default. A recovering master binds its predecessor's port, and
  // with it would share that port with whatever still listens there (a dying master whose last
  // thread is still in an fsync): the kernel would hand some connections to a socket nobody
  // accepts on, and reset them when it closes.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  server_ = builder.BuildAndStart();
  if (!server_ || bound_port == 0) {
    server_.reset();
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options_.listen_host, ":", options_.listen_port,
                     options_.listen_port != 0 ? " (the port is in use, or the address is not "
                                                 "one of this machine)"
                                               : ""));
  }
  service_->Start();
  address_ = absl::StrCat(options_.listen_host == "0.0.0.0" ? "127.0.0.1" : options_.listen_host,
                          ":", bound_port);
  nlohmann::json info = {{"address", address_}, {"pid", ::getpid()}};
  // Where the live master is: nothing a machine crash could lose matters (it takes the master
  // with it, and a recovering master writes its own), so no fsync on the way to the first task.
  if (auto st = ReplaceFile(options_.job_dir + "/master.json", info.dump()); !st.ok()) {
    return st;
  }
  if (options_.spec.framework == spec::Framework::kHorovod) {
    // Up before any rank starts: a rank that cannot reach it aborts within 3 s.
    std::string host = address_.substr(0, address_.rfind(':'));
    auto rendezvous = HorovodRendezvous::Start(host);
    if (!rendezvous.ok()) return rendezvous.status();
    horovod_rendezvous_ = std::move(*rendezvous);
  }
  backend_->SetPlaceLostCallback([this](const std::string& node, const std::string& why) {
    loop_.Post([this, node, why] { OnPlaceLost(node, why); });
  });
  backend_->SetAllocationEventCallback([this](const backends::Backend::AllocationEvent& event) {
    loop_.Post([this, event] { OnAllocationEvent(event); });
  });
  loop_.Start([this] { AfterBatch(); });
  if (options_.recover) {
    loop_.Post([this] { Recover(); });
    return absl::OkStatus();
  }
  loop_.Post([this] {
    Journal({{"type", "job_submitted"},
             {"job_id", options_.job_id},
             {"name", options_.spec.name},
             {"tasks", state_.tasks().size()},
             {"master", address_}});
    for (auto& t : state_.tasks()) {
      Journal({{"type", "task_state"}, {"task", t.Key()}, {"to", "pending"}, {"rank", t.global_rank}});
    }
    TryAdmit();
  });
  return absl::OkStatus();
}

int Master::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  finished_cv_.wait(lock, [&] { return finished_; });
  lock.unlock();
  JobPhase phase;
  std::promise<JobPhase> p;
  loop_.Post([&] { p.set_value(phase_); });
  phase = p.get_future().get();
  switch (phase) {
    case JobPhase::kSucceeded: return 0;
    case JobPhase::kKilled: return 3;
    default: return 1;
  }
}

void Master::Kill(const std::string& reason) {
  loop_.Post([this, reason] {
    if (IsTerminal(phase_) || phase_ == JobPhase::kStopping) return;
    Journal({{"type", "kill_requested"}, {"reason", reason}});
    BeginStopping(JobPhase::kKilled, reason);
  });
}

void Master::AnnounceSidecar(const std::string& name, const std::string& url) {
  loop_.Post([this, name, url] {
    Journal({{"type", "sidecar_started"}, {"name", name}, {"url", url}});
    spdlog::info("{} at {}", name, url);
    EmitNotice(absl::StrCat(name, " at ", url));
  });
}

void Master::SidecarFailed(const std::string& name, const std::string& why) {
  loop_.Post([this, name, why] {
    Journal({{"type", "sidecar_failed"}, {"name", name}, {"reason", why}});
    spdlog::warn("{}", why);
    EmitNotice(why);
  });
}

bool Master::Authorized(const std::string& header) const {
  std::string expected = "Bearer " + options_.token;
  if (header.size() != expected.size()) return false;
  unsigned char diff = 0;  // constant time: no early exit on the first differing byte
  for (size_t i = 0; i < header.size(); ++i) diff |= header[i] ^ expected[i];
  return diff == 0;
}

uint64_t Master::AgentConnected(std::shared_ptr<AgentConnection> connection) {
  // Never blocks a gRPC thread: the id is known now, and the session exists on the loop before
  // any message of it is handled there (posts run in order).
  uint64_t id = next_session_.fetch_add(1);
  connection->Touch(options_.clock->Now());
  loop_.Post([this, id, connection = std::move(connection)] {
    AgentSession s;
    s.id = id;
    s.connection = connection;
    sessions_[id] = std::move(s);
  });
  return id;
}

void Master::AgentMessageReceived(AgentConnection* connection, uint64_t session_id,
                                  const v1::AgentMessage& message) {
  connection->Touch(options_.clock->Now());
  // Heartbeats never wake the loop one by one: the SDK steps they carry are gathered here and
  // applied in one batch every kProgressDrainInterval (a 10,000-task job reports 10,000 steps a
  // second; only the latest of each matters).
  if (message.kind_case() == v1::AgentMessage::kHeartbeat) {
    if (message.heartbeat().tasks().empty()) return;
    bool schedule = false;
    {
      std::lock_guard<std::mutex> lock(progress_mu_);
      for (const auto& p : message.heartbeat().tasks()) {
        // Updated in place: after a task's first report this allocates nothing.
        auto key = std::make_pair(p.task().role(), p.task().index());
        auto it = pending_progress_.find(key);
        if (it == pending_progress_.end()) it = pending_progress_.emplace(std::move(key), PendingStep{}).first;
        it->second.attempt = p.task().attempt();
        it->second.step = p.step();
        it->second.fresh = true;
      }
      schedule = !progress_drain_scheduled_;
      progress_drain_scheduled_ = true;
    }
    if (schedule) loop_.PostAfter(kProgressDrainInterval, [this] { DrainProgress(); });
    return;
  }
  loop_.Post([this, session_id, message] {
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) return;
    AgentSession& session = it->second;
    switch (message.kind_case()) {
      case v1::AgentMessage::kRegister:
        OnRegister(session, message);
        break;
      case v1::AgentMessage::kHeartbeat:
        break;
      case v1::AgentMessage::kStalled:
        OnTaskStalled(message);
        break;
      case v1::AgentMessage::kSdk:
        OnSdkRequest(session, message);
        break;
      case v1::AgentMessage::kTaskStarted:
        OnTaskStarted(message);
        break;
      case v1::AgentMessage::kTaskExited:
        OnTaskExited(message);
        break;
      case v1::AgentMessage::kLog:
        OnLog(message);
        break;
      case v1::AgentMessage::kLeaving:
        session.leaving = message.leaving();
        Journal({{"type", "agent_leaving"}, {"node", session.node}, {"reason", session.leaving}});
        break;
      case v1::AgentMessage::kNotice:
        Journal({{"type", "notice"}, {"node", session.node}, {"message", message.notice()}});
        // Agents on alike machines say the same thing (one agent per task on Slurm): a user
        // needs it once; the journal keeps every one.
        if (notices_shown_.insert(message.notice()).second) {
          spdlog::warn("agent {}: {}", session.node, message.notice());
          EmitNotice(absl::StrCat(session.node, ": ", message.notice()));
        }
        break;
      default:
        break;
    }
  });
}

void Master::AgentDisconnected(uint64_t session_id) {
  loop_.Post([this, session_id] {
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) return;
    std::string node = it->second.registered ? it->second.node : "";
    std::string leaving = it->second.leaving;
    if (!node.empty()) node_sessions_.erase(node);
    sessions_.erase(it);
    if (node.empty() || IsTerminal(phase_)) return;
    Journal({{"type", "agent_disconnected"}, {"node", node}});
    auto lose = [this, node](const std::string& why) {
      if (IsTerminal(phase_) || SessionForNode(node) != nullptr) return;
      // Whatever is left of that agent must not keep running tasks nobody watches.
      backend_->TerminatePlace(node);
      FailTasksOnNode(node, why);
    };
    std::string why = leaving.empty() ? absl::StrCat("lost: the agent on ", node, " disconnected")
                                      : absl::StrCat("lost: the agent on ", node, " stopped: ",
                                                     leaving);
    if (!backend_->SignalsTasksFromOutside() || phase_ == JobPhase::kStopping) {
      lose(why);
      return;
    }
    // The resource manager may stop agents itself (Slurm on scancel, sometimes before the
    // agent can say anything): the backend usually says why a moment later (a cancelled
    // allocation), which ends the job as cancelled rather than as a failure to handle. A place
    // the backend reports lost in the meantime is handled at once (OnPlaceLost).
    loop_.PostAfter(options_.outside_stop_settle, [why, lose] { lose(why); });
  });
}

void Master::FillStatus(v1::JobStatus* status) {
  std::lock_guard<std::mutex> lock(mu_);
  status->ParseFromString(status_snapshot_);
}

std::shared_ptr<WatchQueue> Master::AddWatcher(bool logs, uint64_t log_offset,
                                               std::function<void()> on_ready) {
  auto queue = std::make_shared<WatchQueue>(logs ? log_feed_ : nullptr, log_offset,
                                            std::move(on_ready));
  // On the loop, so the first status and every later event arrive in order. Not waited for:
  // the caller is a gRPC reaction, which must not block on the loop.
  loop_.Post([this, queue] {
    v1::WatchEvent event;
    {
      // Under the lock: nothing published meanwhile is missed or sent twice.
      std::lock_guard<std::mutex> lock(mu_);
      event.mutable_status()->ParseFromString(status_snapshot_);
      watch_backlog_.ReplayTo(*queue);
      queue->Push(event.SerializeAsString(), logs_->combined_bytes(), /*is_status=*/true);
      watchers_.push_back(queue);
    }
    if (IsTerminal(phase_) && finished_unix_ms_ != 0) queue->Close();
  });
  return queue;
}

bool Master::WaitForWatchers(std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (true) {
    bool drained = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& w : watchers_) {
        // A watcher whose client went away is released by its call: expired here.
        if (auto q = w.lock(); q && !q->Drained()) drained = false;
      }
    }
    if (drained) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// ---------------------------------------------------------------- admission and rendezvous

void Master::TryAdmit() {
  if (phase_ != JobPhase::kQueued) return;
  auto grants = backend_->Acquire(options_.spec, options_.job_id);
  if (!grants.ok()) {
    if (absl::IsUnavailable(grants.status())) {
      std::string why(grants.status().message());
      if (why != phase_reason_) {
        Journal({{"type", "queued"}, {"reason", why}});
        SetPhase(JobPhase::kQueued, why);
      }
      loop_.PostAfter(options_.admission_retry, [this] { TryAdmit(); });
      return;
    }
    std::string why = absl::StrCat("cannot be admitted: ", grants.status().message());
    Journal({{"type", "admission_refused"}, {"reason", why}});
    BeginStopping(JobPhase::kFailed, why);
    return;
  }
  grants_ = *grants;
  for (const auto& g : grants_) granted_nodes_.insert(g.name);
  auto placement = PlaceTasks(options_.spec, state_.tasks(), grants_);
  if (!placement.ok()) {
    BeginStopping(JobPhase::kFailed, std::string(placement.status().message()));
    return;
  }
  placement_ = *placement;
  nlohmann::json nodes = nlohmann::json::array();
  for (const auto& g : grants_) {
    nodes.push_back({{"name", g.name}, {"address", g.address}, {"cpus", g.cpus},
                     {"memory_bytes", g.memory_bytes}, {"cores", g.cores}, {"gpus", g.gpus},
                     {"for_task", g.for_task}, {"gpus_from_agent", g.gpus_from_agent},
                     {"gpu_count", g.gpu_count}});
  }
  Journal({{"type", "admitted"}, {"backend", backend_->Name()}, {"nodes", nodes}});
  SetPhase(JobPhase::kStarting, "waiting for agents to register");

  backends::AgentStartOptions start = AgentStartOptionsForJob();
  if (auto st = backend_->StartAgents(start); !st.ok()) {
    BeginStopping(JobPhase::kFailed, absl::StrCat("cannot start agents: ", st.message()));
    return;
  }
  ArmRegisterTimer();
  loop_.PostAfter(options_.heartbeat_interval, [this] { CheckHeartbeats(); });
}

void Master::ArmRegisterTimer() {
  loop_.CancelTimer(register_timer_);
  register_timer_ = loop_.PostAfter(options_.register_timeout, [this] {
    if (rendezvous_done_ || IsTerminal(phase_) || phase_ == JobPhase::kStopping) return;
    std::string missing;
    for (const auto& g : grants_) {
      if (SessionForNode(g.name) == nullptr) missing += (missing.empty() ? "" : ", ") + g.name;
    }
    BeginStopping(JobPhase::kFailed,
                  absl::StrFormat("agents on %s did not register within %.1fs", missing,
                                  options_.register_timeout.count() / 1000.0));
  });
}

void Master::OnAllocationEvent(const backends::Backend::AllocationEvent& event) {
  using Kind = backends::Backend::AllocationEvent::Kind;
  if (IsTerminal(phase_) || phase_ == JobPhase::kStopping) return;
  switch (event.kind) {
    case Kind::kQueued:
      // The scheduler holds the job back: no agent can register until it runs, however long
      // that takes, so the registration deadline waits too.
      if (rendezvous_done_) return;
      loop_.CancelTimer(register_timer_);
      Journal({{"type", "queued"}, {"reason", event.reason}});
      SetPhase(JobPhase::kQueued, event.reason);
      break;
    case Kind::kAllocated:
      if (rendezvous_done_ || phase_ != JobPhase::kQueued) return;
      Journal({{"type", "allocated"}, {"backend", backend_->Name()}});
      SetPhase(JobPhase::kStarting, "waiting for agents to register");
      ArmRegisterTimer();
      break;
    case Kind::kRefused: {
      std::string why = absl::StrCat("cannot be admitted: ", event.reason);
      Journal({{"type", "admission_refused"}, {"reason", why}});
      BeginStopping(JobPhase::kFailed, why);
      break;
    }
    case Kind::kCancelled:
      Journal({{"type", "cancelled_outside"}, {"reason", event.reason}});
      BeginStopping(JobPhase::kKilled, event.reason);
      break;
  }
}

backends::AgentStartOptions Master::AgentStartOptionsForJob() const {
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
  for (const auto& p : placement_) start.ports_per_node[p.node]++;
  for (const auto& g : grants_) start.ports_per_node.try_emplace(g.name, 0);
  return start;
}

void Master::OnRegister(AgentSession& session, const v1::AgentMessage& message) {
  if (options_.recover && !recovery_started_) {
    // An agent redialled faster than the new master's Recover() got onto its loop: answer once
    // the job is rebuilt.
    loop_.PostAfter(std::chrono::milliseconds(1), [this, id = session.id, message] {
      auto it = sessions_.find(id);
      if (it != sessions_.end()) OnRegister(it->second, message);
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
    SendToAgent(session, reply);
    Journal({{"type", "agent_refused"}, {"node", req.node_name()}, {"reason", why}});
    spdlog::warn("refused agent for node {}: {}", req.node_name(), why);
  };
  if (req.version() != v1::PROTOCOL_VERSION_CURRENT) {
    refuse(absl::StrCat("protocol version ", static_cast<int>(req.version()), " is not ",
                        static_cast<int>(v1::PROTOCOL_VERSION_CURRENT),
                        "; run an agent of the same Shoal release as the master"));
    return;
  }
  bool expected = granted_nodes_.count(req.node_name()) > 0;
  bool reattaching = awaiting_reattach_.count(req.node_name()) > 0;
  bool replacing = replacing_nodes_.count(req.node_name()) > 0;
  if (!expected || SessionForNode(req.node_name()) != nullptr ||
      (rendezvous_done_ && !reattaching && !replacing)) {
    refuse(absl::StrCat("node '", req.node_name(), "' is not expected or already registered"));
    return;
  }
  if (const backends::NodeGrant* g = GrantFor(req.node_name());
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
  session.registered = true;
  session.node = req.node_name();
  node_sessions_[session.node] = session.id;
  session.free_ports.assign(req.free_ports().begin(), req.free_ports().end());
  session.address = req.inventory().address();
  node_addresses_[session.node] = session.address;
  node_gpus_[session.node].assign(req.inventory().gpus().begin(), req.inventory().gpus().end());
  r->set_accepted(true);
  SendToAgent(session, reply);
  Journal({{"type", "agent_registered"},
           {"node", session.node},
           {"hostname", req.inventory().hostname()},
           {"address", session.address},
           {"gpus", node_gpus_[session.node]},
           {"ports", session.free_ports.size()}});
  if (reattaching) {
    ReconcileNode(session.node, message);
    return;
  }
  if (replacing) {
    // A new agent for a lost place: the world is unchanged, so it gets the same cluster spec
    // and the tasks that were waiting for it.
    replacing_nodes_.erase(session.node);
    SendToAgent(session, ClusterSpecMessage());
    std::set<std::string> waiting;
    for (const auto& t : state_.tasks()) {
      if (t.node == session.node && t.state == TaskState::kPending && t.in_world) waiting.insert(t.role);
    }
    launched_roles_.erase(std::remove_if(launched_roles_.begin(), launched_roles_.end(),
                                         [&](const std::string& r) { return waiting.count(r) > 0; }),
                          launched_roles_.end());
    LaunchReadyRoles();
    return;
  }
  if (node_sessions_.size() == grants_.size()) CompleteRendezvous();
}

const backends::NodeGrant* Master::GrantFor(const std::string& node) const {
  for (const auto& g : grants_) {
    if (g.name == node) return &g;
  }
  return nullptr;
}

void Master::CompleteRendezvous() {
  loop_.CancelTimer(register_timer_);
  rendezvous_done_ = true;
  // Each task keeps its port for the life of the job: a restarted task binds the port its
  // predecessor held, which the kernel freed when that process died.
  std::map<std::string, uint32_t> port_next;
  for (const auto& p : placement_) {
    AgentSession* s = SessionForNode(p.node);
    uint32_t& next_port = port_next[p.node];
    if (s == nullptr || next_port >= s->free_ports.size()) {
      BeginStopping(JobPhase::kFailed,
                    absl::StrCat("the agent on ", p.node, " reported too few free ports"));
      return;
    }
    slot_ports_[absl::StrCat(p.role, ":", p.index)] = s->free_ports[next_port++];
  }
  if (!BuildPlan()) return;
  SetPhase(JobPhase::kStarting, "launching tasks");
  SendClusterSpec();
  LaunchReadyRoles();
}

bool Master::BuildPlan(bool journal) {
  plan_ = frameworks::ClusterPlan{};
  plan_.job_id = options_.job_id;
  plan_.job_dir = options_.job_dir;
  plan_.restart_count = generation_;
  plan_.checkpoint_dir = options_.spec.checkpoint.dir.empty()
                             ? options_.job_dir + "/checkpoints"
                             : options_.spec.checkpoint.dir;
  // Local ranks and node ranks count machines, not places: a backend may put several places
  // (one per task, on Slurm) on one machine, and tasks there share its devices and memory.
  // A place's machine is the address its agent reported; before that, the place itself.
  auto host_of = [&](const std::string& place) {
    auto it = node_addresses_.find(place);
    return it == node_addresses_.end() || it->second.empty() ? place : it->second;
  };
  std::map<std::string, uint32_t> node_rank, per_node_count, per_node_next, role_count, role_next;
  for (const auto& g : grants_) node_rank.try_emplace(host_of(g.name), node_rank.size());
  plan_.num_nodes = static_cast<uint32_t>(node_rank.size());
  if (options_.spec.framework == spec::Framework::kMpi) {
    plan_.task_secret = TaskSecret(options_.token, options_.job_id);
  }
  if (horovod_rendezvous_) {
    plan_.rendezvous_host = horovod_rendezvous_->host();
    plan_.rendezvous_port = horovod_rendezvous_->port();
  }
  for (size_t i = 0; i < placement_.size(); ++i) {
    const TaskRecord& rec = state_.tasks()[i];
    if (!rec.in_world) continue;
    per_node_count[host_of(placement_[i].node)]++;
    role_count[rec.role]++;
  }
  uint32_t rank = 0;
  for (size_t i = 0; i < placement_.size(); ++i) {
    const PlacedTask& p = placement_[i];
    TaskRecord& rec = state_.tasks()[i];
    if (!rec.in_world) continue;
    frameworks::TaskPlacement t;
    t.role = p.role;
    t.index = p.index;
    rec.global_rank = rank++;
    t.global_rank = rec.global_rank;
    t.node = p.node;
    t.address = node_addresses_[p.node];
    t.port = slot_ports_[rec.Key()];
    std::string host = host_of(p.node);
    t.node_rank = node_rank[host];
    t.local_rank = per_node_next[host]++;
    t.local_world_size = per_node_count[host];
    t.role_rank = role_next[p.role]++;
    t.role_world_size = role_count[p.role];
    t.cpu_affinity = p.cores;
    t.gpus = p.gpus;
    if (const backends::NodeGrant* g = GrantFor(p.node); g != nullptr && g->gpus_from_agent) {
      // The devices the resource manager bound to this place's agent.
      const std::vector<std::string>& have = node_gpus_[p.node];
      const spec::Role* role = options_.spec.FindRole(p.role);
      uint32_t want = role ? role->resources.gpus : 0;
      t.gpus.assign(have.begin(), have.begin() + std::min<size_t>(want, have.size()));
    }
    t.attempt = rec.attempt;
    rec.node = p.node;
    plan_.tasks.push_back(std::move(t));
  }
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& t : plan_.tasks) {
    ranks.push_back({{"task", absl::StrCat(t.role, ":", t.index)}, {"rank", t.global_rank},
                     {"node", t.node}, {"address", t.address}, {"port", t.port}});
  }
  if (!journal) return true;
  Journal({{"type", "rendezvous"},
           {"generation", generation_},
           {"world_size", plan_.tasks.size()},
           {"ranks", ranks}});
  return true;
}

v1::MasterMessage Master::ClusterSpecMessage() const {
  v1::MasterMessage cluster;
  cluster.mutable_cluster()->set_json(frameworks::ClusterSpecJson(plan_));
  cluster.mutable_cluster()->set_generation(plan_.restart_count);
  return cluster;
}

void Master::SendClusterSpec() {
  v1::MasterMessage cluster = ClusterSpecMessage();
  for (auto& [id, s] : sessions_) {
    if (s.registered) SendToAgent(s, cluster);
  }
}

void Master::LaunchReadyRoles() {
  if (phase_ == JobPhase::kStopping || IsTerminal(phase_)) return;
  for (const auto& role : options_.spec.roles) {
    if (std::find(launched_roles_.begin(), launched_roles_.end(), role.name) !=
        launched_roles_.end()) {
      continue;
    }
    bool ready = std::all_of(role.depends_on.begin(), role.depends_on.end(),
                             [&](const std::string& dep) { return state_.RoleStarted(dep); });
    if (!ready) continue;
    launched_roles_.push_back(role.name);
    for (size_t i = 0; i < plan_.tasks.size(); ++i) {
      const frameworks::TaskPlacement& t = plan_.tasks[i];
      if (t.role != role.name) continue;
      TaskRecord* pending = state_.Find(t.role, t.index);
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
      TaskRecord* rec = state_.Find(t.role, t.index);
      AgentSession* s = SessionForNode(t.node);
      // The place lost its agent: the task waits for the new one (launched when it registers),
      // or fails if the place cannot be replaced.
      if (s == nullptr && rendezvous_done_) continue;
      Transition(*rec, TaskState::kStarting);
      if (s == nullptr) {
        rec->exit_code = -1;
        HandleTaskFailure(*rec, "could not be sent to its agent: the agent is gone");
      } else {
        SendToAgent(*s, msg);  // a lost agent shows up as its disconnection
      }
    }
  }
  EvaluateOutcome();
}

// ---------------------------------------------------------------- task facts

void Master::OnTaskStarted(const v1::AgentMessage& message) {
  const auto& m = message.task_started();
  TaskRecord* rec = state_.Find(m.task().role(), m.task().index());
  if (rec == nullptr || rec->attempt != m.task().attempt()) return;
  rec->pid = m.pid();
  Transition(*rec, TaskState::kRunning);
  if (state_.AllStarted() && phase_ == JobPhase::kStarting) {
    SetPhase(JobPhase::kRunning, "");
  }
  LaunchReadyRoles();
}

void Master::OnTaskExited(const v1::AgentMessage& message, bool settled) {
  const auto& m = message.task_exited();
  TaskRecord* rec = state_.Find(m.task().role(), m.task().index());
  if (rec == nullptr || rec->attempt != m.task().attempt() || IsTerminal(rec->state)) return;
  bool signalled_from_outside = (m.signal() == SIGTERM || m.signal() == SIGKILL) &&
                                !m.stopped_by_agent() && m.error().empty() &&
                                rec->hung_reason.empty() && backend_->SignalsTasksFromOutside() &&
                                phase_ != JobPhase::kStopping;
  // The resource manager signals the tasks of a cancelled allocation or of a node it took down
  // along with their agents (Slurm sends SIGTERM, or SIGKILL at once for a node gone down, in
  // no fixed order). Wait for the backend to say so (the job then ends as cancelled) before
  // this counts as a failure of the task; and while the task's agent is going or gone, for its
  // disconnection, which reports every task of the place lost (looked at again in case the
  // agent comes back).
  auto agent_going = [&] {
    AgentSession* session = SessionForNode(rec->node);
    return session == nullptr || !session->leaving.empty();
  };
  if (signalled_from_outside && (!settled || agent_going())) {
    loop_.PostAfter(options_.outside_stop_settle,
                    [this, message] { OnTaskExited(message, /*settled=*/true); });
    return;
  }
  // Whatever partial line the task left goes out too, so its last words are not lost.
  logs_->FinishTask(rec->Key());
  rec->exit_code = m.exit_code();
  rec->signal = m.signal();
  if (!m.error().empty()) {
    HandleTaskFailure(*rec, absl::StrCat("could not start: ", m.error()));
  } else if (!rec->hung_reason.empty()) {
    HandleTaskFailure(*rec, rec->hung_reason);
  } else if (m.stopped_by_agent()) {
    Transition(*rec, TaskState::kKilled, rec->reason.empty() ? "stopped by Shoal" : rec->reason);
  } else if (m.signal() == 0 && m.exit_code() == 0) {
    HandleCleanExit(*rec);
  } else if (m.oom_killed()) {
    // The final line must say why, not only the signal (the notice before it already does).
    HandleTaskFailure(*rec, absl::StrCat(DescribeExit(m.exit_code(), m.signal()),
                                         " for exceeding its memory limit",
                                         MemoryLimitText(options_.spec, rec->role)));
  } else {
    HandleTaskFailure(*rec, DescribeExit(m.exit_code(), m.signal()));
  }
  EvaluateOutcome();
  MaybeRelaunchGroup();
  MaybeFinish();
}

void Master::OnLog(const v1::AgentMessage& message) {
  const auto& m = message.log();
  TaskRecord* rec = state_.Find(m.task().role(), m.task().index());
  if (rec == nullptr) return;
  // Watchers read the lines from logs.txt once the batch's flush commits them.
  logs_->Append(rec->Key(), TaskDirName(rec->role, rec->index),
                m.stream() == v1::LogChunk::STREAM_STDERR, m.data());
}

void Master::EmitNotice(const std::string& notice) {
  v1::WatchEvent event;
  event.set_notice(notice);
  std::string serialized = event.SerializeAsString();
  uint64_t mark = logs_->combined_bytes();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& w : watchers_) {
    if (auto q = w.lock()) q->Push(serialized, mark, /*is_status=*/false);
  }
  watch_backlog_.Add(std::move(serialized), mark);
}

void Master::OnPlaceLost(const std::string& node, const std::string& why) {
  if (IsTerminal(phase_)) return;
  Journal({{"type", "place_lost"}, {"node", node}, {"reason", why}});
  FailTasksOnNode(node, absl::StrCat("lost: ", why));
  // Nothing will report these tasks any more; the agent killed them or they died with it.
  DropSessionsOf(node);
  replacing_nodes_.erase(node);  // a replacement that died before registering
  for (auto& t : state_.tasks()) {
    if (t.node != node || IsTerminal(t.state)) continue;
    if (t.state == TaskState::kPending && rendezvous_done_ && phase_ != JobPhase::kStopping) {
      continue;
    }
    Transition(t, TaskState::kKilled, "lost with its agent");
  }
  if (!rendezvous_done_ && phase_ != JobPhase::kStopping) {
    BeginStopping(JobPhase::kFailed, absl::StrCat("the agent for ", node, " ended before registering: ", why));
  }
  MaybeFinish();
  ReplacePlace(node);
}

// The agent of `node` is being given up: its session goes at once, so that nothing more is sent
// into it (a task restarting right away waits for the replacement instead) and its late
// disconnect cannot be mistaken for the replacement's.
void Master::DropSessionsOf(const std::string& node) {
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (it->second.registered && it->second.node == node) {
      it->second.connection->Close();
      it = sessions_.erase(it);
    } else {
      ++it;
    }
  }
  node_sessions_.erase(node);
}

void Master::ReplacePlace(const std::string& node) {
  if (!rendezvous_done_ || phase_ == JobPhase::kStopping || IsTerminal(phase_) ||
      replacing_nodes_.count(node)) {
    return;
  }
  // A place whose agents keep dying is not replaced forever.
  uint32_t limit = 1;
  for (const auto& role : options_.spec.roles) limit = std::max(limit, role.max_restarts);
  if (++place_replacements_[node] > limit) {
    Journal({{"type", "place_replacing"}, {"node", node}, {"ok", false},
             {"reason", "its agents were lost too often"}});
    for (auto& t : state_.tasks()) {
      if (t.node == node && t.state == TaskState::kPending && t.in_world) {
        t.exit_code = -1;
        Transition(t, TaskState::kFailed,
                   absl::StrCat("its place ", node, " lost its agent ", limit, " times"));
      }
    }
    EvaluateOutcome();
    MaybeFinish();
    return;
  }
  bool needed = false;
  for (const auto& t : state_.tasks()) {
    needed |= (t.node == node && (t.restart_pending || t.state == TaskState::kPending));
  }
  if (!needed) return;
  backends::AgentStartOptions start = AgentStartOptionsForJob();
  auto st = backend_->ReplacePlace(node, start);
  Journal({{"type", "place_replacing"}, {"node", node}, {"ok", st.ok()},
           {"reason", std::string(st.message())}});
  if (!st.ok()) {
    spdlog::warn("cannot replace the lost place {}: {}", node, st.ToString());
    for (auto& t : state_.tasks()) {
      if (t.node == node && t.state == TaskState::kPending && t.in_world) {
        t.exit_code = -1;
        HandleTaskFailure(t, absl::StrCat("its place ", node, " was lost and cannot be replaced: ",
                                          st.message()));
      }
    }
    EvaluateOutcome();
    MaybeFinish();
    return;
  }
  replacing_nodes_.insert(node);
  EmitNotice(absl::StrCat("started a new agent on ", node, " for the tasks that restart there"));
}

void Master::FailTasksOnNode(const std::string& node, const std::string& reason) {
  for (auto& t : state_.tasks()) {
    if (t.node != node || IsTerminal(t.state)) continue;
    // Not launched yet: it never ran on the lost agent and waits for its replacement.
    if (t.state == TaskState::kPending && rendezvous_done_ && phase_ != JobPhase::kStopping) {
      continue;
    }
    if (phase_ == JobPhase::kStopping || t.restart_pending) {
      Transition(t, TaskState::kKilled, t.restart_pending ? t.reason : reason);
    } else {
      t.exit_code = -1;
      HandleTaskFailure(t, reason);
    }
  }
  EvaluateOutcome();
  MaybeRelaunchGroup();
  MaybeFinish();
}

void Master::CheckHeartbeats() {
  if (IsTerminal(phase_)) return;
  auto now = options_.clock->Now();
  auto limit = options_.heartbeat_interval * options_.heartbeat_misses;
  std::vector<std::string> silent;
  for (auto& [id, s] : sessions_) {
    if (s.registered && now - s.connection->last_seen() > limit) silent.push_back(s.node);
  }
  for (const auto& node : silent) {
    double secs = std::chrono::duration<double>(limit).count();
    Journal({{"type", "agent_silent"}, {"node", node}, {"seconds", secs}});
    backend_->TerminatePlace(node);  // a hung agent must not leave its tasks running
    DropSessionsOf(node);
    FailTasksOnNode(node, absl::StrFormat("lost: the agent on %s was silent for %.1fs", node, secs));
  }
  loop_.PostAfter(options_.heartbeat_interval, [this] { CheckHeartbeats(); });
}

// ---------------------------------------------------------------- failure handling

void Master::DrainProgress() {
  std::vector<std::tuple<const std::pair<std::string, uint32_t>*, uint32_t, uint64_t>> batch;
  {
    std::lock_guard<std::mutex> lock(progress_mu_);
    progress_drain_scheduled_ = false;
    for (auto& [key, entry] : pending_progress_) {
      if (!entry.fresh) continue;
      entry.fresh = false;
      // Map nodes are never erased, so the key stays valid after the lock is released.
      batch.emplace_back(&key, entry.attempt, entry.step);
    }
  }
  for (const auto& [key, attempt, step] : batch) {
    TaskRecord* rec = state_.Find(key->first, key->second);
    if (rec == nullptr || rec->attempt != attempt) continue;
    if (rec->step == step) continue;
    rec->step = step;
    // Steps change every second in every task of a large job: they refresh the status at a
    // slow pace of their own (AfterBatch), not as a state change would.
    progress_dirty_ = true;
    if (shards_) shards_->Progress(rec->Key(), options_.clock->Now());
  }
}

void Master::OnTaskStalled(const v1::AgentMessage& message) {
  const auto& m = message.stalled();
  TaskRecord* rec = state_.Find(m.task().role(), m.task().index());
  if (rec == nullptr || rec->attempt != m.task().attempt() || rec->state != TaskState::kRunning ||
      phase_ == JobPhase::kStopping || IsTerminal(phase_)) {
    return;
  }
  rec->hung_reason = absl::StrFormat("hung: no progress for %.1fs after step %d",
                                     m.silent_ms() / 1000.0, m.last_step());
  Journal({{"type", "task_hung"},
           {"task", rec->Key()},
           {"attempt", rec->attempt},
           {"last_step", m.last_step()},
           {"silent_ms", m.silent_ms()}});
  spdlog::warn("{} is {}; killing it", rec->Key(), rec->hung_reason);
  EmitNotice(absl::StrCat(rec->Key(), " is ", rec->hung_reason, "; killing it"));
  // No grace: a hung process rarely handles SIGTERM, and every second it holds the group is lost.
  StopTask(*rec, std::chrono::milliseconds(0), rec->hung_reason);
}

void Master::StopTask(TaskRecord& task, std::chrono::milliseconds grace,
                      const std::string& reason) {
  if (task.state == TaskState::kPending) {
    Transition(task, TaskState::kKilled, reason);
    return;
  }
  if (IsTerminal(task.state)) return;
  task.reason = reason;
  AgentSession* s = SessionForNode(task.node);
  if (s == nullptr) {
    Transition(task, TaskState::kKilled, reason + "; its agent is gone");
    return;
  }
  v1::MasterMessage msg;
  auto* t = msg.mutable_stop()->add_tasks();
  t->set_role(task.role);
  t->set_index(task.index);
  t->set_attempt(task.attempt);
  msg.mutable_stop()->set_grace_ms(static_cast<uint32_t>(grace.count()));
  SendToAgent(*s, msg);
}

void Master::HandleCleanExit(TaskRecord& task) {
  PolicyDecision d = (phase_ == JobPhase::kStopping || IsTerminal(phase_))
                         ? PolicyDecision{}
                         : policy_.OnCleanExit(task);
  if (d.action != PolicyDecision::Action::kRestartTask) {
    Transition(task, TaskState::kSucceeded);
    return;
  }
  task.restart_pending = true;
  Journal({{"type", "failure_handled"},
           {"task", task.Key()},
           {"attempt", task.attempt},
           {"action", ActionName(d.action)},
           {"cause", "exited with code 0"},
           {"restart", d.restart_number},
           {"delay_ms", d.delay.count()}});
  Transition(task, TaskState::kSucceeded);
  ScheduleTaskRestart(task, d);
}

void Master::HandleTaskFailure(TaskRecord& task, const std::string& cause) {
  using Action = PolicyDecision::Action;
  task.cause = cause;
  ReleaseShards(task, absl::StrCat(task.Key(), " ", cause));
  if (task.restart_pending || phase_ == JobPhase::kStopping || IsTerminal(phase_)) {
    Transition(task, TaskState::kFailed, cause);
    return;
  }
  uint32_t in_world_others = 0;
  for (const auto& t : state_.tasks()) in_world_others += (t.role == task.role && t.in_world && &t != &task);
  PolicyDecision d = policy_.OnFailure(task, cause, group_restart_in_progress_, in_world_others,
                                       options_.clock->Now());
  if (d.action != Action::kFail) task.restart_pending = true;
  task.restarts = policy_.task_restarts(task.Key());
  // Before the transition: a master replaying the journal must know the failure is not final.
  Journal({{"type", "failure_handled"},
           {"task", task.Key()},
           {"attempt", task.attempt},
           {"action", ActionName(d.action)},
           {"cause", cause},
           {"restart", d.restart_number},
           {"delay_ms", d.delay.count()}});
  RecordFailure(task, cause, ActionName(d.action), d.restart_number);
  Transition(task, TaskState::kFailed, d.reason);
  switch (d.action) {
    case Action::kNone:
    case Action::kFail:
    case Action::kJoinGroupRestart:
      return;
    case Action::kRestartTask:
      ScheduleTaskRestart(task, d);
      return;
    case Action::kShrinkGroup:
      state_.SetInWorld(task, false);
      Journal({{"type", "slot_left"}, {"task", task.Key()}});
      BeginGroupRestart(absl::StrCat(task.Key(), " ", cause), std::chrono::milliseconds(0));
      return;
    case Action::kRestartGroup:
      BeginGroupRestart(absl::StrCat(task.Key(), " ", cause), d.delay);
      return;
  }
}

void Master::RecordFailure(const TaskRecord& task, const std::string& cause,
                           const std::string& action, uint32_t restart) {
  FailureEntry e{task.role, task.index, task.attempt, cause, action, restart,
                 options_.clock->UnixMillis()};
  failures_.push_back(std::move(e));
  ++failures_total_;
  if (failures_.size() > kFailuresKept) failures_.pop_front();
}

void Master::ScheduleTaskRestart(TaskRecord& task, const PolicyDecision& decision) {
  task.restarts = decision.restart_number;
  task.reason = decision.reason;
  EmitNotice(absl::StrCat(task.Key(), " ", decision.reason));
  loop_.PostAfter(decision.delay, [this, role = task.role, index = task.index,
                                   attempt = task.attempt] { RelaunchTask(role, index, attempt); });
}

void Master::RelaunchTask(const std::string& role_name, uint32_t index, uint32_t attempt) {
  TaskRecord* rec = state_.Find(role_name, index);
  if (rec == nullptr || rec->attempt != attempt || !rec->restart_pending) return;
  if (phase_ == JobPhase::kStopping || IsTerminal(phase_)) return;
  if (auto record = state_.Restart(*rec)) Journal(std::move(*record));
  for (auto& t : plan_.tasks) {
    if (t.role == role_name && t.index == index) t.attempt = rec->attempt;
  }
  // LaunchReadyRoles launches the pending tasks of roles not marked launched.
  launched_roles_.erase(std::remove(launched_roles_.begin(), launched_roles_.end(), role_name),
                        launched_roles_.end());
  LaunchReadyRoles();
}

bool Master::InGroup(const TaskRecord& task) const { return policy_.InGroup(task.role); }

void Master::BeginGroupRestart(const std::string& reason, std::chrono::milliseconds delay) {
  group_restart_in_progress_ = true;
  group_restart_delay_ = delay;
  Journal({{"type", "group_restart_begun"},
           {"generation", generation_ + 1},
           {"reason", reason},
           {"restarts", policy_.group_restarts()},
           {"delay_ms", delay.count()}});
  EmitNotice(absl::StrCat("re-forming the group (generation ", generation_ + 1, "): ", reason));
  if (shards_) {
    std::vector<nlohmann::json> records;
    if (options_.spec.checkpoint.configured) {
      // Shards completed after the checkpoint the new generation resumes from are redone.
      shards_->BeginRollback(&records);
    } else {
      for (const auto& t : state_.tasks()) {
        if (InGroup(t)) shards_->ReleaseTask(t.Key(), ShardTable::kGroupRestartReason, &records);
      }
    }
    for (auto& r : records) Journal(std::move(r));
  }
  std::string why = absl::StrCat("stopped to re-form the group: ", reason);
  for (auto& t : state_.tasks()) {
    if (!InGroup(t) || IsTerminal(t.state)) continue;
    t.restart_pending = true;
    StopTask(t, options_.stop_grace, why);
  }
  MaybeRelaunchGroup();
}

void Master::MaybeRelaunchGroup() {
  if (!group_restart_in_progress_ || phase_ == JobPhase::kStopping || IsTerminal(phase_)) return;
  for (const auto& t : state_.tasks()) {
    if (InGroup(t) && !IsTerminal(t.state)) return;
  }
  group_restart_in_progress_ = false;
  auto delay = group_restart_delay_;
  // An elastic role that fell below min waits for its earliest parked slots.
  auto now = options_.clock->Now();
  for (const auto& role : options_.spec.roles) {
    if (role.min_instances == 0) continue;
    uint32_t in_world = 0;
    std::vector<Clock::TimePoint> back;
    for (const auto& t : state_.tasks()) {
      if (t.role != role.name) continue;
      if (t.in_world) {
        ++in_world;
      } else if (auto it = policy_.parked().find(t.Key()); it != policy_.parked().end()) {
        back.push_back(it->second);
      }
    }
    std::sort(back.begin(), back.end());
    for (size_t i = 0; in_world + i < role.min_instances && i < back.size(); ++i) {
      if (back[i] > now) {
        delay = std::max(delay, std::chrono::duration_cast<std::chrono::milliseconds>(back[i] - now));
      }
    }
  }
  uint32_t gen = generation_;
  loop_.PostAfter(delay, [this, gen] {
    if (generation_ != gen || group_restart_in_progress_) return;
    RelaunchGroup();
  });
}

void Master::RelaunchGroup() {
  if (phase_ == JobPhase::kStopping || IsTerminal(phase_)) return;
  auto now = options_.clock->Now();
  // Parked slots rejoin when their time is up, or earlier while their role is below min.
  for (const auto& role : options_.spec.roles) {
    if (role.min_instances == 0) continue;
    uint32_t in_world = 0;
    for (const auto& t : state_.tasks()) in_world += (t.role == role.name && t.in_world);
    for (auto& t : state_.tasks()) {
      if (t.role != role.name || t.in_world) continue;
      auto it = policy_.parked().find(t.Key());
      bool due = it == policy_.parked().end() || it->second <= now;
      if (due || in_world < role.min_instances) {
        policy_.Unpark(t.Key());
        state_.SetInWorld(t, true);
        Journal({{"type", "slot_rejoined"}, {"task", t.Key()}});
        ++in_world;
      }
    }
  }
  ++generation_;
  for (auto& t : state_.tasks()) {
    if (!InGroup(t) || !t.in_world) continue;
    t.restart_pending = true;  // Restart clears it
    if (auto record = state_.Restart(t)) Journal(std::move(*record));
  }
  if (!BuildPlan()) return;
  Journal({{"type", "group_restarted"},
           {"generation", generation_},
           {"world_size", plan_.tasks.size()}});
  EmitNotice(absl::StrCat("generation ", generation_, ": ", plan_.tasks.size(), " tasks rejoin"));
  SendClusterSpec();
  launched_roles_.clear();
  for (const auto& t : state_.tasks()) {
    // Roles outside the group keep running and count as launched.
    if (!InGroup(t) &&
        std::find(launched_roles_.begin(), launched_roles_.end(), t.role) == launched_roles_.end()) {
      launched_roles_.push_back(t.role);
    }
  }
  LaunchReadyRoles();
  CheckGrowth();
}

// Elastic: parked slots come back once their backoff has passed. The job grows towards max at
// the next checkpoint (no work lost), or at once when the job keeps no checkpoints.
void Master::CheckGrowth() {
  if (policy_.parked().empty() || phase_ == JobPhase::kStopping || IsTerminal(phase_)) return;
  auto now = options_.clock->Now();
  if (!policy_.SlotsBack(now).empty()) {
    if (group_restart_in_progress_) return;  // RelaunchGroup checks again
    grow_pending_ = true;
    if (!options_.spec.checkpoint.configured) BeginGrowth();
    return;
  }
  auto next = policy_.NextSlotBack();
  if (next && !grow_timer_set_) {
    grow_timer_set_ = true;
    loop_.PostAfter(std::chrono::duration_cast<std::chrono::milliseconds>(*next - now) +
                        std::chrono::milliseconds(1),
                    [this] {
                      grow_timer_set_ = false;
                      CheckGrowth();
                    });
  }
}

void Master::BeginGrowth() {
  if (!grow_pending_ || group_restart_in_progress_ || phase_ == JobPhase::kStopping ||
      IsTerminal(phase_)) {
    return;
  }
  grow_pending_ = false;
  size_t back = policy_.SlotsBack(options_.clock->Now()).size();
  if (back == 0) return;
  BeginGroupRestart(absl::StrCat("capacity is back for ", back, " task(s)"),
                    std::chrono::milliseconds(0));
}

// ---------------------------------------------------------------- outcome and shutdown

void Master::EvaluateOutcome() {
  if (phase_ == JobPhase::kStopping || IsTerminal(phase_)) return;
  auto outcome = state_.DecideOutcome();
  if (outcome) BeginStopping(outcome->phase, outcome->reason);
}

void Master::BeginStopping(JobPhase outcome, const std::string& reason) {
  if (phase_ == JobPhase::kStopping || IsTerminal(phase_)) return;
  pending_outcome_ = Outcome{outcome, reason};
  Journal({{"type", "outcome_decided"}, {"outcome", JobPhaseName(outcome)}, {"reason", reason}});
  SetPhase(JobPhase::kStopping, reason);
  // Restarts that were scheduled will not happen: say so instead of promising them.
  for (auto& t : state_.tasks()) {
    if (!t.restart_pending || !IsTerminal(t.state)) continue;
    t.restart_pending = false;
    if (t.state == TaskState::kSucceeded) {
      t.reason.clear();
    } else if (t.state == TaskState::kKilled) {
      t.reason = absl::StrCat(t.reason, "; not restarted: the job ended");
    } else {
      t.reason = absl::StrCat(t.cause.empty() ? DescribeExit(t.exit_code, t.signal) : t.cause,
                              "; not restarted: the job ended");
    }
  }
  std::string stop_reason = outcome == JobPhase::kSucceeded
                                ? "stopped: the job succeeded"
                                : (outcome == JobPhase::kKilled ? "stopped: " + reason
                                                                : "stopped: the job failed");
  std::map<std::string, v1::MasterMessage> stops;
  for (auto& t : state_.tasks()) {
    if (IsTerminal(t.state)) continue;
    if (t.state == TaskState::kPending) {
      Transition(t, TaskState::kKilled, "never started: " + stop_reason.substr(9));
      continue;
    }
    t.reason = stop_reason;
    auto& msg = stops[t.node];
    auto* task = msg.mutable_stop()->add_tasks();
    task->set_role(t.role);
    task->set_index(t.index);
    msg.mutable_stop()->set_grace_ms(static_cast<uint32_t>(options_.stop_grace.count()));
  }
  for (auto& [node, msg] : stops) {
    AgentSession* s = SessionForNode(node);
    if (s != nullptr) {
      SendToAgent(*s, msg);
    } else {
      for (auto& t : state_.tasks()) {
        if (t.node == node && !IsTerminal(t.state)) Transition(t, TaskState::kKilled, "its agent is gone");
      }
    }
  }
  // An agent that does not confirm in time is released by the backend, which kills it and
  // with it its tasks.
  loop_.PostAfter(options_.stop_grace + std::chrono::seconds(2), [this] {
    if (IsTerminal(phase_)) return;
    for (auto& t : state_.tasks()) {
      if (!IsTerminal(t.state)) Transition(t, TaskState::kKilled, "did not stop in time; its agent was terminated");
    }
    MaybeFinish();
  });
  MaybeFinish();
}

void Master::MaybeFinish() {
  if (phase_ != JobPhase::kStopping || !state_.AllTerminal()) return;
  Finish();
}

void Master::Finish() {
  for (auto& [id, s] : sessions_) {
    v1::MasterMessage msg;
    msg.mutable_shutdown()->set_reason("the job has ended");
    SendToAgent(s, msg);
  }
  Commit();  // now, not after the batch: the agents exit on it, and Release waits for them
  using Outcome = backends::Backend::Outcome;
  backend_->SetOutcome(pending_outcome_->phase == JobPhase::kSucceeded ? Outcome::kSucceeded
                       : pending_outcome_->phase == JobPhase::kKilled  ? Outcome::kKilled
                                                                        : Outcome::kFailed,
                       pending_outcome_->reason);
  backend_->Release();
  for (auto& [id, s] : sessions_) s.connection->Close();
  finished_unix_ms_ = options_.clock->UnixMillis();
  Journal({{"type", "job_finished"},
           {"outcome", JobPhaseName(pending_outcome_->phase)},
           {"reason", pending_outcome_->reason}});
  SetPhase(pending_outcome_->phase, pending_outcome_->reason);
  AfterBatch();  // durable before anyone is told
  std::vector<std::shared_ptr<WatchQueue>> watchers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& w : watchers_) {
      if (auto q = w.lock()) watchers.push_back(q);
    }
  }
  for (auto& q : watchers) q->Close();
  {
    std::lock_guard<std::mutex> lock(mu_);
    finished_ = true;
  }
  finished_cv_.notify_all();
}

void Master::SetPhase(JobPhase phase, const std::string& reason) {
  if (phase_ == phase && phase_reason_ == reason) return;
  phase_ = phase;
  phase_reason_ = reason;
  Journal({{"type", "job_state"}, {"to", JobPhaseName(phase)}, {"reason", reason}});
}

void Master::Journal(nlohmann::json record) {
  int64_t us = options_.clock->UnixMicros();
  record["ts"] = us / 1000;
  record["ts_us"] = us;
  journal_->Append(record);
  status_dirty_ = true;
}

void Master::Transition(TaskRecord& task, TaskState to, const std::string& reason) {
  auto record = state_.Transition(task, to, reason);
  if (!record) return;
  (*record)["attempt"] = task.attempt;
  if (to == TaskState::kRunning) (*record)["pid"] = task.pid;
  Journal(std::move(*record));
}

void Master::SendToAgent(AgentSession& session, const v1::MasterMessage& message) {
  outbox_.emplace_back(session.connection, std::make_unique<v1::MasterMessage>(message));
}

void Master::Commit() {
  if (auto st = journal_->Sync(); !st.ok()) {
    spdlog::error("the events journal cannot be written: {}", st.ToString());
  }
  for (auto& [connection, message] : outbox_) connection->Send(*message);
  outbox_.clear();
}

void Master::AfterBatch() {
  Commit();
  if (logs_->Flush() && logs_->combined_bytes() != log_feed_->committed()) {
    log_feed_->Commit(logs_->combined_bytes());
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& w : watchers_) {
      if (auto q = w.lock()) q->NewOutput();
    }
  }
  auto progress_now = options_.clock->Now();
  if (!status_dirty_ && progress_dirty_ &&
      progress_now - last_publish_ >= kProgressPublishInterval) {
    progress_dirty_ = false;
    last_publish_ = progress_now;
    PublishStatus(/*write_file=*/false);
    return;
  }
  if (!status_dirty_) return;
  // A large job changes thousands of task states in a burst: publish the whole status at most
  // every kStatusPublishInterval (the end of the job is always published at once).
  auto now = options_.clock->Now();
  if (IsTerminal(phase_) || now - last_publish_ >= kStatusPublishInterval) {
    status_dirty_ = false;
    progress_dirty_ = false;
    last_publish_ = now;
    PublishStatus(/*write_file=*/true);
  } else if (!publish_pending_) {
    publish_pending_ = true;
    loop_.PostAfter(kStatusPublishInterval, [this] {
      publish_pending_ = false;
      // Runs as a batch of its own: AfterBatch follows and publishes.
    });
  }
}

void Master::PublishStatus(bool write_file) {
  v1::JobStatus status;
  status.set_job_id(options_.job_id);
  status.set_name(options_.spec.name);
  status.set_state(ToProto(phase_));
  status.set_reason(phase_reason_);
  status.set_created_unix_ms(created_unix_ms_);
  status.set_finished_unix_ms(finished_unix_ms_);
  for (const auto& t : state_.tasks()) {
    auto* ts = status.add_tasks();
    ts->mutable_task()->set_role(t.role);
    ts->mutable_task()->set_index(t.index);
    // A finished task that will be started again shows as pending: "failed" would read as final.
    ts->set_state(t.restart_pending && IsTerminal(t.state) && t.in_world &&
                          phase_ != JobPhase::kStopping && !IsTerminal(phase_)
                      ? v1::TASK_STATE_PENDING
                      : ToProto(t.state));
    ts->set_node(t.node);
    ts->set_pid(t.pid);
    ts->set_exit_code(t.exit_code);
    ts->set_signal(t.signal);
    ts->set_global_rank(t.global_rank);
    ts->set_reason(t.reason);
    ts->set_attempt(t.attempt);
    ts->set_in_world(t.in_world);
    ts->set_step(t.step);
  }
  status.set_generation(generation_);
  status.set_group_restarts(policy_.group_restarts());
  status.set_world_size(static_cast<uint32_t>(plan_.tasks.size()));
  if (shards_) status.set_shards_json(shards_->Snapshot().dump());
  for (const auto& f : failures_) {
    auto* fr = status.add_failures();
    fr->mutable_task()->set_role(f.role);
    fr->mutable_task()->set_index(f.index);
    fr->mutable_task()->set_attempt(f.attempt);
    fr->set_cause(f.cause);
    fr->set_action(f.action);
    fr->set_restart(f.restart);
    fr->set_unix_ms(f.unix_ms);
  }
  status.set_failures_total(failures_total_);
  std::string serialized = status.SerializeAsString();
  v1::WatchEvent event;
  *event.mutable_status() = status;
  std::string event_bytes = event.SerializeAsString();
  {
    std::lock_guard<std::mutex> lock(mu_);
    status_snapshot_ = serialized;
    std::vector<std::weak_ptr<WatchQueue>> alive;
    uint64_t mark = logs_->combined_bytes();
    for (auto& w : watchers_) {
      if (auto q = w.lock()) {
        q->Push(event_bytes, mark, /*is_status=*/true);
        alive.push_back(w);
      }
    }
    watchers_.swap(alive);
  }
  if (!write_file) return;
  auto now = options_.clock->Now();
  if (IsTerminal(phase_) || now - last_status_write_ >= kStatusFileInterval) {
    last_status_write_ = now;
    WriteStatusFile();
  } else if (!status_write_pending_) {
    status_write_pending_ = true;
    loop_.PostAfter(kStatusFileInterval, [this] {
      status_write_pending_ = false;
      last_status_write_ = options_.clock->Now();
      WriteStatusFile();
    });
  }
}

void Master::WriteStatusFile() {
  v1::JobStatus status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    status.ParseFromString(status_snapshot_);
  }
  nlohmann::json j = JobStatusToJson(status);
  j["master_pid"] = ::getpid();
  if (auto st = WriteFileAtomically(options_.job_dir + "/status.json", j.dump(2)); !st.ok()) {
    spdlog::error("cannot write status.json: {}", st.ToString());
  }
}

Master::AgentSession* Master::SessionForNode(const std::string& node) {
  auto it = node_sessions_.find(node);
  if (it == node_sessions_.end()) return nullptr;
  auto s = sessions_.find(it->second);
  return s == sessions_.end() ? nullptr : &s->second;
}

}  // namespace shoal::master
