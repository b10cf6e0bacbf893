// File: kernels/status.h
//
// Status plumbing shared by every module. The Abseil in Debian 12 (20220623) predates
// absl/status/status_macros.h, so the two usual macros are defined here once.
//
//   RING_RETURN_IF_ERROR(DoThing());
//   RING_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
#ifndef RINGSERVE_KERNELS_STATUS_H_
#define RINGSERVE_KERNELS_STATUS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define RING_STATUS_CONCAT_INNER_(a, b) a##b
#define RING_STATUS_CONCAT_(a, b) RING_STATUS_CONCAT_INNER_(a, b)

#define RING_RETURN_IF_ERROR(expr)                  \
  do {                                              \
    ::absl::Status ring_status_ = (expr);           \
    if (!ring_status_.ok()) return ring_status_;    \
  } while (0)

#define RING_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()

#define RING_ASSIGN_OR_RETURN(lhs, expr) \
  RING_ASSIGN_OR_RETURN_IMPL_(RING_STATUS_CONCAT_(ring_statusor_, __LINE__), lhs, expr)

#endif  // RINGSERVE_KERNELS_STATUS_H_
