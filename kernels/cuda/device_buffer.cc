#include "kernels/cuda/device_buffer.h"

#include <cuda_runtime.h>

#include <utility>

#include "absl/strings/str_format.h"
#include "kernels/cuda/cuda_status.h"

namespace ring::cuda {

DeviceBuffer::~DeviceBuffer() { Reset(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::Reset() {
  // cudaFree only fails on a corrupted context, where nothing useful can be done in a
  // destructor; the next checked call will report it.
  if (ptr_ != nullptr) cudaFree(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  DeviceBuffer b;
  if (bytes == 0) return b;
  const cudaError_t e = cudaMalloc(&b.ptr_, bytes);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky: clear it so the caller can retry smaller
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "cudaMalloc of %.3f GiB failed: %.3f GiB free of %.3f GiB", bytes / 1073741824.0,
        free_b / 1073741824.0, total_b / 1073741824.0));
  }
  RING_CUDA_RETURN_IF_ERROR(e);
  b.bytes_ = bytes;
  return b;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::FromHost(const void* src, size_t bytes) {
  absl::StatusOr<DeviceBuffer> b = Allocate(bytes);
  if (!b.ok()) return b;
  absl::Status s = b->CopyFromHost(src, bytes);
  if (!s.ok()) return s;
  return b;
}

absl::Status DeviceBuffer::CopyFromHost(const void* src, size_t bytes) {
  if (bytes > bytes_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("copy of %d bytes into a %d-byte device buffer", bytes, bytes_));
  }
  if (bytes == 0) return absl::OkStatus();
  RING_CUDA_RETURN_IF_ERROR(cudaMemcpy(ptr_, src, bytes, cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

absl::Status DeviceBuffer::CopyToHost(void* dst, size_t bytes) const {
  if (bytes > bytes_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("copy of %d bytes out of a %d-byte device buffer", bytes, bytes_));
  }
  if (bytes == 0) return absl::OkStatus();
  RING_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, ptr_, bytes, cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

absl::Status DeviceBuffer::Zero() {
  if (bytes_ == 0) return absl::OkStatus();
  RING_CUDA_RETURN_IF_ERROR(cudaMemset(ptr_, 0, bytes_));
  return absl::OkStatus();
}

StreamBuffer::~StreamBuffer() { Reset(); }

StreamBuffer::StreamBuffer(StreamBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      stream_(other.stream_) {}

StreamBuffer& StreamBuffer::operator=(StreamBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    stream_ = other.stream_;
  }
  return *this;
}

void StreamBuffer::Reset() {
  if (ptr_ != nullptr) cudaFreeAsync(ptr_, stream_);
  ptr_ = nullptr;
  bytes_ = 0;
}

absl::StatusOr<StreamBuffer> StreamBuffer::Allocate(size_t bytes, cudaStream_t stream) {
  StreamBuffer b;
  b.stream_ = stream;
  if (bytes == 0) return b;
  const cudaError_t e = cudaMallocAsync(&b.ptr_, bytes, stream);
  if (e != cudaSuccess) {
    b.ptr_ = nullptr;
    cudaGetLastError();
    return absl::Status(CudaCodeToStatusCode(e),
                        absl::StrFormat("cudaMallocAsync of %d bytes: %s", bytes,
                                        cudaGetErrorString(e)));
  }
  b.bytes_ = bytes;
  return b;
}

}  // namespace ring::cuda
