// Kernels behind attention.cuh.
//
// AttentionKernel (decode and short chunks; AttentionTileKernel takes prefill, see there):
// one block per (query, head), kWarps warps (4; 16 when the grid is too
// small to fill the GPU, as in decode). The scaled query sits in
// shared memory; warp w takes keys w, w + kWarps, ...; a key's score is a lane-split dot
// product and a butterfly sum, then the warp updates its online softmax state (running max,
// running sum, and a dv-wide accumulator spread over the lanes, kMaxChunks values each).
// The warps' states are merged in shared memory, the output divided and rounded once.
// Fully masked keys (causal) are skipped, as the reference gives them probability 0;
// additive-mask keys at bf16's lowest get exp(lowest - max) = 0 once any real key is seen.
//
// The MLA composition follows cpu::MlaAttention step by step; see attention.cuh.
//
// MlaDecodeKernel (absorbed decode, one query row, K = V = the latent cache): the 64 heads
// of a token all read the same latent rows, so a block takes a chunk of 32 keys for 8 heads
// (one warp each): the chunk's latent and rope-key rows (through the top-k indices when
// sparse, no gathered copy) sit in shared memory, lane j scores key j (the latent dot and
// the rope score, the latter rounded exactly as the reference's pe_scores), the warp keeps
// an online softmax over its block's chunks, and each block writes one partial (max, sum,
// kvl-wide accumulator) per head; MlaCombineKernel merges the partials of a head and
// rounds. Replaces per-head blocks that each walked all keys (one warp per key, a
// butterfly sum per key) over a gathered copy plus a separate rope-score pass.
#include "kernels/cuda/attention.cuh"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/linear.cuh"
#include "kernels/cuda/quant_decode.cuh"
#include "kernels/status.h"

namespace ring::cuda {
namespace {

// Warps per (query, head) block: 4, or 16 when there are too few blocks to fill the GPU
// (decode: one query row), so each warp walks a quarter as many keys.
constexpr int kNarrowWarps = 4;
constexpr int kWideWarps = 16;
constexpr int kMaxChunks = kMaxAttentionDv / 32;
constexpr float kBf16Lowest = -3.3895313892515355e38f;  // finfo(bfloat16).min

__device__ __forceinline__ float RoundActDev(float v, cpu::ActDType t) {
  switch (t) {
    case cpu::ActDType::kBF16: return qdec::RoundToBf16(v);
    case cpu::ActDType::kF16: return qdec::RoundToF16(v);
    default: return v;
  }
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

template <int kWarps>
__global__ void __launch_bounds__(kWarps * 32)
    AttentionKernel(AttentionParams p, cpu::ActDType rt) {
  extern __shared__ float smem[];
  const int64_t h = blockIdx.x / p.L, i = blockIdx.x % p.L;
  const int64_t kh = h / (p.hq / p.hkv);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* qs = smem;                      // [dk]
  float* part = smem + p.dk;             // [kWarps][dv + 2]
  const float* qi = p.q + i * p.q_tok + h * p.q_head;
  for (int64_t d = threadIdx.x; d < p.dk; d += blockDim.x) qs[d] = qi[d] * p.scale;
  __syncthreads();

  const int nchunks = static_cast<int>((p.dv + 31) / 32);
  float acc[kMaxChunks];
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) acc[c] = 0.f;
  float m = -INFINITY, l = 0.f;
  const int64_t jend = p.causal_offset >= 0 ? min(p.S, p.causal_offset + i + 1) : p.S;
  const float* mask = p.add_mask != nullptr ? p.add_mask + (h * p.L + i) * p.S : nullptr;
  for (int64_t j = warp; j < jend; j += kWarps) {
    const float* kj = p.k + j * p.k_tok + kh * p.k_head;
    float dot = 0.f;
    for (int64_t d = lane; d < p.dk; d += 32) dot = fmaf(qs[d], kj[d], dot);
    dot = WarpSum(dot);
    if (mask != nullptr) dot += mask[j];
    const float* vj = p.v + j * p.v_tok + kh * p.v_head;
    float cold, pnew;
    if (dot > m) {
      cold = expf(m - dot);
      pnew = 1.f;
      m = dot;
    } else {
      cold = 1.f;
      pnew = expf(dot - m);
    }
    l = l * cold + pnew;
#pragma unroll
    for (int c = 0; c < kMaxChunks; ++c) {
      if (c < nchunks) {
        const int64_t d = c * 32 + lane;
        const float vv = d < p.dv ? vj[d] : 0.f;
        acc[c] = acc[c] * cold + pnew * vv;
      }
    }
  }
  float* mine = part + warp * (p.dv + 2);
  if (lane == 0) {
    mine[0] = m;
    mine[1] = l;
  }
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    const int64_t d = c * 32 + lane;
    if (c < nchunks && d < p.dv) mine[2 + d] = acc[c];
  }
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < kWarps; ++w) {
    const float* pw = part + w * (p.dv + 2);
    if (pw[1] > 0.f) M = fmaxf(M, pw[0]);
  }
  float denom = 0.f;
  float f[kWarps];
  for (int w = 0; w < kWarps; ++w) {
    const float* pw = part + w * (p.dv + 2);
    f[w] = pw[1] > 0.f ? expf(pw[0] - M) : 0.f;
    denom += pw[1] * f[w];
  }
  const float inv = 1.f / denom;
  float* o = p.out + (i * p.hq + h) * p.dv;
  for (int64_t d = threadIdx.x; d < p.dv; d += blockDim.x) {
    float s = 0.f;
    for (int w = 0; w < kWarps; ++w) {
      if (f[w] != 0.f) s += part[w * (p.dv + 2) + 2 + d] * f[w];
    }
    const float r = RoundActDev(s * inv, rt);
    o[d] = r;
    if (p.out_bf16 != nullptr) {
      p.out_bf16[(i * p.hq + h) * p.dv + d] = static_cast<uint16_t>(qdec::F32ToBf16Bits(r));
    }
  }
}

