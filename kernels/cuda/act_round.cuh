// File: kernels/cuda/act_round.cuh
//
// The device form of the CPU reference's activation rounding (cpu::RoundAct), one definition
// for every kernel family that rounds (elementwise, attention, indexer, MoE).
#ifndef RINGSERVE_KERNELS_CUDA_ACT_ROUND_CUH_
#define RINGSERVE_KERNELS_CUDA_ACT_ROUND_CUH_

#include <cuda_runtime.h>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/quant_decode.cuh"

namespace ring::cuda {

// cpu::RoundAct: v rounded to the activation dtype's values, kept as fp32.
__device__ __forceinline__ float DevRoundAct(float v, cpu::ActDType t) {
  switch (t) {
    case cpu::ActDType::kBF16: return qdec::RoundToBf16(v);
    case cpu::ActDType::kF16: return qdec::RoundToF16(v);
    default: return v;
  }
}

}  // namespace ring::cuda

#endif  // RINGSERVE_KERNELS_CUDA_ACT_ROUND_CUH_
