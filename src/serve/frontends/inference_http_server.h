#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace shoal::serve {

class ModelManager;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;  // 0: any free port
  // Event-loop threads, each serving its share of the connections; one per core the server
  // may use is enough, since no request holds a thread while its model works.
  int threads = 1;
  // Threads for the requests that must wait (an ensemble's members in turn, loading and
  // unloading models); they also bound how many ensemble requests run at once.
  int blocking_threads = 16;
  // Bodies larger than this are refused with 413 before they are read.
  size_t max_body_bytes = 64 << 20;
  std::string server_version = "0.1.0";
  std::string backend_description;  // shown in server metadata
  // Non-empty: every request must carry `Authorization: Bearer <auth_token>` (else 401).
  std::string auth_token;
  // Set while the server drains before it stops (SIGTERM, docs/serving.md "Running on
  // Kubernetes"): /v2/health/ready answers 503 and every reply closes its connection, so that
  // a client reconnects through its load balancer, which no longer sends it here. Null: never.
  // Must outlive the server.
  const std::atomic<bool>* draining = nullptr;
};

// The KServe v2 REST endpoints (inference_http_routes.h, docs/serving.md) over HTTP/1.1 with
// keep-alive, on event loops of its own (Boost.Beast over Asio) from Start() until Stop() or
// destruction.
class InferenceHttpServer {
 public:
  // Binds `options.host:options.port` and starts serving. `models` must outlive the server.
  static absl::StatusOr<std::unique_ptr<InferenceHttpServer>> Start(
      const HttpServerOptions& options, ModelManager* models);
  // Stops accepting, finishes the requests being answered, joins. Idempotent.
  void Stop();
  ~InferenceHttpServer();

  uint16_t port() const { return port_; }

 private:
  struct Impl;
  InferenceHttpServer() = default;
  std::unique_ptr<Impl> impl_;
  uint16_t port_ = 0;
};

}  // namespace shoal::serve