// Prefill attention (L >= kTileMinL): a block takes kTileQ queries of one head (kTileQ / 8
// per warp) and walks the keys in chunks of 32 (one per lane): the chunk's K and V rows in
// shared memory serve all the block's queries, lane j scores key j for each of its warp's
// queries, and each query keeps an online softmax (its dv-wide accumulator spread over the
// lanes). Same arithmetic per score as AttentionKernel up to the summation order.
constexpr int kTileQ = 16;
constexpr int kTileQPerWarp = kTileQ / 8;
constexpr int kTileMaxD = 256;
constexpr int64_t kTileMinL = 16;

size_t AttentionTileSmem(int64_t dk, int64_t dv) {
  return sizeof(float) * (32 * (dk + 1) + 32 * (dv + 1) + kTileQ * dk);
}

__global__ void __launch_bounds__(256) AttentionTileKernel(AttentionParams p, cpu::ActDType rt) {
  extern __shared__ float sm[];
  const int dk = static_cast<int>(p.dk), dv = static_cast<int>(p.dv);
  float* ks = sm;                    // [32][dk + 1]
  float* vs = ks + 32 * (dk + 1);    // [32][dv + 1]
  float* qs = vs + 32 * (dv + 1);    // [kTileQ][dk], scaled
  const int64_t h = blockIdx.y, kh = h / (p.hq / p.hkv);
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * kTileQ;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int e = threadIdx.x; e < kTileQ * dk; e += blockDim.x) {
    const int64_t i = i0 + e / dk;
    qs[e] = i < p.L ? p.q[i * p.q_tok + h * p.q_head + e % dk] * p.scale : 0.f;
  }
  // Keys any query of the block sees.
  const int64_t ilast = min(p.L, i0 + kTileQ) - 1;
  const int64_t jend = p.causal_offset >= 0 ? min(p.S, p.causal_offset + ilast + 1) : p.S;
  const int nc = (dv + 31) / 32;
  float acc[kTileQPerWarp][kTileMaxD / 32];
  float m[kTileQPerWarp], l[kTileQPerWarp];
