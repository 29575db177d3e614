#pragma once

// Beast's HTTP/1.1 request parser as the REST front end uses it. Only
// inference_http_server.cc and its tests include this header (it brings in Beast).

#include <cstdint>
#include <optional>
#include <string>

#include <boost/beast/core/string.hpp>
#include <boost/beast/http/basic_parser.hpp>

#include "serve/frontends/json_codec.h"

namespace shoal::serve {

// What the server keeps of one request: the request line, the fields it acts on and the body.
// A connection reuses one for all its requests, so that their strings keep their storage.
struct RequestHead {
  std::string method;
  std::string target;
  // Of a field given twice the first counts, as with Beast's own fields container.
  std::optional<std::string> authorization;
  std::optional<std::string> expect;
  std::optional<std::string> inference_header_content_length;
  std::string body;

  void Clear() {
    method.clear();
    target.clear();
    authorization.reset();
    expect.reset();
    inference_header_content_length.reset();
    body.clear();
  }
};

// Beast's HTTP/1.1 request parser (framing, limits, keep-alive, chunked bodies), writing into a
// RequestHead. Beast's own request_parser keeps every field in a container, which the server
// then searched again by name: about 2,000 instructions of a small inference request
// (docs/design/0005-serving.md, "Where a small request's CPU goes: a second count"). A request
// in the common form does not come here at all (simple_http_request.h).
class RequestReader : public boost::beast::http::basic_parser<true> {
 public:
  explicit RequestReader(RequestHead* head) : head_(head) {}

 private:
  using StringView = boost::beast::string_view;
  using ErrorCode = boost::beast::error_code;
  using Field = boost::beast::http::field;

  void on_request_impl(boost::beast::http::verb, StringView method, StringView target, int,
                       ErrorCode& ec) override {
    head_->method.assign(method.data(), method.size());
    head_->target.assign(target.data(), target.size());
    ec = {};
  }
  void on_response_impl(int, StringView, int, ErrorCode& ec) override {
    ec = boost::beast::http::error::bad_version;  // a request parser is never given a status
  }
  void on_field_impl(Field name, StringView name_string, StringView value,
                     ErrorCode& ec) override {
    ec = {};
    std::optional<std::string>* kept = nullptr;
    if (name == Field::authorization) {
      kept = &head_->authorization;
    } else if (name == Field::expect) {
      kept = &head_->expect;
    } else if (name == Field::unknown &&
               boost::beast::iequals(name_string, kInferenceHeaderContentLength)) {
      kept = &head_->inference_header_content_length;
    }
    if (kept != nullptr && !kept->has_value()) kept->emplace(value.data(), value.size());
  }
  void on_header_impl(ErrorCode& ec) override { ec = {}; }
  void on_body_init_impl(const boost::optional<std::uint64_t>& content_length,
                         ErrorCode& ec) override {
    // The parser has held it to the body limit already.
    if (content_length) head_->body.reserve(static_cast<size_t>(*content_length));
    ec = {};
  }
  size_t on_body_impl(StringView body, ErrorCode& ec) override {
    head_->body.append(body.data(), body.size());
    ec = {};
    return body.size();
  }
  void on_chunk_header_impl(std::uint64_t, StringView, ErrorCode& ec) override { ec = {}; }
  size_t on_chunk_body_impl(std::uint64_t, StringView body, ErrorCode& ec) override {
    return on_body_impl(body, ec);
  }
  void on_finish_impl(ErrorCode& ec) override { ec = {}; }

  RequestHead* head_;
};

}  // namespace shoal::serve
