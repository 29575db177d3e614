#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace shoal::common {

struct HttpReply {
  int status = 0;
  std::string body;
};

struct HttpRequest {
  std::string method = "GET";  // GET, POST, PUT or DELETE
  std::string base;            // http://HOST:PORT
  std::string target;          // /path?query
  std::string body;            // sent with Content-Length when the method is not GET
  // When set (and the method is not GET), the body is this file's contents instead, streamed
  // from disk rather than held in memory (uploads of large files).
  std::string body_file;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;
  std::chrono::milliseconds connect_timeout{5000};
  // For sending the request and receiving the whole reply.
  std::chrono::milliseconds timeout{10000};
};

// One blocking HTTP/1.1 exchange on a fresh connection (no TLS, no redirects). A reply of any
// status is a value; Unavailable when nothing answered in time, InvalidArgument for a bad
// `base`. Only from threads that may block.
absl::StatusOr<HttpReply> SendHttp(const HttpRequest& request);

}  // namespace shoal::common
