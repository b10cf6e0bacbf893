// File: kernels/cuda/elementwise.cu
//
// Kernels behind elementwise.cuh. Loads and stores go through Load()/Store() so one kernel
// body serves F32 and BF16 storage; the dtype switch is warp-uniform. Reductions (norms)
// use one block per row: per-thread partial sums, warp butterflies, then the per-warp
// partials summed in warp order, so results are deterministic run to run.
#include "kernels/cuda/elementwise.cuh"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "kernels/cuda/act_round.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/quant_decode.cuh"

namespace ring::cuda {
namespace {

// Element i of a float-typed device array as fp32.
__device__ __forceinline__ float Load(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kBF16: return qdec::Bf16ToF32(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16: return qdec::F16ToF32(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}
__device__ __forceinline__ void Store(void* p, DType t, int64_t i, float v) {
  if (t == DType::kBF16) {
    static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(qdec::F32ToBf16Bits(v));
  } else {
    static_cast<float*>(p)[i] = v;
  }
}
// Sum over the block; every thread gets the result. `scratch` holds 32 floats.
__device__ float BlockSum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float s = 0.f;
  for (int w = 0; w < nwarps; ++w) s += scratch[w];
  return s;
}

// Row kernels (RmsNorm, LayerNorm) hold a row's elements in registers when the row fits
// kRowRegs per thread (RowThreads gives ~4): all of a thread's loads are issued at once and
// the row is read once, where a loop per pass waits on each load in turn (a decode row is a
// single block, so that latency was the kernel's whole time). Each thread visits its
// elements in the same order either way, so the sums and results are unchanged.
constexpr int kRowRegs = 8;

// v[c] = element threadIdx.x + c * blockDim.x of the row at `base` (0 past dim).
__device__ __forceinline__ void LoadRowRegs(DevArray a, int64_t base, int64_t dim,
                                            float (&v)[kRowRegs]) {
#pragma unroll
  for (int c = 0; c < kRowRegs; ++c) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(c) * blockDim.x;
    v[c] = i < dim && a.data != nullptr ? Load(a.data, a.dtype, base + i) : 0.f;
  }
}

// One row of RmsNormKernel: x (and add, sum) at `base`, the output (and out_bf16) at
// `obase`. With `add` (AddRmsNorm) the row normed is s = round(x + add), which is also
// stored to `sum` (may alias x: every element is read before it is written, by the same
// thread).
// `wv`: w's elements in registers (PreloadRowWeights), read on the register path.
__device__ __forceinline__ void RmsNormRow(DevArray x, int64_t base, int64_t dim, DevArray w, float eps,
                                           cpu::ActDType rt, DevMutArray out, int64_t obase,
                                           uint16_t* out_bf16, DevArray add, DevMutArray sum,
                                           float* scratch, const float (&wv)[kRowRegs]) {
  if (dim <= static_cast<int64_t>(kRowRegs) * blockDim.x) {
    float v[kRowRegs];
    LoadRowRegs(x, base, dim, v);
    if (add.data != nullptr) {
      float av[kRowRegs];
      LoadRowRegs(add, base, dim, av);
#pragma unroll
      for (int c = 0; c < kRowRegs; ++c) {
        const int64_t i = threadIdx.x + static_cast<int64_t>(c) * blockDim.x;
        v[c] = DevRoundAct(v[c] + av[c], rt);  // 0 + 0 past dim
        if (i < dim) Store(sum.data, sum.dtype, base + i, v[c]);
      }
    }
    float ss = 0.f;
#pragma unroll
    for (int c = 0; c < kRowRegs; ++c) ss = fmaf(v[c], v[c], ss);  // + 0 past dim: exact
    ss = BlockSum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
#pragma unroll
    for (int c = 0; c < kRowRegs; ++c) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(c) * blockDim.x;
      if (i >= dim) break;
      float y = DevRoundAct(v[c] * inv, rt);
      if (w.data != nullptr) y = DevRoundAct(y * wv[c], rt);
      Store(out.data, out.dtype, obase + i, y);
      if (out_bf16 != nullptr) out_bf16[obase + i] = static_cast<uint16_t>(qdec::F32ToBf16Bits(y));
    }
    return;
  }
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = Load(x.data, x.dtype, base + i);
    if (add.data != nullptr) {
      v = DevRoundAct(v + Load(add.data, add.dtype, base + i), rt);
      Store(sum.data, sum.dtype, base + i, v);
    }
    ss = fmaf(v, v, ss);
  }
  ss = BlockSum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
  // The normed row: x, or the sum this thread stored above (x may be overwritten by now).
  const DevArray src = add.data != nullptr ? DevArray{sum.data, sum.dtype} : x;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float y = DevRoundAct(Load(src.data, src.dtype, base + i) * inv, rt);
    if (w.data != nullptr) y = DevRoundAct(y * Load(w.data, w.dtype, i), rt);
    Store(out.data, out.dtype, obase + i, y);
    if (out_bf16 != nullptr) out_bf16[obase + i] = static_cast<uint16_t>(qdec::F32ToBf16Bits(y));
  }
}

