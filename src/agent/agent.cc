#include "agent/agent.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "machine/free_ports.h"
#include "agent/master_outbox.h"
#include "agent/resource_sampler.h"
#include "agent/task_directories.h"
#include "agent/task_environment.h"
#include "common/files.h"
#include "process/process.h"
#include "shoal/v1/shoal.grpc.pb.h"
#include "machine/inventory.h"
#include "spdlog/spdlog.h"

namespace shoal::agent {

// The agent's one stream to the master. Messages sent while the stream is down are held (exits
// and starts always) and go out on reconnect, after the relayed SDK calls that the previous
// master never answered and the output it never wrote to the job's files (master_outbox.h).
class MasterLink {
 public:
  MasterLink(std::string address, std::string token)
      : address_(std::move(address)), token_(std::move(token)) {}

  bool Open() {
    std::lock_guard<std::mutex> lock(mu_);
    // A master that died is replaced within milliseconds (shoal run starts a new one on the
    // same address): retry quickly, not after gRPC's default one-second backoff.
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
    // A task's launch carries its whole environment, which the job file may fill up to the
    // kernel's ARG_MAX (up to 6 MiB): over gRPC's 4 MiB default the stream would break and the
    // master would see the agent disconnect instead of the task start. The master's side
    // accepts the same.
    args.SetMaxReceiveMessageSize(64 << 20);
    channel_ = grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), args);
    if (!channel_->WaitForConnected(std::chrono::system_clock::now() +
                                    std::chrono::milliseconds(1000))) {
      return false;
    }
    stub_ = v1::Master::NewStub(channel_);
    context_ = std::make_unique<grpc::ClientContext>();
    context_->AddMetadata("authorization", "Bearer " + token_);
    stream_ = stub_->AgentSession(context_.get());
    open_ = stream_ != nullptr;
    registered_ = false;
    return open_;
  }

  // Writes now or holds for the next stream (MasterOutbox says what is kept, and keeps relayed
  // SDK calls until the master answers them).
  void Send(const v1::AgentMessage& message) {
    std::lock_guard<std::mutex> lock(mu_);
    // Nothing may overtake the registration: until it is written, messages are held.
    if (open_ && registered_) {
      if (stream_->Write(message)) {
        outbox_.Written(message);
        return;
      }
      open_ = false;
    }
    outbox_.Hold(message);
  }

  // Sends `first` (the registration), then the relayed calls no master answered and everything
  // held while the link was down.
  bool SendFirstThenQueued(const v1::AgentMessage& first) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!open_ || !stream_->Write(first)) return false;
    std::vector<v1::AgentMessage> pending = outbox_.TakeForNewStream();
    for (size_t i = 0; i < pending.size(); ++i) {
      if (!stream_->Write(pending[i])) {
        for (size_t j = i; j < pending.size(); ++j) outbox_.Hold(pending[j]);
        return false;
      }
      outbox_.Written(pending[i]);
    }
    registered_ = true;
    return true;
  }

  // The master answered relayed call `request_id`.
  void Answered(uint64_t request_id) {
    std::lock_guard<std::mutex> lock(mu_);
    outbox_.Answered(request_id);
  }

  // The master's files hold this output: no need to keep it for a master that replaces it.
  void Committed(const v1::LogsCommitted& committed) {
    std::lock_guard<std::mutex> lock(mu_);
    outbox_.Committed(committed);
  }

  // Blocks in the caller's thread; only one reader.
  bool Read(v1::MasterMessage* message) { return stream_ && stream_->Read(message); }

  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = false;
    if (context_) context_->TryCancel();
  }

  void Finish() {
    std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::MasterMessage>> stream;
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = false;
      if (context_) context_->TryCancel();
      stream = std::move(stream_);
    }
    if (stream) stream->Finish();
  }

 private:
  std::string address_;
  std::string token_;
  std::mutex mu_;
  std::shared_ptr<grpc::Channel> channel_;
  bool registered_ = false;  // the registration went out on the current stream
  std::unique_ptr<v1::Master::Stub> stub_;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::MasterMessage>> stream_;
  bool open_ = false;
  MasterOutbox outbox_;
};

