#pragma once

#include "shoal/v1/shoal.grpc.pb.h"

namespace shoal::master {

class Master;

// The gRPC face of a Master. Handlers run on gRPC's threads and only post to the master or read
// its snapshot. Every call must carry the job token. Only master.cc includes this header.
class MasterService final : public v1::Master::Service {
 public:
  explicit MasterService(Master* master) : master_(master) {}

  grpc::Status AgentSession(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::MasterMessage, v1::AgentMessage>* stream) override;
  grpc::Status GetStatus(grpc::ServerContext* context, const v1::GetStatusRequest* request,
                         v1::JobStatus* response) override;
  grpc::Status Watch(grpc::ServerContext* context, const v1::WatchRequest* request,
                     grpc::ServerWriter<v1::WatchEvent>* writer) override;
  grpc::Status Kill(grpc::ServerContext* context, const v1::KillRequest* request,
                    v1::KillReply* response) override;

 private:
  grpc::Status CheckAuth(grpc::ServerContext* context) const;
  Master* master_;  // outlives the service
};

}  // namespace shoal::master
