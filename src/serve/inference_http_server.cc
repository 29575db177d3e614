#include "serve/inference_http_server.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <mutex>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "serve/bearer_token.h"
#include "serve/json_codec.h"
#include "serve/model_manager.h"
#include "serve/prometheus_text.h"

namespace shoal::serve {
namespace {

// Ordered: metadata reads name first, as in the KServe v2 examples.
using json = nlohmann::ordered_json;

constexpr char kJson[] = "application/json";
// Every route's {name} and optional /versions/{v}; the tail differs.
constexpr char kModelPath[] = R"(/v2/models/([^/]+)(?:/versions/([^/]+))?)";

int HttpStatus(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument: return 400;
    case absl::StatusCode::kNotFound: return 404;
    case absl::StatusCode::kUnavailable: return 503;
    default: return 500;
  }
}

void ReplyError(httplib::Response& res, int http_status, std::string_view message) {
  res.status = http_status;
  res.set_content(EncodeError(message), kJson);
}

void ReplyError(httplib::Response& res, const absl::Status& status) {
  ReplyError(res, HttpStatus(status), std::string(status.message()));
}

void ReplyJson(httplib::Response& res, const json& body) {
  res.status = 200;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), kJson);
}

std::optional<std::string> VersionOf(const httplib::Request& req) {
  if (req.matches.size() > 2 && req.matches[2].matched) return req.matches[2].str();
  return std::nullopt;
}

json TensorMetadata(const TensorSignature& tensor) {
  return {{"name", tensor.name},
          {"datatype", tensor.datatype ? std::string(DataTypeName(*tensor.datatype)) : ""},
          {"shape", tensor.shape.value_or(std::vector<int64_t>{})}};
}

// The body of a repository request: empty, or a JSON object with only the keys in `allowed`.
// The error names the endpoint.
absl::StatusOr<json> RepositoryRequestBody(const httplib::Request& req,
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

}  // namespace

struct InferenceHttpServer::Impl {
  httplib::Server server;
  std::thread thread;
  std::once_flag stopped;
};

