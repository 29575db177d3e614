#include "master/master.h"

#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/files.h"
#include "common/status_macros.h"
#include "master/master_service.h"
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

}  // namespace

absl::StatusOr<std::unique_ptr<Master>> Master::Create(MasterOptions options,
                                                       std::unique_ptr<backends::Backend> backend) {
  if (options.token.empty()) return absl::InvalidArgumentError("the master needs a token");
  auto master = std::unique_ptr<Master>(new Master(std::move(options), std::move(backend)));
  const std::string& dir = master->options_.job_dir;
  auto journal = Journal::Open(dir + "/events.jsonl");
  if (!journal.ok()) return journal.status();
  master->journal_ = std::move(*journal);
  auto publisher = StatusPublisher::Open(dir, &master->loop_, master->options_.clock);
  if (!publisher.ok()) return publisher.status();
  master->publisher_ = std::move(*publisher);
  master->resource_logs_ = std::make_unique<ResourceLogs>(dir);
  if (master->options_.recover) {
    // Read before anything is appended: the previous master's record of the job.
    auto records = Journal::ReadAll(dir + "/events.jsonl");
    if (!records.ok()) return records.status();
    if (records->empty()) {
      // The previous master died before it made anything durable: nothing ran, start afresh.
      master->options_.recover = false;
    } else {
      // Errors mean the journal cannot be trusted; the job is then left as it is for a person
      // to look at.
      SHOAL_RETURN_IF_ERROR(Replay(*records, master->job_, master->options_.clock->Now()));
      // The agents keep dialling the address they were given: listen there again.
      const std::string& previous = master->job_.master_address;
      if (size_t colon = previous.rfind(':');
          colon != std::string::npos && master->options_.listen_port == 0) {
        master->options_.listen_port =
            static_cast<uint16_t>(std::strtoul(previous.c_str() + colon + 1, nullptr, 10));
      }
    }
  }
  return master;
}

Master::Master(MasterOptions options, std::unique_ptr<backends::Backend> backend)
    : options_(std::move(options)),
      backend_(std::move(backend)),
      loop_(options_.clock),
      job_(options_.job_id, options_.spec),
      restarts_(&job_, this, options_.clock, options_.stop_grace),
      sdk_(&job_, this, options_.clock),
      admission_(&job_, backend_.get(), this,
                 {options_.job_id, options_.admission_retry, options_.register_timeout}) {
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
    loop_.Post([this, event] { admission_.OnAllocationEvent(event); });
  });
  loop_.Start([this] { AfterBatch(); });
  if (options_.recover) {
    loop_.Post([this] { Recover(); });
    return absl::OkStatus();
  }
  loop_.Post([this] {
    Record(JobSubmitted{options_.job_id, options_.spec.name, job_.tasks.tasks().size(), address_});
    if (!options_.spec.dataset.parquet.empty()) {
      Record(DatasetListed{options_.spec.dataset.parquet, options_.spec.dataset.files});
    }
    for (auto& t : job_.tasks.tasks()) {
      TaskStateChanged initial;
      initial.task = t.Key();
      initial.to = TaskStateName(TaskState::kPending);
      initial.rank = t.global_rank;
      Record(std::move(initial));
    }
    admission_.TryAdmit();
  });
  return absl::OkStatus();
}

int Master::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  finished_cv_.wait(lock, [&] { return finished_; });
  lock.unlock();
  std::promise<JobPhase> p;
  loop_.Post([&] { p.set_value(job_.phase); });
  switch (p.get_future().get()) {
    case JobPhase::kSucceeded: return 0;
    case JobPhase::kKilled: return 3;
    default: return 1;
  }
}

void Master::Kill(const std::string& reason) {
  loop_.Post([this, reason] {
    if (Ending()) return;
    Record(KillRequested{reason});
    BeginStopping(JobPhase::kKilled, reason);
  });
}

void Master::AnnounceSidecar(const std::string& name, const std::string& url) {
  loop_.Post([this, name, url] {
    Record(SidecarStarted{name, url});
    spdlog::info("{} at {}", name, url);
    Notice(absl::StrCat(name, " at ", url));
  });
}

void Master::SidecarFailed(const std::string& name, const std::string& why) {
  loop_.Post([this, name, why] {
    Record(master::SidecarFailed{name, why});
    spdlog::warn("{}", why);
    Notice(why);
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
  uint64_t id = agents_.NextId();
  connection->Touch(options_.clock->Now());
  loop_.Post([this, id, connection = std::move(connection)] { agents_.Add(id, connection); });
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
    AgentSession* session = agents_.Find(session_id);
    if (session == nullptr) return;
    switch (message.kind_case()) {
      case v1::AgentMessage::kRegister:
        OnRegister(*session, message);
        break;
      case v1::AgentMessage::kStalled:
        OnTaskStalled(message);
        break;
      case v1::AgentMessage::kSdk:
        sdk_.OnRequest(session_id, message);
        break;
      case v1::AgentMessage::kTaskStarted:
        OnTaskStarted(message);
        break;
      case v1::AgentMessage::kTaskExited:
        OnTaskExited(message);
        break;
      case v1::AgentMessage::kLog:
        OnLogChunk(message.log(), session->node);
        break;
      case v1::AgentMessage::kLogs:
        for (const v1::LogChunk& chunk : message.logs().chunks()) OnLogChunk(chunk, session->node);
        break;
      case v1::AgentMessage::kResources:
        OnResourceSamples(message);
        break;
      case v1::AgentMessage::kLeaving:
        session->leaving = message.leaving();
        Record(AgentLeaving{session->node, session->leaving});
        break;
      case v1::AgentMessage::kNotice:
        Record(AgentNotice{session->node, message.notice()});
        // Agents on alike machines say the same thing (one agent per task on Slurm): a user
        // needs it once; the journal keeps every one.
        if (notices_shown_.insert(message.notice()).second) {
          spdlog::warn("agent {}: {}", session->node, message.notice());
          Notice(absl::StrCat(session->node, ": ", message.notice()));
        }
        break;
      default:
        break;
    }
  });
}

