#include "client/master_client.h"

#include <grpcpp/grpcpp.h>

#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "client/job_directory.h"
#include "common/files.h"
#include "master/job_status_json.h"
#include "shoal/v1/shoal.grpc.pb.h"

namespace shoal::client {
namespace {

absl::Status FromGrpc(const grpc::Status& st, const std::string& what) {
  if (st.ok()) return absl::OkStatus();
  std::string msg = absl::StrCat(what, ": ", st.error_message());
  switch (st.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::UnavailableError(msg);
    case grpc::StatusCode::UNAUTHENTICATED:
      return absl::UnauthenticatedError(msg);
    case grpc::StatusCode::CANCELLED:
      return absl::CancelledError(msg);
    default:
      return absl::InternalError(msg);
  }
}

class GrpcMasterClient final : public MasterClient {
 public:
  GrpcMasterClient(std::shared_ptr<grpc::Channel> channel, std::string token)
      : stub_(v1::Master::NewStub(channel)), token_(std::move(token)) {}

  absl::StatusOr<nlohmann::json> GetStatus(std::chrono::milliseconds timeout) override {
    grpc::ClientContext ctx;
    Prepare(ctx);
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    v1::JobStatus status;
    auto st = stub_->GetStatus(&ctx, v1::GetStatusRequest(), &status);
    if (!st.ok()) return FromGrpc(st, "ask the master for the job's status");
    return master::JobStatusToJson(status);
  }

  absl::Status Kill(const std::string& reason) override {
    grpc::ClientContext ctx;
    Prepare(ctx);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::KillRequest req;
    req.set_reason(reason);
    v1::KillReply reply;
    return FromGrpc(stub_->Kill(&ctx, req, &reply), "ask the master to kill the job");
  }

  absl::Status Watch(bool logs, uint64_t log_offset,
                     const std::function<void(const nlohmann::json&)>& on_status,
                     const std::function<void(uint64_t, const std::string&)>& on_log,
                     const std::function<void(const std::string&)>& on_notice) override {
    grpc::ClientContext ctx;
    Prepare(ctx);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cancelled_) return absl::CancelledError("cancelled");
      watch_ctx_ = &ctx;
    }
    v1::WatchRequest req;
    req.set_logs(logs);
    req.set_log_offset(log_offset);
    auto reader = stub_->Watch(&ctx, req);
    v1::WatchEvent event;
    while (reader->Read(&event)) {
      if (event.has_status()) on_status(master::JobStatusToJson(event.status()));
      if (event.has_log()) on_log(event.log_offset(), event.log().data());
      if (event.kind_case() == v1::WatchEvent::kNotice) on_notice(event.notice());
    }
    auto st = reader->Finish();
    {
      std::lock_guard<std::mutex> lock(mu_);
      watch_ctx_ = nullptr;
    }
    return FromGrpc(st, "follow the job");
  }

  void Cancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    if (watch_ctx_) watch_ctx_->TryCancel();
  }

 private:
  void Prepare(grpc::ClientContext& ctx) { ctx.AddMetadata("authorization", "Bearer " + token_); }

  std::unique_ptr<v1::Master::Stub> stub_;
  std::string token_;
  std::mutex mu_;
  grpc::ClientContext* watch_ctx_ = nullptr;
  bool cancelled_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MasterClient>> MasterClient::Connect(const std::string& job_dir) {
  auto info = ReadMasterInfo(job_dir);
  if (!info) return absl::UnavailableError(absl::StrCat("no master address in ", job_dir));
  auto token = ReadFile(job_dir + "/token");
  if (!token.ok()) return token.status();
  std::string t(absl::StripAsciiWhitespace(*token));
  auto channel = grpc::CreateChannel(info->address, grpc::InsecureChannelCredentials());
  return std::unique_ptr<MasterClient>(new GrpcMasterClient(channel, t));
}

}  // namespace shoal::client
