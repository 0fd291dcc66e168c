// Error plumbing: Status at boundaries, CHECK for internal invariants.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define WM_STATUS_CONCAT_INNER(a, b) a##b
#define WM_STATUS_CONCAT(a, b) WM_STATUS_CONCAT_INNER(a, b)

#define WM_RETURN_IF_ERROR(expr)                  \
  do {                                            \
    ::absl::Status wm_status_ = (expr);           \
    if (!wm_status_.ok()) return wm_status_;      \
  } while (0)

#define WM_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(*tmp)

#define WM_ASSIGN_OR_RETURN(lhs, expr) \
  WM_ASSIGN_OR_RETURN_IMPL(WM_STATUS_CONCAT(wm_statusor_, __LINE__), lhs, expr)

// internal invariants only: never for anything a client or a file can send
#define WM_CHECK(cond)                                                              \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)
