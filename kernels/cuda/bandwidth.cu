#include "kernels/cuda/bandwidth.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/status.h"

namespace ring::cuda {
namespace {

// Every 16-byte word read once; the XOR reduction keeps the loads from being dropped.
__global__ void ReadProbeKernel(const uint4* p, int64_t n, uint32_t* sink) {
  uint32_t acc = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;
}

}  // namespace

absl::Status LaunchReadPass(const void* data, int64_t bytes, uint32_t* sink, int grid,
                            cudaStream_t stream) {
  if (bytes % 16 != 0 || reinterpret_cast<uintptr_t>(data) % 16 != 0 || grid < 1) {
    return absl::InvalidArgumentError("LaunchReadPass: bytes and address must be 16-byte multiples, grid >= 1");
  }
  ReadProbeKernel<<<grid, 512, 0, stream>>>(static_cast<const uint4*>(data), bytes / 16, sink);
  RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::StatusOr<double> ReadBandwidth(int ordinal, int64_t bytes, int reps) {
  RING_ASSIGN_OR_RETURN(DeviceInfo dev, QueryDevice(ordinal));
  int prev = 0;
  RING_CUDA_RETURN_IF_ERROR(cudaGetDevice(&prev));
  RING_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  auto measure = [&]() -> absl::StatusOr<double> {
    RING_ASSIGN_OR_RETURN(DeviceBuffer buf, DeviceBuffer::Allocate(static_cast<size_t>(bytes)));
    RING_ASSIGN_OR_RETURN(DeviceBuffer sink, DeviceBuffer::Allocate(4));
    // Contents do not matter for a read probe, but the pages must be touched first.
    RING_CUDA_RETURN_IF_ERROR(cudaMemset(buf.data(), 0x5a, static_cast<size_t>(bytes)));
    cudaEvent_t a, b;
    RING_CUDA_RETURN_IF_ERROR(cudaEventCreate(&a));
    RING_CUDA_RETURN_IF_ERROR(cudaEventCreate(&b));
    const int64_t n = bytes / 16;
    double best = 0;
    cudaError_t err = cudaSuccess;
    for (int blocks_per_sm : {4, 8, 16}) {
      const unsigned grid = static_cast<unsigned>(std::max(1, dev.sm_count * blocks_per_sm));
      ReadProbeKernel<<<grid, 512>>>(buf.as<uint4>(), n, sink.as<uint32_t>());  // warm-up
      for (int r = 0; r < reps && err == cudaSuccess; ++r) {
        cudaEventRecord(a);
        ReadProbeKernel<<<grid, 512>>>(buf.as<uint4>(), n, sink.as<uint32_t>());
        cudaEventRecord(b);
        err = cudaEventSynchronize(b);
        if (err != cudaSuccess) break;
        float ms = 0;
        cudaEventElapsedTime(&ms, a, b);
        if (ms > 0) best = std::max(best, static_cast<double>(n * 16) / (ms * 1e-3));
      }
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    RING_CUDA_RETURN_IF_ERROR(err);
    RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return best;
  };
  absl::StatusOr<double> r = measure();
  cudaSetDevice(prev);
  return r;
}

}  // namespace ring::cuda
