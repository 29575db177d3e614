#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

namespace shoal {

// The longest duration ParseDuration accepts: about 31 years. Anything longer is a slip, and the
// bound keeps sums and products of parsed durations (interval x misses, backoff doubling) far
// from overflowing.
inline constexpr std::chrono::milliseconds kMaxDuration{1'000'000'000'000};

// Parses durations written as a number and a unit: "500ms", "1.5s", "2m", "1h". Units are
// lowercase ms, s, m and h; a bare number ("30", "0.5") means seconds. Surrounding whitespace
// is ignored; signs, exponents, spaces inside and other units are not accepted. Fractions are
// rounded to the nearest millisecond. Returns nullopt for anything else, a negative value or
// one above kMaxDuration; the caller words the message, e.g. "must be a duration such as 500ms,
// 30s or 2m".
std::optional<std::chrono::milliseconds> ParseDuration(std::string_view text);

// 90000ms -> "90s", 120000ms -> "2m", 1500ms -> "1500ms", 0 -> "0s": the largest unit that
// divides the value exactly, in a form ParseDuration reads back.
std::string FormatDuration(std::chrono::milliseconds d);

}  // namespace shoal