namespace {

// Past this much output held for the master, the batch goes at once (and stays far below
// gRPC's 4 MiB message limit).
constexpr size_t kMaxHeldOutputBytes = 256 * 1024;

std::string KeyOf(const std::string& role, uint32_t index) {
  return absl::StrCat(role, ":", index);
}

std::pair<std::string, uint32_t> SplitKey(const std::string& key) {
  size_t colon = key.rfind(':');
  return {key.substr(0, colon), static_cast<uint32_t>(std::stoul(key.substr(colon + 1)))};
}

// The address of this node as the master sees it: the source address the kernel would use to
// reach the master. Loopback for a master on loopback.
std::string AddressTowards(const std::string& master_address) {
  std::string host = master_address.substr(0, master_address.rfind(':'));
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  if (::getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || res == nullptr) return "127.0.0.1";
  std::string result = "127.0.0.1";
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET_ADDRSTRLEN];
      if (::inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf))) result = buf;
    }
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  return result;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Agent>> Agent::Create(AgentOptions options) {
  if (options.master_address.empty()) return absl::InvalidArgumentError("--master is required");
  if (options.token.empty()) {
    return absl::InvalidArgumentError("SHOAL_AGENT_TOKEN is not set; the master gives it");
  }
  if (auto st = MakeDirs(options.work_dir); !st.ok()) return st;
  auto agent = std::unique_ptr<Agent>(new Agent(std::move(options)));
  SupervisorCallbacks callbacks;
  Agent* self = agent.get();
  SdkServerCallbacks sdk_callbacks;
  sdk_callbacks.on_request = [self](uint64_t id, const std::string& task, uint32_t attempt,
                                    const std::string& line) {
    v1::AgentMessage m;
    auto [role, index] = SplitKey(task);
    m.mutable_sdk()->set_request_id(id);
    m.mutable_sdk()->mutable_task()->set_role(role);
    m.mutable_sdk()->mutable_task()->set_index(index);
    m.mutable_sdk()->mutable_task()->set_attempt(attempt);
    m.mutable_sdk()->set_json(line);
    self->Send(m);
  };
  sdk_callbacks.on_stalled = [self](const std::string& task, uint32_t attempt, uint64_t step,
                                    std::chrono::milliseconds silent) {
    v1::AgentMessage m;
    auto [role, index] = SplitKey(task);
    m.mutable_stalled()->mutable_task()->set_role(role);
    m.mutable_stalled()->mutable_task()->set_index(index);
    m.mutable_stalled()->mutable_task()->set_attempt(attempt);
    m.mutable_stalled()->set_last_step(step);
    m.mutable_stalled()->set_silent_ms(static_cast<uint32_t>(silent.count()));
    self->Send(m);
  };
  // Abstract namespace: no file to clean up, no path-length limit from a deep job directory.
  auto sdk = SdkServer::Create(
      absl::StrCat("@shoal-agent-", agent->options_.node_name, "-", ::getpid()),
      std::move(sdk_callbacks));
  if (!sdk.ok()) return sdk.status();
  agent->sdk_ = std::move(*sdk);
  // A flush's chunks gather in one message, sent at its end: the batcher calls both lambdas
  // from one thread at a time, so the message needs no lock of its own.
  auto batch = std::make_shared<v1::AgentMessage>();
  agent->log_batcher_ = std::make_unique<LogBatcher>(
      agent->options_.log_flush_window, kMaxHeldOutputBytes,
      [self, batch](const std::string& key, OutputStream stream, std::string data) {
        v1::LogChunk* chunk = batch->mutable_logs()->add_chunks();
        auto [role, index] = SplitKey(key);
        chunk->mutable_task()->set_role(role);
        chunk->mutable_task()->set_index(index);
        const bool is_stderr = stream == OutputStream::kStderr;
        chunk->set_stream(is_stderr ? v1::LogChunk::STREAM_STDERR : v1::LogChunk::STREAM_STDOUT);
        {
          absl::MutexLock lock(&self->mu_);
          Agent::OutputOffsets& offsets = self->output_offsets_[key];
          chunk->mutable_task()->set_attempt(offsets.attempt);
          chunk->set_offset(offsets.next[is_stderr ? 1 : 0]);
          offsets.next[is_stderr ? 1 : 0] += data.size();
        }
        chunk->set_data(std::move(data));
      },
      [self, batch] {
        self->Send(*batch);
        batch->Clear();
      });
  callbacks.on_output = [self](const std::string& key, OutputStream stream, std::string_view data) {
    self->log_batcher_->Add(key, stream, data);
  };
  callbacks.on_exit = [self](const std::string& key, const ProcessExit& exit) {
    self->OnExit(key, exit);
  };
  callbacks.on_notice = [self](const std::string& notice) {
    v1::AgentMessage m;
    m.set_notice(notice);
    self->Send(m);
  };
  SupervisorOptions sup;
  sup.instance_id = absl::StrCat(agent->options_.node_name, "-", ::getpid());
  sup.quiet_without_cgroups = agent->options_.in_container;
  // Setting up cgroups takes several milliseconds: it runs while the agent dials and registers,
  // and only the first launch waits for it.
  agent->supervisor_ready_ =
      std::async(std::launch::async, [self, sup, callbacks = std::move(callbacks)]() mutable {
        auto supervisor = ProcessSupervisor::Create(sup, std::move(callbacks));
        if (!supervisor.ok()) return supervisor.status();
        self->supervisor_ = std::move(*supervisor);
        return absl::OkStatus();
      }).share();
  return agent;
}

