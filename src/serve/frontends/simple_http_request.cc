#include "serve/frontends/simple_http_request.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>

namespace shoal::serve {
namespace {

// RFC 9110's tchar: the characters of a field name.
constexpr std::array<bool, 256> kTokenChars = [] {
  std::array<bool, 256> table{};
  for (int c = '0'; c <= '9'; ++c) table[c] = true;
  for (int c = 'a'; c <= 'z'; ++c) table[c] = true;
  for (int c = 'A'; c <= 'Z'; ++c) table[c] = true;
  for (char c : std::string_view("!#$%&'*+-.^_`|~")) table[static_cast<unsigned char>(c)] = true;
  return table;
}();

bool IsToken(char c) { return kTokenChars[static_cast<unsigned char>(c)]; }
bool IsBlank(char c) { return c == ' ' || c == '\t'; }

// The first byte at or after `at` that is below `low` or above 0x7e, or `end`; tabs count as
// such bytes too when `low` is above them. Eight bytes at a time: header text is mostly plain.
template <unsigned char low>
const char* SkipPlain(const char* at, const char* end) {
  constexpr uint64_t kOnes = 0x0101010101010101ULL;
  constexpr uint64_t kHighBits = 0x8080808080808080ULL;
  while (end - at >= 8) {
    uint64_t word;
    std::memcpy(&word, at, sizeof(word));
    // High bit of each byte below `low`, of each above 0x7e (adding 1 reaches 0x80), and of
    // each with it set already. A borrow or carry can mark a byte after the first one that
    // qualifies, never one before it, so the lowest marked byte is exact.
    uint64_t marked = (((word - kOnes * low) & ~word) | (word + kOnes) | word) & kHighBits;
    if (marked != 0) return at + std::countr_zero(marked) / 8;
    at += 8;
  }
  while (at != end && static_cast<unsigned char>(*at) >= low &&
         static_cast<unsigned char>(*at) <= 0x7e) {
    ++at;
  }
  return at;
}

// `name` equals `lower` in any case. `lower` holds only lower-case letters and '-', so setting
// bit 0x20 folds a letter's case and can turn no other byte of a field's name or value (a
// token, or visible ASCII with blanks, never a CR) into a letter or '-'.
bool NameIs(std::string_view name, std::string_view lower) {
  if (name.size() != lower.size()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if ((name[i] | 0x20) != lower[i]) return false;
  }
  return true;
}

}  // namespace

std::optional<SimpleRequestHead> ParseSimpleRequestHead(std::string_view bytes) {
  // Never more than the limit, and never past the bytes read: an incomplete header runs into
  // `end` before its empty line.
  const char* const begin = bytes.data();
  const char* const end = begin + std::min(bytes.size(), kMaxSimpleHeaderBytes);
  const char* at = begin;
  SimpleRequestHead head;

  // The request line: METHOD SP target SP HTTP/1.1 CRLF.
  while (at < end && *at >= 'A' && *at <= 'Z') ++at;
  if (at == begin || at - begin > 32 || at >= end || *at != ' ') return std::nullopt;
  head.method = std::string_view(begin, static_cast<size_t>(at - begin));
  const char* target = ++at;
  at = SkipPlain<0x21>(at, end);
  if (at == target || at >= end || *at != ' ') return std::nullopt;
  head.target = std::string_view(target, static_cast<size_t>(at - target));
  ++at;
  static constexpr std::string_view kVersion = "HTTP/1.1\r\n";
  if (static_cast<size_t>(end - at) < kVersion.size() ||
      std::string_view(at, kVersion.size()) != kVersion) {
    return std::nullopt;
  }
  at += kVersion.size();

  bool has_content_length = false;
  for (;;) {
    if (at + 1 >= end) return std::nullopt;  // incomplete, or longer than the limit
    if (at[0] == '\r') {
      if (at[1] != '\n') return std::nullopt;
      at += 2;
      break;  // the empty line: the header is complete
    }
    // name ":" OWS value OWS CRLF; a line that starts with a blank is a folded one.
    const char* name_start = at;
    while (at < end && IsToken(*at)) ++at;
    if (at == name_start || at >= end || *at != ':') return std::nullopt;
    std::string_view name(name_start, static_cast<size_t>(at - name_start));
    ++at;
    while (at < end && IsBlank(*at)) ++at;
    const char* value_start = at;
    for (;;) {
      at = SkipPlain<0x20>(at, end);
      if (at == end || *at != '\t') break;
      ++at;  // a tab, allowed in a value
    }
    if (at + 1 >= end || at[0] != '\r' || at[1] != '\n') return std::nullopt;
    const char* value_end = at;
    while (value_end > value_start && IsBlank(value_end[-1])) --value_end;
    std::string_view value(value_start, static_cast<size_t>(value_end - value_start));
    at += 2;
    switch (name.size()) {
      case 6:
        if (NameIs(name, "expect")) return std::nullopt;
        break;
      case 7:
        if (NameIs(name, "upgrade")) return std::nullopt;
        break;
      case 10:
        if (NameIs(name, "connection")) {
          if (NameIs(value, "close")) {
            head.keep_alive = false;
          } else if (!NameIs(value, "keep-alive")) {
            return std::nullopt;
          }
        }
        break;
      case 13:
        if (NameIs(name, "authorization") && !head.authorization) head.authorization = value;
        break;
      case 14:
        if (NameIs(name, "content-length")) {
          if (has_content_length || value.empty() || value.size() > 18) return std::nullopt;
          uint64_t length = 0;
          for (char c : value) {
            if (c < '0' || c > '9') return std::nullopt;
            length = length * 10 + static_cast<uint64_t>(c - '0');
          }
          head.content_length = length;
          has_content_length = true;
        }
        break;
      case 16:
        if (NameIs(name, "proxy-connection")) return std::nullopt;
        break;
      case 17:
        if (NameIs(name, "transfer-encoding")) return std::nullopt;
        break;
      case 31:
        if (NameIs(name, "inference-header-content-length") &&
            !head.inference_header_content_length) {
          head.inference_header_content_length = value;
        }
        break;
      default:
        break;
    }
  }
  head.header_size = static_cast<size_t>(at - begin);
  return head;
}

}  // namespace shoal::serve
