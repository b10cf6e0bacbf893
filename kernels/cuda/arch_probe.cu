// File: kernels/cuda/arch_probe.cu
//
// A kernel that does nothing, so the runtime can tell us which of the binary's images it
// loaded for a device, and the list of architectures nvcc compiled this file for. Kept in
// a .cu because only nvcc defines __CUDA_ARCH_LIST__ and can form a kernel handle.
#include <cuda_runtime.h>

#include <vector>

#include "kernels/cuda/cuda_status.h"

namespace ring::cuda::internal {

__global__ void ArchProbeKernel() {}

absl::Status ProbeLoadedCode(int* ptx_cc, int* binary_cc) {
  cudaFuncAttributes attr{};
  RING_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attr, ArchProbeKernel));
  *ptx_cc = attr.ptxVersion;
  *binary_cc = attr.binaryVersion;
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
