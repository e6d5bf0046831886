// RETURN_IF_ERROR / ASSIGN_OR_RETURN for absl::Status and absl::StatusOr.
// Abseil 20220623 (Debian bookworm) ships neither.
#ifndef SLUICE_SERVER_COMMON_STATUS_MACROS_H_
#define SLUICE_SERVER_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Evaluates `expr` (an absl::Status) once and returns it from the enclosing
// function if it is not OK.
#define RETURN_IF_ERROR(expr)                        \
  do {                                               \
    ::absl::Status sluice_status_ = (expr);          \
    if (!sluice_status_.ok()) return sluice_status_; \
  } while (0)

#define SLUICE_CONCAT_INNER_(a, b) a##b
#define SLUICE_CONCAT_(a, b) SLUICE_CONCAT_INNER_(a, b)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status,
// otherwise moves the value into `lhs`, which may be a declaration:
//   ASSIGN_OR_RETURN(auto spec, ParseSpec(text));
#define ASSIGN_OR_RETURN(lhs, rexpr)                                        \
  SLUICE_ASSIGN_OR_RETURN_IMPL_(SLUICE_CONCAT_(sluice_statusor_, __LINE__), \
                                lhs, rexpr)

#define SLUICE_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                  \
  if (!statusor.ok()) return std::move(statusor).status();  \
  lhs = std::move(statusor).value()

#endif  // SLUICE_SERVER_COMMON_STATUS_MACROS_H_
