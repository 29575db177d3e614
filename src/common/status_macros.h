#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Propagate a non-OK absl::Status to the caller.
#define SHOAL_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::absl::Status shoal_status_ = (expr);         \
    if (!shoal_status_.ok()) return shoal_status_; \
  } while (false)

#define SHOAL_CONCAT_INNER_(a, b) a##b
#define SHOAL_CONCAT_(a, b) SHOAL_CONCAT_INNER_(a, b)

// `SHOAL_ASSIGN_OR_RETURN(auto x, MakeX());` binds the value or returns the error.
#define SHOAL_ASSIGN_OR_RETURN(lhs, expr) \
  SHOAL_ASSIGN_OR_RETURN_IMPL_(SHOAL_CONCAT_(shoal_statusor_, __LINE__), lhs, expr)
#define SHOAL_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
