#include "master/master_service.h"

#include <deque>
#include <mutex>

#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "master/control_plane.h"
#include "master/watch_queue.h"
#include "spdlog/spdlog.h"

namespace shoal::master {

// One call of any method. Its tags point back at it; the service's thread hands each completed
// operation to OnEvent.
class AsyncCall {
 public:
  explicit AsyncCall(MasterService* service) : service_(service) { service_->Track(this); }
  virtual ~AsyncCall() { service_->Untrack(this); }
  virtual void OnEvent(int op, bool ok) = 0;

  struct Tag {
    AsyncCall* call;
    int op;
  };

 protected:
  MasterService* service_;
};

namespace {

constexpr char kUnauthenticated[] =
    "missing or wrong job token (see the job directory's token file)";

enum Op : int { kAccept, kRead, kWrite, kFinish };

// Starts one operation on the call's stream unless the service is stopping; counts it in
// `outstanding` first, since it may complete on the service's thread at once.
template <typename StartFn>
bool StartOp(MasterService* service, int* outstanding, StartFn start) {
  std::shared_lock<std::shared_mutex> lock(service->start_mu());
  if (service->stopping()) return false;
  ++*outstanding;
  start();
  return true;
}

// A pointer to a call that others (the master's loop) keep past the call's life: each use runs
// under its lock, and the call detaches it before it is deleted.
template <typename Call>
class CallHandle {
 public:
  explicit CallHandle(Call* call) : call_(call) {}
  // Runs fn(Call&) if the call is still there.
  template <typename Fn>
  void With(Fn fn) {
    std::lock_guard<std::mutex> lock(mu_);
    if (call_ != nullptr) fn(*call_);
  }
  void Detach() {
    std::lock_guard<std::mutex> lock(mu_);
    call_ = nullptr;
  }

 private:
  std::mutex mu_;
  Call* call_;
};

class AgentSessionCall;

// What the master holds for one agent's stream.
class StreamConnection final : public AgentConnection {
 public:
  explicit StreamConnection(AgentSessionCall* call) : call_(call) {}
  bool Send(const v1::MasterMessage& message) override;
  void Close() override;
  void Detach() { call_.Detach(); }

 private:
  CallHandle<AgentSessionCall> call_;
};

// One agent's bidirectional stream: reads are handled as they come; writes queue up so that
// the master's loop never blocks on an agent, one in flight at a time.
class AgentSessionCall final : public AsyncCall {
 public:
  explicit AgentSessionCall(MasterService* service) : AsyncCall(service), stream_(&context_) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!StartOp(service_, &outstanding_, [this] {
          service_->service()->RequestAgentSession(&context_, &stream_, service_->queue(),
                                                   service_->queue(), &accept_tag_);
        })) {
      ended_ = true;  // deleted by Stop
    }
  }

  void OnEvent(int op, bool ok) override {
    switch (op) {
      case kAccept:
        OnAccept(ok);
        break;
      case kRead:
        OnRead(ok);
        break;
      case kWrite:
        OnWrite(ok);
        break;
      default:
        break;
    }
    bool done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      --outstanding_;
      if (op == kFinish) ended_ = true;
      done = ended_ && outstanding_ == 0;
    }
    if (done) delete this;
  }

  ~AgentSessionCall() override {
    if (connection_) connection_->Detach();
  }

  bool Send(const v1::MasterMessage& message) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finishing_ || ended_) return false;
    out_.push_back(message);
    if (!writing_) StartWrite();
    return true;
  }

  void Cancel() { context_.TryCancel(); }

 private:
  void OnAccept(bool ok) {
    if (!ok) {  // the server is shutting down: no call came
      std::lock_guard<std::mutex> lock(mu_);
      ended_ = true;
      return;
    }
    new AgentSessionCall(service_);  // ready for the next agent
    if (!service_->Authorized(&context_)) {
      std::lock_guard<std::mutex> lock(mu_);
      StartFinish(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, kUnauthenticated));
      return;
    }
    connection_ = std::make_shared<StreamConnection>(this);
    session_ = service_->master()->AgentConnected(connection_);
    std::lock_guard<std::mutex> lock(mu_);
    StartRead();
  }

  void OnRead(bool ok) {
    if (ok) {
      service_->master()->AgentMessageReceived(connection_.get(), session_, in_);
      std::lock_guard<std::mutex> lock(mu_);
      StartRead();
      return;
    }
    service_->master()->AgentDisconnected(session_);
    std::lock_guard<std::mutex> lock(mu_);
    read_ended_ = true;
    if (!writing_) StartFinish(grpc::Status::OK);
  }

  void OnWrite(bool ok) {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    out_.pop_front();
    if (!ok) {
      // The stream is broken: end the read side too; its failed read finishes the call.
      out_.clear();
      finishing_ = true;
      context_.TryCancel();
    }
    if (!out_.empty()) return StartWrite();
    if (read_ended_) StartFinish(grpc::Status::OK);
  }

  // mu_ held for these three.
  void StartRead() {
    if (!StartOp(service_, &outstanding_, [this] { stream_.Read(&in_, &read_tag_); })) {
      ended_ = true;
    }
  }
  void StartWrite() {
    writing_ = StartOp(service_, &outstanding_,
                       [this] { stream_.Write(out_.front(), &write_tag_); });
    if (!writing_) ended_ = true;
  }
  void StartFinish(grpc::Status status) {
    if (finish_started_) return;
    finishing_ = true;
    finish_started_ = true;
    if (!StartOp(service_, &outstanding_, [&] { stream_.Finish(status, &finish_tag_); })) {
      ended_ = true;
    }
  }

  grpc::ServerContext context_;
  grpc::ServerAsyncReaderWriter<v1::MasterMessage, v1::AgentMessage> stream_;
  Tag accept_tag_{this, kAccept};
  Tag read_tag_{this, kRead};
  Tag write_tag_{this, kWrite};
  Tag finish_tag_{this, kFinish};
  std::shared_ptr<StreamConnection> connection_;
  uint64_t session_ = 0;
  v1::AgentMessage in_;  // written by the read in flight

  std::mutex mu_;
  int outstanding_ = 0;
  std::deque<v1::MasterMessage> out_;
  bool writing_ = false;
  bool read_ended_ = false;
  bool finishing_ = false;     // no more writes
  bool finish_started_ = false;
  bool ended_ = false;         // finished, or never started: deleted once nothing is in flight
};

