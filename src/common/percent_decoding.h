#pragma once

#include <string>
#include <string_view>

namespace shoal::common {

// A URL path's %XX escapes decoded ("%41" -> "A", "a%2Fb" -> "a/b"); a '%' not followed by two
// hex digits stays as it is, and '+' is left alone (it means a space only in query strings).
std::string PercentDecoded(std::string_view text);

}  // namespace shoal::common
