#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace shoal::serve {

class ModelManager;

struct GrpcServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8001;  // 0: any free port
  // Threads running ModelInfer calls (decode, check, queue for the model, wait, encode). A call
  // waiting for its model holds one; calls beyond this many wait for a thread, in order.
  int threads = 64;
  // Larger request messages are refused by gRPC with RESOURCE_EXHAUSTED before they are read.
  size_t max_message_bytes = 64 << 20;
  std::string server_version = "0.1.0";
  // Non-empty: every call must carry the metadata `authorization: Bearer <auth_token>` (else
  // UNAUTHENTICATED).
  std::string auth_token;
  // While set, ServerReady answers false (the server is about to stop). Null: never. Must
  // outlive the server.
  const std::atomic<bool>* draining = nullptr;
};

// KServe v2's inference.GRPCInferenceService (proto/inference/grpc_predict_v2.proto,
// docs/serving.md), on gRPC's callback API: health and metadata calls are answered on gRPC's
// own threads, ModelInfer calls on a pool of `threads` threads of this server. Requests go to
// the same ModelManager as REST's, so both share the models' batch queues.
class InferenceGrpcServer {
 public:
  // Binds `options.host:options.port` and starts serving. `models` must outlive the server.
  static absl::StatusOr<std::unique_ptr<InferenceGrpcServer>> Start(
      const GrpcServerOptions& options, const ModelManager* models);
  // Stops accepting calls, answers those already taken, joins the threads. Idempotent.
  void Stop();
  ~InferenceGrpcServer();

  uint16_t port() const { return port_; }

 private:
  struct Impl;
  InferenceGrpcServer() = default;
  std::unique_ptr<Impl> impl_;
  uint16_t port_ = 0;
};

}  // namespace shoal::serve
