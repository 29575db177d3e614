#include "backends/kubernetes/kube_client.h"

#include <curl/curl.h>

#include <fstream>
#include <mutex>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shoal::backends {
namespace {

// How often a stream asks should_stop() while nothing arrives.
constexpr int kStopPollMs = 200;
// How much of a reply that is not a Kubernetes Status goes into an error message.
constexpr size_t kMaxBodyInMessage = 300;

void InitCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

size_t AppendToString(char* data, size_t size, size_t count, void* user) {
  static_cast<std::string*>(user)->append(data, size * count);
  return size * count;
}

// The error for an answer of the API server: `http_code` and, when the reply was a Kubernetes
// Status object, its message and reason.
absl::Status ApiError(absl::string_view what, int http_code, const nlohmann::json* status,
                      absl::string_view raw_body, absl::string_view source,
                      absl::string_view code_label = "HTTP") {
  std::string message;
  std::string reason;
  if (status != nullptr && status->is_object()) {
    if (auto it = status->find("message"); it != status->end() && it->is_string()) {
      message = it->get<std::string>();
    }
    if (auto it = status->find("reason"); it != status->end() && it->is_string()) {
      reason = it->get<std::string>();
    }
  }
  if (message.empty()) {
    message = std::string(absl::StripAsciiWhitespace(raw_body.substr(0, kMaxBodyInMessage)));
    if (raw_body.size() > kMaxBodyInMessage) message += "...";
    if (message.empty()) message = reason.empty() ? "no message" : reason;
  }
  std::string text = absl::StrCat(what, ": ", code_label, " ", http_code, ": ", message);
  switch (http_code) {
    case 400:
    case 422: return absl::InvalidArgumentError(text);
    case 401:
      return absl::UnauthenticatedError(absl::StrCat(text, " (credentials from ", source, ")"));
    case 403: return absl::PermissionDeniedError(text);
    case 404: return absl::NotFoundError(text);
    case 409:
      if (reason == "AlreadyExists") return absl::AlreadyExistsError(text);
      return absl::AbortedError(text);
    case 410: return absl::Status(kResourceVersionTooOld, text);
    case 429: return absl::UnavailableError(text);
    default:
      if (http_code >= 500) return absl::UnavailableError(text);
      return absl::UnknownError(text);
  }
}

absl::Status ApiErrorFromBody(absl::string_view what, int http_code, const std::string& body,
                              absl::string_view source) {
  nlohmann::json status = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  return ApiError(what, http_code, status.is_discarded() ? nullptr : &status, body, source);
}

std::string TransportMessage(CURLcode code, const char* error_buffer) {
  if (error_buffer != nullptr && error_buffer[0] != '\0') return error_buffer;
  return curl_easy_strerror(code);
}

absl::StatusOr<std::string> ReadToken(const std::string& file, absl::string_view source) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream text;
  if (in) text << in.rdbuf();
  if (!in || in.bad()) {
    return absl::UnauthenticatedError(
        absl::StrCat("cannot read the token file ", file, " (from ", source, ")"));
  }
  std::string token(absl::StripAsciiWhitespace(text.str()));
  if (token.empty()) {
    return absl::UnauthenticatedError(
        absl::StrCat("the token file ", file, " is empty (from ", source, ")"));
  }
  return token;
}

void SetBlob(CURL* easy, CURLoption option, const std::string& bytes) {
  curl_blob blob;
  blob.data = const_cast<char*>(bytes.data());
  blob.len = bytes.size();
  blob.flags = CURL_BLOB_COPY;
  curl_easy_setopt(easy, option, &blob);
}

std::string Escape(absl::string_view text) {
  std::string escaped;
  for (unsigned char c : text) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      escaped += static_cast<char>(c);
    } else {
      absl::StrAppend(&escaped, "%", absl::Hex(c, absl::kZeroPad2));
    }
  }
  return escaped;
}

}  // namespace

// One easy handle with what it points to; curl copies every string option but the error
// buffer and the header list, which live here as long as the handle.
struct KubeClient::Request {
  explicit Request(KubeClient& client) : client(client) {}
  ~Request() {
    curl_slist_free_all(headers);
    if (easy == nullptr) return;
    // The handle keeps its connection open for the next request unless the pool is full.
    {
      absl::MutexLock lock(&client.idle_mutex_);
      if (client.idle_handles_.size() < kMaxIdleConnections) {
        client.idle_handles_.push_back(easy);
        return;
      }
    }
    curl_easy_cleanup(easy);
  }

  KubeClient& client;
  CURL* easy = nullptr;
  curl_slist* headers = nullptr;
  char error[CURL_ERROR_SIZE] = {};
  // "GET /api/v1/namespaces", for messages.
  std::string what;
  std::string url;
};

