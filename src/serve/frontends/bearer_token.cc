#include "serve/frontends/bearer_token.h"

namespace shoal::serve {

bool BearerTokenMatches(std::string_view header, std::string_view token) {
  constexpr std::string_view kScheme = "Bearer ";
  if (header.size() != kScheme.size() + token.size() || header.substr(0, kScheme.size()) != kScheme) {
    return false;
  }
  unsigned char diff = 0;
  for (size_t i = 0; i < token.size(); ++i) {
    diff |= static_cast<unsigned char>(header[kScheme.size() + i] ^ token[i]);
  }
  return diff == 0;
}

}  // namespace shoal::serve
