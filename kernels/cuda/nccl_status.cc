#include "kernels/cuda/nccl_status.h"

#include <atomic>

#include "absl/strings/str_cat.h"

namespace ring::cuda {
namespace {
std::atomic<const char* (*)(ncclResult_t)> g_error_string{nullptr};
std::atomic<const char* (*)(ncclComm_t)> g_last_error{nullptr};
}  // namespace

absl::StatusCode NcclCodeToStatusCode(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return absl::StatusCode::kOk;
    case ncclSystemError:
    case ncclRemoteError:
      return absl::StatusCode::kUnavailable;
    case ncclInvalidArgument:
      return absl::StatusCode::kInvalidArgument;
    case ncclInvalidUsage:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

const char* NcclCodeName(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return "ncclResult(unknown)";
  }
}

std::string NcclCodeText(ncclResult_t r) {
  const auto error_string = g_error_string.load(std::memory_order_acquire);
  const auto last_error = g_last_error.load(std::memory_order_acquire);
  if (error_string == nullptr) return "NCCL not loaded";
  std::string text = error_string(r);
  // The last-error text is the library's most recent message (the comm argument is unused
  // by NCCL); it usually says which peer or system call failed.
  const char* detail = last_error != nullptr ? last_error(nullptr) : nullptr;
  if (detail != nullptr && detail[0] != '\0') absl::StrAppend(&text, ": ", detail);
  return text;
}

namespace internal {
void SetNcclTextSource(const char* (*error_string)(ncclResult_t),
                       const char* (*last_error)(ncclComm_t)) {
  g_last_error.store(last_error, std::memory_order_release);
  g_error_string.store(error_string, std::memory_order_release);
}
}  // namespace internal
}  // namespace ring::cuda
