#include "serve/frontends/inference_grpc_server.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <climits>
#include <mutex>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "serve/frontends/bearer_token.h"
#include "serve/frontends/grpc_codec.h"
#include "serve/repository/model_manager.h"
#include "serve/scheduling/worker_pool.h"

namespace shoal::serve {
namespace {

// The REST server's status for each absl code, as gRPC codes; the message is the same.
grpc::Status ToGrpcStatus(const absl::Status& status) {
  grpc::StatusCode code = grpc::StatusCode::INTERNAL;
  switch (status.code()) {
    case absl::StatusCode::kOk: return grpc::Status::OK;
    case absl::StatusCode::kInvalidArgument: code = grpc::StatusCode::INVALID_ARGUMENT; break;
    case absl::StatusCode::kNotFound: code = grpc::StatusCode::NOT_FOUND; break;
    case absl::StatusCode::kUnavailable: code = grpc::StatusCode::UNAVAILABLE; break;
    case absl::StatusCode::kResourceExhausted: code = grpc::StatusCode::RESOURCE_EXHAUSTED; break;
    default: break;
  }
  return grpc::Status(code, std::string(status.message()));
}

std::optional<std::string> VersionOf(const std::string& version) {
  if (version.empty()) return std::nullopt;
  return version;
}

class InferenceService final : public inference::GRPCInferenceService::CallbackService {
 public:
  InferenceService(const GrpcServerOptions& options, const ModelManager* models)
      : models_(models),
        auth_token_(options.auth_token),
        draining_(options.draining),
        server_version_(options.server_version),
        pool_(std::max(1, options.threads)) {}

  // Answers the ModelInfer calls still queued. REQUIRES: the server no longer takes calls.
  void StopWorkers() { pool_.Stop(); }

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* context,
                                       const inference::ServerLiveRequest*,
                                       inference::ServerLiveResponse* response) override {
    return Answer(context, [&] {
      response->set_live(true);
      return grpc::Status::OK;
    });
  }

  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* context,
                                        const inference::ServerReadyRequest*,
                                        inference::ServerReadyResponse* response) override {
    return Answer(context, [&] {
      bool draining = draining_ != nullptr && draining_->load();
      response->set_ready(!draining && models_->IsLoaded());
      return grpc::Status::OK;
    });
  }

  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* context,
                                           const inference::ServerMetadataRequest*,
                                           inference::ServerMetadataResponse* response) override {
    return Answer(context, [&] {
      response->set_name("shoal");
      response->set_version(server_version_);
      // The server's extensions, which are REST's (statistics, binary tensor data).
      response->add_extensions("binary_tensor_data");
      response->add_extensions("statistics");
      return grpc::Status::OK;
    });
  }

  // As REST's /ready: NOT_FOUND for an unknown model or a version it does not have; ready
  // false while loading, when refused or unloaded, or for a version its policy does not serve.
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* context,
                                       const inference::ModelReadyRequest* request,
                                       inference::ModelReadyResponse* response) override {
    return Answer(context, [&] {
      absl::StatusOr<Readiness> readiness =
          models_->CheckReadiness(request->name(), VersionOf(request->version()));
      if (!readiness.ok()) return ToGrpcStatus(readiness.status());
      response->set_ready(readiness->ready);
      return grpc::Status::OK;
    });
  }

  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* context,
                                          const inference::ModelMetadataRequest* request,
                                          inference::ModelMetadataResponse* response) override {
    return Answer(context, [&] {
      auto version = models_->FindVersion(request->name(), VersionOf(request->version()));
      if (!version.ok()) return ToGrpcStatus(version.status());
      auto model = models_->FindModel(request->name());
      if (!model.ok()) return ToGrpcStatus(model.status());
      response->set_name(model->name);
      for (const auto& v : model->versions) response->add_versions(absl::StrCat(v->version()));
      response->set_platform((*version)->platform());
      auto describe = [](const TensorSignature& signature,
                         inference::ModelMetadataResponse::TensorMetadata* tensor) {
        tensor->set_name(signature.name);
        tensor->set_datatype(signature.datatype ? DataTypeName(*signature.datatype) : "");
        if (signature.shape) {
          for (int64_t dim : *signature.shape) tensor->add_shape(dim);
        }
      };
      for (const auto& t : (*version)->inputs()) describe(t, response->add_inputs());
      for (const auto& t : (*version)->outputs()) describe(t, response->add_outputs());
      auto& properties = *response->mutable_properties();
      properties["version"] = absl::StrCat((*version)->version());
      properties["max_batch_size"] = absl::StrCat((*version)->max_batch_size());
      properties["instances"] = absl::StrCat((*version)->instances());
      properties["threads_per_instance"] = absl::StrCat((*version)->threads_per_instance());
      return grpc::Status::OK;
    });
  }

  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* context,
                                       const inference::ModelInferRequest* request,
                                       inference::ModelInferResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (grpc::Status refused = CheckToken(context); !refused.ok()) {
      reactor->Finish(refused);
      return reactor;
    }
    // `request` and `response` stay valid until Finish.
    pool_.Post([this, context, request, response, reactor] {
      if (context->IsCancelled()) {
        reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the call"));
        return;
      }
      reactor->Finish(Infer(*request, response));
    });
    return reactor;
  }

 private:
  grpc::Status Infer(const inference::ModelInferRequest& request,
                     inference::ModelInferResponse* response) {
    auto route = models_->RouteInference(request.model_name(), VersionOf(request.model_version()));
    if (!route.ok()) return ToGrpcStatus(route.status());
    absl::StatusOr<InferRequest> decoded = DecodeModelInferRequest(request);
    if (!decoded.ok()) return ToGrpcStatus(decoded.status());
    std::string id = decoded->id;
    // While a canary runs, the rollout picks the version (held by `route` meanwhile).
    ServedVersion* answered = route->version.get();
    absl::StatusOr<std::vector<Tensor>> outputs;
    if (route->rollout) {
      std::tie(answered, outputs) = route->rollout->Infer(*std::move(decoded));
    } else {
      outputs = answered->Infer(*std::move(decoded));
    }
    if (!outputs.ok()) return ToGrpcStatus(outputs.status());
    // Outputs come back in the form the inputs came in.
    bool raw = request.raw_input_contents_size() > 0;
    EncodeModelInferResponse(answered->model_name(), answered->version(), id, *outputs, raw,
                             response);
    return grpc::Status::OK;
  }

  grpc::Status CheckToken(grpc::CallbackServerContext* context) const {
    if (auth_token_.empty()) return grpc::Status::OK;
    const auto& metadata = context->client_metadata();
    auto header = metadata.find("authorization");
    if (header != metadata.end() &&
        BearerTokenMatches(std::string_view(header->second.data(), header->second.size()),
                           auth_token_)) {
      return grpc::Status::OK;
    }
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "this server needs its token: send the metadata authorization: Bearer "
                        "<token>");
  }

  // Answers a call that does not wait for a model, on the calling gRPC thread.
  template <typename Body>
  grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context, Body body) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    grpc::Status status = CheckToken(context);
    reactor->Finish(status.ok() ? body() : status);
    return reactor;
  }

  const ModelManager* const models_;
  const std::string auth_token_;
  const std::atomic<bool>* const draining_;
  const std::string server_version_;
  WorkerPool pool_;
};

}  // namespace

