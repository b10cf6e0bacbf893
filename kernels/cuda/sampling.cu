// Kernels behind sampling.cuh: one block per row; each thread scans a strided slice, then a
// shared-memory reduction of (value, index) pairs that prefers the larger value and, among
// equal values, the lower index (cpu::ArgMax's `x[i] > x[best]` scan).
#include "kernels/cuda/sampling.cuh"

#include "kernels/cuda/cuda_status.h"

namespace ring::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ bool Better(float v, int64_t i, float bv, int64_t bi) {
  return v > bv || (v == bv && i < bi);
}

__global__ void __launch_bounds__(kThreads) ArgMaxKernel(const float* x, int64_t n, int32_t* out) {
  __shared__ float sv[kThreads];
  __shared__ int64_t si[kThreads];
  const float* row = x + static_cast<int64_t>(blockIdx.x) * n;
  float bv = -INFINITY;
  int64_t bi = n;  // "none yet"
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const float v = row[i];
    if (bi == n || v > bv) {
      bv = v;
      bi = i;
    }
  }
  sv[threadIdx.x] = bv;
  si[threadIdx.x] = bi;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const float v = sv[threadIdx.x + s];
      const int64_t i = si[threadIdx.x + s];
      if (i < n && (si[threadIdx.x] == n || Better(v, i, sv[threadIdx.x], si[threadIdx.x]))) {
        sv[threadIdx.x] = v;
        si[threadIdx.x] = i;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<int32_t>(si[0] == n ? 0 : si[0]);
}

}  // namespace

absl::Status ArgMaxRows(const float* x, int64_t rows, int64_t n, int32_t* out,
                        cudaStream_t stream) {
  if (rows <= 0) return absl::OkStatus();
  if (x == nullptr || out == nullptr || n <= 0) {
    return absl::InvalidArgumentError("argmax: null pointer or empty row");
  }
  if (rows > 0x7fffffff || n > 0x7fffffff) return absl::InvalidArgumentError("argmax: too large");
  ArgMaxKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, n, out);
  RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace ring::cuda