Agent::Agent(AgentOptions options)
    : options_(std::move(options)),
      link_(std::make_unique<MasterLink>(options_.master_address, options_.token)) {}

Agent::~Agent() { Shutdown(); }

void Agent::Shutdown() {
  shutting_down_ = true;
  cv_.SignalAll();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  if (sample_thread_.joinable()) sample_thread_.join();
  if (supervisor_ready_.valid()) supervisor_ready_.wait();
  supervisor_.reset();  // kills anything left
  log_batcher_->Flush();  // what the tasks wrote last
  sdk_.reset();
  link_->Finish();
}

void Agent::Send(const v1::AgentMessage& message) { link_->Send(message); }

namespace {

v1::AgentMessage TaskExitedMessage(const std::string& key, uint32_t attempt,
                                   const ProcessExit& exit) {
  v1::AgentMessage m;
  auto [role, index] = SplitKey(key);
  auto* e = m.mutable_task_exited();
  e->mutable_task()->set_role(role);
  e->mutable_task()->set_index(index);
  e->mutable_task()->set_attempt(attempt);
  e->set_exit_code(exit.exit_code);
  e->set_signal(exit.signal);
  e->set_stopped_by_agent(exit.stopped_by_request);
  e->set_oom_killed(exit.oom_killed);
  return m;
}

}  // namespace

void Agent::OnExit(const std::string& key, const ProcessExit& exit) {
  uint32_t attempt = 0;
  {
    absl::MutexLock lock(&mu_);
    if (starting_.count(key)) {
      early_exits_[key] = exit;  // Launch sends it right after TaskStarted
      return;
    }
    live_.erase(key);
    stopping_.erase(key);
    attempt = attempts_[key];
    last_exits_[key] = {attempt, exit};
  }
  cv_.SignalAll();
  sdk_->TaskEnded(key, attempt);
  log_batcher_->Flush();  // the task's last words before its exit
  if (exit.oom_killed) {
    v1::AgentMessage notice;
    notice.set_notice(absl::StrCat(key, " was killed for exceeding its memory limit"));
    Send(notice);
  }
  Send(TaskExitedMessage(key, attempt, exit));
}

