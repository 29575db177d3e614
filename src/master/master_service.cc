#include "master/master_service.h"

#include <mutex>

#include "master/master.h"
#include "master/watch_queue.h"

namespace shoal::master {
namespace {

// One agent's stream as the master sees it. Writes are serialized; after the handler returns
// the stream is gone, so `closed_` guards every use.
class GrpcAgentConnection final : public AgentConnection {
 public:
  GrpcAgentConnection(grpc::ServerContext* context,
                      grpc::ServerReaderWriter<v1::MasterMessage, v1::AgentMessage>* stream)
      : context_(context), stream_(stream) {}

  bool Send(const v1::MasterMessage& message) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return false;
    return stream_->Write(message);
  }
  void Close() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_) context_->TryCancel();
  }
  void Detach() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }

 private:
  std::mutex mu_;
  bool closed_ = false;
  grpc::ServerContext* context_;
  grpc::ServerReaderWriter<v1::MasterMessage, v1::AgentMessage>* stream_;
};

}  // namespace

grpc::Status MasterService::CheckAuth(grpc::ServerContext* context) const {
  const auto& md = context->client_metadata();
  auto it = md.find("authorization");
  std::string header = it == md.end() ? "" : std::string(it->second.data(), it->second.size());
  if (!master_->Authorized(header)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing or wrong job token (see the job directory's token file)");
  }
  return grpc::Status::OK;
}

grpc::Status MasterService::AgentSession(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::MasterMessage, v1::AgentMessage>* stream) {
  if (auto st = CheckAuth(context); !st.ok()) return st;
  auto connection = std::make_shared<GrpcAgentConnection>(context, stream);
  uint64_t session = master_->AgentConnected(connection);
  v1::AgentMessage message;
  while (stream->Read(&message)) master_->AgentMessageReceived(session, message);
  connection->Detach();
  master_->AgentDisconnected(session);
  return grpc::Status::OK;
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
