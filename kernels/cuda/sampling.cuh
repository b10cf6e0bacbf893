// File: kernels/cuda/sampling.cuh
//
// Token selection from logits that stay on the GPU. Greedy only for now (cpu::ArgMax:
// the first maximal index of each row); top-k / top-p sampling will join it here.
#ifndef RINGSERVE_KERNELS_CUDA_SAMPLING_CUH_
#define RINGSERVE_KERNELS_CUDA_SAMPLING_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"

namespace ring::cuda {

// out[r] = argmax of x[r, 0..n) (lowest index among equal maxima); device pointers.
absl::Status ArgMaxRows(const float* x, int64_t rows, int64_t n, int32_t* out,
                        cudaStream_t stream);

}  // namespace ring::cuda

#endif  // RINGSERVE_KERNELS_CUDA_SAMPLING_CUH_
