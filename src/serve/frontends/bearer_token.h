#pragma once

#include <string_view>

namespace shoal::serve {

// Whether `header` (an HTTP Authorization header or gRPC `authorization` metadata value) is
// exactly "Bearer <token>". Takes the same time wherever the two differ, so that the time of
// a refusal says nothing about the token.
bool BearerTokenMatches(std::string_view header, std::string_view token);

}  // namespace shoal::serve
