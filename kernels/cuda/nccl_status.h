// File: kernels/cuda/nccl_status.h
//
// NCCL results as absl::Status, through the same macro family as CUDA's (cuda_status.h):
// the message names the NCCL code, its text, the file:line and the failing expression.
//
//   RING_NCCL_RETURN_IF_ERROR(api.comm_abort(comm));
//   if (async != ncclSuccess) return RING_NCCL_STATUS(async, "ncclCommGetAsyncError(comm)");
//
// NCCL is loaded at run time (nccl_link.h), so the text comes from the loaded library's
// ncclGetErrorString plus its ncclGetLastError detail once a library is loaded, and from a
// built-in table before that (or when none exists). Only nccl.h's types are used here.
#ifndef RINGSERVE_KERNELS_CUDA_NCCL_STATUS_H_
#define RINGSERVE_KERNELS_CUDA_NCCL_STATUS_H_

#include <nccl.h>

#include <string>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_status.h"

namespace ring::cuda {

// A peer that went away (remote error) or a system/socket failure is Unavailable: the
// caller can fall back to another transport. Misuse is InvalidArgument/FailedPrecondition;
// everything else (CUDA inside NCCL, internal) is Internal.
absl::StatusCode NcclCodeToStatusCode(ncclResult_t r);
const char* NcclCodeName(ncclResult_t r);
std::string NcclCodeText(ncclResult_t r);

namespace internal {
// Called once by the NCCL loader: where NcclCodeText gets the library's own words.
void SetNcclTextSource(const char* (*error_string)(ncclResult_t),
                       const char* (*last_error)(ncclComm_t));
}  // namespace internal
}  // namespace ring::cuda

// The Status for an NCCL code obtained other than as a call's return value (an async error).
#define RING_NCCL_STATUS(code, what)                                                    \
  ::ring::cuda::internal::GpuCallStatus(static_cast<ncclResult_t>(code),                \
                                        ::ring::cuda::NcclCodeToStatusCode,             \
                                        ::ring::cuda::NcclCodeName,                     \
                                        ::ring::cuda::NcclCodeText, what, __FILE__, __LINE__)

#define RING_NCCL_RETURN_IF_ERROR(expr)                                                   \
  RING_GPU_RETURN_IF_ERROR_(static_cast<ncclResult_t>(expr), #expr, ncclSuccess,         \
                            ::ring::cuda::NcclCodeToStatusCode, ::ring::cuda::NcclCodeName, \
                            ::ring::cuda::NcclCodeText)

#endif  // RINGSERVE_KERNELS_CUDA_NCCL_STATUS_H_
