#pragma once

#include "shoal/v1/shoal.grpc.pb.h"

namespace shoal::master {

class Master;

// The gRPC face of a Master. Handlers run on gRPC's threads and only post to the master or read
// its snapshot. Every call must carry the job token. Only master.cc includes this header.
// Agent sessions use the callback API: thousands of agents cost no thread each, and the master
// never blocks on a slow agent (writes are queued per session).
class MasterService final : public v1::Master::WithCallbackMethod_AgentSession<v1::Master::Service> {
 public:
  explicit MasterService(Master* master) : master_(master) {}

  grpc::ServerBidiReactor<v1::AgentMessage, v1::MasterMessage>* AgentSession(
      grpc::CallbackServerContext* context) override;
  grpc::Status GetStatus(grpc::ServerContext* context, const v1::GetStatusRequest* request,
                         v1::JobStatus* response) override;
  grpc::Status Watch(grpc::ServerContext* context, const v1::WatchRequest* request,
                     grpc::ServerWriter<v1::WatchEvent>* writer) override;
  grpc::Status Kill(grpc::ServerContext* context, const v1::KillRequest* request,
                    v1::KillReply* response) override;

 private:
  bool Authorized(const grpc::ServerContextBase* context) const;
  grpc::Status CheckAuth(grpc::ServerContext* context) const;
  Master* master_;  // outlives the service
};

}  // namespace shoal::master