// A norm's weights are the model's (no kernel writes them), so the row kernels issue their
// loads before PdlWait: a decode row is one block whose time is mostly load latency, and
// the weights (evicted from L2 by the step's streaming) then arrive under the previous
// kernel's tail instead of after it. Loads nothing when the row is too long for the
// register path (which then reads w itself).
__device__ __forceinline__ void PreloadRowWeights(DevArray w, int64_t dim, float (&wv)[kRowRegs]) {
  if (dim <= static_cast<int64_t>(kRowRegs) * blockDim.x) LoadRowRegs(w, 0, dim, wv);
}

__global__ void RmsNormKernel(DevArray x, int64_t dim, DevArray w, float eps, cpu::ActDType rt,
                              DevMutArray out, uint16_t* out_bf16, DevArray add,
                              DevMutArray sum) {
  float wv[kRowRegs];
  PreloadRowWeights(w, dim, wv);
  PdlBegin();
  __shared__ float scratch[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * dim;
  RmsNormRow(x, base, dim, w, eps, rt, out, base, out_bf16, add, sum, scratch, wv);
}

// One row of LayerNormKernel: x's row at `base`, written at the same place of out.
// `wv`, `bv`: w's and b's elements in registers (PreloadRowWeights), read on the register path.
__device__ __forceinline__ void LayerNormRow(DevArray x, int64_t base, int64_t dim, DevArray w, DevArray b,
                                             float eps, cpu::ActDType rt, DevMutArray out, float* scratch,
                                             const float (&wv)[kRowRegs], const float (&bv)[kRowRegs]) {
  if (dim <= static_cast<int64_t>(kRowRegs) * blockDim.x) {
    float v[kRowRegs];
    LoadRowRegs(x, base, dim, v);
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < kRowRegs; ++c) s += v[c];
    const float mean = BlockSum(s, scratch) / static_cast<float>(dim);
    float var = 0.f;
#pragma unroll
    for (int c = 0; c < kRowRegs; ++c) {
      if (threadIdx.x + static_cast<int64_t>(c) * blockDim.x >= dim) break;
      const float d = v[c] - mean;
      var = fmaf(d, d, var);
    }
    const float inv = 1.0f / sqrtf(BlockSum(var, scratch) / static_cast<float>(dim) + eps);
#pragma unroll
    for (int c = 0; c < kRowRegs; ++c) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(c) * blockDim.x;
      if (i >= dim) break;
      float y = DevRoundAct((v[c] - mean) * inv, rt);
      if (w.data != nullptr) y = DevRoundAct(y * wv[c], rt);
      if (b.data != nullptr) y = DevRoundAct(y + bv[c], rt);
      Store(out.data, out.dtype, base + i, y);
    }
    return;
  }
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) s += Load(x.data, x.dtype, base + i);
  const float mean = BlockSum(s, scratch) / static_cast<float>(dim);
  float v = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float d = Load(x.data, x.dtype, base + i) - mean;
    v = fmaf(d, d, v);
  }
  const float var = BlockSum(v, scratch) / static_cast<float>(dim);
  const float inv = 1.0f / sqrtf(var + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float y = DevRoundAct((Load(x.data, x.dtype, base + i) - mean) * inv, rt);
    if (w.data != nullptr) y = DevRoundAct(y * Load(w.data, w.dtype, i), rt);
    if (b.data != nullptr) y = DevRoundAct(y + Load(b.data, b.dtype, i), rt);
    Store(out.data, out.dtype, base + i, y);
  }
}

__global__ void LayerNormKernel(DevArray x, int64_t dim, DevArray w, DevArray b, float eps,
                                cpu::ActDType rt, DevMutArray out) {
  float wv[kRowRegs], bv[kRowRegs];
  PreloadRowWeights(w, dim, wv);
  PreloadRowWeights(b, dim, bv);
  PdlBegin();
  __shared__ float scratch[32];
  LayerNormRow(x, static_cast<int64_t>(blockIdx.x) * dim, dim, w, b, eps, rt, out, scratch, wv, bv);
}

// RoPE of one pair at position `pos` (RopeKernel and HeadNormRopeKernel share it, so the two
// round identically).
__device__ __forceinline__ void RotatePair(float x1, float x2, int64_t pos, float inv_freq,
                                           cpu::ActDType rt, float* a, float* b) {
  const float theta = static_cast<float>(pos) * inv_freq;
  float sn, cs;
  sincosf(theta, &sn, &cs);
  *a = DevRoundAct(x1 * cs - x2 * sn, rt);
  *b = DevRoundAct(x1 * sn + x2 * cs, rt);
}

