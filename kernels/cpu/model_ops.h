// File: kernels/cpu/model_ops.h
//
// The larger CPU reference ops of the layer programs, each the oracle of one CUDA op family
// (kernels/cuda/attention.cuh, indexer.cuh, moe.cuh): the MLA attention core (expanded
// prefill form and absorbed decode form, dense or over DSA-selected keys), the DSA
// lightning-indexer scores with their top-k, MoE routing (DeepSeek/GLM sigmoid + correction
// bias + group-limited top-k; Qwen3 softmax top-k), the stacked-expert SwiGLU MLP of the
// selected experts and the weighted combine. Same conventions as ops.h: fp32 buffers,
// rounding to the activation dtype exactly where MLX materialises a value (each rounding
// point is named at the function), token-major layouts. The shared spec sections are cited
// as "spec §n".
#ifndef RINGSERVE_KERNELS_CPU_MODEL_OPS_H_
#define RINGSERVE_KERNELS_CPU_MODEL_OPS_H_

#include <cstdint>

#include "kernels/cpu/ops.h"
#include "kernels/quant.h"

namespace ring::cpu {

// MLA attention after the projections (spec §1.3): q [T, H, nope + rope] with the rope part
// already rotated; the layer's caches latent [S, kvl] (post-norm) and k_pe [S, rope]
// (post-rope); the queries sit at positions offset .. offset + T - 1 and S = offset + T.
// topk: [T, K] selected key positions per query row (ascending), or null for dense.
//   pe_scores[h, i, j] = round(round(q_pe * scale) . k_pe_j), set to finfo(bf16).min where
//     key j is not allowed (T > 1: causal, and for sparse rows not selected);
//   T > 1  (expanded): K_h = round(latent @ W_UK_h), V_h = round(latent @ W_UV_h^T),
//          out = Attention(q_nope, K, V, scale, add_mask = pe_scores);
//   T == 1 (absorbed): q_lat = round(q_nope @ W_UK_h^T); sparse rows first gather their K
//          keys; out_lat = Attention(q_lat, latent, latent, add_mask = pe_scores) over one KV
//          head; out = round(out_lat @ W_UV_h^T).
// out: [T, H * vd]. embed_q: [H, kvl, nope], unembed_out: [H, vd, kvl] (MLX layout).
struct MlaAttentionArgs {
  const float* q = nullptr;
  const float* latent = nullptr;
  const float* k_pe = nullptr;
  const int32_t* topk = nullptr;
  int64_t T = 0, S = 0, offset = 0, K = 0;
  int64_t H = 0, nope = 0, rope = 0, vd = 0, kvl = 0;
  float scale = 1.f;
};
void MlaAttention(const MlaAttentionArgs& a, const QuantWeight& embed_q,
                  const QuantWeight& unembed_out, ActDType t, float* out);

// DSA indexer selection (spec §1.5) for T query rows at positions offset .. offset+T-1 over
// S = offset + T cached keys (S > K): q [T, heads, dim] and keys [S, dim] after RoPE,
// w [T, heads] = round(weights_proj(x) * heads^-0.5 * dim^-0.5).
//   score[h] = round(max(round(q_h . k_j), 0) * w_h); summed over heads in head order:
//   T > 1: each partial sum rounded (mlx-lm adds the heads one at a time in bf16);
//   T == 1: fp32 sum rounded once (mx.sum). T > 1 rows mask keys j > offset + i to -inf.
// topk: [T, K] per row the K best keys (ties: lower position), ascending.
struct IndexerArgs {
  const float* q = nullptr;
  const float* keys = nullptr;
  const float* w = nullptr;
  int64_t T = 0, S = 0, offset = 0, heads = 0, dim = 0, K = 0;
};
void IndexerTopK(const IndexerArgs& a, ActDType t, int32_t* topk);

// DeepSeek/GLM router (spec §1.7) on logits [T, E] (the gate's rounded output):
// s = sigmoid(logit) in fp32, sel = s + bias; with n_group > 1 the n_group - topk_group
// groups with the lowest top-2 sums are zeroed; ids = top-k of sel (ascending, ties: lower
// id); weights = s[ids] (divided by their sum when norm_topk_prob and k > 1) *
// routed_scaling_factor, fp32.
struct SigmoidRouting {
  int64_t E = 0, k = 0, n_group = 1, topk_group = 1;
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.f;
};
void RouteSigmoid(const float* logits, const float* bias, int64_t T, const SigmoidRouting& r,
                  int32_t* ids, float* weights);

// Qwen3-MoE router (spec §5): p = round(softmax(gates)) with an fp32 softmax, ids = top-k of p;
// scores = p[ids], with norm_topk_prob: round(score / round(sum)).
void RouteSoftmax(const float* gates, int64_t T, int64_t E, int64_t k, bool norm_topk_prob,
                  ActDType t, int32_t* ids, float* scores);

// The selected experts of every token: y[r, s, :] = down_e(round(silu(round(gate_e(x_r))) *
// round(up_e(x_r)))) rounded, e = ids[r, s]. gate/up [E, inter, hidden], down [E, hidden,
// inter]. x [T, hidden], ids [T, k], y [T, k, hidden].
void ExpertsSwiGlu(const QuantWeight& gate, const QuantWeight& up, const QuantWeight& down,
                   const float* x, int64_t T, const int32_t* ids, int64_t k, ActDType t, float* y);

// Weighted sum of the expert outputs y [T, k, hidden] with w [T, k], in slot order:
//   kFp32Sum (DeepSeek): out = round(sum_s y_s * w_s) and then round(out + shared) when
//     shared [T, hidden] is given;
//   kRoundedProducts (Qwen3): out = round(sum_s round(y_s * w_s)).
enum class CombineMode : uint8_t { kFp32Sum, kRoundedProducts };
void MoeCombine(const float* y, const float* w, const float* shared, int64_t T, int64_t k,
                int64_t hidden, CombineMode mode, ActDType t, float* out);

}  // namespace ring::cpu

#endif  // RINGSERVE_KERNELS_CPU_MODEL_OPS_H_
