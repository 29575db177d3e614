#include "serve/frontends/inference_http_routes.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <string_view>

#include "absl/container/inlined_vector.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "nlohmann/json.hpp"
#include "serve/frontends/json_codec.h"
#include "serve/frontends/prometheus_text.h"
#include "serve/repository/model_manager.h"
#include "serve/repository/served_version.h"
#include "serve/scheduling/worker_pool.h"

namespace shoal::serve {
namespace {

// Ordered: metadata reads name first, as in the KServe v2 examples.
using json = nlohmann::ordered_json;

int HttpStatus(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument: return 400;
    case absl::StatusCode::kNotFound: return 404;
    case absl::StatusCode::kFailedPrecondition: return 409;
    case absl::StatusCode::kUnavailable: return 503;
    default: return 500;
  }
}

HttpReply ErrorReply(const absl::Status& status) {
  return InferenceRoutes::Error(HttpStatus(status), std::string(status.message()));
}

HttpReply JsonReply(const json& body, int status = 200) {
  HttpReply reply;
  reply.status = status;
  reply.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return reply;
}

void Send(const HttpReplyFn& reply, HttpReply ready) {
  reply([ready = std::move(ready)]() mutable { return std::move(ready); });
}

json TensorMetadata(const TensorSignature& tensor) {
  return {{"name", tensor.name},
          {"datatype", tensor.datatype ? std::string(DataTypeName(*tensor.datatype)) : ""},
          {"shape", tensor.shape.value_or(std::vector<int64_t>{})}};
}

json VersionStats(const ServedVersion& version) {
  const InferenceStats& s = version.stats();
  auto duration = [](uint64_t count, uint64_t ns) { return json{{"count", count}, {"ns", ns}}; };
  uint64_t success = s.success_count;
  return {{"name", version.model_name()},
          {"version", absl::StrCat(version.version())},
          {"last_inference", s.last_inference_ms.load()},
          {"inference_count", s.inference_count.load()},
          {"execution_count", s.execution_count.load()},
          {"inference_stats",
           {{"success", duration(success, s.success_ns)},
            {"fail", duration(s.failure_count, s.failure_ns)},
            {"queue", duration(success, s.queue_ns)},
            {"compute_infer", duration(s.execution_count, s.compute_ns)}}}};
}

// The body of a repository request: empty, or a JSON object with only the keys in `allowed`.
// The error names the endpoint.
absl::StatusOr<json> RepositoryRequestBody(const HttpRequest& req,
                                           std::initializer_list<std::string_view> allowed) {
  if (req.body.empty()) return json::object();
  json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(req.path, ": the body must be empty or a JSON object"));
  }
  for (const auto& [key, value] : body.items()) {
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      return absl::InvalidArgumentError(absl::StrCat(req.path, ": unknown key '", key, "'"));
    }
  }
  // Triton's parameters override the config or carry the model's files; shoal reads both
  // from the repository only.
  if (body.contains("parameters") &&
      !(body["parameters"].is_object() && body["parameters"].empty())) {
    return absl::InvalidArgumentError(absl::StrCat(
        req.path, ": parameters are not supported; shoal loads the config and files from the "
                  "repository directory"));
  }
  return body;
}

// What a /v2/models/{name}[/versions/{version}][/{action}] path names.
struct ModelPath {
  std::string name;
  std::optional<std::string> version;
  std::string action;  // "", "ready", "stats" or "infer"
};

std::optional<ModelPath> ParseModelPath(absl::Span<const std::string_view> segments) {
  // segments[0] == "v2", segments[1] == "models"
  if (segments.size() < 3) return std::nullopt;
  ModelPath path;
  path.name = std::string(segments[2]);
  size_t next = 3;
  if (segments.size() >= 5 && segments[3] == "versions") {
    path.version = std::string(segments[4]);
    next = 5;
  }
  if (next + 1 == segments.size()) {
    std::string_view action = segments[next];
    if (action != "ready" && action != "stats" && action != "infer") return std::nullopt;
    path.action = std::string(action);
  } else if (next != segments.size()) {
    return std::nullopt;
  }
  return path;
}

