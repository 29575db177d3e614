#pragma once

// `shoal serve`: what the CLI needs and nothing more (no libtorch, gRPC or Boost here).

#include <cstddef>
#include <cstdint>
#include <string>

namespace shoal::serve {

struct ServeOptions {
  std::string model_repository;  // required: DIR/<model>/<version>/model.pt, or hdfs://nn/path
  // Where an hdfs:// repository is copied to be served (HdfsRepositoryMirror); "": a fresh
  // temporary directory, removed at exit.
  std::string repository_cache_dir;
  std::string host = "127.0.0.1";
  uint16_t http_port = 8000;  // 0: a free port, printed
  // HTTP event-loop threads; 0: one per CPU the server may use (its affinity mask). No request
  // holds one while its model works.
  int http_threads = 0;
  size_t max_request_bytes = 64 << 20;  // larger bodies get 413, larger gRPC messages
                                        // RESOURCE_EXHAUSTED
  uint16_t grpc_port = 8001;  // on `host`; 0: a free port, printed
  // Threads running gRPC ModelInfer calls (each call waiting for its model holds one).
  int grpc_threads = 64;
  // A file holding the token callers must send (Authorization: Bearer <token>); required when
  // `host` is not a loopback address. Empty: SHOAL_SERVE_TOKEN_FILE, else no token.
  std::string token_file;
  // How often the repository is rescanned for new, changed or removed versions and models;
  // 0: never (the load/unload endpoints still work). docs/serving.md, "Repository watching".
  int64_t repository_poll_ms = 1000;
  // How long a version directory's files must stay unchanged before the watcher loads it.
  int64_t repository_settle_ms = 2000;
  // On SIGTERM: how long the server keeps answering while /v2/health/ready says 503, so that
  // load balancers (a Kubernetes Service's endpoints) stop sending to it before it stops
  // accepting. 0: stop at once. SIGINT never drains. docs/serving.md, "Running on Kubernetes".
  int drain_seconds = 5;
  // After the listeners close: how long the requests in flight may take to be answered before
  // the server exits without them.
  int finish_seconds = 20;
};

// Serves the repository's models over REST and gRPC until SIGINT or SIGTERM (SIGTERM drains
// first: drain_seconds above; a second signal exits at once, with 1). Prints
//   shoal serve: listening on http://HOST:PORT
//   shoal serve: listening on grpc://HOST:PORT
// on stdout once both ports are bound (models load after that; /v2/health/ready says when they
// are), and what happens to each model on stderr. Returns the process exit code: 0 after a
// signal, 2 when the repository is missing or unreadable (an hdfs:// one malformed or its
// NameNode unreachable) or a non-loopback --host comes without a token, 1 when the server
// cannot start
// (port taken, TorchScript runtime missing).
int RunServer(const ServeOptions& options);

}  // namespace shoal::serve
