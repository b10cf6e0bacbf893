// File: kernels/cuda/cuda_status.h
//
// The one way GPU runtime errors leave the CUDA backend: as an absl::Status that names the
// failing expression and the file:line it was written at. Kernels never abort the process;
// callers decide (a stage reports the error upstream, a test fails with the message).
//
//   RING_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
//   RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());   // after a kernel launch
//
// The macro is generic over the library: RING_GPU_RETURN_IF_ERROR_ takes the success code,
// a code -> absl::StatusCode classifier and code -> name / text functions, so NCCL has its
// own one-line macro, RING_NCCL_RETURN_IF_ERROR, in nccl_status.h (kept apart so that only
// code that talks to NCCL needs nccl.h).
#ifndef RINGSERVE_KERNELS_CUDA_CUDA_STATUS_H_
#define RINGSERVE_KERNELS_CUDA_CUDA_STATUS_H_

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ring::cuda {

// Out-of-memory is the one error a caller can act on (smaller batch, fewer layers), so it
// is ResourceExhausted; a missing/old driver or a binary without code for the device is an
// environment problem (FailedPrecondition); everything else is Internal.
inline absl::StatusCode CudaCodeToStatusCode(cudaError_t e) {
  switch (e) {
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorInvalidDevice:
      return absl::StatusCode::kFailedPrecondition;
    case cudaErrorInvalidValue:
      return absl::StatusCode::kInvalidArgument;
    default:
      return absl::StatusCode::kInternal;
  }
}

inline const char* CudaCodeName(cudaError_t e) { return cudaGetErrorName(e); }
inline const char* CudaCodeText(cudaError_t e) { return cudaGetErrorString(e); }

namespace internal {
// Strips the build machine's prefix so messages read "kernels/cuda/qgemv.cu:123".
inline absl::string_view ShortPath(absl::string_view file) {
  for (absl::string_view root : {"kernels/", "bench/", "models/", "server/", "tests/"}) {
    const size_t pos = file.rfind(root);
    if (pos != absl::string_view::npos) return file.substr(pos);
  }
  return file;
}

// `Text` returns anything absl::StrCat takes: CUDA's text is a static string, NCCL's is
// assembled (error string + the library's last-error detail).
template <typename Code, typename Text>
absl::Status GpuCallStatus(Code code, absl::StatusCode (*classify)(Code),
                           const char* (*name)(Code), Text (*text)(Code),
                           const char* expr, const char* file, int line) {
  return absl::Status(classify(code),
                      absl::StrCat(name(code), " (", text(code), ") at ", ShortPath(file), ":",
                                   line, " in `", expr, "`"));
}
}  // namespace internal
}  // namespace ring::cuda

// code_expr must evaluate to the library's code type; text is what the message quotes.
#define RING_GPU_RETURN_IF_ERROR_(code_expr, text_expr, ok_code, classify, name, text)  \
  do {                                                                                \
    const auto ring_gpu_code_ = (code_expr);                                          \
    if (ring_gpu_code_ != (ok_code)) {                                                \
      return ::ring::cuda::internal::GpuCallStatus(ring_gpu_code_, classify, name, text, \
                                                   text_expr, __FILE__, __LINE__);    \
    }                                                                                 \
  } while (0)

#define RING_CUDA_RETURN_IF_ERROR(expr)                                                   \
  RING_GPU_RETURN_IF_ERROR_(static_cast<cudaError_t>(expr), #expr, cudaSuccess,          \
                            ::ring::cuda::CudaCodeToStatusCode, ::ring::cuda::CudaCodeName, \
                            ::ring::cuda::CudaCodeText)

#endif  // RINGSERVE_KERNELS_CUDA_CUDA_STATUS_H_
