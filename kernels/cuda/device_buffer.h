// File: kernels/cuda/device_buffer.h
//
// DeviceBuffer: owns one cudaMalloc allocation; move-only; frees on destruction. Allocation
// and copies return Status (ResourceExhausted on out-of-memory) instead of aborting.
//
//   RING_ASSIGN_OR_RETURN(DeviceBuffer buf, DeviceBuffer::Allocate(bytes));
//   RING_RETURN_IF_ERROR(buf.CopyFromHost(host.data(), bytes));
#ifndef RINGSERVE_KERNELS_CUDA_DEVICE_BUFFER_H_
#define RINGSERVE_KERNELS_CUDA_DEVICE_BUFFER_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ring::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // A zero-byte request gives an empty buffer (data() == nullptr), not an error.
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes);
  // Allocates and uploads `bytes` from host memory.
  static absl::StatusOr<DeviceBuffer> FromHost(const void* src, size_t bytes);
  template <typename T>
  static absl::StatusOr<DeviceBuffer> FromVector(const std::vector<T>& v) {
    return FromHost(v.data(), v.size() * sizeof(T));
  }

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t size() const { return bytes_; }

  // Synchronous copies of the first `bytes` (must be <= size()).
  absl::Status CopyFromHost(const void* src, size_t bytes);
  absl::Status CopyToHost(void* dst, size_t bytes) const;
  absl::Status Zero();

  template <typename T>
  absl::StatusOr<std::vector<T>> ToVector(size_t count) const {
    std::vector<T> v(count);
    absl::Status s = CopyToHost(v.data(), count * sizeof(T));
    if (!s.ok()) return s;
    return v;
  }

 private:
  void Reset();
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Stream-ordered scratch for an op's temporaries: cudaMallocAsync on `stream`, and
// cudaFreeAsync on the same stream when destroyed, so the memory is reused only after the
// work queued before the free has finished. Move-only.
class StreamBuffer {
 public:
  StreamBuffer() = default;
  ~StreamBuffer();
  StreamBuffer(StreamBuffer&& other) noexcept;
  StreamBuffer& operator=(StreamBuffer&& other) noexcept;
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;

  static absl::StatusOr<StreamBuffer> Allocate(size_t bytes, cudaStream_t stream);
  void* data() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t size() const { return bytes_; }

 private:
  void Reset();
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  cudaStream_t stream_ = nullptr;
};

}  // namespace ring::cuda

#endif  // RINGSERVE_KERNELS_CUDA_DEVICE_BUFFER_H_