bool Agent::Connect() {
  if (!link_->Open()) return false;
  v1::AgentMessage reg;
  auto* r = reg.mutable_register_();
  r->set_version(v1::PROTOCOL_VERSION_CURRENT);
  r->set_node_name(options_.node_name);
  machine::InventoryOptions inv_options;
  inv_options.fake_gpus = options_.fake_gpus;
  machine::MachineInventory inv = machine::DetectLocalInventory(inv_options);
  if (options_.bound_gpus) inv.gpus = *options_.bound_gpus;
  auto* i = r->mutable_inventory();
  i->set_hostname(inv.hostname);
  i->set_address(AddressTowards(options_.master_address));
  i->set_cpus(inv.cpus);
  i->set_memory_bytes(inv.memory_bytes);
  for (const auto& g : inv.gpus) i->add_gpus(g);
  PortRange range =
      options_.task_ports.value_or(machine::TaskPortRange(machine::EphemeralPortRange()));
  // As many spares again: another agent on this machine may have picked the same ports, and
  // the master then hands a task a spare instead (AssignTaskPorts).
  std::vector<uint32_t> ports = machine::FindFreePorts(options_.ports, range, options_.ports);
  size_t outside = 0;
  for (uint32_t p : ports) {
    r->add_free_ports(p);
    outside += p < range.low || p > range.high;
  }
  std::string short_of_ports;
  if (options_.task_ports && outside > 0) {
    short_of_ports = absl::StrCat("SHOAL_TASK_PORTS ", range.low, "-", range.high, " had ",
                                  options_.ports - outside, " free port(s) of the ",
                                  options_.ports,
                                  " this node's tasks need; the others were picked by the kernel");
    spdlog::warn("{}", short_of_ports);
  }
  std::vector<v1::AgentMessage> exits_again;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& key : live_) {
      auto [role, index] = SplitKey(key);
      auto* t = r->add_running_tasks();
      t->set_role(role);
      t->set_index(index);
      t->set_attempt(attempts_[key]);
    }
    if (registered_before_) {
      for (const auto& [key, reported] : last_exits_) {
        if (!live_.contains(key)) {
          exits_again.push_back(TaskExitedMessage(key, reported.attempt, reported.exit));
        }
      }
    }
    registered_before_ = true;
  }
  bool sent = link_->SendFirstThenQueued(reg);
  // Right after the registration, before the new master gives up on the tasks it expected to
  // run here (ReconcileNode waits a moment for exactly this).
  if (sent) {
    for (const auto& exited : exits_again) Send(exited);
  }
  if (sent && !short_of_ports.empty()) {
    v1::AgentMessage notice;
    notice.set_notice(short_of_ports);
    Send(notice);
  }
  return sent;
}

int Agent::Run() {
  heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
  if (options_.resource_sample_interval.count() > 0) {
    sample_thread_ = std::thread([this] { SampleLoop(); });
  }
  auto lost_since = std::chrono::steady_clock::now();
  bool ever_connected = false;
  int exit_code = 0;
  while (!stop_requested_) {
    if (!Connect()) {
      if (std::chrono::steady_clock::now() - lost_since > options_.master_grace) {
        spdlog::error("the master at {} was unreachable for {:.1f}s; stopping every task",
                      options_.master_address, options_.master_grace.count() / 1000.0);
        exit_code = 1;
        break;
      }
      absl::MutexLock lock(&mu_);
      const absl::Time retry_at = absl::Now() + absl::FromChrono(options_.reconnect_interval);
      while (!stop_requested_ && !cv_.WaitWithDeadline(&mu_, retry_at)) {
      }
      continue;
    }
    if (ever_connected) spdlog::info("reconnected to the master at {}", options_.master_address);
    ever_connected = true;
    v1::MasterMessage message;
    while (!shutting_down_ && link_->Read(&message)) HandleMessage(message);
    if (shutting_down_) break;
    link_->Close();
    lost_since = std::chrono::steady_clock::now();
    if (!stop_requested_) {
      spdlog::warn("lost the master at {}; keeping tasks for {:.1f}s", options_.master_address,
                   options_.master_grace.count() / 1000.0);
    }
  }
  StopTasksAndWait(exit_code == 0 ? std::chrono::milliseconds(3000) : std::chrono::milliseconds(0));
  shutting_down_ = true;
  cv_.SignalAll();
  log_batcher_->Flush();
  link_->Finish();
  return exit_code;
}

void Agent::RequestStop(const std::string& why) {
  if (!why.empty()) {
    log_batcher_->Flush();
    v1::AgentMessage leaving;
    leaving.set_leaving(why);
    link_->Send(leaving);
  }
  stop_requested_ = true;
  shutting_down_ = true;
  link_->Close();
  cv_.SignalAll();
}