#pragma unroll
  for (int a = 0; a < kTileQPerWarp; ++a) {
    m[a] = -INFINITY;
    l[a] = 0.f;
#pragma unroll
    for (int c = 0; c < kTileMaxD / 32; ++c) acc[a][c] = 0.f;
  }
  for (int64_t j0 = 0; j0 < jend; j0 += 32) {
    const int n = static_cast<int>(min(static_cast<int64_t>(32), jend - j0));
    __syncthreads();  // the previous chunk's readers are done (and qs is written)
    for (int e = threadIdx.x; e < n * dk; e += blockDim.x) {
      ks[(e / dk) * (dk + 1) + e % dk] = p.k[(j0 + e / dk) * p.k_tok + kh * p.k_head + e % dk];
    }
    for (int e = threadIdx.x; e < n * dv; e += blockDim.x) {
      vs[(e / dv) * (dv + 1) + e % dv] = p.v[(j0 + e / dv) * p.v_tok + kh * p.v_head + e % dv];
    }
    __syncthreads();
    const int64_t j = j0 + lane;
    float pj[kTileQPerWarp];
#pragma unroll
    for (int a = 0; a < kTileQPerWarp; ++a) {
      const int qi = warp * kTileQPerWarp + a;
      const int64_t i = i0 + qi;
      float s = -INFINITY;
      if (lane < n && i < p.L && (p.causal_offset < 0 || j <= p.causal_offset + i)) {
        const float* qv = qs + qi * dk;
        const float* kr = ks + lane * (dk + 1);
        float dot = 0.f;
        for (int d = 0; d < dk; ++d) dot = fmaf(qv[d], kr[d], dot);
        if (p.add_mask != nullptr) dot += p.add_mask[(h * p.L + i) * p.S + j];
        s = dot;
      }
      float mc = s;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) mc = fmaxf(mc, __shfl_xor_sync(0xffffffffu, mc, off));
      const float mn = fmaxf(m[a], mc);
      pj[a] = 0.f;
      if (mn == -INFINITY) continue;  // warp-uniform
      const float cold = m[a] == -INFINITY ? 0.f : expf(m[a] - mn);
      pj[a] = s == -INFINITY ? 0.f : expf(s - mn);
      l[a] = l[a] * cold + WarpSum(pj[a]);
      m[a] = mn;
#pragma unroll
      for (int c = 0; c < kTileMaxD / 32; ++c) acc[a][c] *= cold;
    }
    for (int jj = 0; jj < n; ++jj) {
      float pb[kTileQPerWarp];
#pragma unroll
      for (int a = 0; a < kTileQPerWarp; ++a) pb[a] = __shfl_sync(0xffffffffu, pj[a], jj);
      const float* vr = vs + jj * (dv + 1) + lane;
#pragma unroll
      for (int c = 0; c < kTileMaxD / 32; ++c) {
        if (c < nc && c * 32 + lane < dv) {
          const float vv = vr[c * 32];
#pragma unroll
          for (int a = 0; a < kTileQPerWarp; ++a) acc[a][c] = fmaf(pb[a], vv, acc[a][c]);
        }
      }
    }
  }
#pragma unroll
  for (int a = 0; a < kTileQPerWarp; ++a) {
    const int64_t i = i0 + warp * kTileQPerWarp + a;
    if (i >= p.L) continue;
    const float inv = 1.f / l[a];
    float* o = p.out + (i * p.hq + h) * p.dv;
#pragma unroll
    for (int c = 0; c < kTileMaxD / 32; ++c) {
      const int d = c * 32 + lane;
      if (c < nc && d < dv) {
        const float r = RoundActDev(acc[a][c] * inv, rt);
        o[d] = r;
        if (p.out_bf16 != nullptr) {
          p.out_bf16[(i * p.hq + h) * p.dv + d] = static_cast<uint16_t>(qdec::F32ToBf16Bits(r));
        }
      }
    }
  }
}

// pe[h, i, j] = round(sum_d round(q[i, h, off + d] * scale) * kpe[j, d]) over d < rope,
// sequential in d like cpu::MatMulABt; bf16's lowest where key j is not allowed. A block
// takes kPeKeys keys (their rope keys in shared memory, one per lane) for kPeRows (h, i)
// rows (kPeRows / 8 per warp): the query values are warp-uniform loads, the writes of a
// row coalesced.
constexpr int kPeKeys = 32;
constexpr int kPeRows = 64;

__global__ void __launch_bounds__(256)
    PeScoresKernel(const float* q, int64_t q_tok, int64_t q_head, int64_t q_off, float scale,
                   const float* kpe, int64_t rope, int64_t T, int64_t H, int64_t Sk,
                   const uint8_t* allowed, int64_t causal_offset, cpu::ActDType rt, float* out) {
  extern __shared__ float kt[];  // [kPeKeys][rope + 1]
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kPeKeys;
  const int n = static_cast<int>(min(static_cast<int64_t>(kPeKeys), Sk - j0));
  for (int64_t e = threadIdx.x; e < n * rope; e += blockDim.x) {
    kt[(e / rope) * (rope + 1) + e % rope] = kpe[(j0 + e / rope) * rope + e % rope];
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane >= n) return;
  const int64_t j = j0 + lane;
  const float* kv = kt + lane * (rope + 1);
  constexpr int kPerWarp = kPeRows / 8;
  for (int w = 0; w < kPerWarp; ++w) {
    const int64_t r = static_cast<int64_t>(blockIdx.y) * kPeRows + warp * kPerWarp + w;
    if (r >= H * T) return;
    const int64_t h = r / T, i = r % T;
    const float* qv = q + i * q_tok + h * q_head + q_off;
    float dot = 0.f;
    for (int64_t d = 0; d < rope; ++d) dot = fmaf(RoundActDev(qv[d] * scale, rt), kv[d], dot);
    float v = RoundActDev(dot, rt);
    const bool ok = (causal_offset < 0 || j <= causal_offset + i) &&
                    (allowed == nullptr || allowed[i * Sk + j] != 0);
    out[r * Sk + j] = ok ? v : kBf16Lowest;
  }
}