// One thread per (token, head, pair).
__global__ void RopeKernel(DevMutArray x, int64_t tokens, int64_t heads, int64_t head_dim,
                           int64_t stride, int64_t half, int traditional, const float* inv_freq,
                           int64_t offset, cpu::ActDType rt) {
  PdlBegin();
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= tokens * heads * half) return;
  const int64_t i = idx % half;
  const int64_t h = (idx / half) % heads;
  const int64_t tok = idx / (half * heads);
  const int64_t base = tok * stride + h * head_dim;
  const int64_t a = base + (traditional ? 2 * i : i);
  const int64_t b = base + (traditional ? 2 * i + 1 : i + half);
  float ya, yb;
  RotatePair(Load(x.data, x.dtype, a), Load(x.data, x.dtype, b), offset + tok, inv_freq[i], rt,
             &ya, &yb);
  Store(x.data, x.dtype, a, ya);
  Store(x.data, x.dtype, b, yb);
}

// HeadNormRope: one warp per head row of q then k ([rows, d] fp32, d = 32 * nj, nj 2 or 4).
// Lane l holds elements l, l + 32, ...: the RMS sum runs as RmsNormKernel's with 32 threads
// (RowThreads(d) for d <= 128), and the half-split pair (i, i + d/2) sits in one lane.
constexpr int kHeadNormRopeWarps = 4;
__global__ void __launch_bounds__(kHeadNormRopeWarps * 32)
    HeadNormRopeKernel(float* q, int64_t q_rows, int64_t q_heads, const float* qw, float* k,
                       int64_t k_rows, int64_t k_heads, const float* kw, int d, float eps,
                       float pre_scale, const float* inv_freq, int64_t offset,
                       const int32_t* pos_at, float* k_cache, const float* vin, float* v_cache,
                       cpu::ActDType rt) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kHeadNormRopeWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  const int nj = d / 32;
  // The norm weights and RoPE frequencies are constants (no kernel writes them): loaded
  // before the wait, they are not a round trip after the row's sum (PreloadRowWeights).
  const float* w = row < q_rows ? qw : kw;
  float wv[4] = {1.f, 1.f, 1.f, 1.f}, fv[2] = {0.f, 0.f};
  if (row < q_rows + k_rows) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (j < nj && w != nullptr) wv[j] = w[lane + 32 * j];
      if (j < 2 && j < nj / 2) fv[j] = inv_freq[lane + 32 * j];
    }
  }
  PdlBegin();
  const int64_t v_rows = vin != nullptr ? k_rows : 0;
  if (row >= q_rows + k_rows + v_rows) return;
  const int64_t pos0 = pos_at != nullptr ? LoadProduced(pos_at) : offset;
  if (row >= q_rows + k_rows) {  // a v row into its cache row
    const int64_t r = row - q_rows - k_rows;
    const float* src = vin + r * d;
    float* dst = v_cache + (pos0 * k_heads + r) * d;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (j < nj) dst[lane + 32 * j] = LoadProduced(src + lane + 32 * j);
    }
    return;
  }
  const bool is_q = row < q_rows;
  const int64_t r = is_q ? row : row - q_rows;
  const float* x = (is_q ? q : k) + r * d;
  float* y = is_q || k_cache == nullptr ? (is_q ? q : k) + r * d
                                        : k_cache + (pos0 * k_heads + r) * d;
  const int64_t tok = r / (is_q ? q_heads : k_heads);
  const int64_t pos = pos0 + tok;
  float v[4];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (j < nj) {
      v[j] = x[lane + 32 * j];
      ss = fmaf(v[j], v[j], ss);
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (j < nj) {
      float y = DevRoundAct(v[j] * inv, rt);
      if (w != nullptr) y = DevRoundAct(y * wv[j], rt);
      if (pre_scale != 1.f) y = DevRoundAct(y * pre_scale, rt);
      v[j] = y;
    }
  }
  const int hj = nj / 2;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    if (j < hj) {
      const int i = lane + 32 * j;
      float ya, yb;
      RotatePair(v[j], v[j + hj], pos, fv[j], rt, &ya, &yb);
      y[i] = ya;
      y[i + d / 2] = yb;
    }
  }
}

// Pair i of a head's rope features (traditional: 2i and 2i + 1, else i and i + half) read from
// src, YaRN's pre-scale applied, rotated to position `pos` and written to dst (may be src).
__device__ __forceinline__ void RopePairAt(const float* src, float* dst, int64_t i, int64_t half, int traditional,
                                           float pre_scale, int64_t pos, float inv_freq, cpu::ActDType rt) {
  const int64_t a = traditional ? 2 * i : i;
  const int64_t b = traditional ? 2 * i + 1 : i + half;
  float xa = src[a], xb = src[b];
  if (pre_scale != 1.f) {
    xa = DevRoundAct(xa * pre_scale, rt);
    xb = DevRoundAct(xb * pre_scale, rt);
  }
  float ya, yb;
  RotatePair(xa, xb, pos, inv_freq, rt, &ya, &yb);
  dst[a] = ya;
  dst[b] = yb;
}

