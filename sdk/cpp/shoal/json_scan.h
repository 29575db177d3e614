#pragma once

// Just enough JSON for the agent's flat replies and WebHDFS's answers: string literals written
// and read, and the value of a key found by scanning. No document is built: the SDK has no
// dependencies beyond the standard library.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

namespace shoal::sdk {

namespace internal {

inline std::string JsonString(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", static_cast<unsigned>(c));
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

inline size_t SkipSpace(std::string_view text, size_t pos) {
  while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\t' || text[pos] == '\r')) ++pos;
  return pos;
}

// Where the value of the top-level-looking key `"key":` starts in a one-line JSON object, or
// npos. Enough for the agent's flat replies (`{"ok":false,"error":"..."}`).
inline size_t FindValue(std::string_view json, std::string_view key) {
  std::string quoted = JsonString(key);
  for (size_t pos = json.find(quoted); pos != std::string_view::npos;
       pos = json.find(quoted, pos + 1)) {
    size_t colon = SkipSpace(json, pos + quoted.size());
    if (colon < json.size() && json[colon] == ':') return SkipSpace(json, colon + 1);
  }
  return std::string_view::npos;
}

inline bool ReplyOk(std::string_view json) {
  size_t value = FindValue(json, "ok");
  return value != std::string_view::npos && json.substr(value, 4) == "true";
}

inline std::string ReplyError(std::string_view json) {
  size_t pos = FindValue(json, "error");
  if (pos == std::string_view::npos || json[pos] != '"') return "no reason given";
  std::string out;
  for (++pos; pos < json.size() && json[pos] != '"'; ++pos) {
    if (json[pos] == '\\' && pos + 1 < json.size()) {
      char c = json[++pos];
      out += c == 'n' ? '\n' : c == 't' ? '\t' : c;
    } else {
      out += json[pos];
    }
  }
  return out;
}

// A JSON string literal starting at json[pos] ('"'), decoded (\uXXXX as UTF-8, BMP only);
// `pos` is left after it. nullopt when malformed.
inline std::optional<std::string> ParseJsonString(std::string_view json, size_t* pos) {
  if (*pos >= json.size() || json[*pos] != '"') return std::nullopt;
  std::string out;
  for (size_t i = *pos + 1; i < json.size(); ++i) {
    char c = json[i];
    if (c == '"') {
      *pos = i + 1;
      return out;
    }
    if (c != '\\') {
      out += c;
      continue;
    }
    if (++i >= json.size()) return std::nullopt;
    switch (json[i]) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'u': {
        if (i + 4 >= json.size()) return std::nullopt;
        unsigned code = static_cast<unsigned>(
            std::strtoul(std::string(json.substr(i + 1, 4)).c_str(), nullptr, 16));
        i += 4;
        if (code < 0x80) {
          out += static_cast<char>(code);
        } else if (code < 0x800) {
          out += static_cast<char>(0xC0 | (code >> 6));
          out += static_cast<char>(0x80 | (code & 0x3F));
        } else {
          out += static_cast<char>(0xE0 | (code >> 12));
          out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
          out += static_cast<char>(0x80 | (code & 0x3F));
        }
        break;
      }
      default: out += json[i];
    }
  }
  return std::nullopt;
}

// The value of {"boolean": true|false}; nullopt when absent.
inline std::optional<bool> JsonBoolean(std::string_view json) {
  size_t value = FindValue(json, "boolean");
  if (value == std::string_view::npos) return std::nullopt;
  if (json.substr(value, 4) == "true") return true;
  if (json.substr(value, 5) == "false") return false;
  return std::nullopt;
}

}  // namespace internal

}  // namespace shoal::sdk
