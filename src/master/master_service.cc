#include "master/master_service.h"

#include <deque>
#include <mutex>

#include "master/master.h"
#include "master/watch_queue.h"

namespace shoal::master {
namespace {

// One agent's stream. gRPC owns the reactor and deletes it after OnDone; the master holds the
// AgentConnection, which forwards to the reactor until it is done. Writes queue up so that the
// master's loop never blocks on an agent.
class AgentSessionReactor;

class ReactorConnection final : public AgentConnection {
 public:
  explicit ReactorConnection(AgentSessionReactor* reactor) : reactor_(reactor) {}
  bool Send(const v1::MasterMessage& message) override;
  void Close() override;
  void Detach() {
    std::lock_guard<std::mutex> lock(mu_);
    reactor_ = nullptr;
  }

 private:
  std::mutex mu_;  // held while calling into the reactor, so it cannot be deleted under us
  AgentSessionReactor* reactor_;
};

class AgentSessionReactor final
    : public grpc::ServerBidiReactor<v1::AgentMessage, v1::MasterMessage> {
 public:
  AgentSessionReactor(Master* master, grpc::CallbackServerContext* context, bool authorized)
      : master_(master), context_(context) {
    if (!authorized) {
      Finish(grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "missing or wrong job token (see the job directory's token file)"));
      return;
    }
    connection_ = std::make_shared<ReactorConnection>(this);
    session_ = master_->AgentConnected(connection_);
    StartRead(&in_);
  }

  bool Send(const v1::MasterMessage& message) {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (finishing_) return false;
    out_.push_back(message);
    if (!writing_) {
      writing_ = true;
      StartWrite(&out_.front());
    }
    return true;
  }

  void Cancel() { context_->TryCancel(); }

  void OnReadDone(bool ok) override {
    if (ok) {
      master_->AgentMessageReceived(connection_.get(), session_, in_);
      StartRead(&in_);
      return;
    }
    master_->AgentDisconnected(session_);
    std::lock_guard<std::recursive_mutex> lock(mu_);
    read_ended_ = true;
    finishing_ = true;
    if (!writing_) Finish(grpc::Status::OK);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    out_.pop_front();
    if (!ok) {
      // The stream is broken: end the read side too; OnReadDone(false) will follow.
      out_.clear();
      finishing_ = true;
      context_->TryCancel();
    }
    if (!out_.empty()) {
      StartWrite(&out_.front());
      return;
    }
    writing_ = false;
    if (read_ended_) Finish(grpc::Status::OK);
  }

  void OnDone() override {
    if (connection_) connection_->Detach();
    delete this;
  }

 private:
  Master* master_;
  grpc::CallbackServerContext* context_;
  std::shared_ptr<ReactorConnection> connection_;
  uint64_t session_ = 0;
  v1::AgentMessage in_;
  std::recursive_mutex mu_;  // a reaction may run inline inside StartWrite
  std::deque<v1::MasterMessage> out_;
  bool writing_ = false;
  bool finishing_ = false;
  bool read_ended_ = false;
};

bool ReactorConnection::Send(const v1::MasterMessage& message) {
  std::lock_guard<std::mutex> lock(mu_);
  return reactor_ != nullptr && reactor_->Send(message);
}

void ReactorConnection::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (reactor_ != nullptr) reactor_->Cancel();
}

}  // namespace

bool MasterService::Authorized(const grpc::ServerContextBase* context) const {
  const auto& md = context->client_metadata();
  auto it = md.find("authorization");
  std::string header = it == md.end() ? "" : std::string(it->second.data(), it->second.size());
  return master_->Authorized(header);
}

grpc::Status MasterService::CheckAuth(grpc::ServerContext* context) const {
  if (!Authorized(context)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing or wrong job token (see the job directory's token file)");
  }
  return grpc::Status::OK;
}

grpc::ServerBidiReactor<v1::AgentMessage, v1::MasterMessage>* MasterService::AgentSession(
    grpc::CallbackServerContext* context) {
  return new AgentSessionReactor(master_, context, Authorized(context));
}

grpc::Status MasterService::GetStatus(grpc::ServerContext* context, const v1::GetStatusRequest*,
                                      v1::JobStatus* response) {
  if (auto st = CheckAuth(context); !st.ok()) return st;
  master_->FillStatus(response);
  return grpc::Status::OK;
}

grpc::Status MasterService::Watch(grpc::ServerContext* context, const v1::WatchRequest* request,
                                  grpc::ServerWriter<v1::WatchEvent>* writer) {
  if (auto st = CheckAuth(context); !st.ok()) return st;
  auto queue = master_->AddWatcher(request->logs());
  std::vector<std::string> batch;
  v1::WatchEvent event;
  while (!context->IsCancelled()) {
    batch.clear();
    if (!queue->Pop(&batch, std::chrono::milliseconds(200))) break;
    for (const auto& bytes : batch) {
      event.ParseFromString(bytes);
      if (!writer->Write(event)) return grpc::Status::OK;
    }
  }
  return grpc::Status::OK;
}

grpc::Status MasterService::Kill(grpc::ServerContext* context, const v1::KillRequest* request,
                                 v1::KillReply*) {
  if (auto st = CheckAuth(context); !st.ok()) return st;
  master_->Kill(request->reason().empty() ? "killed by the user" : request->reason());
  return grpc::Status::OK;
}

}  // namespace shoal::master