// allowed[i, topk[i, s]] = 1 (the buffer was zeroed).
__global__ void ScatterAllowedKernel(const int32_t* topk, int64_t T, int64_t K, int64_t Sk,
                                     uint8_t* allowed) {
  const int64_t n = T * K;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = idx / K;
    const int32_t j = topk[idx];
    if (j >= 0 && j < Sk) allowed[i * Sk + j] = 1;
  }
}


// Absorbed MLA decode (file comment). Partial p of head h at part + (p * H + h) * (kvl + 2):
// [max, sum, acc[kvl]].
constexpr int kMlaChunk = 32;         // keys per chunk: one per lane
constexpr int kMlaHeadsPerBlock = 8;  // one per warp
constexpr int kMlaMaxKvl = 512;
constexpr int kMlaMaxSplits = 64;     // partials per head

struct MlaDecodeParams {
  const float* qlat = nullptr;  // [H, kvl], rounded
  const float* q = nullptr;     // [H, qd]: the rope part at + nope
  int64_t qd = 0, nope = 0;
  const float* lat = nullptr;   // [S, kvl]
  const float* pe = nullptr;    // [S, rope]
  const int32_t* topk = nullptr;  // [Sk] or null (key j is row j)
  int64_t S = 0, Sk = 0, H = 0;
  int kvl = 0, rope = 0;
  int chunks_per_split = 1;
  float scale = 1.f;
  float* part = nullptr;
};

size_t MlaDecodeSmem(int kvl, int rope) {
  return sizeof(float) * (kMlaChunk * (kvl + 1) + kMlaChunk * (rope + 1) +
                          kMlaHeadsPerBlock * (kvl + rope));
}

__global__ void __launch_bounds__(kMlaHeadsPerBlock * 32)
    MlaDecodeKernel(MlaDecodeParams p, cpu::ActDType rt) {
  extern __shared__ float sm[];
  const int kvl = p.kvl, rope = p.rope, ks = kvl + 1, ps = rope + 1;
  float* keys = sm;                                 // [chunk][kvl + 1]
  float* kpe = keys + kMlaChunk * ks;               // [chunk][rope + 1]
  float* qs = kpe + kMlaChunk * ps;                 // [heads][kvl]: q_lat * scale
  float* qp = qs + kMlaHeadsPerBlock * kvl;         // [heads][rope]: round(q_pe * scale)
  __shared__ int rows[kMlaChunk];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t h0 = static_cast<int64_t>(blockIdx.y) * kMlaHeadsPerBlock;
  for (int i = threadIdx.x; i < kMlaHeadsPerBlock * kvl; i += blockDim.x) {
    const int64_t h = h0 + i / kvl;
    qs[i] = h < p.H ? p.qlat[h * kvl + i % kvl] * p.scale : 0.f;
  }
  for (int i = threadIdx.x; i < kMlaHeadsPerBlock * rope; i += blockDim.x) {
    const int64_t h = h0 + i / rope;
    qp[i] = h < p.H ? RoundActDev(p.q[h * p.qd + p.nope + i % rope] * p.scale, rt) : 0.f;
  }
  const int nc = kvl / 32;
  float acc[kMlaMaxKvl / 32];
#pragma unroll
  for (int c = 0; c < kMlaMaxKvl / 32; ++c) acc[c] = 0.f;
  float m = -INFINITY, l = 0.f;
  const float* qv = qs + warp * kvl;
  const float* qpv = qp + warp * rope;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * p.chunks_per_split * kMlaChunk;
  for (int ch = 0; ch < p.chunks_per_split; ++ch) {
    const int64_t j0 = first + static_cast<int64_t>(ch) * kMlaChunk;
    if (j0 >= p.Sk) break;  // uniform over the block
    const int n = static_cast<int>(min(static_cast<int64_t>(kMlaChunk), p.Sk - j0));
    __syncthreads();  // the previous chunk's readers are done
    if (threadIdx.x < kMlaChunk) {
      int64_t r = -1;
      if (threadIdx.x < n) {
        r = p.topk != nullptr ? p.topk[j0 + threadIdx.x] : j0 + threadIdx.x;
        if (r < 0 || r >= p.S) r = -1;
      }
      rows[threadIdx.x] = static_cast<int>(r);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n * kvl; i += blockDim.x) {
      const int r = i / kvl, d = i % kvl;
      const int row = rows[r];
      keys[r * ks + d] = row >= 0 ? p.lat[static_cast<int64_t>(row) * kvl + d] : 0.f;
    }
    for (int i = threadIdx.x; i < n * rope; i += blockDim.x) {
      const int r = i / rope, d = i % rope;
      const int row = rows[r];
      kpe[r * ps + d] = row >= 0 ? p.pe[static_cast<int64_t>(row) * rope + d] : 0.f;
    }
    __syncthreads();
    // Lane j scores key j: latent dot (scaled query) + the rounded rope score.
    float s = -INFINITY;
    if (lane < n && rows[lane] >= 0) {
      const float* kr = keys + lane * ks;
      float dot = 0.f;
      for (int d = 0; d < kvl; ++d) dot = fmaf(qv[d], kr[d], dot);
      const float* pr = kpe + lane * ps;
      float pe = 0.f;
      for (int d = 0; d < rope; ++d) pe = fmaf(qpv[d], pr[d], pe);
      s = dot + RoundActDev(pe, rt);
    }
    float mc = s;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mc = fmaxf(mc, __shfl_xor_sync(0xffffffffu, mc, off));
    const float mn = fmaxf(m, mc);
    if (mn == -INFINITY) continue;  // nothing visible yet (uniform over the warp)
    const float cold = m == -INFINITY ? 0.f : expf(m - mn);
    const float pj = s == -INFINITY ? 0.f : expf(s - mn);
    l = l * cold + WarpSum(pj);
    m = mn;
#pragma unroll
    for (int c = 0; c < kMlaMaxKvl / 32; ++c) acc[c] *= cold;
    for (int j = 0; j < n; ++j) {
      const float pb = __shfl_sync(0xffffffffu, pj, j);
      const float* kr = keys + j * ks + lane;
#pragma unroll
      for (int c = 0; c < kMlaMaxKvl / 32; ++c) {
        if (c < nc) acc[c] = fmaf(pb, kr[c * 32], acc[c]);
      }
    }
  }
  const int64_t h = h0 + warp;
  if (h >= p.H) return;
  float* out = p.part + (static_cast<int64_t>(blockIdx.x) * p.H + h) * (kvl + 2);
  if (lane == 0) {
    out[0] = m;
    out[1] = l;
  }
#pragma unroll
  for (int c = 0; c < kMlaMaxKvl / 32; ++c) {
    if (c < nc) out[2 + c * 32 + lane] = acc[c];
  }
}