absl::StatusOr<std::unique_ptr<KubeClient>> KubeClient::Create(KubeConfig config,
                                                               KubeClientOptions options) {
  if (!absl::StartsWith(config.server, "https://") && !absl::StartsWith(config.server, "http://")) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.source, ": the API server must be an https:// URL, got \"", config.server, "\""));
  }
  InitCurlOnce();
  return std::unique_ptr<KubeClient>(new KubeClient(std::move(config), options));
}

KubeClient::~KubeClient() {
  absl::MutexLock lock(&idle_mutex_);
  for (void* easy : idle_handles_) curl_easy_cleanup(static_cast<CURL*>(easy));
}

absl::StatusOr<std::unique_ptr<KubeClient::Request>> KubeClient::Prepare(
    absl::string_view method, absl::string_view path, const std::string* body,
    absl::string_view content_type) {
  if (!absl::StartsWith(path, "/")) {
    return absl::InvalidArgumentError(
        absl::StrCat(method, " ", path, ": an API path must begin with '/'"));
  }
  auto request = std::make_unique<Request>(*this);
  request->what = absl::StrCat(method, " ", path);
  request->url = absl::StrCat(config_.server, path);
  std::string token = config_.token;
  if (token.empty() && !config_.token_file.empty()) {
    // Re-read on every request: the kubelet rotates a pod's token in place.
    SHOAL_ASSIGN_OR_RETURN(token, ReadToken(config_.token_file, config_.source));
  }
  {
    absl::MutexLock lock(&idle_mutex_);
    if (!idle_handles_.empty()) {
      request->easy = static_cast<CURL*>(idle_handles_.back());
      idle_handles_.pop_back();
    }
  }
  if (request->easy != nullptr) {
    // No option of the previous request survives; its connection does.
    curl_easy_reset(request->easy);
  } else {
    request->easy = curl_easy_init();
    if (request->easy == nullptr) return absl::InternalError("curl_easy_init failed");
  }
  CURL* easy = request->easy;
  curl_easy_setopt(easy, CURLOPT_URL, request->url.c_str());
  curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, request->error);
  curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "https,http");
  curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(options_.connect_timeout.count()));
  curl_easy_setopt(easy, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(easy, CURLOPT_USERAGENT, "shoal");

  if (config_.insecure_skip_tls_verify) {
    curl_easy_setopt(easy, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(easy, CURLOPT_SSL_VERIFYHOST, 0L);
  } else if (!config_.certificate_authority.empty()) {
    // Only the cluster's CA, as kubectl: not the system's too.
    curl_easy_setopt(easy, CURLOPT_CAPATH, nullptr);
    if (!config_.certificate_authority.file.empty()) {
      curl_easy_setopt(easy, CURLOPT_CAINFO, config_.certificate_authority.file.c_str());
    } else {
      curl_easy_setopt(easy, CURLOPT_CAINFO, nullptr);
      SetBlob(easy, CURLOPT_CAINFO_BLOB, config_.certificate_authority.pem);
    }
  }
  if (!config_.client_certificate.empty()) {
    curl_easy_setopt(easy, CURLOPT_SSLCERTTYPE, "PEM");
    if (!config_.client_certificate.file.empty()) {
      curl_easy_setopt(easy, CURLOPT_SSLCERT, config_.client_certificate.file.c_str());
    } else {
      SetBlob(easy, CURLOPT_SSLCERT_BLOB, config_.client_certificate.pem);
    }
    curl_easy_setopt(easy, CURLOPT_SSLKEYTYPE, "PEM");
    if (!config_.client_key.file.empty()) {
      curl_easy_setopt(easy, CURLOPT_SSLKEY, config_.client_key.file.c_str());
    } else {
      SetBlob(easy, CURLOPT_SSLKEY_BLOB, config_.client_key.pem);
    }
  }

  request->headers = curl_slist_append(request->headers, "Accept: application/json, */*");
  // No "Expect: 100-continue" round trip before a body.
  request->headers = curl_slist_append(request->headers, "Expect:");
  if (!token.empty()) {
    const std::string authorization = absl::StrCat("Authorization: Bearer ", token);
    request->headers = curl_slist_append(request->headers, authorization.c_str());
  }
  if (body != nullptr) {
    const std::string type = absl::StrCat("Content-Type: ", content_type);
    request->headers = curl_slist_append(request->headers, type.c_str());
    curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body->size()));
    curl_easy_setopt(easy, CURLOPT_COPYPOSTFIELDS, body->c_str());
  }
  curl_easy_setopt(easy, CURLOPT_HTTPHEADER, request->headers);
  if (method != "GET" && method != "POST") {
    const std::string custom(method);
    curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, custom.c_str());
  }
  requests_.fetch_add(1, std::memory_order_relaxed);
  return request;
}