void Agent::HandleMessage(const v1::MasterMessage& message) {
  switch (message.kind_case()) {
    case v1::MasterMessage::kRegisterReply:
      if (!message.register_reply().accepted()) {
        spdlog::error("the master refused this agent: {}", message.register_reply().reason());
        RequestStop();
      }
      break;
    case v1::MasterMessage::kCluster:
      // Written before any launch of this rendezvous arrives: the stream keeps order. Only this
      // rendezvous's live tasks read it, and a machine crash takes them along: no fsync.
      if (auto st = ReplaceFile(options_.work_dir + "/cluster.json", message.cluster().json());
          !st.ok()) {
        spdlog::error("cannot write the cluster spec: {}", st.ToString());
      }
      break;
    case v1::MasterMessage::kLaunch:
      Launch(message);
      break;
    case v1::MasterMessage::kStop: {
      auto grace = std::chrono::milliseconds(message.stop().grace_ms());
      if (Supervisor() == nullptr) break;  // it never started anything
      if (message.stop().tasks().empty()) {
        supervisor_->StopAll(grace);
        break;
      }
      for (const auto& t : message.stop().tasks()) {
        std::string key = KeyOf(t.role(), t.index());
        {
          absl::MutexLock lock(&mu_);
          if (!live_.count(key)) continue;
          stopping_.insert(key);
        }
        supervisor_->Stop(key, grace);
      }
      break;
    }
    case v1::MasterMessage::kSdkReply:
      link_->Answered(message.sdk_reply().request_id());
      sdk_->Reply(message.sdk_reply().request_id(), message.sdk_reply().json());
      break;
    case v1::MasterMessage::kLogsCommitted:
      link_->Committed(message.logs_committed());
      break;
    case v1::MasterMessage::kShutdown:
      shutting_down_ = true;
      stop_requested_ = true;
      break;
    default:
      break;
  }
}