absl::StatusOr<std::unique_ptr<InferenceHttpServer>> InferenceHttpServer::Start(
    const HttpServerOptions& options, ModelManager* models) {
  std::unique_ptr<InferenceHttpServer> http(new InferenceHttpServer());
  http->impl_ = std::make_unique<Impl>();
  httplib::Server& server = http->impl_->server;

  server.Get("/v2/health/live", [](const httplib::Request&, httplib::Response& res) {
    ReplyJson(res, {{"live", true}});
  });
  server.Get("/v2/health/ready", [models](const httplib::Request&, httplib::Response& res) {
    if (models->IsLoaded()) {
      ReplyJson(res, {{"ready", true}});
    } else {
      res.status = 400;  // KServe v2: readiness false is a 4xx
      res.set_content(json{{"ready", false}, {"error", "the models are still loading"}}.dump(),
                      kJson);
    }
  });
  json server_metadata = {{"name", "shoal"},
                          {"version", options.server_version},
                          {"extensions", {"binary_tensor_data", "statistics"}},
                          {"backend", options.backend_description}};
  server.Get("/v2", [server_metadata](const httplib::Request&, httplib::Response& res) {
    ReplyJson(res, server_metadata);
  });

  server.Get(kModelPath, [models](const httplib::Request& req, httplib::Response& res) {
    auto version = models->FindVersion(req.matches[1], VersionOf(req));
    if (!version.ok()) return ReplyError(res, version.status());
    auto model = models->FindModel(req.matches[1]);
    if (!model.ok()) return ReplyError(res, model.status());
    json versions = json::array();
    for (const auto& v : model->versions) versions.push_back(absl::StrCat(v->version()));
    json inputs = json::array(), outputs = json::array();
    for (const auto& t : (*version)->inputs()) inputs.push_back(TensorMetadata(t));
    for (const auto& t : (*version)->outputs()) outputs.push_back(TensorMetadata(t));
    ReplyJson(res, {{"name", model->name},
                    {"versions", versions},
                    {"platform", (*version)->platform()},
                    {"inputs", inputs},
                    {"outputs", outputs},
                    {"parameters",
                     {{"version", absl::StrCat((*version)->version())},
                      {"max_batch_size", (*version)->max_batch_size()},
                      {"instances", (*version)->instances()},
                      {"threads_per_instance", (*version)->threads_per_instance()}}}});
  });

  server.Get(absl::StrCat(kModelPath, "/ready"),
             [models](const httplib::Request& req, httplib::Response& res) {
               std::string name = req.matches[1];
               auto model = models->FindModel(name);
               if (!model.ok()) return ReplyError(res, model.status());
               auto version = models->FindVersion(name, VersionOf(req));
               if (version.ok()) {
                 ReplyJson(res, {{"name", name}, {"ready", true}});
                 return;
               }
               if (version.status().code() == absl::StatusCode::kNotFound && model->ready) {
                 return ReplyError(res, version.status());  // an unknown version of a model
               }
               res.status = 400;  // KServe v2: readiness false is a 4xx
               res.set_content(json{{"name", name},
                                    {"ready", false},
                                    {"error", version.status().message()}}
                                   .dump(-1, ' ', false, json::error_handler_t::replace),
                               kJson);
             });

  server.Get(absl::StrCat(kModelPath, "/stats"),
             [models](const httplib::Request& req, httplib::Response& res) {
               std::optional<std::string> wanted = VersionOf(req);
               json stats = json::array();
               if (wanted) {
                 auto version = models->FindVersion(req.matches[1], wanted);
                 if (!version.ok()) return ReplyError(res, version.status());
                 stats.push_back(VersionStats(**version));
               } else {
                 auto model = models->FindModel(req.matches[1]);
                 if (!model.ok()) return ReplyError(res, model.status());
                 for (const auto& v : model->versions) stats.push_back(VersionStats(*v));
               }
               ReplyJson(res, {{"model_stats", stats}});
             });

  server.Post(absl::StrCat(kModelPath, "/infer"),
              [models](const httplib::Request& req, httplib::Response& res) {
                auto version = models->FindVersion(req.matches[1], VersionOf(req));
                if (!version.ok()) return ReplyError(res, version.status());
                // The binary tensor extension: the JSON's length, the tensors' bytes after it.
                std::string json_size_text = req.get_header_value(kInferenceHeaderContentLength);
                std::optional<std::string_view> json_size;
                if (req.has_header(kInferenceHeaderContentLength)) json_size = json_size_text;
                absl::StatusOr<InferRequest> request = DecodeInferRequest(req.body, json_size);
                if (!request.ok()) return ReplyError(res, request.status());
                std::string id = request->id;
                BinaryOutputs binary = request->binary_outputs;
                absl::StatusOr<std::vector<Tensor>> outputs =
                    (*version)->Infer(*std::move(request));
                if (!outputs.ok()) return ReplyError(res, outputs.status());
                EncodedInferResponse response = EncodeInferResponse(
                    (*version)->model_name(), (*version)->version(), id, *outputs, binary);
                res.status = 200;
                if (response.json_size) {
                  res.set_header(kInferenceHeaderContentLength,
                                 std::to_string(*response.json_size));
                  res.set_content(std::move(response.body), "application/octet-stream");
                } else {
                  res.set_content(std::move(response.body), kJson);
                }
              });

  // Prometheus scrapes this; the figures of every version serving now, REST and gRPC requests
  // alike (both run through ServedVersion::Infer).
  server.Get("/metrics", [models](const httplib::Request&, httplib::Response& res) {
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
    res.status = 200;
    res.set_content(FormatPrometheusText(metrics), "text/plain; version=0.0.4; charset=utf-8");
  });

  // Triton's model repository extension.
  server.Post("/v2/repository/index", [models](const httplib::Request& req,
                                               httplib::Response& res) {
    absl::StatusOr<json> body = RepositoryRequestBody(req, {"ready"});
    if (!body.ok()) return ReplyError(res, body.status());
    bool only_ready = false;
    if (body->contains("ready")) {
      if (!(*body)["ready"].is_boolean()) {
        return ReplyError(res, 400, "/v2/repository/index: 'ready' must be true or false");
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
      index.push_back(std::move(row));
    }
    ReplyJson(res, index);
  });
  server.Post(R"(/v2/repository/models/([^/]+)/(load|unload))",
              [models](const httplib::Request& req, httplib::Response& res) {
                absl::StatusOr<json> body = RepositoryRequestBody(req, {"parameters"});
                if (!body.ok()) return ReplyError(res, body.status());
                std::string model = req.matches[1];
                absl::Status done = req.matches[2] == "load" ? models->LoadModel(model)
                                                             : models->UnloadModel(model);
                if (!done.ok()) return ReplyError(res, done);
                ReplyJson(res, json::object());
              });

  // Everything httplib answers itself (no route, body over the limit, unreadable request)
  // still gets a JSON error body.
  size_t max_body = options.max_body_bytes;
  server.set_error_handler([max_body](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string message;
    switch (res.status) {
      case 404: message = absl::StrCat("no endpoint ", req.method, " ", req.path); break;
      case 413:
        message = absl::StrCat("request body larger than the server's limit of ", max_body,
                               " bytes (--max-request-bytes)");
        break;
      case 400: message = "bad request"; break;
      case 408: message = "the request was not received in time"; break;
      case 414: message = "request URI too long"; break;
      default: message = absl::StrCat("HTTP status ", res.status); break;
    }
    res.set_content(EncodeError(message), kJson);
  });
  server.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr error) {
        std::string what = "internal error";
        try {
          if (error) std::rethrow_exception(error);
        } catch (const std::exception& e) {
          what = absl::StrCat("internal error: ", e.what());
        } catch (...) {
        }
        ReplyError(res, 500, what);
      });
  // httplib itself answers 413 only after reading (and dropping) the whole declared body, which
  // holds a thread until the read times out when a client declares more than it sends. Refuse
  // on the header instead, and close the connection: its unread body cannot be parsed as the
  // next request. set_payload_max_length still catches chunked bodies as they grow.
  server.set_pre_routing_handler([max_body, token = options.auth_token](
                                     const httplib::Request& req, httplib::Response& res) {
    if (!token.empty() && !BearerTokenMatches(req.get_header_value("Authorization"), token)) {
      ReplyError(res, 401,
                 "this server needs its token: send the header Authorization: Bearer <token>");
      res.set_header("WWW-Authenticate", "Bearer");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!req.has_header("Content-Length")) return httplib::Server::HandlerResponse::Unhandled;
    uint64_t length = 0;
    std::string declared = req.get_header_value("Content-Length");
    if (absl::SimpleAtoi(declared, &length) && length <= max_body) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    ReplyError(res, 413,
               absl::StrCat("request body larger than the server's limit of ", max_body,
                            " bytes (--max-request-bytes)"));
    res.set_header("Connection", "close");
    return httplib::Server::HandlerResponse::Handled;
  });
  server.set_payload_max_length(options.max_body_bytes);
  // httplib writes a response in two pieces; without TCP_NODELAY the second waits for the
  // client's delayed ACK, about 40 ms a request on Linux.
  server.set_tcp_nodelay(true);
  // httplib 0.11 closes a keep-alive connection after 5 requests by default, so a busy client
  // paid a TCP handshake (and the server a thread hand-off) every fifth request: measured at
  // 8 connections, 4,665 reconnects in 20,225 requests. A connection now lives until it has
  // been idle for the keep-alive timeout (5 s), as uvicorn's do.
  server.set_keep_alive_max_count(std::numeric_limits<size_t>::max());
  int threads = std::max(1, options.threads);
  server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };

  int port = options.port == 0 ? server.bind_to_any_port(options.host)
                               : (server.bind_to_port(options.host, options.port) ? options.port : -1);
  if (port <= 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.host, ":", options.port,
                     " (address in use, or not an address of this machine)"));
  }
  http->port_ = static_cast<uint16_t>(port);
  http->impl_->thread = std::thread([&server] { server.listen_after_bind(); });
  // httplib's stop() only stops a server that already runs its accept loop: wait for it, so
  // that a Stop() right after Start() cannot be lost. The socket is bound and listening, so
  // clients that connect meanwhile just wait.
  while (!server.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return http;
}

void InferenceHttpServer::Stop() {
  if (!impl_) return;
  std::call_once(impl_->stopped, [this] {
    impl_->server.stop();
    if (impl_->thread.joinable()) impl_->thread.join();
  });
}

InferenceHttpServer::~InferenceHttpServer() { Stop(); }

}  // namespace shoal::serve