// MlaKvRope: blocks [0, tokens) norm one latent row each (RmsNormRow, with the block size
// RmsNorm launches for kvl, so the sums group alike), the rest run one thread per RoPE pair:
// q's heads of every token, then each token's k_pe (read from ckv, written to k_pe).
__global__ void MlaKvRopeKernel(const float* ckv, int64_t tokens, int64_t kvl, int64_t rope, DevArray w,
                                float eps, float* latent, float* k_pe, float* q, int64_t q_heads,
                                int64_t qd, float pre_scale, int traditional, const float* inv_freq,
                                int64_t offset, const int32_t* pos_at, cpu::ActDType rt) {
  float wv[kRowRegs];
  if (blockIdx.x < tokens) PreloadRowWeights(w, kvl, wv);
  PdlBegin();
  __shared__ float scratch[32];
  const int64_t ld = kvl + rope;
  // With the position on the device, latent and k_pe are the caches' row 0.
  const int64_t pos0 = pos_at != nullptr ? LoadProduced(pos_at) : offset;
  const int64_t row0 = pos_at != nullptr ? pos0 : 0;
  if (blockIdx.x < tokens) {
    RmsNormRow(DevArray{ckv, DType::kF32}, static_cast<int64_t>(blockIdx.x) * ld, kvl, w, eps, rt,
               DevMutArray{latent, DType::kF32}, (row0 + blockIdx.x) * kvl, nullptr,
               DevArray{nullptr, DType::kF32}, DevMutArray{nullptr, DType::kF32}, scratch, wv);
    return;
  }
  const int64_t half = rope / 2;
  const int64_t idx = static_cast<int64_t>(blockIdx.x - tokens) * blockDim.x + threadIdx.x;
  const int64_t nq = tokens * q_heads * half;
  if (idx >= nq + tokens * half) return;
  const int64_t i = idx < nq ? idx % half : (idx - nq) % half;
  const int64_t tok = idx < nq ? idx / (half * q_heads) : (idx - nq) / half;
  const float* src;
  float* dst;
  if (idx < nq) {
    const int64_t h = (idx / half) % q_heads;
    dst = q + tok * q_heads * qd + h * qd + (qd - rope);
    src = dst;
  } else {
    src = ckv + tok * ld + kvl;
    dst = k_pe + (row0 + tok) * rope;
  }
  RopePairAt(src, dst, i, half, traditional, pre_scale, pos0 + tok, inv_freq[i], rt);
}

// IndexerNormRope: blocks [0, tokens) LayerNorm one key row each (LayerNormRow, with the
// block size LayerNorm launches for d) and then rotate it; the rest run one thread per RoPE
// pair of q's heads, then one per weight element to scale.
__global__ void IndexerNormRopeKernel(float* q, int64_t tokens, int64_t heads, int64_t d, float* k, DevArray nw,
                                      DevArray nb, float eps, int64_t dims, float pre_scale, int traditional,
                                      const float* inv_freq, int64_t offset, const int32_t* pos_at,
                                      float* k_cache, float* w, int64_t n_w, float wscale, cpu::ActDType rt) {
  float nwv[kRowRegs], nbv[kRowRegs];
  if (blockIdx.x < tokens) {
    PreloadRowWeights(nw, d, nwv);
    PreloadRowWeights(nb, d, nbv);
  }
  PdlBegin();
  __shared__ float scratch[32];
  const int64_t half = dims / 2;
  const int64_t pos0 = pos_at != nullptr ? LoadProduced(pos_at) : offset;
  auto rotate = [&](float* x, int64_t i, int64_t tok) {
    RopePairAt(x, x, i, half, traditional, pre_scale, pos0 + tok, inv_freq[i], rt);
  };
  if (blockIdx.x < tokens) {
    const int64_t row = blockIdx.x;
    float* out = k_cache != nullptr ? k_cache + (pos0 + row) * d : k + row * d;
    LayerNormRow(DevArray{k + row * d, DType::kF32}, 0, d, nw, nb, eps, rt, DevMutArray{out, DType::kF32},
                 scratch, nwv, nbv);
    __syncthreads();  // the row's normed values, written by the block's threads
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) rotate(out, i, row);
    return;
  }
  const int64_t idx = static_cast<int64_t>(blockIdx.x - tokens) * blockDim.x + threadIdx.x;
  const int64_t nq = tokens * heads * half;
  if (idx < nq) {
    const int64_t tok = idx / (half * heads), h = (idx / half) % heads;
    rotate(q + tok * heads * d + h * d, idx % half, tok);
  } else if (idx - nq < n_w) {
    w[idx - nq] = DevRoundAct(w[idx - nq] * wscale, rt);
  }
}

