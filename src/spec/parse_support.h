#pragma once

// Helpers of the job-file parser (spec/job_file_parser.h) for reading values and writing
// messages. Internal to spec/.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "yaml-cpp/yaml.h"

namespace shoal::spec {

inline constexpr char kNulMessage[] =
    "must not contain a NUL byte (\\x00): paths, arguments and environment variables end at "
    "the first one";

// User text as messages print it: control bytes (a NUL, a tab, an escape sequence) written as
// \x00, \t and so on, so that each problem stays one line of plain text whatever the file or
// its name holds.
std::string Printable(absl::string_view text);

// "file:line" or just "file" when the line is unknown (0), as in hand-built specs.
std::string Where(absl::string_view source, int line);

std::string JoinKey(absl::string_view path, absl::string_view key);

// The YAML 1.2 core schema's booleans; YAML 1.1's yes/no/on/off are refused so that a country
// code or a stray "no" never turns into a bool by accident.
std::optional<bool> ParseBool(absl::string_view text);

std::optional<int64_t> ParseInt(absl::string_view text);

// A finite decimal number ("1", "0.5", "+2", "1e3"); not inf, nan or hex.
std::optional<double> ParseNumber(absl::string_view text);

// The closest of `choices` within edit distance 2, for "did you mean" hints.
std::optional<absl::string_view> Closest(absl::string_view word,
                                        absl::Span<const absl::string_view> choices);

bool IsValidJobName(absl::string_view s);

bool IsValidRoleName(absl::string_view s);

bool IsValidEnvName(absl::string_view s);

bool IsPlainScalar(const YAML::Node& node);

// A NUL ends a C string: a path, argument or variable holding one would be cut short at exec.
bool HasNul(absl::string_view text);

// How a value reads in "got ..." messages: numbers as written, other text quoted and cut short.
std::string Describe(const YAML::Node& node);

std::string FormatCount(double n);

// Resolves `dir` against `base` and drops "." and ".." parts and any trailing '/'.
std::string ResolveDir(const std::string& base, const std::string& dir);

// "hdfs://nn/ckpt", "s3://bucket/x": a scheme of letters, digits, '+', '-' and '.' that starts
// with a letter, then "://".
bool HasUriScheme(absl::string_view s);

std::string AbsoluteBaseDir(const std::string& base_dir);

}  // namespace shoal::spec