json RolloutEventJson(const RolloutEvent& event) {
  return {{"version", absl::StrCat(event.version)},
          {"decision", event.decision},
          {"reason", event.reason},
          {"unix_ms", event.unix_ms}};
}

// The "rollout" object of a model's metadata (docs/serving.md, "Canary rollout and rollback").
json RolloutJson(const RolloutView& view) {
  json rollout = {{"policy", view.has_policy ? "canary" : "none"},
                  {"serving", view.serving ? json(absl::StrCat(view.serving)) : json(nullptr)},
                  {"state", view.canary ? "canary" : "serving"}};
  if (view.canary) {
    const CanarySnapshot& f = *view.canary_figures;
    rollout["canary"] = {
        {"version", absl::StrCat(*view.canary)},
        {"share", view.canary_share},
        {"mirror", view.mirror},
        {"seconds", std::chrono::duration<double>(f.elapsed).count()},
        {"requests", f.canary_requests},
        {"errors", f.canary_errors},
        {"fallbacks", f.fallbacks},
        {"p99_ms", static_cast<double>(f.canary_p99_ns) / 1e6},
        {"current_requests", f.current_requests},
        {"current_errors", f.current_errors},
        {"current_p99_ms", static_cast<double>(f.current_p99_ns) / 1e6},
        {"drift_pairs", f.drift_pairs},
        {"mean_drift", f.mean_drift}};
  }
  rollout["pinned"] = view.pinned ? json(absl::StrCat(*view.pinned)) : json(nullptr);
  json rolled_back = json::object();
  for (const auto& [v, why] : view.rolled_back) rolled_back[absl::StrCat(v)] = why;
  rollout["rolled_back"] = rolled_back;
  rollout["last_decision"] = view.last ? RolloutEventJson(*view.last) : json(nullptr);
  return rollout;
}

HttpReply ModelMetadata(ModelManager* models, const ModelPath& path) {
  auto version = models->FindVersion(path.name, path.version);
  if (!version.ok()) return ErrorReply(version.status());
  auto model = models->FindModel(path.name);
  if (!model.ok()) return ErrorReply(model.status());
  json versions = json::array();
  for (const auto& v : model->versions) versions.push_back(absl::StrCat(v->version()));
  json inputs = json::array(), outputs = json::array();
  for (const auto& t : (*version)->inputs()) inputs.push_back(TensorMetadata(t));
  for (const auto& t : (*version)->outputs()) outputs.push_back(TensorMetadata(t));
  json metadata = {{"name", model->name},
                   {"versions", versions},
                   {"platform", (*version)->platform()},
                   {"inputs", inputs},
                   {"outputs", outputs},
                   {"parameters",
                    {{"version", absl::StrCat((*version)->version())},
                     {"max_batch_size", (*version)->max_batch_size()},
                     {"instances", (*version)->instances()},
                     {"threads_per_instance", (*version)->threads_per_instance()}}}};
  if (model->rollout) metadata["rollout"] = RolloutJson(*model->rollout);
  return JsonReply(metadata);
}

// KServe v2: 200 when ready, another status when not. A model or version that exists but does
// not serve (loading, refused, unloaded, not served by its version policy) is 400 with why;
// 404 is kept for what does not exist, so that a client can tell a typo from a failed load.
HttpReply ModelReady(ModelManager* models, const ModelPath& path) {
  absl::StatusOr<Readiness> readiness = models->CheckReadiness(path.name, path.version);
  if (!readiness.ok()) return ErrorReply(readiness.status());
  if (readiness->ready) return JsonReply({{"name", path.name}, {"ready", true}});
  return JsonReply({{"name", path.name}, {"ready", false}, {"error", readiness->why_not}}, 400);
}

