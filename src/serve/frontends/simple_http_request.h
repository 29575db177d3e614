#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace shoal::serve {

// The header of an HTTP/1.1 request in the form nearly every client sends, read without
// Beast. Beast's parser, with the composed read operation around it, cost about a sixth of a
// small inference request's instructions (docs/design/0005-serving.md, "A third count").
// Views into the bytes given to ParseSimpleRequestHead.
struct SimpleRequestHead {
  std::string_view method;
  std::string_view target;
  // Of a field given twice the first counts, as with Beast.
  std::optional<std::string_view> authorization;
  std::optional<std::string_view> inference_header_content_length;
  uint64_t content_length = 0;  // 0 when the header has none: a request without a body
  bool keep_alive = true;
  size_t header_size = 0;  // bytes through the empty line that ends the header
};

// The longest header ParseSimpleRequestHead reads; a longer one is left to Beast.
inline constexpr size_t kMaxSimpleHeaderBytes = 8 * 1024;

// Reads the header at the front of `bytes` when it is complete and simple: an upper-case
// method, a target of visible ASCII, "HTTP/1.1", fields of a token name and a value of
// visible ASCII, spaces and tabs, at most one Content-Length of digits, and a Connection of
// exactly "keep-alive" or "close". Anything else returns nullopt and the caller parses the
// same bytes with Beast: a header that is incomplete or longer than kMaxSimpleHeaderBytes,
// HTTP/1.0, Transfer-Encoding, Upgrade, Expect, Proxy-Connection, folded lines, bare CR or LF,
// control or non-ASCII bytes. The contract (tests/serve/frontends and fuzz/fuzz_http_request):
// whatever this accepts, Beast accepts too, with the same method, target, fields, body length
// and keep-alive.
std::optional<SimpleRequestHead> ParseSimpleRequestHead(std::string_view bytes);

}  // namespace shoal::serve
