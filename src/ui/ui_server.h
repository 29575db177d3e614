#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shoal::ui {

struct UiServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8470;  // 0: any free port
  std::string jobs_root;
  // Non-empty: every caller must present it (Authorization: Bearer, or the login form's
  // cookie). Required when `host` is not a loopback address.
  std::string token;
  std::vector<std::string> serve_urls;  // shoal serve instances for the models page
  std::string shoal_binary;             // for "run again" and TensorBoard
  std::function<int64_t()> now_unix_ms;  // the clock; default: the system's
  int max_connections = 128;
};

// `shoal ui`'s HTTP server (docs/design/0014-web-ui.md): the embedded single-page app, the JSON
// API over the jobs directory, log following by server-sent events, /metrics. A thread per
// connection: a dashboard has few callers, and a follower is a long-lived connection anyway.
class UiServer {
 public:
  // InvalidArgument when a non-loopback host has no token; the bind's error otherwise.
  static absl::StatusOr<std::unique_ptr<UiServer>> Start(UiServerOptions options);
  // Stops accepting, ends followers, joins every connection. Idempotent.
  void Stop();
  ~UiServer();

  uint16_t port() const;

 private:
  struct Impl;
  explicit UiServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace shoal::ui