__global__ void SwiGluKernel(DevArray gate, DevArray up, int64_t n, cpu::ActDType rt,
                             DevMutArray out, uint16_t* out_bf16) {
  PdlBegin();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float y = SwiGluOne(Load(gate.data, gate.dtype, i), Load(up.data, up.dtype, i), rt);
    Store(out.data, out.dtype, i, y);
    if (out_bf16 != nullptr) out_bf16[i] = static_cast<uint16_t>(qdec::F32ToBf16Bits(y));
  }
}

// Four bf16 bits of four floats, packed.
__device__ __forceinline__ uint2 Bf16x4(float4 v) {
  return make_uint2(qdec::F32ToBf16Bits(v.x) | (qdec::F32ToBf16Bits(v.y) << 16),
                    qdec::F32ToBf16Bits(v.z) | (qdec::F32ToBf16Bits(v.w) << 16));
}

// SwiGluKernel for fp32 gate, up and out, four elements a thread and step (16-byte loads
// and stores; the scalar kernel's 4-byte accesses left it at about half the bandwidth).
__global__ void SwiGlu4Kernel(const float4* gate, const float4* up, int64_t n4, cpu::ActDType rt,
                              float4* out, uint2* out_bf16) {
  PdlBegin();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n4;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float4 g = LoadProduced(gate + i), u = LoadProduced(up + i);
    const float4 y = make_float4(SwiGluOne(g.x, u.x, rt), SwiGluOne(g.y, u.y, rt),
                                 SwiGluOne(g.z, u.z, rt), SwiGluOne(g.w, u.w, rt));
    out[i] = y;
    if (out_bf16 != nullptr) out_bf16[i] = Bf16x4(y);
  }
}

__global__ void AddKernel(DevArray a, DevArray b, int64_t n, cpu::ActDType rt, DevMutArray out) {
  PdlBegin();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    Store(out.data, out.dtype, i,
          DevRoundAct(Load(a.data, a.dtype, i) + Load(b.data, b.dtype, i), rt));
  }
}

// One thread per scaled element.
__global__ void ScaleRoundKernel(DevMutArray x, int64_t tokens, int64_t heads, int64_t head_dim,
                                 int64_t stride, int64_t dims, float s, cpu::ActDType rt) {
  PdlBegin();
  const int64_t n = tokens * heads * dims;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t d = idx % dims, h = (idx / dims) % heads, tok = idx / (dims * heads);
    const int64_t i = tok * stride + h * head_dim + d;
    Store(x.data, x.dtype, i, DevRoundAct(Load(x.data, x.dtype, i) * s, rt));
  }
}

__global__ void CopyVec16Kernel(const uint4* src, uint4* dst, int64_t n) {
  PdlBegin();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = LoadProduced(src + i);
  }
}
__global__ void CopyByteKernel(const unsigned char* src, unsigned char* dst, int64_t n) {
  PdlBegin();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = LoadProduced(src + i);
  }
}

__global__ void ToBf16Kernel(const float* x, int64_t n, uint16_t* out) {
  PdlBegin();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = static_cast<uint16_t>(qdec::F32ToBf16Bits(x[i]));
  }
}

// ToBf16Kernel four elements a thread and step.
__global__ void ToBf16x4Kernel(const float4* x, int64_t n4, uint2* out) {
  PdlBegin();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n4;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = Bf16x4(LoadProduced(x + i));
  }
}

__global__ void GatherRowsKernel(const float* src, int64_t width, const int32_t* idx,
                                 float* dst) {
  PdlBegin();
  const int64_t r = blockIdx.y;
  const float* s = src + static_cast<int64_t>(idx[r]) * width;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < width;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[r * width + c] = s[c];
  }
}

__global__ void SlowCopyKernel(const uint32_t* src, uint32_t* dst, int64_t n, int64_t cycles) {
  PdlBegin();
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = src[i];
  }
}

absl::Status CheckAct(DevArray a, const char* what, bool optional = false) {
  if (a.data == nullptr) {
    return optional ? absl::OkStatus()
                    : absl::InvalidArgumentError(absl::StrCat(what, " is null"));
  }
  if (a.dtype != DType::kF32 && a.dtype != DType::kBF16 && a.dtype != DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be F32, BF16 or F16"));
  }
  return absl::OkStatus();
}
absl::Status CheckOut(DevMutArray a) {
  if (a.data == nullptr) return absl::InvalidArgumentError("output is null");
  if (a.dtype != DType::kF32 && a.dtype != DType::kBF16) {
    return absl::InvalidArgumentError("output must be F32 or BF16");
  }
  return absl::OkStatus();
}

// A block per row: up to 1024 threads, about 4 elements each.
unsigned RowThreads(int64_t dim) {
  const int64_t t = std::clamp<int64_t>((dim / 4 + 31) / 32 * 32, 32, 1024);
  return static_cast<unsigned>(t);
}
// Whether p is a multiple of `bytes` (null counts as aligned: an absent output).
bool Aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
unsigned FlatBlocks(int64_t n, int threads) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + threads - 1) / threads, 1, 65535));
}

