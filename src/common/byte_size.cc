#include "common/byte_size.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"

namespace shoal {

absl::StatusOr<uint64_t> ParseByteSize(std::string_view text) {
  std::string owned(text);
  std::string_view s = owned;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  size_t i = 0;
  bool seen_digit = false, seen_dot = false;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || (s[i] == '.' && !seen_dot))) {
    if (s[i] == '.') seen_dot = true; else seen_digit = true;
    ++i;
  }
  auto invalid = [&] {
    return absl::InvalidArgumentError(absl::StrFormat(
        "'%s' is not a size; expected a number with an optional unit, e.g. 512MiB, 2GiB, 1.5G, 4GB",
        std::string(text)));
  };
  if (!seen_digit) return invalid();
  double number = std::strtod(std::string(s.substr(0, i)).c_str(), nullptr);
  std::string unit = absl::AsciiStrToLower(std::string(s.substr(i)));
  while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  static const std::pair<const char*, double> kUnits[] = {
      {"", 1},           {"b", 1},
      {"k", 1024.0},     {"ki", 1024.0},   {"kib", 1024.0},  {"kb", 1e3},
      {"m", 1048576.0},  {"mi", 1048576.0}, {"mib", 1048576.0}, {"mb", 1e6},
      {"g", 1073741824.0}, {"gi", 1073741824.0}, {"gib", 1073741824.0}, {"gb", 1e9},
      {"t", 1099511627776.0}, {"ti", 1099511627776.0}, {"tib", 1099511627776.0}, {"tb", 1e12},
  };
  for (const auto& [name, factor] : kUnits) {
    if (unit == name) {
      // A fraction of a larger unit is rounded to whole bytes; a fraction of a byte is a slip.
      if (factor == 1 && number != std::floor(number)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "'%s' is not a whole number of bytes; write a whole number, or a fraction of a larger "
            "unit such as 1.5KiB",
            std::string(text)));
      }
      double bytes = std::round(number * factor);
      if (!std::isfinite(bytes) || bytes > 1.8e19) return invalid();
      return static_cast<uint64_t>(bytes);
    }
  }
  return invalid();
}

std::string FormatByteSize(uint64_t bytes) {
  static const char* kNames[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024.0 && unit < 4) {
    v /= 1024.0;
    ++unit;
  }
  if (std::fabs(v - std::round(v)) < 1e-9) return absl::StrFormat("%.0f%s", v, kNames[unit]);
  return absl::StrFormat("%.1f%s", v, kNames[unit]);
}

}  // namespace shoal
