// Status propagation helpers. Abseil's own macros are not public in the Debian release we build
// against, so the project carries these two.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SPECULA_CONCAT_INNER(a, b) a##b
#define SPECULA_CONCAT(a, b) SPECULA_CONCAT_INNER(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                         \
  do {                                                \
    ::absl::Status _specula_status = (expr);          \
    if (!_specula_status.ok()) return _specula_status; \
  } while (0)

// `lhs` = value of `rexpr` (an absl::StatusOr<T>), or returns its status from the enclosing function.
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  ASSIGN_OR_RETURN_IMPL(SPECULA_CONCAT(_specula_statusor_, __LINE__), lhs, rexpr)
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                          \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()