void Agent::Launch(const v1::MasterMessage& message) {
  const v1::TaskLaunch& l = message.launch();
  std::string key = KeyOf(l.task().role(), l.task().index());
  std::string task_dir =
      absl::StrCat(options_.work_dir, "/tasks/", l.task().role(), "-", l.task().index());
  ProcessSpec spec;
  spec.key = key;
  spec.argv.assign(l.argv().begin(), l.argv().end());
  spec.working_dir = l.working_dir().empty() ? task_dir : l.working_dir();
  spec.cpu_affinity.assign(l.cpu_affinity().begin(), l.cpu_affinity().end());
  spec.memory_limit_bytes = l.memory_limit_bytes();
  if (options_.keep_task_output) {
    spec.stdout_path = task_dir + "/stdout";
    spec.stderr_path = task_dir + "/stderr";
  }

  v1::AgentMessage reply;
  auto fail = [&](const std::string& error) {
    auto* e = reply.mutable_task_exited();
    *e->mutable_task() = l.task();
    e->set_exit_code(-1);
    e->set_error(error);
    Send(reply);
  };
  if (options_.keep_task_output || l.working_dir().empty()) {
    if (auto st = MakeDirs(task_dir); !st.ok()) return fail(std::string(st.message()));
  }
  // Here, not on the master: on Slurm and YARN this node's disk is not the master's.
  if (auto st = MakeTaskDirectories({l.local_dirs().begin(), l.local_dirs().end()}); !st.ok()) {
    return fail(std::string(st.message()));
  }
  {
    absl::MutexLock lock(&mu_);
    if (live_.count(key)) {
      // The master only relaunches a task once its previous attempt was reported gone.
      spdlog::error("refusing to launch {} attempt {}: attempt {} still runs", key,
                    l.task().attempt(), attempts_[key]);
      return;
    }
    starting_.insert(key);
    live_.insert(key);
    attempts_[key] = l.task().attempt();
    output_offsets_[key] = OutputOffsets{l.task().attempt(), {0, 0}};
    SampledTask& sampled = sampled_[key];
    sampled.start_unix_ms = absl::ToUnixMillis(absl::Now());
    sampled.gpus.clear();
    for (const std::string& gpu : l.gpus()) {
      // A UUID or MIG id is not an NVML index: that GPU goes unsampled.
      if (uint32_t index = 0; absl::SimpleAtoi(gpu, &index)) sampled.gpus.push_back(index);
    }
  }
  // A board per attempt (a new attempt's file is never the one the old attempt's entry removes).
  std::string progress_error;
  std::string progress_file = sdk_->TaskLaunched(
      key, l.task().attempt(), std::chrono::milliseconds(l.progress_timeout_ms()),
      absl::StrCat(options_.work_dir, "/progress-", l.task().role(), "-", l.task().index(), ".",
                   l.task().attempt()),
      &progress_error);
  if (progress_file.empty()) {
    spdlog::warn("{}: {}; its progress reports go over the SDK socket", key, progress_error);
  }
  TaskEnvironmentInputs env_inputs;
  env_inputs.inherited = InheritedEnvironment({});
  env_inputs.hide_slurm_step_env = options_.hide_slurm_step_env;
  for (const auto& [name, value] : l.env()) env_inputs.from_master[name] = value;
  env_inputs.cluster_spec_file = options_.work_dir + "/cluster.json";
  env_inputs.agent_socket = sdk_->address();
  env_inputs.progress_file = progress_file;
  spec.env = TaskEnvironment(env_inputs);
  if (Supervisor() == nullptr) {
    {
      absl::MutexLock lock(&mu_);
      starting_.erase(key);
      live_.erase(key);
    }
    return fail(std::string(supervisor_ready_.get().message()));
  }
  auto pid = supervisor_->Launch(spec);
  if (!pid.ok()) {
    {
      absl::MutexLock lock(&mu_);
      starting_.erase(key);
      live_.erase(key);
    }
    return fail(std::string(pid.status().message()));
  }
  auto* s = reply.mutable_task_started();
  *s->mutable_task() = l.task();
  s->set_pid(*pid);
  Send(reply);
  std::optional<ProcessExit> early;
  {
    absl::MutexLock lock(&mu_);
    starting_.erase(key);
    if (auto it = early_exits_.find(key); it != early_exits_.end()) {
      early = it->second;
      early_exits_.erase(it);
    }
  }
  if (early) OnExit(key, *early);
}

void Agent::HeartbeatLoop() {
  mu_.Lock();
  while (!shutting_down_) {
    const absl::Time beat_at = absl::Now() + absl::FromChrono(options_.heartbeat_interval);
    while (!shutting_down_ && !cv_.WaitWithDeadline(&mu_, beat_at)) {
    }
    if (shutting_down_) break;
    if (options_.watchdog_limit.count() > 0 && !watchdog_) {
      // Started one heartbeat after the agent, not beside its registration: a process start
      // costs ~7 ms of CPU here, which on a loaded node delayed every task of the gang (5 ms of
      // a 50 ms launch budget on 2 cores), and a job shorter than a heartbeat never needs it.
      // Until then a hang is the master's to see (silent agent) and the backend's to end.
      mu_.Unlock();
      auto watchdog = AgentWatchdog::Start(options_.shoal_binary, options_.watchdog_limit);
      mu_.Lock();
      if (watchdog.ok()) {
        watchdog_ = std::move(*watchdog);
      } else {
        spdlog::warn("running without a watchdog: {}", std::string(watchdog.status().message()));
        options_.watchdog_limit = std::chrono::milliseconds(0);
      }
      if (shutting_down_) break;
    }
    if (watchdog_) watchdog_->Ping();
    v1::AgentMessage m;
    auto* hb = m.mutable_heartbeat();
    hb->set_sequence(++heartbeat_seq_);
    mu_.Unlock();
    for (const auto& p : sdk_->TakeProgress()) {
      auto [role, index] = SplitKey(p.task);
      auto* t = hb->add_tasks();
      t->mutable_task()->set_role(role);
      t->mutable_task()->set_index(index);
      t->mutable_task()->set_attempt(p.attempt);
      t->set_step(p.step);
    }
    Send(m);
    mu_.Lock();
  }
  mu_.Unlock();
}