#define RING_EW_CHECK(expr)                      \
  do {                                           \
    const absl::Status ring_ew_s_ = (expr);      \
    if (!ring_ew_s_.ok()) return ring_ew_s_;     \
  } while (0)

}  // namespace

absl::Status RmsNorm(DevArray x, int64_t rows, int64_t dim, DevArray weight, float eps,
                     cpu::ActDType round, DevMutArray out, cudaStream_t stream,
                     uint16_t* out_bf16) {
  RING_EW_CHECK(CheckAct(x, "x"));
  RING_EW_CHECK(CheckAct(weight, "weight", /*optional=*/true));
  RING_EW_CHECK(CheckOut(out));
  if (rows <= 0 || dim <= 0) return absl::OkStatus();
  if (rows > 0x7fffffff) return absl::InvalidArgumentError("too many rows");
  RING_LAUNCH_PDL(RmsNormKernel, static_cast<unsigned>(rows), RowThreads(dim), 0, stream, x, dim,
                  weight, eps, round, out, out_bf16, DevArray{nullptr, DType::kF32},
                  DevMutArray{nullptr, DType::kF32});
  return absl::OkStatus();
}

absl::Status AddRmsNorm(DevArray a, DevArray b, int64_t rows, int64_t dim, DevArray weight,
                        float eps, cpu::ActDType round, DevMutArray sum, DevMutArray out,
                        cudaStream_t stream, uint16_t* out_bf16) {
  RING_EW_CHECK(CheckAct(a, "a"));
  RING_EW_CHECK(CheckAct(b, "b"));
  RING_EW_CHECK(CheckAct(weight, "weight", /*optional=*/true));
  RING_EW_CHECK(CheckOut(sum));
  RING_EW_CHECK(CheckOut(out));
  if (rows <= 0 || dim <= 0) return absl::OkStatus();
  if (rows > 0x7fffffff) return absl::InvalidArgumentError("too many rows");
  RING_LAUNCH_PDL(RmsNormKernel, static_cast<unsigned>(rows), RowThreads(dim), 0, stream, a, dim,
                  weight, eps, round, out, out_bf16, b, sum);
  return absl::OkStatus();
}

absl::Status LayerNorm(DevArray x, int64_t rows, int64_t dim, DevArray weight, DevArray bias,
                       float eps, cpu::ActDType round, DevMutArray out, cudaStream_t stream) {
  RING_EW_CHECK(CheckAct(x, "x"));
  RING_EW_CHECK(CheckAct(weight, "weight", true));
  RING_EW_CHECK(CheckAct(bias, "bias", true));
  RING_EW_CHECK(CheckOut(out));
  if (rows <= 0 || dim <= 0) return absl::OkStatus();
  if (rows > 0x7fffffff) return absl::InvalidArgumentError("too many rows");
  RING_LAUNCH_PDL(LayerNormKernel, static_cast<unsigned>(rows), RowThreads(dim), 0, stream, x, dim,
                  weight, bias, eps, round, out);
  return absl::OkStatus();
}

absl::Status Rope(DevMutArray x, int64_t tokens, int64_t heads, int64_t head_dim,
                  int64_t stride, int64_t dims, bool traditional, const float* inv_freq,
                  int64_t offset, cpu::ActDType round, cudaStream_t stream) {
  RING_EW_CHECK(CheckOut(x));
  if (inv_freq == nullptr) return absl::InvalidArgumentError("inv_freq is null");
  if (dims % 2 != 0 || dims > head_dim || stride < heads * head_dim) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "rope: dims %d, head_dim %d, heads %d, stride %d inconsistent", dims, head_dim, heads,
        stride));
  }
  const int64_t n = tokens * heads * (dims / 2);
  if (n <= 0) return absl::OkStatus();
  const int threads = 256;
  const int64_t blocks = (n + threads - 1) / threads;
  if (blocks > 0x7fffffff) return absl::InvalidArgumentError("rope too large");
  RING_LAUNCH_PDL(RopeKernel, static_cast<unsigned>(blocks), threads, 0, stream, x, tokens, heads,
                  head_dim, stride, dims / 2, traditional, inv_freq, offset, round);
  return absl::OkStatus();
}