bool StreamConnection::Send(const v1::MasterMessage& message) {
  bool sent = false;
  call_.With([&](AgentSessionCall& call) { sent = call.Send(message); });
  return sent;
}

void StreamConnection::Close() {
  call_.With([](AgentSessionCall& call) { call.Cancel(); });
}

// One `shoal run` / `shoal logs --follow` stream: a write starts whenever events are queued and
// none is in flight, so a client costs no thread while it waits.
class WatchCall final : public AsyncCall {
 public:
  explicit WatchCall(MasterService* service) : AsyncCall(service), writer_(&context_) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!StartOp(service_, &outstanding_, [this] {
          service_->service()->RequestWatch(&context_, &request_, &writer_, service_->queue(),
                                            service_->queue(), &accept_tag_);
        })) {
      ended_ = true;
    }
  }

  ~WatchCall() override {
    if (notifier_) notifier_->Detach();
  }

  void OnEvent(int op, bool ok) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      switch (op) {
        case kAccept:
          OnAccept(ok);
          break;
        case kWrite:
          writing_ = false;
          if (!ok) {
            StartFinish(grpc::Status::OK);  // the client is gone
          } else {
            WriteNext();
          }
          break;
        case kFinish:
          ended_ = true;
          break;
        default:
          break;
      }
      --outstanding_;
      if (!ended_ || outstanding_ != 0) return;
    }
    delete this;
  }

 private:
  // Under mu_: the next queued event or read of output, or the end.
  void WriteNext() {
    if (writing_ || finish_started_ || ended_) return;
    std::string bytes;
    uint64_t offset = 0;
    bool more = false;
    switch (queue_->TryPop(&bytes, &offset, &more)) {
      case WatchQueue::Next::kEmpty:
        return;
      case WatchQueue::Next::kEnded:
        return StartFinish(grpc::Status::OK);
      case WatchQueue::Next::kEvent:
        event_.ParseFromString(bytes);
        break;
      case WatchQueue::Next::kOutput:
        event_.Clear();
        event_.mutable_log()->set_data(std::move(bytes));
        event_.set_log_offset(offset);
        break;
      case WatchQueue::Next::kOutputFailed:
        spdlog::error("a watcher's output stops at byte {}: {}", offset, bytes);
        event_.Clear();
        event_.set_notice(absl::StrCat("output stops here (byte ", offset, " of logs.txt): ",
                                       bytes, "; the task logs are in tasks/ of the job"));
        break;
    }
    // No buffer hint, though more may be ready: a hinted write's completion can wait for the
    // next write, and the next one starts only on that completion. Output goes in reads of up
    // to 256 KiB, so there is little to coalesce anyway.
    (void)more;
    writing_ = StartOp(service_, &outstanding_, [&] { writer_.Write(event_, &write_tag_); });
    if (!writing_) ended_ = true;
  }

  // Under mu_.
  void OnAccept(bool ok) {
    if (!ok) {
      ended_ = true;
      return;
    }
    new WatchCall(service_);
    if (!service_->Authorized(&context_)) {
      return StartFinish(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, kUnauthenticated));
    }
    notifier_ = std::make_shared<CallHandle<WatchCall>>(this);
    // The loop pushes the first status (and notifies) later, never inside AddWatcher.
    queue_ = service_->master()->AddWatcher(request_.logs(), request_.log_offset(),
                                            [notifier = notifier_] {
      notifier->With([](WatchCall& call) {
        std::lock_guard<std::mutex> lock(call.mu_);
        call.WriteNext();
      });
    });
  }

  void StartFinish(grpc::Status status) {
    if (finish_started_) return;
    finish_started_ = true;
    if (!StartOp(service_, &outstanding_, [&] { writer_.Finish(status, &finish_tag_); })) {
      ended_ = true;
    }
  }

  grpc::ServerContext context_;
  v1::WatchRequest request_;
  grpc::ServerAsyncWriter<v1::WatchEvent> writer_;
  Tag accept_tag_{this, kAccept};
  Tag write_tag_{this, kWrite};
  Tag finish_tag_{this, kFinish};
  std::shared_ptr<CallHandle<WatchCall>> notifier_;  // what the watcher's queue calls
  std::shared_ptr<WatchQueue> queue_;
  v1::WatchEvent event_;  // the one being written

  std::mutex mu_;
  int outstanding_ = 0;
  bool writing_ = false;
  bool finish_started_ = false;
  bool ended_ = false;
};

