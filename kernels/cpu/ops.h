// File: kernels/cpu/ops.h
//
// The CPU reference ops: fp32 arithmetic with fp32 accumulation on fp32 buffers, plus
// explicit rounding to the model's activation dtype wherever MLX materialises an activation
// in that dtype (bf16 for mlx-community checkpoints). Fused primitives (RoPE, attention,
// quantized matmul) compute in fp32 and round once, as MLX's GPU kernels do; elementwise
// ops round after every op, as MLX does on every backend.
//
// Layouts are token-major: a [T, H, D] activation is T rows of H*D floats.
// All functions are reentrant and parallelise internally with cpu::ParallelFor.
#ifndef RINGSERVE_KERNELS_CPU_OPS_H_
#define RINGSERVE_KERNELS_CPU_OPS_H_

#include <cstdint>
#include <vector>

#include "kernels/tensor.h"

namespace ring::cpu {

// Storage dtype of activations: values are rounded to it after every op.
enum class ActDType : uint8_t { kF32, kBF16, kF16 };

inline float RoundAct(float v, ActDType t) {
  switch (t) {
    case ActDType::kBF16: return RoundBf16(v);
    case ActDType::kF16: return RoundF16(v);
    default: return v;
  }
}
void RoundActInPlace(float* x, int64_t n, ActDType t);

// y = x * rsqrt(mean(x^2) + eps) per row, rounded to t, then * weight (rounded to t):
// mx.fast.rms_norm. weight may be absent (plain normalisation).
void RmsNorm(const float* x, int64_t rows, int64_t dim, const TensorView& weight, float eps,
             ActDType t, float* out);
// mx.fast.layer_norm: normalise in fp32, round, then * weight + bias (each rounded).
void LayerNorm(const float* x, int64_t rows, int64_t dim, const TensorView& weight,
               const TensorView& bias, float eps, ActDType t, float* out);

// RoPE as mx.fast.rope: x is [T, heads, head_dim] (row stride `stride` floats between
// tokens, heads contiguous with stride head_dim); the first `dims` features of every head
// rotate by angle (offset + t) * inv_freq[i] (i < dims/2), interleaved pairs (2i, 2i+1)
// when traditional, else (i, i + dims/2). Computed in fp32, rounded once to t
// (the GPU kernels' numerics; MLX's CPU backend rounds cos/sin and each product to bf16).
void Rope(float* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t stride,
          int64_t dims, bool traditional, const std::vector<float>& inv_freq, int64_t offset,
          ActDType t);

// Attention core with fused-kernel numerics: fp32 throughout (scaled scores, additive mask,
// softmax, p @ v), one rounding of the output to t. (MLX's unfused CPU fallback rounds the
// scaled q, the scores and the probabilities to bf16; its Metal/CUDA kernels do not.)
// q [L, Hq, Dk] (row stride q_stride), k [S, Hkv, Dk] (k_stride), v [S, Hkv, Dv] (v_stride),
// out [L, Hq, Dv] contiguous. Hq % Hkv == 0 (GQA). Masks (any combination):
//   add_mask: [Hq, L, S] float added to the scores (then rounded) — MLA's pe_scores;
//   causal_offset >= 0: key j is visible to query i iff j <= causal_offset + i.
struct AttentionArgs {
  const float* q; int64_t q_stride;
  const float* k; int64_t k_stride;
  const float* v; int64_t v_stride;
  int64_t L, S, hq, hkv, dk, dv;
  float scale;
  const float* add_mask = nullptr;
  int64_t causal_offset = -1;
};
void Attention(const AttentionArgs& a, ActDType t, float* out);

// c[m, n] = a[m, k] @ b[n, k]^T with leading strides; fp32 accumulate; optional rounding.
void MatMulABt(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t m, int64_t n,
               int64_t k, float* c, int64_t ldc, ActDType t);

// out = round(round(silu(gate)) * up) elementwise, silu(g) = g * sigmoid(g).
void SwiGlu(const float* gate, const float* up, int64_t n, ActDType t, float* out);

// out[i] = round(a[i] + b[i]).
void Add(const float* a, const float* b, int64_t n, ActDType t, float* out);

// Indices of the k largest values of x[0..n) (ties: lower index first), unordered set
// semantics as mx.argpartition; returned sorted ascending by index for determinism.
std::vector<int32_t> TopKIndices(const float* x, int64_t n, int64_t k);

// argmax with lowest index on ties.
int64_t ArgMax(const float* x, int64_t n);

}  // namespace ring::cpu

#endif  // RINGSERVE_KERNELS_CPU_OPS_H_
