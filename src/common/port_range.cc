#include "common/port_range.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace shoal {

absl::StatusOr<PortRange> ParsePortRange(std::string_view text) {
  std::pair<absl::string_view, absl::string_view> ends =
      absl::StrSplit(absl::string_view(text.data(), text.size()), absl::MaxSplits('-', 1));
  uint32_t low = 0, high = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(ends.first), &low) ||
      !absl::SimpleAtoi(absl::StripAsciiWhitespace(ends.second), &high)) {
    return absl::InvalidArgumentError("expected a port range LOW-HIGH, e.g. 20000-20999");
  }
  if (low < 1024 || high > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("ports must be from 1024 to 65535 (unprivileged); got ", low, "-", high));
  }
  if (low > high) {
    return absl::InvalidArgumentError(absl::StrCat("the range ", low, "-", high, " is empty"));
  }
  return PortRange{low, high};
}

}  // namespace shoal
