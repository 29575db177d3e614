#include "common/http_client.h"

#include <functional>
#include <optional>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace shoal::common {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// Replies here are REST documents (YARN's application reports are the largest).
constexpr uint64_t kMaxReplyBytes = 64ull << 20;

std::string Describe(beast::error_code ec) {
  if (ec == beast::error::timeout) return "timed out";
  return ec.message();
}

// Connects, sends `message` and reads the final reply into `parser`; the failure, if any.
template <class Body>
absl::Status Exchange(asio::io_context& io, const tcp::resolver::results_type& endpoints,
                      http::request<Body>& message, const HttpRequest& request,
                      const std::string& what,
                      std::optional<http::response_parser<http::string_body>>& parser) {
  beast::tcp_stream stream(io);
  beast::flat_buffer buffer;
  parser.emplace();
  parser->body_limit(kMaxReplyBytes);
  beast::error_code failure;
  // Interim replies (1xx: a DataNode answers "100 Continue" to a PUT unasked) are skipped: the
  // reply is the final one that follows.
  std::function<void(beast::error_code, size_t)> on_read = [&](beast::error_code read_ec,
                                                               size_t) {
    if (!read_ec && parser->get().result_int() >= 100 && parser->get().result_int() < 200) {
      parser.emplace();
      parser->body_limit(kMaxReplyBytes);
      http::async_read(stream, buffer, *parser, on_read);
      return;
    }
    failure = read_ec;
  };
  std::string stage = "connect";
  stream.expires_after(request.connect_timeout);
  stream.async_connect(endpoints, [&](beast::error_code connect_ec, const tcp::endpoint&) {
    if (connect_ec) {
      failure = connect_ec;
      return;
    }
    stage = "send";
    stream.expires_after(request.timeout);
    http::async_write(stream, message, [&](beast::error_code write_ec, size_t) {
      if (write_ec) {
        failure = write_ec;
        return;
      }
      stage = "read the reply";
      http::async_read(stream, buffer, *parser, on_read);
    });
  });
  io.run();
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  if (failure) {
    return absl::UnavailableError(absl::StrCat(what, ": ", stage, ": ", Describe(failure)));
  }
  return absl::OkStatus();
}

template <class Body>
void PrepareHeaders(http::request<Body>& message, const HttpRequest& request,
                    absl::string_view host_port) {
  message.set(http::field::host, std::string(host_port));
  message.set(http::field::connection, "close");
  for (const auto& [name, value] : request.headers) message.set(name, value);
  if (message.method() != http::verb::get) {
    message.set(http::field::content_type, request.content_type);
  }
}

}  // namespace

absl::StatusOr<HttpReply> SendHttp(const HttpRequest& request) {
  absl::string_view rest = request.base;
  if (!absl::ConsumePrefix(&rest, "http://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("not an http://HOST:PORT address: '", request.base, "'"));
  }
  while (absl::ConsumeSuffix(&rest, "/")) {
  }
  size_t colon = rest.rfind(':');
  uint32_t port = 0;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(rest.substr(colon + 1), &port) || port == 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("not an http://HOST:PORT address: '", request.base, "'"));
  }
  std::string host(rest.substr(0, colon));
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  http::verb verb = http::string_to_verb(request.method);
  if (verb == http::verb::unknown) {
    return absl::InvalidArgumentError(absl::StrCat("unknown HTTP method ", request.method));
  }
  std::string what = absl::StrCat(request.method, " ", request.base, request.target);

  asio::io_context io{1};
  beast::error_code ec;
  tcp::resolver resolver(io);
  auto endpoints = resolver.resolve(host, std::to_string(port), ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat(what, ": cannot resolve ", host, ": ", ec.message()));
  }

  std::optional<http::response_parser<http::string_body>> parser;
  absl::Status exchanged;
  if (!request.body_file.empty() && verb != http::verb::get) {
    // Streamed from the file, so that a large upload is never held in memory.
    http::request<http::file_body> message{verb, request.target, 11};
    PrepareHeaders(message, request, rest);
    message.body().open(request.body_file.c_str(), beast::file_mode::scan, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": cannot read ", request.body_file, ": ", ec.message()));
    }
    message.prepare_payload();
    exchanged = Exchange(io, endpoints, message, request, what, parser);
  } else {
    http::request<http::string_body> message{verb, request.target, 11};
    PrepareHeaders(message, request, rest);
    if (verb != http::verb::get) {
      message.body() = request.body;
      message.prepare_payload();
    }
    exchanged = Exchange(io, endpoints, message, request, what, parser);
  }
  if (!exchanged.ok()) return exchanged;
  HttpReply reply;
  reply.status = static_cast<int>(parser->get().result_int());
  reply.body = std::move(parser->get().body());
  return reply;
}

}  // namespace shoal::common