absl::StatusOr<nlohmann::json> KubeClient::Send(absl::string_view method, absl::string_view path,
                                                const std::string* body,
                                                absl::string_view content_type) {
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Request> request,
                         Prepare(method, path, body, content_type));
  std::string reply;
  curl_easy_setopt(request->easy, CURLOPT_WRITEFUNCTION, &AppendToString);
  curl_easy_setopt(request->easy, CURLOPT_WRITEDATA, &reply);
  curl_easy_setopt(request->easy, CURLOPT_TIMEOUT_MS,
                   static_cast<long>(options_.request_timeout.count()));
  const CURLcode code = curl_easy_perform(request->easy);
  if (code != CURLE_OK) {
    return absl::UnavailableError(absl::StrCat(request->what, ": ", config_.server, ": ",
                                               TransportMessage(code, request->error),
                                               " (configuration from ", config_.source, ")"));
  }
  long http_code = 0;
  curl_easy_getinfo(request->easy, CURLINFO_RESPONSE_CODE, &http_code);
  if (http_code < 200 || http_code > 299) {
    return ApiErrorFromBody(request->what, static_cast<int>(http_code), reply, config_.source);
  }
  const char* type = nullptr;
  curl_easy_getinfo(request->easy, CURLINFO_CONTENT_TYPE, &type);
  if (type == nullptr || !absl::StrContains(absl::AsciiStrToLower(type), "json")) {
    return nlohmann::json(std::move(reply));
  }
  if (reply.empty()) return nlohmann::json::object();
  nlohmann::json value = nlohmann::json::parse(reply, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    return absl::InternalError(
        absl::StrCat(request->what, ": HTTP ", http_code, ": the reply is not valid JSON"));
  }
  return value;
}

absl::StatusOr<nlohmann::json> KubeClient::Get(absl::string_view path) {
  return Send("GET", path, nullptr, {});
}

absl::StatusOr<nlohmann::json> KubeClient::Create(absl::string_view path,
                                                  const nlohmann::json& object) {
  const std::string body = object.dump();
  return Send("POST", path, &body, "application/json");
}

absl::StatusOr<nlohmann::json> KubeClient::Replace(absl::string_view path,
                                                   const nlohmann::json& object) {
  const std::string body = object.dump();
  return Send("PUT", path, &body, "application/json");
}

absl::StatusOr<nlohmann::json> KubeClient::Patch(absl::string_view path,
                                                 const nlohmann::json& patch, PatchType type) {
  const std::string body = patch.dump();
  absl::string_view content_type = "application/merge-patch+json";
  switch (type) {
    case PatchType::kMerge: break;
    case PatchType::kStrategicMerge: content_type = "application/strategic-merge-patch+json"; break;
    case PatchType::kJson: content_type = "application/json-patch+json"; break;
  }
  return Send("PATCH", path, &body, content_type);
}

absl::StatusOr<nlohmann::json> KubeClient::Delete(absl::string_view path,
                                                  const std::optional<nlohmann::json>& options) {
  if (!options.has_value()) return Send("DELETE", path, nullptr, {});
  const std::string body = options->dump();
  return Send("DELETE", path, &body, "application/json");
}

