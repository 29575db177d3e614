#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace shoal {

// Parses sizes such as "2GiB", "512MiB", "1.5G", "1000000" (bytes). Binary suffixes (KiB, MiB,
// GiB, TiB) and their short forms (K, M, G, T) are powers of 1024; decimal KB, MB, GB, TB are
// powers of 1000. Fractions are rounded to whole bytes, but a fraction of a byte ("1.5B", "0.5")
// is refused. Anything else is an InvalidArgument naming the accepted forms.
absl::StatusOr<uint64_t> ParseByteSize(std::string_view text);

// 2147483648 -> "2GiB"; non-round values get one decimal ("1.5GiB").
std::string FormatByteSize(uint64_t bytes);

}  // namespace shoal