HttpReply ModelStats(ModelManager* models, const ModelPath& path) {
  json stats = json::array();
  if (path.version) {
    auto version = models->FindVersion(path.name, path.version);
    if (!version.ok()) return ErrorReply(version.status());
    stats.push_back(VersionStats(**version));
  } else {
    auto model = models->FindModel(path.name);
    if (!model.ok()) return ErrorReply(model.status());
    for (const auto& v : model->versions) stats.push_back(VersionStats(*v));
  }
  return JsonReply({{"model_stats", stats}});
}

// Prometheus scrapes this: the figures of every version serving now, REST and gRPC requests
// alike (both run through ServedVersion).
HttpReply Metrics(ModelManager* models) {
  std::vector<VersionMetrics> metrics;
  for (const auto& version : models->ServingVersions()) {
    const InferenceStats& s = version->stats();
    VersionMetrics& m = metrics.emplace_back();
    m.model = version->model_name();
    m.version = version->version();
    m.success_count = s.success_count;
    m.failure_count = s.failure_count + s.invalid_count;
    m.inference_count = s.inference_count;
    m.execution_count = s.execution_count;
    m.queue_ns = s.queue_ns;
    m.compute_ns = s.compute_ns;
    m.in_flight = s.in_flight;
    for (const auto& bucket : s.latency_buckets) m.latency_buckets.push_back(bucket);
    m.latency_sum_ns = s.latency_sum_ns;
  }
  HttpReply reply;
  reply.content_type = "text/plain; version=0.0.4; charset=utf-8";
  reply.body = FormatPrometheusText(metrics);
  reply.body += FormatRolloutPrometheusText(models->RolloutMetricsNow());
  return reply;
}

HttpReply RepositoryIndex(ModelManager* models, const HttpRequest& req) {
  absl::StatusOr<json> body = RepositoryRequestBody(req, {"ready"});
  if (!body.ok()) return ErrorReply(body.status());
  bool only_ready = false;
  if (body->contains("ready")) {
    if (!(*body)["ready"].is_boolean()) {
      return InferenceRoutes::Error(400, "/v2/repository/index: 'ready' must be true or false");
    }
    only_ready = (*body)["ready"].get<bool>();
  }
  json index = json::array();
  for (const RepositoryIndexEntry& entry : models->Index()) {
    if (only_ready && entry.state != "READY") continue;
    json row = {{"name", entry.name}};
    if (!entry.version.empty()) row["version"] = entry.version;
    row["state"] = entry.state;
    if (!entry.reason.empty()) row["reason"] = entry.reason;
    if (!entry.rollout_state.empty()) row["rollout_state"] = entry.rollout_state;
    if (!entry.decision.empty()) {
      row["decision"] = entry.decision;
      row["decision_reason"] = entry.decision_reason;
    }
    index.push_back(std::move(row));
  }
  return JsonReply(index);
}

// POST /v2/repository/models/{m}/pin {"version": "N"}, .../unpin and .../rollback (bodies
// empty or {}): the model's metadata "rollout" object after the change.
HttpReply RolloutAction(ModelManager* models, const HttpRequest& req, const std::string& action,
                        const std::string& model) {
  absl::StatusOr<json> body =
      RepositoryRequestBody(req, action == "pin" ? std::initializer_list<std::string_view>{"version"}
                                                 : std::initializer_list<std::string_view>{});
  if (!body.ok()) return ErrorReply(body.status());
  absl::Status done;
  if (action == "pin") {
    const json& version = (*body)["version"];
    int64_t number = 0;
    bool ok = (version.is_number_integer() && (number = version.get<int64_t>()) >= 1) ||
              (version.is_string() && absl::SimpleAtoi(version.get<std::string>(), &number) &&
               number >= 1 && absl::StrCat(number) == version.get<std::string>());
    if (!ok) {
      return InferenceRoutes::Error(
          400, absl::StrCat(req.path, ": the body must be {\"version\": N} with N a version "
                                      "number >= 1, e.g. {\"version\": \"2\"}"));
    }
    done = models->Pin(model, number);
  } else if (action == "unpin") {
    done = models->Unpin(model);
  } else {
    done = models->RollBack(model);
  }
  if (!done.ok()) return ErrorReply(done);
  absl::StatusOr<ModelView> view = models->FindModel(model);
  if (!view.ok()) return ErrorReply(view.status());
  return JsonReply({{"name", model},
                    {"rollout", view->rollout ? RolloutJson(*view->rollout) : json(nullptr)}});
}