struct InferenceGrpcServer::Impl {
  std::unique_ptr<InferenceService> service;
  std::unique_ptr<grpc::Server> server;
  std::once_flag stopped;
};

absl::StatusOr<std::unique_ptr<InferenceGrpcServer>> InferenceGrpcServer::Start(
    const GrpcServerOptions& options, const ModelManager* models) {
  std::unique_ptr<InferenceGrpcServer> grpc_server(new InferenceGrpcServer());
  grpc_server->impl_ = std::make_unique<Impl>();
  Impl& impl = *grpc_server->impl_;
  impl.service = std::make_unique<InferenceService>(options, models);

  bool ipv6 = options.host.find(':') != std::string::npos;
  std::string address = ipv6 ? absl::StrCat("[", options.host, "]:", options.port)
                             : absl::StrCat(options.host, ":", options.port);
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &bound_port);
  builder.RegisterService(impl.service.get());
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(std::min<size_t>(options.max_message_bytes, INT_MAX)));
  // gRPC sets SO_REUSEPORT by default: a second server on the same port would share it and
  // take some of the calls instead of failing to start.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  impl.server = builder.BuildAndStart();
  if (!impl.server || bound_port == 0) {
    impl.service->StopWorkers();
    return absl::UnavailableError(
        absl::StrCat("cannot listen for gRPC on ", options.host, ":", options.port,
                     " (address in use, or not an address of this machine)"));
  }
  grpc_server->port_ = static_cast<uint16_t>(bound_port);
  return grpc_server;
}

void InferenceGrpcServer::Stop() {
  if (!impl_) return;
  std::call_once(impl_->stopped, [this] {
    // Waits for every call taken to be answered; the pool answers the queued ModelInfer calls
    // meanwhile, so it stops after.
    if (impl_->server) impl_->server->Shutdown();
    impl_->service->StopWorkers();
  });
}

InferenceGrpcServer::~InferenceGrpcServer() { Stop(); }

}  // namespace shoal::serve