absl::Status HeadNormRope(float* q, int64_t q_heads, const float* q_norm, float* k,
                          int64_t k_heads, const float* k_norm, int64_t tokens, int64_t head_dim,
                          float eps, float pre_scale, const float* inv_freq, int64_t offset,
                          cpu::ActDType round, cudaStream_t stream, const int32_t* pos_at,
                          float* k_cache, const float* v, float* v_cache) {
  if (!HeadNormRopeSupports(head_dim)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("head norm + rope: head_dim %d is not 64 or 128", head_dim));
  }
  if (q == nullptr || k == nullptr || inv_freq == nullptr) {
    return absl::InvalidArgumentError("head norm + rope: null operand");
  }
  if ((k_cache == nullptr) != (v_cache == nullptr) || (v != nullptr) != (v_cache != nullptr)) {
    return absl::InvalidArgumentError("head norm + rope: k_cache, v and v_cache go together");
  }
  const int64_t rows = tokens * (q_heads + k_heads + (v != nullptr ? k_heads : 0));
  if (rows <= 0) return absl::OkStatus();
  const int64_t blocks = (rows + kHeadNormRopeWarps - 1) / kHeadNormRopeWarps;
  if (blocks > 0x7fffffff) return absl::InvalidArgumentError("head norm + rope: too many rows");
  RING_LAUNCH_PDL(HeadNormRopeKernel, static_cast<unsigned>(blocks), kHeadNormRopeWarps * 32, 0,
                  stream, q, tokens * q_heads, q_heads, q_norm, k, tokens * k_heads, k_heads,
                  k_norm, static_cast<int>(head_dim), eps, pre_scale, inv_freq, offset, pos_at,
                  k_cache, v, v_cache, round);
  return absl::OkStatus();
}

absl::Status MlaKvRope(const float* ckv, int64_t tokens, int64_t kvl, int64_t rope, DevArray norm,
                       float eps, float* latent, float* k_pe, float* q, int64_t q_heads, int64_t qd,
                       float pre_scale, bool traditional, const float* inv_freq, int64_t offset,
                       cpu::ActDType round, cudaStream_t stream, const int32_t* pos_at) {
  RING_EW_CHECK(CheckAct(norm, "norm", /*optional=*/true));
  if (ckv == nullptr || latent == nullptr || k_pe == nullptr || q == nullptr || inv_freq == nullptr) {
    return absl::InvalidArgumentError("MLA k/v write + rope: null operand");
  }
  if (kvl <= 0 || rope <= 0 || rope % 2 != 0 || qd < rope || q_heads <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "MLA k/v write + rope: kvl %d, rope %d, qd %d, heads %d inconsistent", kvl, rope, qd, q_heads));
  }
  if (tokens <= 0) return absl::OkStatus();
  const unsigned threads = RowThreads(kvl);
  const int64_t pairs = tokens * (q_heads + 1) * (rope / 2);
  const int64_t blocks = tokens + (pairs + threads - 1) / threads;
  if (blocks > 0x7fffffff) return absl::InvalidArgumentError("MLA k/v write + rope: too many tokens");
  RING_LAUNCH_PDL(MlaKvRopeKernel, static_cast<unsigned>(blocks), threads, 0, stream, ckv, tokens, kvl,
                  rope, norm, eps, latent, k_pe, q, q_heads, qd, pre_scale, traditional ? 1 : 0,
                  inv_freq, offset, pos_at, round);
  return absl::OkStatus();
}

absl::Status IndexerNormRope(float* q, int64_t tokens, int64_t heads, int64_t d, float* k, DevArray norm_w,
                             DevArray norm_b, float eps, int64_t dims, float pre_scale, bool traditional,
                             const float* inv_freq, int64_t offset, float* w, int64_t n_w, float wscale,
                             cpu::ActDType round, cudaStream_t stream, const int32_t* pos_at,
                             float* k_cache) {
  RING_EW_CHECK(CheckAct(norm_w, "norm weight", /*optional=*/true));
  RING_EW_CHECK(CheckAct(norm_b, "norm bias", /*optional=*/true));
  if (q == nullptr || k == nullptr || inv_freq == nullptr || (w == nullptr && n_w > 0)) {
    return absl::InvalidArgumentError("indexer norm + rope: null operand");
  }
  if (d <= 0 || heads <= 0 || dims <= 0 || dims % 2 != 0 || dims > d || n_w < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "indexer norm + rope: d %d, heads %d, rope dims %d, %d weights inconsistent", d, heads, dims, n_w));
  }
  if (tokens <= 0) return absl::OkStatus();
  const unsigned threads = RowThreads(d);
  const int64_t rest = tokens * heads * (dims / 2) + n_w;
  const int64_t blocks = tokens + (rest + threads - 1) / threads;
  if (blocks > 0x7fffffff) return absl::InvalidArgumentError("indexer norm + rope: too many tokens");
  RING_LAUNCH_PDL(IndexerNormRopeKernel, static_cast<unsigned>(blocks), threads, 0, stream, q, tokens, heads, d,
                  k, norm_w, norm_b, eps, dims, pre_scale, traditional ? 1 : 0, inv_freq, offset, pos_at,
                  k_cache, w, n_w, wscale, round);
  return absl::OkStatus();
}

