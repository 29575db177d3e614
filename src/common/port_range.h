#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace shoal {

// A range of TCP ports, both ends included.
struct PortRange {
  uint32_t low = 0;
  uint32_t high = 0;
};

// "LOW-HIGH" (e.g. "20000-20999"), unprivileged ports (1024-65535), LOW <= HIGH. The error
// says which of these the text breaks.
absl::StatusOr<PortRange> ParsePortRange(std::string_view text);

}  // namespace shoal