HttpReply InferReply(const ServedVersion& version, const std::string& id,
                     const BinaryOutputs& binary,
                     const absl::StatusOr<std::vector<Tensor>>& outputs) {
  if (!outputs.ok()) return ErrorReply(outputs.status());
  EncodedInferResponse response =
      EncodeInferResponse(version.model_name(), version.version(), id, *outputs, binary);
  HttpReply reply;
  reply.body = std::move(response.body);
  if (response.json_size) {
    reply.content_type = "application/octet-stream";
    reply.headers.emplace_back(kInferenceHeaderContentLength,
                               std::to_string(*response.json_size));
  }
  return reply;
}

}  // namespace

HttpReply InferenceRoutes::Error(int status, std::string_view message) {
  HttpReply reply;
  reply.status = status;
  reply.body = EncodeError(message);
  return reply;
}

void InferenceRoutes::Handle(HttpRequest& req, HttpReplyFn reply) const {
  const bool get = req.method == "GET";
  const bool post = req.method == "POST";
  // Inline: a request's path has five segments at most, and a vector grown per request was
  // three allocations of every inference.
  absl::InlinedVector<std::string_view, 8> segments;
  if (!req.path.empty() && req.path[0] == '/') {
    std::string_view rest = std::string_view(req.path).substr(1);
    for (size_t slash; (slash = rest.find('/')) != std::string_view::npos;
         rest.remove_prefix(slash + 1)) {
      segments.push_back(rest.substr(0, slash));
    }
    segments.push_back(rest);
  }
  bool empty_segment = std::any_of(segments.begin(), segments.end(),
                                   [](std::string_view s) { return s.empty(); });
  auto no_endpoint = [&] {
    Send(reply, Error(404, absl::StrCat("no endpoint ", req.method, " ", req.path)));
  };
  if (segments.empty() || empty_segment || (segments[0] != "v2" && segments[0] != "metrics")) {
    return no_endpoint();
  }
  if (segments[0] == "metrics") {
    if (!get || segments.size() != 1) return no_endpoint();
    return Send(reply, Metrics(models_));
  }
  if (segments.size() == 1) {
    if (!get) return no_endpoint();
    return Send(reply, JsonReply({{"name", "shoal"},
                                  {"version", options_.server_version},
                                  {"extensions", {"binary_tensor_data", "statistics"}},
                                  {"backend", options_.backend_description}}));
  }
  if (segments[1] == "health" && segments.size() == 3 && get) {
    if (segments[2] == "live") return Send(reply, JsonReply({{"live", true}}));
    if (segments[2] == "ready") {
      if (options_.draining != nullptr && options_.draining->load()) {
        // Not a 4xx like loading: the server is going away, not waiting for something.
        return Send(reply, JsonReply({{"ready", false},
                                      {"error", "the server is shutting down (draining)"}},
                                     503));
      }
      if (models_->IsLoaded()) return Send(reply, JsonReply({{"ready", true}}));
      // KServe v2: readiness false is a 4xx.
      return Send(reply,
                  JsonReply({{"ready", false}, {"error", "the models are still loading"}}, 400));
    }
    return no_endpoint();
  }
  if (segments[1] == "repository" && post) {
    if (segments.size() == 3 && segments[2] == "index") {
      return Send(reply, RepositoryIndex(models_, req));
    }
    if (segments.size() == 5 && segments[2] == "models" &&
        (segments[4] == "load" || segments[4] == "unload")) {
      // Loading reads and warms a model up: seconds, off the front end's threads.
      bool load = segments[4] == "load";
      std::string model(segments[3]);
      blocking_->Post([models = models_, req = std::move(req), reply = std::move(reply), load,
                       model = std::move(model)] {
        absl::StatusOr<json> body = RepositoryRequestBody(req, {"parameters"});
        if (!body.ok()) return Send(reply, ErrorReply(body.status()));
        absl::Status done = load ? models->LoadModel(model) : models->UnloadModel(model);
        if (!done.ok()) return Send(reply, ErrorReply(done));
        Send(reply, JsonReply(json::object()));
      });
      return;
    }
    if (segments.size() == 5 && segments[2] == "models" &&
        (segments[4] == "pin" || segments[4] == "unpin" || segments[4] == "rollback")) {
      std::string action(segments[4]);
      std::string model(segments[3]);
      // Pinning may load a version, rolling back may load an earlier one: off the front end.
      blocking_->Post([models = models_, req = std::move(req), reply = std::move(reply),
                       action = std::move(action), model = std::move(model)] {
        Send(reply, RolloutAction(models, req, action, model));
      });
      return;
    }
    return no_endpoint();
  }
  if (segments[1] != "models") return no_endpoint();
  std::optional<ModelPath> path = ParseModelPath(segments);
  if (!path) return no_endpoint();
  if (path->action == "infer") {
    if (!post) return no_endpoint();
  } else if (!get) {
    return no_endpoint();
  }
  if (path->action.empty()) return Send(reply, ModelMetadata(models_, *path));
  if (path->action == "ready") return Send(reply, ModelReady(models_, *path));
  if (path->action == "stats") return Send(reply, ModelStats(models_, *path));

  absl::StatusOr<InferenceRoute> route = models_->RouteInference(path->name, path->version);
  if (!route.ok()) return Send(reply, ErrorReply(route.status()));
  std::optional<std::string_view> json_size;
  if (req.inference_header_content_length) json_size = *req.inference_header_content_length;
  absl::StatusOr<InferRequest> request = DecodeInferRequest(req.body, json_size);
  if (!request.ok()) return Send(reply, ErrorReply(request.status()));
  std::string id = request->id;
  BinaryOutputs binary = request->binary_outputs;
  if (route->rollout) {
    // A canary runs: the rollout picks the version. The reply closure holds the rollout (and
    // so both versions) until the front end has sent it.
    CanaryRollout* rollout = route->rollout.get();
    rollout->InferAsync(
        *std::move(request),
        [reply = std::move(reply), hold = std::move(route->rollout), id = std::move(id),
         binary = std::move(binary)](ServedVersion* answered,
                                     absl::StatusOr<std::vector<Tensor>> outputs) mutable {
          HttpReplyFn send = std::move(reply);
          send([hold = std::move(hold), answered, id = std::move(id), binary = std::move(binary),
                outputs = std::move(outputs)] { return InferReply(*answered, id, binary, outputs); });
        });
    return;
  }
  std::shared_ptr<ServedVersion> served = std::move(route->version);
  // Everything the reply needs moves into the closure handed to the front end, so that the
  // model's thread lets go of the version before the front end does.
  auto done = [reply = std::move(reply), served, id = std::move(id),
               binary = std::move(binary)](absl::StatusOr<std::vector<Tensor>> outputs) mutable {
    HttpReplyFn send = std::move(reply);
    send([served = std::move(served), id = std::move(id), binary = std::move(binary),
          outputs = std::move(outputs)] { return InferReply(*served, id, binary, outputs); });
  };
  if (served->is_ensemble()) {
    // An ensemble waits for each member in turn.
    blocking_->Post([served, request = *std::move(request), done = std::move(done)]() mutable {
      served->InferAsync(std::move(request), std::move(done));
    });
    return;
  }
  served->InferAsync(*std::move(request), std::move(done));
}

}  // namespace shoal::serve