void Agent::SampleLoop() {
  std::unique_ptr<Nvml> nvml;
  bool nvml_tried = false;
  std::unique_ptr<ResourceSampler> sampler;
  mu_.Lock();
  while (!shutting_down_) {
    const absl::Time sample_at =
        absl::Now() + absl::FromChrono(options_.resource_sample_interval);
    while (!shutting_down_ && !cv_.WaitWithDeadline(&mu_, sample_at)) {
    }
    if (shutting_down_) break;
    std::vector<TaskToSample> tasks;
    std::vector<std::pair<uint32_t, int64_t>> facts;  // attempt, start of each task
    bool wants_gpus = false;
    mu_.Unlock();
    // Null until the supervisor exists (the first launch waits for it, so no task runs yet).
    ProcessSupervisor* supervisor =
        supervisor_ready_.wait_for(std::chrono::seconds(0)) == std::future_status::ready
            ? Supervisor()
            : nullptr;
    std::vector<ProcessSupervisor::LiveProcess> live;
    if (supervisor != nullptr) live = supervisor->LiveProcesses();
    mu_.Lock();
    for (auto& process : live) {
      auto it = sampled_.find(process.key);
      // A task is sampled once its start has been told (samples never precede TaskStarted).
      if (it == sampled_.end() || !live_.count(process.key) || starting_.count(process.key)) {
        continue;
      }
      TaskToSample& task = tasks.emplace_back();
      task.key = process.key;
      task.pid = process.pid;
      task.cgroup_dirs = std::move(process.cgroup_dirs);
      task.gpus = it->second.gpus;
      wants_gpus = wants_gpus || !task.gpus.empty();
      facts.emplace_back(attempts_[process.key], it->second.start_unix_ms);
    }
    mu_.Unlock();
    if (!tasks.empty()) {
      // Loaded once, when a task first has a GPU: NVML's initialisation takes a while on a
      // machine with GPUs, and machines without any never pay for it.
      if (wants_gpus && !nvml_tried) {
        nvml_tried = true;
        nvml = Nvml::Load(options_.nvml_library);
        sampler.reset();
      }
      if (!sampler) {
        ResourceSamplerOptions sampler_options;
        sampler_options.nvml = nvml.get();
        sampler = std::make_unique<ResourceSampler>(sampler_options);
      }
      std::vector<TaskUsage> usages = sampler->Sample(tasks);
      v1::AgentMessage m;
      for (size_t i = 0; i < usages.size(); ++i) {
        const TaskUsage& usage = usages[i];
        auto [role, index] = SplitKey(usage.key);
        v1::TaskResources* t = m.mutable_resources()->add_tasks();
        t->mutable_task()->set_role(role);
        t->mutable_task()->set_index(index);
        t->mutable_task()->set_attempt(facts[i].first);
        t->set_ts_unix_ms(usage.ts_unix_ms);
        t->set_start_unix_ms(facts[i].second);
        t->set_cpu_seconds_total(usage.cpu_seconds_total);
        t->set_rss_bytes(usage.rss_bytes);
        for (const auto& gpu : usage.gpus) {
          v1::TaskResources::Gpu* g = t->add_gpus();
          g->set_index(gpu.index);
          g->set_util_percent(gpu.util_percent);
          g->set_memory_bytes(gpu.memory_bytes);
        }
      }
      Send(m);
    }
    mu_.Lock();
  }
  mu_.Unlock();
}

ProcessSupervisor* Agent::Supervisor() {
  return supervisor_ready_.get().ok() ? supervisor_.get() : nullptr;
}

void Agent::StopTasksAndWait(std::chrono::milliseconds grace) {
  if (Supervisor() == nullptr) return;
  supervisor_->StopAll(grace);
  absl::MutexLock lock(&mu_);
  const absl::Time give_up_at = absl::Now() + absl::FromChrono(grace + std::chrono::seconds(5));
  while (!live_.empty() && !cv_.WaitWithDeadline(&mu_, give_up_at)) {
  }
}

}  // namespace shoal::agent
