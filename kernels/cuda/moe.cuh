// File: kernels/cuda/moe.cuh
//
// Mixture-of-experts on the GPU, mirroring kernels/cpu/model_ops.h:
//   RouteSigmoid   DeepSeek/GLM router: sigmoid + e_score_correction_bias, group-limited
//                  top-k (n_group / topk_group), weights normalised and scaled by
//                  routed_scaling_factor (cpu::RouteSigmoid).
//   RouteSoftmax   Qwen3-MoE router: softmax top-k with optional renormalisation
//                  (cpu::RouteSoftmax).
//   ExpertsSwiGlu  the selected experts of every token over the stacked quantized experts:
//                  gate, up and down are each ONE gathered launch for all tokens x slots
//                  (QMatmulT with expert ids), SwiGLU in between (cpu::ExpertsSwiGlu).
//   MoeCombine     the weighted sum over slots (+ shared expert) (cpu::MoeCombine).
// Routing runs one thread per token and follows the reference's arithmetic and selection
// order exactly (ties: lower expert id; ids ascending), so the chosen experts agree unless
// an fp32 sigmoid/exp differs in its last ulp at a tie.
#ifndef RINGSERVE_KERNELS_CUDA_MOE_CUH_
#define RINGSERVE_KERNELS_CUDA_MOE_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/model_ops.h"
#include "kernels/cuda/qgemv.cuh"

namespace ring::cuda {

inline constexpr int64_t kMaxRoutedExperts = 512;

// logits [T, E], bias [E] fp32, ids [T, k], weights [T, k]: device memory.
absl::Status RouteSigmoid(const float* logits, const float* bias, int64_t T,
                          const cpu::SigmoidRouting& r, int32_t* ids, float* weights,
                          cudaStream_t stream);
absl::Status RouteSoftmax(const float* gates, int64_t T, int64_t E, int64_t k,
                          bool norm_topk_prob, cpu::ActDType round, int32_t* ids, float* scores,
                          cudaStream_t stream);
// gate/up [E, inter, hidden], down [E, hidden, inter]; x [T, hidden], ids [T, k],
// y [T, k, hidden] (device).
absl::Status ExpertsSwiGlu(const DeviceQuantWeight& gate, const DeviceQuantWeight& up,
                           const DeviceQuantWeight& down, const float* x, int64_t T,
                           const int32_t* ids, int64_t k, cpu::ActDType round, float* y,
                           cudaStream_t stream);
absl::Status MoeCombine(const float* y, const float* w, const float* shared, int64_t T,
                        int64_t k, int64_t hidden, cpu::CombineMode mode, cpu::ActDType round,
                        float* out, cudaStream_t stream);

}  // namespace ring::cuda

#endif  // RINGSERVE_KERNELS_CUDA_MOE_CUH_