// A unary method: one request, one reply, answered at once on the service's thread.
template <typename Request, typename Reply>
class UnaryCall final : public AsyncCall {
 public:
  using RequestMethod = void (v1::Master::AsyncService::*)(
      grpc::ServerContext*, Request*, grpc::ServerAsyncResponseWriter<Reply>*,
      grpc::CompletionQueue*, grpc::ServerCompletionQueue*, void*);
  using Handler = grpc::Status (*)(ControlPlane*, const Request&, Reply*);

  UnaryCall(MasterService* service, RequestMethod request_method, Handler handler)
      : AsyncCall(service), request_method_(request_method), handler_(handler),
        responder_(&context_) {
    // Refused only when stopping: then Stop deletes it.
    StartOp(service_, &outstanding_, [this] {
      (service_->service()->*request_method_)(&context_, &request_, &responder_,
                                              service_->queue(), service_->queue(),
                                              &accept_tag_);
    });
  }

  void OnEvent(int op, bool ok) override {
    --outstanding_;
    if (op == kAccept && ok) {
      new UnaryCall(service_, request_method_, handler_);
      grpc::Status status =
          service_->Authorized(&context_)
              ? handler_(service_->master(), request_, &reply_)
              : grpc::Status(grpc::StatusCode::UNAUTHENTICATED, kUnauthenticated);
      if (StartOp(service_, &outstanding_,
                  [&] { responder_.Finish(reply_, status, &finish_tag_); })) {
        return;
      }
    }
    delete this;  // refused (shutting down), or answered
  }

 private:
  RequestMethod request_method_;
  Handler handler_;
  grpc::ServerContext context_;
  Request request_;
  Reply reply_;
  grpc::ServerAsyncResponseWriter<Reply> responder_;
  Tag accept_tag_{this, kAccept};
  Tag finish_tag_{this, kFinish};
  int outstanding_ = 0;  // only the service's thread touches a unary call
};

grpc::Status HandleGetStatus(ControlPlane* master, const v1::GetStatusRequest&, v1::JobStatus* status) {
  master->FillStatus(status);
  return grpc::Status::OK;
}

grpc::Status HandleKill(ControlPlane* master, const v1::KillRequest& request, v1::KillReply*) {
  master->Kill(request.reason().empty() ? "killed by the user" : request.reason());
  return grpc::Status::OK;
}

}  // namespace

MasterService::~MasterService() { Stop(); }

void MasterService::Register(grpc::ServerBuilder* builder) {
  builder->RegisterService(&service_);
  queue_ = builder->AddCompletionQueue();
}

void MasterService::Start() {
  new AgentSessionCall(this);
  new WatchCall(this);
  new UnaryCall<v1::GetStatusRequest, v1::JobStatus>(
      this, &v1::Master::AsyncService::RequestGetStatus, &HandleGetStatus);
  new UnaryCall<v1::KillRequest, v1::KillReply>(this, &v1::Master::AsyncService::RequestKill,
                                                &HandleKill);
  thread_ = std::thread([this] { Serve(); });
}

void MasterService::Serve() {
  void* tag = nullptr;
  bool ok = false;
  while (queue_->Next(&tag, &ok)) {
    auto* t = static_cast<AsyncCall::Tag*>(tag);
    t->call->OnEvent(t->op, ok);
  }
}

void MasterService::Stop() {
  if (stopped_ || !queue_) return;
  stopped_ = true;
  {
    std::unique_lock<std::shared_mutex> lock(start_mu_);
    stopping_ = true;
  }
  queue_->Shutdown();
  if (thread_.joinable()) {
    thread_.join();
  } else {
    Serve();  // a queue is drained before it is destroyed
  }
  std::set<AsyncCall*> left;
  {
    std::lock_guard<std::mutex> lock(live_mu_);
    left.swap(live_);
  }
  // Their destructors untrack them from the emptied set.
  for (AsyncCall* call : left) delete call;
}

void MasterService::Track(AsyncCall* call) {
  std::lock_guard<std::mutex> lock(live_mu_);
  live_.insert(call);
}

void MasterService::Untrack(AsyncCall* call) {
  std::lock_guard<std::mutex> lock(live_mu_);
  live_.erase(call);
}

bool MasterService::Authorized(const grpc::ServerContextBase* context) const {
  const auto& md = context->client_metadata();
  auto it = md.find("authorization");
  std::string header = it == md.end() ? "" : std::string(it->second.data(), it->second.size());
  return master_->Authorized(header);
}

}  // namespace shoal::master
