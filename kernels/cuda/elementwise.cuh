// File: kernels/cuda/elementwise.cuh
//
// Norms, RoPE, SwiGLU and residual add on the GPU, mirroring kernels/cpu/ops.h operation
// for operation: fp32 arithmetic, and rounding to the activation dtype `round` at exactly
// the points where the CPU reference calls RoundAct (which is where MLX materialises a
// bf16 value). Activations may be stored as F32 (holding rounded values, like the CPU
// engine) or BF16; a BF16 output is the rounded value itself. Weights of norms (F32, F16
// or BF16) are the checkpoint's tensors on the device.
//
// Differences from the CPU reference are limited to fp32 summation order in reductions
// (norms) and the last ulp of expf/sinf/cosf, which is what the harness tolerances cover.
// All functions are asynchronous on `stream`.
#ifndef RINGSERVE_KERNELS_CUDA_ELEMENTWISE_CUH_
#define RINGSERVE_KERNELS_CUDA_ELEMENTWISE_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/ops.h"
#include "kernels/dtype.h"

namespace ring::cuda {

// A device array and its element type (F32 or BF16 for activations).
struct DevArray {
  const void* data = nullptr;
  DType dtype = DType::kF32;
};
struct DevMutArray {
  void* data = nullptr;
  DType dtype = DType::kF32;
};

// cpu::RmsNorm: per row y = round(x * rsqrt(mean(x^2) + eps)), then round(y * w) when a
// weight is given (weight.data == nullptr: plain normalisation). out_bf16 (optional): also
// y's bf16 bits, [rows, dim] (exact when round is bf16), for a matmul that reads y next.
absl::Status RmsNorm(DevArray x, int64_t rows, int64_t dim, DevArray weight, float eps,
                     cpu::ActDType round, DevMutArray out, cudaStream_t stream,
                     uint16_t* out_bf16 = nullptr);

// sum = round(a + b) (cpu::Add; sum may alias a), then out = RmsNorm(sum) as above, in one
// launch: a residual add and the next norm (bitwise the two calls).
absl::Status AddRmsNorm(DevArray a, DevArray b, int64_t rows, int64_t dim, DevArray weight,
                        float eps, cpu::ActDType round, DevMutArray sum, DevMutArray out,
                        cudaStream_t stream, uint16_t* out_bf16 = nullptr);

// cpu::LayerNorm: two-pass mean/variance in fp32, round, * w (round), + b (round).
absl::Status LayerNorm(DevArray x, int64_t rows, int64_t dim, DevArray weight, DevArray bias,
                       float eps, cpu::ActDType round, DevMutArray out, cudaStream_t stream);

// cpu::Rope, in place on x [tokens, heads, head_dim] with `stride` elements between tokens.
// inv_freq: device fp32 [dims/2]. Angles (offset + t) * inv_freq[i] in fp32; cos/sin and
// the rotation rounded to `round` (MLX's CPU rope, measured bit-exact by the CPU reference).
absl::Status Rope(DevMutArray x, int64_t tokens, int64_t heads, int64_t head_dim,
                  int64_t stride, int64_t dims, bool traditional, const float* inv_freq,
                  int64_t offset, cpu::ActDType round, cudaStream_t stream);

// Qwen3's q/k head norms and RoPE in one launch, exactly (bitwise) as RmsNorm(q),
// RmsNorm(k), [ScaleRound(pre_scale)], Rope(q), Rope(k) above with fp32 storage: q
// [tokens, q_heads, head_dim] and k [tokens, k_heads, head_dim] dense, in place; the RoPE is
// half-split over the whole head (dims == head_dim); norm weights fp32 (null: none).
// Positions are pos + t, pos = *pos_at when pos_at is set (read on the device, so that a
// captured launch stays valid as the position moves), else offset.
// The step's cache write in the same launch (k_cache, v, v_cache all set, or none): the
// normed, rotated k rows go to rows pos.. of k_cache instead of back to k (k is only read),
// and v's rows ([tokens, k_heads, head_dim]) are copied to the same rows of v_cache; both
// caches are [*, k_heads * head_dim] dense, given by their row 0.
inline bool HeadNormRopeSupports(int64_t head_dim) { return head_dim == 64 || head_dim == 128; }
absl::Status HeadNormRope(float* q, int64_t q_heads, const float* q_norm, float* k,
                          int64_t k_heads, const float* k_norm, int64_t tokens, int64_t head_dim,
                          float eps, float pre_scale, const float* inv_freq, int64_t offset,
                          cpu::ActDType round, cudaStream_t stream,
                          const int32_t* pos_at = nullptr, float* k_cache = nullptr,
                          const float* v = nullptr, float* v_cache = nullptr);

// MLA's per-step K/V write and RoPE (models/deepseek.cc) in one launch, exactly (bitwise)
// as the calls it replaces with fp32 storage: Copy2D of ckv's latent and rope parts
// ([tokens, kvl + rope] rows) into `latent` ([tokens, kvl]) and `k_pe` ([tokens, rope]),
// RmsNorm(latent) with `norm`, then [ScaleRound(pre_scale),] Rope of q's rope slice (the last
// `rope` features of each of q_heads heads of [tokens, q_heads, qd]) and of k_pe, at
// positions offset + t. The RoPE covers the whole slice (dims == rope).
// pos_at (optional): the position read on the device (as HeadNormRope's); latent and k_pe are
// then the caches' row 0 and rows *pos_at.. are written.
absl::Status MlaKvRope(const float* ckv, int64_t tokens, int64_t kvl, int64_t rope, DevArray norm,
                       float eps, float* latent, float* k_pe, float* q, int64_t q_heads, int64_t qd,
                       float pre_scale, bool traditional, const float* inv_freq, int64_t offset,
                       cpu::ActDType round, cudaStream_t stream, const int32_t* pos_at = nullptr);

// The DSA indexer's per-step preparation (models/deepseek.cc, one sequence) in one launch,
// exactly (bitwise) as LayerNorm(k), [ScaleRound(pre_scale),] Rope(q), Rope(k) and, when
// n_w > 0, ScaleRound(w, wscale) with fp32 storage: k [tokens, d] normed in place, the RoPE
// over the first `dims` features of each of q's heads ([tokens, heads, d]) and of k.
// pos_at (optional): the position read on the device (as HeadNormRope's). k_cache
// (optional): the key cache's row 0 ([*, d]); the normed, rotated keys then go to its rows
// pos.. and k is only read.
absl::Status IndexerNormRope(float* q, int64_t tokens, int64_t heads, int64_t d, float* k, DevArray norm_w,
                             DevArray norm_b, float eps, int64_t dims, float pre_scale, bool traditional,
                             const float* inv_freq, int64_t offset, float* w, int64_t n_w, float wscale,
                             cpu::ActDType round, cudaStream_t stream, const int32_t* pos_at = nullptr,
                             float* k_cache = nullptr);

// cpu::SwiGlu: out = round(round(silu(gate)) * up), sigmoid rounding as the reference.
// out_bf16 (optional) as RmsNorm's.
absl::Status SwiGlu(DevArray gate, DevArray up, int64_t n, cpu::ActDType round,
                    DevMutArray out, cudaStream_t stream, uint16_t* out_bf16 = nullptr);

// cpu::Add: out = round(a + b).
absl::Status Add(DevArray a, DevArray b, int64_t n, cpu::ActDType round, DevMutArray out,
                 cudaStream_t stream);

// In place x = round(x * s) on the first `dims` features of every head of [tokens, heads,
// head_dim] rows (`stride` elements between tokens): RoPE's YaRN pre-scale; with
// tokens = heads = 1 and dims = head_dim = stride = n, a flat scale (s = 1: a rounding).
absl::Status ScaleRound(DevMutArray x, int64_t tokens, int64_t heads, int64_t head_dim,
                        int64_t stride, int64_t dims, float s, cpu::ActDType round,
                        cudaStream_t stream);
inline absl::Status ScaleRound(DevMutArray x, int64_t n, float s, cpu::ActDType round,
                               cudaStream_t stream) {
  return ScaleRound(x, 1, 1, n, n, n, s, round, stream);
}

// out[i] = bf16 bits of x[i] (round to nearest even), n elements.
absl::Status ToBf16(const float* x, int64_t n, uint16_t* out, cudaStream_t stream);

// dst[r, :] = src[idx[r], :] for r < n, rows of `width` floats (idx on the device).
absl::Status GatherRows(const float* src, int64_t width, const int32_t* idx, int64_t n,
                        float* dst, cudaStream_t stream);

// dst[0, bytes) = src[0, bytes) as one kernel (launched under the previous one's tail, PDL);
// dst may be mapped pinned host memory (its device pointer), so that a small download
// waits for no copy engine: ~2 us behind the kernel that produced src instead of ~6 us.
absl::Status CopyBytes(const void* src, void* dst, int64_t bytes, cudaStream_t stream);

// Test hook for programmatic dependent launch (kernels/cuda/launch.cuh): copies `words`
// 32-bit words src -> dst, but first lets the next kernel in the stream start and spins for
// `cycles` clock cycles, so that kernel runs while the copy is still pending and must wait
// for it before reading dst.
absl::Status TEST_SlowCopy(const void* src, void* dst, int64_t words, int64_t cycles,
                           cudaStream_t stream);

}  // namespace ring::cuda

#endif  // RINGSERVE_KERNELS_CUDA_ELEMENTWISE_CUH_
