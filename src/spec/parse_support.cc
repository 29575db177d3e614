#include "spec/parse_support.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spec/job_section.h"

namespace shoal::spec {

std::string Printable(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    unsigned char u = static_cast<unsigned char>(c);
    if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (u < 0x20 || u == 0x7f) {
      out += absl::StrFormat("\\x%02x", u);
    } else {
      out += c;
    }
  }
  return out;
}

std::string Where(absl::string_view source, int line) {
  std::string name = source.empty() ? std::string("job") : Printable(source);
  return line > 0 ? absl::StrCat(name, ":", line) : name;
}

std::string JoinKey(absl::string_view path, absl::string_view key) {
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
}

std::optional<bool> ParseBool(absl::string_view text) {
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  return std::nullopt;
}

std::optional<int64_t> ParseInt(absl::string_view text) {
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) return std::nullopt;
  return value;
}

std::optional<double> ParseNumber(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  if (text.empty()) return std::nullopt;
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value,
                                   std::chars_format::general);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value)) {
    return std::nullopt;
  }
  return value;
}

namespace {

size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t substitute = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, substitute});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

std::optional<absl::string_view> Closest(absl::string_view word,
                                        absl::Span<const absl::string_view> choices) {
  std::optional<absl::string_view> best;
  size_t best_distance = 3;
  std::string lower = absl::AsciiStrToLower(word);
  for (absl::string_view choice : choices) {
    size_t d = EditDistance(lower, choice);
    if (d < best_distance) {
      best_distance = d;
      best = choice;
    }
  }
  return best;
}

bool IsValidJobName(absl::string_view s) {
  if (s.empty() || s.size() > 63 || !absl::ascii_isalnum(static_cast<unsigned char>(s[0]))) {
    return false;
  }
  return std::all_of(s.begin(), s.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

bool IsValidRoleName(absl::string_view s) {
  if (s.empty() || !absl::ascii_isalpha(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
}

bool IsValidEnvName(absl::string_view s) {
  if (s.empty() || absl::ascii_isdigit(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

bool IsPlainScalar(const YAML::Node& node) { return node.IsScalar() && node.Tag() == "?"; }

bool HasNul(absl::string_view text) { return text.find('\0') != absl::string_view::npos; }

std::string Describe(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "nothing";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a map";
  std::string text = node.Scalar();
  if (IsPlainScalar(node) && ParseNumber(text)) return text;
  if (text.size() > 60) text = absl::StrCat(text.substr(0, 57), "...");
  return absl::StrCat("'", text, "'");
}

std::string FormatCount(double n) { return absl::StrFormat("%.6g", n); }

std::string ResolveDir(const std::string& base, const std::string& dir) {
  std::filesystem::path p(dir);
  if (p.is_relative()) p = std::filesystem::path(base) / p;
  std::string s = p.lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

bool HasUriScheme(absl::string_view s) {
  size_t colon = s.find("://");
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::ascii_isalpha(static_cast<unsigned char>(s[0]))) {
    return false;
  }
  return std::all_of(s.begin(), s.begin() + colon, [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.';
  });
}

std::string AbsoluteBaseDir(const std::string& base_dir) {
  std::error_code ec;
  std::filesystem::path cwd = std::filesystem::current_path(ec);
  if (ec) cwd = "/";
  if (base_dir.empty()) return ResolveDir(cwd.string(), ".");
  return ResolveDir(cwd.string(), base_dir);
}

std::string DescribeText(absl::string_view text) {
  std::string shown(text);
  if (shown.size() > 60) shown = absl::StrCat(shown.substr(0, 57), "...");
  return Printable(absl::StrCat("'", shown, "'"));
}

}  // namespace shoal::spec
