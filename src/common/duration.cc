#include "common/duration.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace shoal {

std::optional<std::chrono::milliseconds> ParseDuration(std::string_view text) {
  // absl::string_view may not be std::string_view in this abseil build.
  absl::string_view s = absl::StripAsciiWhitespace(absl::string_view(text.data(), text.size()));
  size_t i = 0;
  bool seen_digit = false;
  bool seen_dot = false;
  while (i < s.size() && (absl::ascii_isdigit(static_cast<unsigned char>(s[i])) ||
                          (s[i] == '.' && !seen_dot))) {
    if (s[i] == '.') {
      seen_dot = true;
    } else {
      seen_digit = true;
    }
    ++i;
  }
  if (!seen_digit) return std::nullopt;
  // Only digits and one '.' are left in the number, so strtod reads all of it.
  double number = std::strtod(std::string(s.substr(0, i)).c_str(), nullptr);

  absl::string_view unit = s.substr(i);
  double factor = 0;
  if (unit.empty() || unit == "s") {
    factor = 1000;
  } else if (unit == "ms") {
    factor = 1;
  } else if (unit == "m") {
    factor = 60'000;
  } else if (unit == "h") {
    factor = 3'600'000;
  } else {
    return std::nullopt;
  }
  double ms = std::round(number * factor);
  if (!std::isfinite(ms) || ms > static_cast<double>(kMaxDuration.count())) return std::nullopt;
  return std::chrono::milliseconds(static_cast<int64_t>(ms));
}

std::string FormatDuration(std::chrono::milliseconds d) {
  int64_t ms = d.count();
  if (ms == 0) return "0s";
  if (ms % 3'600'000 == 0) return absl::StrCat(ms / 3'600'000, "h");
  if (ms % 60'000 == 0) return absl::StrCat(ms / 60'000, "m");
  if (ms % 1000 == 0) return absl::StrCat(ms / 1000, "s");
  return absl::StrCat(ms, "ms");
}

}  // namespace shoal
