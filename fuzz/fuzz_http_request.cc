// The REST front end's request path (src/serve/frontends/inference_http_server.cc) on the
// bytes a client sends: Boost.Beast's HTTP/1.1 parser with the server's limits, then what the
// server does with each request before the routes see it (the bearer token check, the
// percent-decoded path, the binary tensor extension's header) and, for an inference, the
// request decoder.
// The server itself reads from a socket on its event loops; this drives the same steps
// on a buffer, keep-alive included (several requests one after the other).
// The server takes a request in the common form without Beast (simple_http_request.h); that
// parser is held to Beast's here: whatever it accepts, Beast must read the same way, or the
// target aborts.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include <boost/asio/buffer.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/http.hpp>

#include "absl/strings/match.h"
#include "common/percent_decoding.h"
#include "serve/frontends/bearer_token.h"
#include "serve/frontends/json_codec.h"
#include "serve/frontends/simple_http_request.h"

namespace {

namespace beast = boost::beast;
namespace http = beast::http;

// As the server sets them (kMaxHeaderBytes; the body limit is --max-request-bytes, smaller
// here so that the fuzzer's inputs can pass it).
constexpr uint32_t kMaxHeaderBytes = 64 * 1024;
constexpr uint64_t kMaxBodyBytes = 1 << 20;
constexpr int kMaxRequestsPerInput = 8;

std::string_view Std(beast::string_view view) { return {view.data(), view.size()}; }

// Parses one request from the front of `bytes`; how many bytes it took, 0 when the bytes
// hold no complete, valid request (the server answers 400, 413 or 431, or closes).
size_t ParseOne(std::string_view bytes, std::optional<http::request<http::string_body>>* out) {
  http::request_parser<http::string_body> parser;
  parser.header_limit(kMaxHeaderBytes);
  parser.body_limit(kMaxBodyBytes);
  parser.eager(true);
  beast::error_code ec;
  size_t used = 0;
  while (!parser.is_done() && used < bytes.size()) {
    size_t n = parser.put(boost::asio::const_buffer(bytes.data() + used, bytes.size() - used), ec);
    used += n;
    if (ec || n == 0) break;
  }
  if (!parser.is_done() && (!ec || ec == http::error::need_more)) {
    parser.put_eof(ec);  // the client closed after these bytes
  }
  if (!parser.is_done()) return 0;
  out->emplace(parser.release());
  return used;
}

// Aborts unless Beast's reading of the request at the front of `bytes` (`message`, `used`
// bytes; 0 when Beast refused it) is the simple parser's, wherever the simple parser took it.
void CheckSimpleParserAgrees(std::string_view bytes,
                             const std::optional<http::request<http::string_body>>& message,
                             size_t used) {
  std::optional<shoal::serve::SimpleRequestHead> simple =
      shoal::serve::ParseSimpleRequestHead(bytes);
  if (!simple || simple->content_length > kMaxBodyBytes ||
      bytes.size() - simple->header_size < simple->content_length) {
    return;  // the server leaves these to Beast
  }
  if (!message) std::abort();  // the simple parser took what Beast refuses
  auto first = [&](auto name) -> std::optional<std::string_view> {
    auto it = message->find(name);
    if (it == message->end()) return std::nullopt;
    return Std(it->value());
  };
  bool same = used == simple->header_size + simple->content_length &&
              Std(message->method_string()) == simple->method &&
              Std(message->target()) == simple->target &&
              first(http::field::authorization) == simple->authorization &&
              first(shoal::serve::kInferenceHeaderContentLength) ==
                  simple->inference_header_content_length &&
              !first(http::field::expect) &&
              message->body() == bytes.substr(simple->header_size, simple->content_length) &&
              message->keep_alive() == simple->keep_alive;
  if (!same) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  for (int i = 0; i < kMaxRequestsPerInput && !bytes.empty(); ++i) {
    std::optional<http::request<http::string_body>> message;
    size_t used = ParseOne(bytes, &message);
    CheckSimpleParserAgrees(bytes, message, used);
    if (used == 0) break;
    bytes.remove_prefix(used);
    (void)shoal::serve::BearerTokenMatches(Std((*message)[http::field::authorization]),
                                           "fuzz-token");
    (void)absl::EqualsIgnoreCase(std::string(Std((*message)[http::field::expect])), "100-continue");
    std::string method(Std(message->method_string()));
    std::string_view target = Std(message->target());
    std::string path = shoal::common::PercentDecoded(target.substr(0, target.find('?')));
    std::optional<std::string> json_size;
    if (auto it = message->find(shoal::serve::kInferenceHeaderContentLength);
        it != message->end()) {
      json_size = std::string(Std(it->value()));
    }
    if (method == "POST" && absl::EndsWith(path, "/infer")) {
      std::optional<std::string_view> header;
      if (json_size) header = *json_size;
      (void)shoal::serve::DecodeInferRequest(message->body(), header);
    }
    if (!message->keep_alive()) break;
  }
  return 0;
}