void Master::AgentDisconnected(uint64_t session_id) {
  loop_.Post([this, session_id] {
    if (agents_.Find(session_id) == nullptr) return;
    AgentSession gone = agents_.Remove(session_id);
    const std::string node = gone.node;
    if (node.empty() || IsTerminal(job_.phase)) return;
    Record(master::AgentDisconnected{node});
    auto lose = [this, node](const std::string& why) {
      if (IsTerminal(job_.phase) || agents_.ForNode(node) != nullptr) return;
      // Whatever is left of that agent must not keep running tasks nobody watches, unless the
      // backend already reported the place lost and is replacing it: then what it would
      // terminate is the replacement.
      if (replacing_nodes_.count(node) == 0) backend_->TerminatePlace(node);
      FailTasksOnNode(node, why);
    };
    std::string why = gone.leaving.empty()
                          ? absl::StrCat("lost: the agent on ", node, " disconnected")
                          : absl::StrCat("lost: the agent on ", node, " stopped: ", gone.leaving);
    if (!backend_->SignalsTasksFromOutside() || job_.phase == JobPhase::kStopping) {
      lose(why);
      return;
    }
    // The resource manager may stop agents itself (Slurm on scancel, sometimes before the
    // agent can say anything): the backend usually says why a moment later (a cancelled
    // allocation), which ends the job as cancelled rather than as a failure to handle. A place
    // the backend reports lost in the meantime is handled at once (OnPlaceLost).
    loop_.PostAfter(backend_->OutsideStopSettle(), [why, lose] { lose(why); });
  });
}

void Master::FillStatus(v1::JobStatus* status) { publisher_->FillStatus(status); }

std::shared_ptr<WatchQueue> Master::AddWatcher(bool logs, uint64_t log_offset,
                                               std::function<void()> on_ready) {
  auto queue = publisher_->NewWatcher(logs, log_offset, std::move(on_ready));
  // On the loop, so the first status and every later event arrive in order. Not waited for:
  // the caller is a gRPC reaction, which must not block on the loop.
  loop_.Post([this, queue] {
    publisher_->Attach(queue, IsTerminal(job_.phase) && finished_unix_ms_ != 0);
  });
  return queue;
}

bool Master::WaitForWatchers(std::chrono::milliseconds limit) {
  return publisher_->WaitForWatchers(limit);
}

// ---------------------------------------------------------------- the journal

void Master::Record(JournalRecord record) {
  JournalEntry entry{std::move(record), options_.clock->UnixMicros()};
  if (auto st = Apply(entry, job_, RecordSource::kLive, options_.clock->Now()); !st.ok()) {
    spdlog::error("journal record {} does not fit the job: {}", TypeOf(entry.record),
                  st.ToString());
  }
  journal_->Append(ToJson(entry));
  publisher_->StateChanged();
}

void Master::Transition(TaskRecord& task, TaskState to, const std::string& reason) {
  if (auto record = TransitionRecord(task, to, reason)) Record(std::move(*record));
}

void Master::SetPhase(JobPhase phase, const std::string& reason) {
  if (job_.phase == phase && job_.phase_reason == reason) return;
  Record(JobStateChanged{JobPhaseName(phase), reason});
}

void Master::Commit() {
  if (auto st = journal_->Sync(); !st.ok()) {
    spdlog::error("the events journal cannot be written: {}", st.ToString());
  }
  agents_.Flush();
}

void Master::AfterBatch() {
  Commit();
  publisher_->AfterBatch(IsTerminal(job_.phase), [this] {
    return BuildJobStatus(job_, {options_.spec.name, created_unix_ms_, finished_unix_ms_,
                                 static_cast<uint32_t>(plan_.tasks.size())});
  });
  TellAgentsWhatOutputIsCommitted();
}

void Master::Notice(const std::string& text) { publisher_->EmitNotice(text); }

uint64_t Master::PostAfter(std::chrono::milliseconds delay, std::function<void()> task) {
  return loop_.PostAfter(delay, std::move(task));
}

void Master::CancelTimer(uint64_t id) { loop_.CancelTimer(id); }

void Master::Reply(uint64_t session, uint64_t request_id, const nlohmann::json& reply) {
  AgentSession* s = agents_.Find(session);
  if (request_id == 0 || s == nullptr) return;
  v1::MasterMessage msg;
  msg.mutable_sdk_reply()->set_request_id(request_id);
  msg.mutable_sdk_reply()->set_json(reply.dump());
  agents_.Send(*s, msg);
}

bool Master::Ending() const { return job_.phase == JobPhase::kStopping || IsTerminal(job_.phase); }

}  // namespace shoal::master