// out[h, :] = round(sum_p acc_p * e^(m_p - M) / sum_p l_p * e^(m_p - M)); one block per head.
__global__ void MlaCombineKernel(const float* part, int splits, int64_t H, int kvl,
                                 cpu::ActDType rt, float* out) {
  __shared__ float f[kMlaMaxSplits];
  __shared__ float inv;
  const int64_t h = blockIdx.x;
  if (threadIdx.x == 0) {
    float M = -INFINITY;
    for (int s = 0; s < splits; ++s) {
      const float* ps = part + (s * H + h) * (kvl + 2);
      if (ps[1] > 0.f) M = fmaxf(M, ps[0]);
    }
    float denom = 0.f;
    for (int s = 0; s < splits; ++s) {
      const float* ps = part + (s * H + h) * (kvl + 2);
      f[s] = ps[1] > 0.f ? expf(ps[0] - M) : 0.f;
      denom += ps[1] * f[s];
    }
    inv = 1.f / denom;
  }
  __syncthreads();
  for (int d = threadIdx.x; d < kvl; d += blockDim.x) {
    float acc = 0.f;
    for (int s = 0; s < splits; ++s) {
      if (f[s] != 0.f) acc += part[(s * H + h) * (kvl + 2) + 2 + d] * f[s];
    }
    out[h * kvl + d] = RoundActDev(acc * inv, rt);
  }
}

unsigned Blocks(int64_t n, int threads) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + threads - 1) / threads, 1, 65535 * 4));
}

}  // namespace

