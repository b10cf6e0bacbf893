// File: kernels/cuda/arch_probe.cu
//
// A kernel that does nothing, so the runtime can tell us which of the binary's images it
// loaded for a device, and the list of architectures nvcc compiled this file for. Kept in
// a .cu because only nvcc defines __CUDA_ARCH_LIST__ and can form a kernel handle.
#include <cuda_runtime.h>

#include <vector>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/qgemv_internal.cuh"
#include "kernels/status.h"

namespace ring::cuda::internal {

__global__ void ArchProbeKernel() {}

absl::Status ProbeLoadedCode(int* ptx_cc, int* binary_cc) {
  cudaFuncAttributes attr{};
  RING_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attr, ArchProbeKernel));
  *ptx_cc = attr.ptxVersion;
  *binary_cc = attr.binaryVersion;
  return absl::OkStatus();
}

// One m16n8k16 bf16 MMA whose A operand is all 0x0040 (2^-127, a bf16 subnormal) and B all
// 2^64: each output is 16 * 2^-127 * 2^64 = 2^-59 exactly when the tensor cores keep
// subnormal inputs, 0 when they flush them.
__global__ void MmaSubnormalProbeKernel(float* out) {
  float c[4];
  const uint32_t a = 0x00400040u, b = 0x5f805f80u;
  MmaBf16Zero(c, a, a, a, a, b, b);
  if (threadIdx.x == 0) out[0] = c[0];
}

// Runs a one-block probe kernel that writes one T, and returns what it wrote.
template <class T>
absl::StatusOr<T> RunProbe(void (*kernel)(T*), int threads) {
  T* d = nullptr;
  RING_CUDA_RETURN_IF_ERROR(cudaMalloc(&d, sizeof(T)));
  kernel<<<1, threads>>>(d);
  T h{};
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaMemcpy(&h, d, sizeof(T), cudaMemcpyDeviceToHost);
  cudaFree(d);
  RING_CUDA_RETURN_IF_ERROR(e);
  return h;
}

absl::Status ProbeMmaSubnormals(bool* kept) {
  *kept = false;
  int dev = 0;
  RING_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  int major = 0;
  RING_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  if (major < 8) return absl::OkStatus();  // no bf16 MMA
  RING_ASSIGN_OR_RETURN(const float h, RunProbe(MmaSubnormalProbeKernel, 32));
  *kept = h == ldexpf(1.f, -59);
  return absl::OkStatus();
}

// Writes 1 when the image running it was compiled with Hopper's warpgroup MMA (sm_90a).
__global__ void WgmmaProbeKernel(int* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  out[0] = 1;
#else
  out[0] = 0;
#endif
}

absl::Status ProbeWgmma(bool* available) {
  *available = false;
  RING_ASSIGN_OR_RETURN(const int h, RunProbe(WgmmaProbeKernel, 1));
  *available = h == 1;
  return absl::OkStatus();
}

std::vector<int> CompiledArchList() {
#ifdef __CUDA_ARCH_LIST__
  // __CUDA_ARCH_LIST__ holds values like 900,1200 (10*(10*major+minor)).
  std::vector<int> archs = {__CUDA_ARCH_LIST__};
  for (int& a : archs) a /= 10;
  return archs;
#else
  return {};
#endif
}

}  // namespace ring::cuda::internal