absl::Status SwiGlu(DevArray gate, DevArray up, int64_t n, cpu::ActDType round,
                    DevMutArray out, cudaStream_t stream, uint16_t* out_bf16) {
  RING_EW_CHECK(CheckAct(gate, "gate"));
  RING_EW_CHECK(CheckAct(up, "up"));
  RING_EW_CHECK(CheckOut(out));
  if (n <= 0) return absl::OkStatus();
  if (gate.dtype == DType::kF32 && up.dtype == DType::kF32 && out.dtype == DType::kF32 &&
      n % 4 == 0 && Aligned(gate.data, 16) && Aligned(up.data, 16) && Aligned(out.data, 16) &&
      Aligned(out_bf16, 8)) {
    RING_LAUNCH_PDL(SwiGlu4Kernel, FlatBlocks(n / 4, 256), 256, 0, stream,
                    static_cast<const float4*>(gate.data), static_cast<const float4*>(up.data),
                    n / 4, round, static_cast<float4*>(out.data), reinterpret_cast<uint2*>(out_bf16));
    return absl::OkStatus();
  }
  RING_LAUNCH_PDL(SwiGluKernel, FlatBlocks(n, 256), 256, 0, stream, gate, up, n, round, out,
                  out_bf16);
  return absl::OkStatus();
}

absl::Status Add(DevArray a, DevArray b, int64_t n, cpu::ActDType round, DevMutArray out,
                 cudaStream_t stream) {
  RING_EW_CHECK(CheckAct(a, "a"));
  RING_EW_CHECK(CheckAct(b, "b"));
  RING_EW_CHECK(CheckOut(out));
  if (n <= 0) return absl::OkStatus();
  RING_LAUNCH_PDL(AddKernel, FlatBlocks(n, 256), 256, 0, stream, a, b, n, round, out);
  return absl::OkStatus();
}

absl::Status ScaleRound(DevMutArray x, int64_t tokens, int64_t heads, int64_t head_dim,
                        int64_t stride, int64_t dims, float s, cpu::ActDType round,
                        cudaStream_t stream) {
  RING_EW_CHECK(CheckOut(x));
  if (dims > head_dim || heads * head_dim > stride) {
    return absl::InvalidArgumentError("scale_round: dims/head_dim/stride inconsistent");
  }
  const int64_t n = tokens * heads * dims;
  if (n <= 0) return absl::OkStatus();
  RING_LAUNCH_PDL(ScaleRoundKernel, FlatBlocks(n, 256), 256, 0, stream, x, tokens, heads, head_dim,
                  stride, dims, s, round);
  return absl::OkStatus();
}

absl::Status ToBf16(const float* x, int64_t n, uint16_t* out, cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  if (x == nullptr || out == nullptr) return absl::InvalidArgumentError("to_bf16: null pointer");
  if (n % 4 == 0 && Aligned(x, 16) && Aligned(out, 8)) {
    RING_LAUNCH_PDL(ToBf16x4Kernel, FlatBlocks(n / 4, 256), 256, 0, stream,
                    reinterpret_cast<const float4*>(x), n / 4, reinterpret_cast<uint2*>(out));
    return absl::OkStatus();
  }
  RING_LAUNCH_PDL(ToBf16Kernel, FlatBlocks(n, 256), 256, 0, stream, x, n, out);
  return absl::OkStatus();
}

absl::Status GatherRows(const float* src, int64_t width, const int32_t* idx, int64_t n,
                        float* dst, cudaStream_t stream) {
  if (n <= 0 || width <= 0) return absl::OkStatus();
  if (src == nullptr || idx == nullptr || dst == nullptr) {
    return absl::InvalidArgumentError("gather_rows: null pointer");
  }
  if (n > 65535) return absl::InvalidArgumentError("gather_rows: more than 65535 rows");
  const int threads = 128;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((width + threads - 1) / threads, 1024)),
                  static_cast<unsigned>(n));
  RING_LAUNCH_PDL(GatherRowsKernel, grid, threads, 0, stream, src, width, idx, dst);
  return absl::OkStatus();
}

absl::Status CopyBytes(const void* src, void* dst, int64_t bytes, cudaStream_t stream) {
  if (bytes <= 0) return absl::OkStatus();
  if (src == nullptr || dst == nullptr) return absl::InvalidArgumentError("copy_bytes: null pointer");
  if (bytes % 16 == 0 && Aligned(src, 16) && Aligned(dst, 16)) {
    RING_LAUNCH_PDL(CopyVec16Kernel, FlatBlocks(bytes / 16, 256), 256, 0, stream,
                    static_cast<const uint4*>(src), static_cast<uint4*>(dst), bytes / 16);
  } else {
    RING_LAUNCH_PDL(CopyByteKernel, FlatBlocks(bytes, 256), 256, 0, stream,
                    static_cast<const unsigned char*>(src), static_cast<unsigned char*>(dst), bytes);
  }
  return absl::OkStatus();
}

absl::Status TEST_SlowCopy(const void* src, void* dst, int64_t words, int64_t cycles,
                           cudaStream_t stream) {
  if (words <= 0) return absl::OkStatus();
  RING_LAUNCH_PDL(SlowCopyKernel, FlatBlocks(words, 256), 256, 0, stream,
                  static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst), words, cycles);
  return absl::OkStatus();
}

}  // namespace ring::cuda