absl::Status Attention(const AttentionParams& p, cpu::ActDType round, cudaStream_t stream) {
  if (p.q == nullptr || p.k == nullptr || p.v == nullptr || p.out == nullptr) {
    return absl::InvalidArgumentError("attention: null operand");
  }
  if (p.L <= 0 || p.S <= 0) return absl::OkStatus();
  if (p.hq <= 0 || p.hkv <= 0 || p.hq % p.hkv != 0 || p.dk <= 0 || p.dv <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "attention: heads %d / kv heads %d / dk %d / dv %d inconsistent", p.hq, p.hkv, p.dk, p.dv));
  }
  if (p.dv > kMaxAttentionDv) {
    return absl::UnimplementedError(
        absl::StrFormat("attention: value width %d above %d", p.dv, kMaxAttentionDv));
  }
  const int64_t blocks = p.L * p.hq;
  if (blocks > 0x7fffffff) return absl::InvalidArgumentError("attention: too many rows");
  absl::StatusOr<const DeviceInfo*> dev = CurrentDevice();
  if (!dev.ok()) return dev.status();
  const size_t tile_smem = AttentionTileSmem(p.dk, p.dv);
  if (p.L >= kTileMinL && p.dk <= kTileMaxD && p.dv <= kTileMaxD && p.hq <= 65535 &&
      static_cast<int64_t>(tile_smem) <= (*dev)->smem_per_block_optin) {
    if (tile_smem > 48 * 1024) {
      RING_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(AttentionTileKernel,
                                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                     static_cast<int>(tile_smem)));
    }
    const dim3 grid(static_cast<unsigned>((p.L + kTileQ - 1) / kTileQ), static_cast<unsigned>(p.hq));
    AttentionTileKernel<<<grid, 256, tile_smem, stream>>>(p, round);
    RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  }
  const bool wide = blocks < 2 * static_cast<int64_t>((*dev)->sm_count);
  const int warps = wide ? kWideWarps : kNarrowWarps;
  const size_t smem = (p.dk + warps * (p.dv + 2)) * sizeof(float);
  const void* fn = wide ? reinterpret_cast<const void*>(AttentionKernel<kWideWarps>)
                        : reinterpret_cast<const void*>(AttentionKernel<kNarrowWarps>);
  if (smem > 48 * 1024) {
    RING_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
        fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
  if (wide) {
    AttentionKernel<kWideWarps><<<static_cast<unsigned>(blocks), warps * 32, smem, stream>>>(p, round);
  } else {
    AttentionKernel<kNarrowWarps><<<static_cast<unsigned>(blocks), warps * 32, smem, stream>>>(p, round);
  }
  RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status Attention(const cpu::AttentionArgs& a, cpu::ActDType round, float* out,
                       cudaStream_t stream, uint16_t* out_bf16) {
  AttentionParams p;
  p.q = a.q;
  p.q_tok = a.q_stride;
  p.q_head = a.dk;
  p.k = a.k;
  p.k_tok = a.k_stride;
  p.k_head = a.dk;
  p.v = a.v;
  p.v_tok = a.v_stride;
  p.v_head = a.dv;
  p.L = a.L;
  p.S = a.S;
  p.hq = a.hq;
  p.hkv = a.hkv;
  p.dk = a.dk;
  p.dv = a.dv;
  p.scale = a.scale;
  p.add_mask = a.add_mask;
  p.causal_offset = a.causal_offset;
  p.out = out;
  p.out_bf16 = out_bf16;
  return Attention(p, round, stream);
}

namespace {

// Absorbed decode through MlaDecodeKernel (file comment): q_lat = round(q_nope @ W_UK_h^T)
// per head, the split attention and its combine, out = round(o_lat @ W_UV_h^T).
absl::Status MlaDecode(const cpu::MlaAttentionArgs& a, const DeviceQuantWeight& embed_q,
                       const DeviceQuantWeight& unembed_out, cpu::ActDType t, float* out,
                       int64_t Sk, size_t smem, cudaStream_t stream) {
  const int64_t H = a.H, kvl = a.kvl, qd = a.nope + a.rope;
  const int64_t chunks = (Sk + kMlaChunk - 1) / kMlaChunk;
  const int64_t per_split = (chunks + kMlaMaxSplits - 1) / kMlaMaxSplits;
  const int64_t splits = (chunks + per_split - 1) / per_split;
  const int64_t head_blocks = (H + kMlaHeadsPerBlock - 1) / kMlaHeadsPerBlock;
  if (per_split > 0x7fffffff || head_blocks > 65535) {
    return absl::InvalidArgumentError("mla decode: too many keys or heads");
  }
  // One scratch block: q_lat, o_lat, the partials.
  const int64_t part_floats = splits * H * (kvl + 2);
  RING_ASSIGN_OR_RETURN(StreamBuffer scratch,
                        StreamBuffer::Allocate((2 * H * kvl + part_floats) * sizeof(float), stream));
  float* qlat = scratch.as<float>();
  float* olat = qlat + H * kvl;
  QMatmulArgs qa;
  qa.x = a.q;  // q_nope of head h at h * qd
  qa.m = 1;
  qa.y = qlat;
  qa.problems = H;
  qa.x_problem_stride = qd;
  qa.y_problem_stride = kvl;
  RING_RETURN_IF_ERROR(LinearT(embed_q, qa, t, stream));
  MlaDecodeParams p;
  p.qlat = qlat;
  p.q = a.q;
  p.qd = qd;
  p.nope = a.nope;
  p.lat = a.latent;
  p.pe = a.k_pe;
  p.topk = a.topk;
  p.S = a.S;
  p.Sk = Sk;
  p.H = H;
  p.kvl = static_cast<int>(kvl);
  p.rope = static_cast<int>(a.rope);
  p.chunks_per_split = static_cast<int>(per_split);
  p.scale = a.scale;
  p.part = olat + H * kvl;
  if (smem > 48 * 1024) {
    RING_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
        MlaDecodeKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
  MlaDecodeKernel<<<dim3(static_cast<unsigned>(splits), static_cast<unsigned>(head_blocks)),
                    kMlaHeadsPerBlock * 32, smem, stream>>>(p, t);
  RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  MlaCombineKernel<<<static_cast<unsigned>(H), 256, 0, stream>>>(
      p.part, static_cast<int>(splits), H, p.kvl, t, olat);
  RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  QMatmulArgs oa;
  oa.x = olat;
  oa.m = 1;
  oa.y = out;
  oa.problems = H;
  oa.x_problem_stride = kvl;
  oa.y_problem_stride = a.vd;
  return LinearT(unembed_out, oa, t, stream);
}

}  // namespace

absl::Status MlaAttention(const cpu::MlaAttentionArgs& a, const DeviceQuantWeight& embed_q,
                          const DeviceQuantWeight& unembed_out, cpu::ActDType t, float* out,
                          cudaStream_t stream) {
  const int64_t T = a.T, H = a.H, nope = a.nope, rope = a.rope, vd = a.vd, kvl = a.kvl;
  const int64_t qd = nope + rope;
  const bool sparse = a.topk != nullptr;
  const int64_t K = sparse ? a.K : 0;
  if (T <= 0) return absl::OkStatus();
  if (a.S != a.offset + T || (sparse && (K <= 0 || K > a.S))) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "mla attention: S %d, offset %d, T %d, K %d inconsistent", a.S, a.offset, T, K));
  }
  if (embed_q.batch != H || embed_q.rows != kvl || embed_q.cols != nope ||
      unembed_out.batch != H || unembed_out.rows != vd || unembed_out.cols != kvl) {
    return absl::InvalidArgumentError("mla attention: embed_q / unembed_out shapes do not match");
  }
  const bool gather = sparse && T == 1;
  const int64_t Sk = gather ? K : a.S;
  if (T == 1) {
    absl::StatusOr<const DeviceInfo*> dev = CurrentDevice();
    if (!dev.ok()) return dev.status();
    const size_t smem = MlaDecodeSmem(static_cast<int>(kvl), static_cast<int>(rope));
    if (kvl % 32 == 0 && kvl <= kMlaMaxKvl && rope <= 1024 && (nope + rope) % 8 == 0 &&
        static_cast<int64_t>(smem) <= (*dev)->smem_per_block_optin) {
      return MlaDecode(a, embed_q, unembed_out, t, out, Sk, smem, stream);
    }
  }
  const float* lat = a.latent;
  const float* pe = a.k_pe;
  StreamBuffer glat, gpe;
  if (gather) {
    RING_ASSIGN_OR_RETURN(glat, StreamBuffer::Allocate(K * kvl * sizeof(float), stream));
    RING_ASSIGN_OR_RETURN(gpe, StreamBuffer::Allocate(K * rope * sizeof(float), stream));
    RING_RETURN_IF_ERROR(GatherRows(a.latent, kvl, a.topk, K, glat.as<float>(), stream));
    RING_RETURN_IF_ERROR(GatherRows(a.k_pe, rope, a.topk, K, gpe.as<float>(), stream));
    lat = glat.as<float>();
    pe = gpe.as<float>();
  }
  // pe_scores with the masks of the reference: T > 1 causal, and sparse rows' selection.
  StreamBuffer allowed, pe_scores;
  if (T > 1 && sparse) {
    RING_ASSIGN_OR_RETURN(allowed, StreamBuffer::Allocate(T * Sk, stream));
    RING_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(allowed.data(), 0, T * Sk, stream));
    ScatterAllowedKernel<<<Blocks(T * K, 256), 256, 0, stream>>>(a.topk, T, K, Sk,
                                                                  allowed.as<uint8_t>());
    RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  RING_ASSIGN_OR_RETURN(pe_scores, StreamBuffer::Allocate(H * T * Sk * sizeof(float), stream));
  const int64_t pe_row_blocks = (H * T + kPeRows - 1) / kPeRows;
  if (pe_row_blocks > 65535 || (Sk + kPeKeys - 1) / kPeKeys > 0x7fffffff) {
    return absl::InvalidArgumentError("mla attention: too many query rows or keys");
  }
  const size_t pe_smem = kPeKeys * (rope + 1) * sizeof(float);
  if (pe_smem > 48 * 1024) {
    RING_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
        PeScoresKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(pe_smem)));
  }
  PeScoresKernel<<<dim3(static_cast<unsigned>((Sk + kPeKeys - 1) / kPeKeys),
                        static_cast<unsigned>(pe_row_blocks)),
                   256, pe_smem, stream>>>(
      a.q, H * qd, qd, nope, a.scale, pe, rope, T, H, Sk,
      allowed.data() != nullptr ? allowed.as<uint8_t>() : nullptr, T > 1 ? a.offset : -1, t,
      pe_scores.as<float>());
  RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  // q_nope, contiguous [T, H, nope].
  RING_ASSIGN_OR_RETURN(StreamBuffer qn, StreamBuffer::Allocate(T * H * nope * sizeof(float), stream));
  RING_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(qn.data(), nope * sizeof(float), a.q,
                                              qd * sizeof(float), nope * sizeof(float), T * H,
                                              cudaMemcpyDeviceToDevice, stream));
  if (T > 1) {
    // Expanded form: K_h = round(latent @ W_UK_h) [H, Sk, nope], V_h = round(latent @
    // W_UV_h^T) [H, Sk, vd]; one launch each over the H heads.
    RING_ASSIGN_OR_RETURN(StreamBuffer kexp, StreamBuffer::Allocate(H * Sk * nope * sizeof(float), stream));
    RING_ASSIGN_OR_RETURN(StreamBuffer vexp, StreamBuffer::Allocate(H * Sk * vd * sizeof(float), stream));
    QMatmulArgs ka;
    ka.x = lat;
    ka.m = Sk;
    ka.y = kexp.as<float>();
    ka.problems = H;
    ka.x_problem_stride = 0;
    ka.y_problem_stride = Sk * nope;
    RING_RETURN_IF_ERROR(LinearN(embed_q, ka, t, stream));
    QMatmulArgs va = ka;
    va.y = vexp.as<float>();
    va.y_problem_stride = Sk * vd;
    RING_RETURN_IF_ERROR(LinearT(unembed_out, va, t, stream));
    AttentionParams p;
    p.q = qn.as<float>();
    p.q_tok = H * nope;
    p.q_head = nope;
    p.k = kexp.as<float>();
    p.k_tok = nope;
    p.k_head = Sk * nope;
    p.v = vexp.as<float>();
    p.v_tok = vd;
    p.v_head = Sk * vd;
    p.L = T;
    p.S = Sk;
    p.hq = p.hkv = H;
    p.dk = nope;
    p.dv = vd;
    p.scale = a.scale;
    p.add_mask = pe_scores.as<float>();
    p.out = out;
    return Attention(p, t, stream);
  }
  // Absorbed form: q_lat = round(q_nope @ W_UK_h^T) [H, kvl]; attention over the latent
  // (K = V, one KV head); out = round(out_lat @ W_UV_h^T) [H, vd].
  RING_ASSIGN_OR_RETURN(StreamBuffer qlat, StreamBuffer::Allocate(H * kvl * sizeof(float), stream));
  RING_ASSIGN_OR_RETURN(StreamBuffer olat, StreamBuffer::Allocate(H * kvl * sizeof(float), stream));
  QMatmulArgs qa;
  qa.x = qn.data();
  qa.m = 1;
  qa.y = qlat.as<float>();
  qa.problems = H;
  qa.x_problem_stride = nope;
  qa.y_problem_stride = kvl;
  RING_RETURN_IF_ERROR(LinearT(embed_q, qa, t, stream));
  AttentionParams p;
  p.q = qlat.as<float>();
  p.q_tok = H * kvl;
  p.q_head = kvl;
  p.k = p.v = lat;
  p.k_tok = p.v_tok = kvl;
  p.k_head = p.v_head = 0;
  p.L = 1;
  p.S = Sk;
  p.hq = H;
  p.hkv = 1;
  p.dk = p.dv = kvl;
  p.scale = a.scale;
  p.add_mask = pe_scores.as<float>();
  p.out = olat.as<float>();
  RING_RETURN_IF_ERROR(Attention(p, t, stream));
  QMatmulArgs oa;
  oa.x = olat.data();
  oa.m = 1;
  oa.y = out;
  oa.problems = H;
  oa.x_problem_stride = kvl;
  oa.y_problem_stride = vd;
  return LinearT(unembed_out, oa, t, stream);
}

}  // namespace ring::cuda