absl::Status KubeClient::Stream(absl::string_view path,
                                const std::function<bool(absl::string_view)>& on_data,
                                const StopRequested& should_stop,
                                std::chrono::milliseconds total_timeout) {
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Request> request, Prepare("GET", path, nullptr, {}));
  // curl fills `received` inside curl_multi_perform; it is handed on outside curl's callbacks,
  // so on_data may take its time and nothing it does unwinds through C code.
  std::string received;
  curl_easy_setopt(request->easy, CURLOPT_WRITEFUNCTION, &AppendToString);
  curl_easy_setopt(request->easy, CURLOPT_WRITEDATA, &received);
  curl_easy_setopt(request->easy, CURLOPT_TIMEOUT_MS, static_cast<long>(total_timeout.count()));

  CURLM* multi = curl_multi_init();
  if (multi == nullptr) return absl::InternalError("curl_multi_init failed");
  struct MultiCleanup {
    CURLM* multi;
    CURL* easy;
    ~MultiCleanup() {
      curl_multi_remove_handle(multi, easy);
      curl_multi_cleanup(multi);
    }
  };
  curl_multi_add_handle(multi, request->easy);
  MultiCleanup cleanup{multi, request->easy};

  long http_code = 0;
  bool began = false;    // a 2xx reply's body is flowing
  bool stopped = false;  // by should_stop() or on_data
  std::string error_body;
  int running = 1;
  while (true) {
    if (const CURLMcode m = curl_multi_perform(multi, &running); m != CURLM_OK) {
      return absl::InternalError(absl::StrCat(request->what, ": ", curl_multi_strerror(m)));
    }
    if (!received.empty()) {
      curl_easy_getinfo(request->easy, CURLINFO_RESPONSE_CODE, &http_code);
      if (http_code >= 200 && http_code <= 299) {
        began = true;
        std::string chunk;
        chunk.swap(received);
        if (!on_data(chunk)) {
          stopped = true;
          break;
        }
      } else {
        error_body += received;
        received.clear();
      }
    }
    if (running == 0) break;
    if (should_stop()) {
      stopped = true;
      break;
    }
    if (const CURLMcode m = curl_multi_poll(multi, nullptr, 0, kStopPollMs, nullptr);
        m != CURLM_OK) {
      return absl::InternalError(absl::StrCat(request->what, ": ", curl_multi_strerror(m)));
    }
  }
  if (stopped) return absl::OkStatus();

  CURLcode result = CURLE_OK;
  int queued = 0;
  while (CURLMsg* message = curl_multi_info_read(multi, &queued)) {
    if (message->msg == CURLMSG_DONE) result = message->data.result;
  }
  curl_easy_getinfo(request->easy, CURLINFO_RESPONSE_CODE, &http_code);
  if (http_code >= 200 && http_code <= 299) {
    // The server's end of a stream, a dropped connection or our own total timeout: all mean
    // "start again from where you are".
    began = true;
  }
  if (began) return absl::OkStatus();
  if (http_code != 0) {
    return ApiErrorFromBody(request->what, static_cast<int>(http_code), error_body, config_.source);
  }
  return absl::UnavailableError(absl::StrCat(request->what, ": ", config_.server, ": ",
                                             TransportMessage(result, request->error),
                                             " (configuration from ", config_.source, ")"));
}

absl::Status KubeClient::StreamGet(absl::string_view path,
                                   const std::function<void(absl::string_view)>& on_data,
                                   const StopRequested& should_stop) {
  return Stream(
      path,
      [&](absl::string_view bytes) {
        on_data(bytes);
        return true;
      },
      should_stop, std::chrono::milliseconds(0));
}

absl::StatusOr<std::string> KubeClient::Watch(absl::string_view path,
                                              absl::string_view resource_version,
                                              const WatchEventHandler& on_event,
                                              const StopRequested& should_stop) {
  std::string target = absl::StrCat(
      path, absl::StrContains(path, '?') ? "&" : "?",
      "watch=1&allowWatchBookmarks=true&timeoutSeconds=", options_.watch_timeout.count());
  if (!resource_version.empty()) {
    absl::StrAppend(&target, "&resourceVersion=", Escape(resource_version));
  }
  const std::string what = absl::StrCat("GET ", target);
  std::string last_version(resource_version);
  std::string line_buffer;
  absl::Status event_error;

  // One event line; false (with event_error set, or should_stop) ends the stream.
  auto handle_line = [&](absl::string_view line) -> bool {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) return true;
    nlohmann::json event =
        nlohmann::json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
    if (event.is_discarded() || !event.is_object() || !event.contains("type") ||
        !event["type"].is_string()) {
      event_error = absl::InternalError(absl::StrCat(what, ": a watch event is not valid JSON"));
      return false;
    }
    const std::string type = event["type"].get<std::string>();
    const nlohmann::json& object = event.contains("object") ? event["object"] : nlohmann::json();
    if (type == "ERROR") {
      int code = 0;
      if (object.is_object() && object.contains("code") && object["code"].is_number_integer()) {
        code = object["code"].get<int>();
      }
      event_error = ApiError(what, code, &object, "", config_.source, "watch ERROR event, code");
      return false;
    }
    if (object.is_object()) {
      const nlohmann::json::json_pointer version_pointer("/metadata/resourceVersion");
      if (object.contains(version_pointer) && object[version_pointer].is_string()) {
        last_version = object[version_pointer].get<std::string>();
      }
    }
    if (type == "BOOKMARK") return true;
    if (should_stop()) return false;
    on_event(type, object);
    return true;
  };

  absl::Status stream_status = Stream(
      target,
      [&](absl::string_view bytes) {
        line_buffer.append(bytes.data(), bytes.size());
        size_t start = 0;
        for (size_t end; (end = line_buffer.find('\n', start)) != std::string::npos;
             start = end + 1) {
          if (!handle_line(absl::string_view(line_buffer).substr(start, end - start))) {
            return false;
          }
        }
        line_buffer.erase(0, start);
        return true;
      },
      should_stop, options_.watch_timeout + options_.request_timeout);
  SHOAL_RETURN_IF_ERROR(stream_status);
  SHOAL_RETURN_IF_ERROR(event_error);
  return last_version;
}

}  // namespace shoal::backends
