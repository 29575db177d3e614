#pragma once

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shoal::serve {

class ModelManager;
class WorkerPool;

// One HTTP request as the routes see it, whatever parsed it.
struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // percent-decoded, without the query
  std::string body;
  // The binary tensor extension's header, when the request has one.
  std::optional<std::string> inference_header_content_length;
};

struct HttpReply {
  int status = 200;
  // Always one of the routes' literals: a std::string of these would be allocated per reply.
  std::string_view content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

// Called exactly once per request, on any thread, with what makes its reply; the front end
// runs it on its own thread, so that encoding a response never holds up a model's instance
// thread. (An inference's reply usually comes on the front end's thread already: its event
// loops are the CompletionHome of the requests they submit, completion_home.h.)
using HttpReplyFn = std::function<void(std::function<HttpReply()> make_reply)>;

// The KServe v2 REST endpoints and Triton's repository extension (docs/serving.md), apart
// from the transport: the front end (inference_http_server.cc) parses HTTP and hands each
// request to Handle. Quick requests are answered before Handle returns; an inference is
// answered from the model's instance thread once its batch ran, so that no thread waits for a
// model; what blocks (an ensemble's members one after the other, loading and unloading models)
// runs on `blocking`.
class InferenceRoutes {
 public:
  struct Options {
    std::string server_version;
    std::string backend_description;
    // While set, /v2/health/ready answers 503 (the server is about to stop). Null: never.
    const std::atomic<bool>* draining = nullptr;
  };
  // `models` and `blocking` must outlive the routes and every reply they owe.
  InferenceRoutes(Options options, ModelManager* models, WorkerPool* blocking)
      : options_(std::move(options)), models_(models), blocking_(blocking) {}

  // Answers `request` through `reply`. Moves from `request` only what it keeps beyond the
  // call; the front end may reuse what is left, strings with their room, for its next request.
  void Handle(HttpRequest& request, HttpReplyFn reply) const;

  // {"error": message} with `status`.
  static HttpReply Error(int status, std::string_view message);

 private:
  Options options_;
  ModelManager* models_;
  WorkerPool* blocking_;
};

}  // namespace shoal::serve
