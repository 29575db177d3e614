#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "backends/kubernetes/kube_config.h"
#include "nlohmann/json.hpp"

namespace shoal::backends {

struct KubeClientOptions {
  // For the TCP connection and the TLS handshake. Default: 5 s.
  std::chrono::milliseconds connect_timeout{5000};
  // For one whole request and its reply (not for Watch and StreamGet). Default: 30 s.
  std::chrono::milliseconds request_timeout{30000};
  // The timeoutSeconds a watch asks of the server, which then ends the stream cleanly; the
  // caller watches again from the resourceVersion returned. Default: 5 min.
  std::chrono::seconds watch_timeout{300};
};

// The status code of "the resourceVersion asked for is older than the server keeps" (HTTP 410
// Gone, or a watch's ERROR event with code 410): the caller must list again and watch from the
// list's resourceVersion. No other answer of the API server maps to it.
inline constexpr absl::StatusCode kResourceVersionTooOld = absl::StatusCode::kOutOfRange;
inline bool IsResourceVersionTooOld(const absl::Status& status) {
  return status.code() == kResourceVersionTooOld;
}

// How Patch's body is to be read (the request's Content-Type).
enum class PatchType {
  kMerge,           // application/merge-patch+json (RFC 7386)
  kStrategicMerge,  // application/strategic-merge-patch+json (built-in kinds only)
  kJson,            // application/json-patch+json (RFC 6902, a list of operations)
};

// A client of one Kubernetes API server, over HTTPS with libcurl. `path` is the API path with
// its query, already escaped: "/api/v1/namespaces/ns/configmaps?labelSelector=app%3Dx".
//
// Thread-safe: any number of threads may call it at once; each call blocks its thread (never
// call it from an event loop). A call reuses the connection of an earlier call that has ended
// (up to kMaxIdleConnections are kept), else opens its own.
//
// Errors (every message holds the method, the path and the API server's own Status message,
// e.g. `POST /api/v1/namespaces/z/pods: HTTP 403: pods "x" is forbidden: User "y" cannot
// create resource "pods" in API group "" in the namespace "z"`):
//   400, 422  InvalidArgument       the object or the request is wrong
//   401       Unauthenticated       the credentials are refused (names the config's source)
//   403       PermissionDenied      RBAC forbids it
//   404       NotFound
//   409       AlreadyExists         (Create of an existing name; Status reason AlreadyExists)
//             Aborted               (any other conflict: a stale resourceVersion on update)
//   410       kResourceVersionTooOld
//   429, 5xx  Unavailable           overloaded or failing; retry later
//   connection, TLS or timeout      Unavailable (names the server and the config's source)
//   other                           Unknown
// No message holds the token or the key and certificate material.
class KubeClient {
 public:
  using WatchEventHandler =
      std::function<void(absl::string_view type, const nlohmann::json& object)>;
  using StopRequested = std::function<bool()>;

  // InvalidArgument when `config.server` is not an http(s) URL.
  static absl::StatusOr<std::unique_ptr<KubeClient>> Create(KubeConfig config,
                                                            KubeClientOptions options = {});

  // How many finished requests' curl handles, with their open connections, are kept for reuse.
  static constexpr size_t kMaxIdleConnections = 16;

  ~KubeClient();
  KubeClient(const KubeClient&) = delete;
  KubeClient& operator=(const KubeClient&) = delete;

  // GET: one object, or a list (…List with `items` and metadata.resourceVersion). A reply that
  // is not JSON (a pod's log, /readyz) comes back as a JSON string.
  absl::StatusOr<nlohmann::json> Get(absl::string_view path);
  // POST `object` to a collection; the object as created.
  absl::StatusOr<nlohmann::json> Create(absl::string_view path, const nlohmann::json& object);
  // PUT: replaces the whole object; Aborted when its metadata.resourceVersion is stale.
  absl::StatusOr<nlohmann::json> Replace(absl::string_view path, const nlohmann::json& object);
  absl::StatusOr<nlohmann::json> Patch(absl::string_view path, const nlohmann::json& patch,
                                       PatchType type = PatchType::kMerge);
  // DELETE, with DeleteOptions as the body when given ({"propagationPolicy": "Foreground"}).
  // The reply is the object being deleted or a Status.
  absl::StatusOr<nlohmann::json> Delete(absl::string_view path,
                                        const std::optional<nlohmann::json>& options = {});

  // Watches `path` (a collection, with any labelSelector/fieldSelector in its query) from
  // `resource_version` (empty: from now, after an ADDED event per existing object). Calls
  // on_event(type, object) on this thread for each ADDED, MODIFIED or DELETED event as it
  // arrives, in the server's order; BOOKMARK events only advance the resourceVersion. Returns
  // the last resourceVersion seen (or `resource_version` when none), to watch again from,
  // when:
  //   - the server ends the stream (after options.watch_timeout), or the connection drops
  //     once the stream had begun: both are a normal end, watch again;
  //   - should_stop() returns true (it is asked at least every 200 ms, and before each event).
  // Errors: kResourceVersionTooOld (HTTP 410 or an ERROR event with code 410: list again),
  // any other ERROR event or refusal mapped as above, Unavailable when no stream began.
  // REQUIRES: on_event and should_stop do not call back into this Watch.
  absl::StatusOr<std::string> Watch(absl::string_view path, absl::string_view resource_version,
                                    const WatchEventHandler& on_event,
                                    const StopRequested& should_stop);

  // A streaming GET (a pod's log with follow=true): on_data gets the body's bytes as they
  // arrive, on this thread. Ends OK when the server ends the body, the connection drops once
  // the body had begun, or should_stop() returns true (asked at least every 200 ms); errors as
  // above. No request timeout applies, only the connect timeout.
  absl::Status StreamGet(absl::string_view path,
                         const std::function<void(absl::string_view)>& on_data,
                         const StopRequested& should_stop);

  // How many HTTP requests this client has sent (every call above counts one, a watch too).
  int64_t requests() const { return requests_.load(std::memory_order_relaxed); }

  const KubeConfig& config() const { return config_; }

 private:
  KubeClient(KubeConfig config, KubeClientOptions options)
      : config_(std::move(config)), options_(options) {}

  struct Request;
  // A request ready to perform, counted in requests(); `body` may be null.
  absl::StatusOr<std::unique_ptr<Request>> Prepare(absl::string_view method, absl::string_view path,
                                                   const std::string* body,
                                                   absl::string_view content_type);
  absl::StatusOr<nlohmann::json> Send(absl::string_view method, absl::string_view path,
                                      const std::string* body, absl::string_view content_type);
  // A GET whose body goes to on_data as it arrives, until on_data returns false, should_stop()
  // returns true, the body ends or `total_timeout` (zero: none) passes.
  absl::Status Stream(absl::string_view path, const std::function<bool(absl::string_view)>& on_data,
                      const StopRequested& should_stop, std::chrono::milliseconds total_timeout);

  const KubeConfig config_;
  const KubeClientOptions options_;
  std::atomic<int64_t> requests_{0};
  // curl easy handles (CURL*) of ended requests, each holding its live connection; a request
  // takes one (reset to no options) instead of opening a new connection and TLS session.
  absl::Mutex idle_mutex_;
  std::vector<void*> idle_handles_ ABSL_GUARDED_BY(idle_mutex_);
};

}  // namespace shoal::backends
