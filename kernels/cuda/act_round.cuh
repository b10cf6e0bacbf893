// File: kernels/cuda/act_round.cuh
//
// The device form of the CPU reference's activation rounding (cpu::RoundAct), one definition
// for every kernel family that rounds (elementwise, attention, indexer, MoE), and of
// cpu::SwiGlu's element (the SwiGLU kernel and the decode GEMV's fused SwiGLU output).
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

// silu(g) * u with cpu::SwiGlu's roundings.
__device__ __forceinline__ float SwiGluOne(float g, float u, cpu::ActDType rt) {
  const float sig = DevRoundAct(1.f / (1.f + DevRoundAct(expf(-g), rt)), rt);
  const float silu = DevRoundAct(g * sig, rt);
  return DevRoundAct(silu * u, rt);
}

}  // namespace ring::cuda

#endif  // RINGSERVE_KERNELS_CUDA_ACT_ROUND_CUH_
