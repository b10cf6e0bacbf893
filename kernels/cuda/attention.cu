// Kernels behind attention.cuh.
//
// Prefill (L >= 16 query rows) with bf16 activations runs on the tensor cores
// (AttentionMmaKernel, see there; RING_ATTN_MMA=0 turns it off), otherwise on the tiled fp32
// kernel (AttentionTileKernel).
// AttentionKernel (decode and short chunks; AttentionTileKernel takes prefill, see there):
// one block per (query, head), kWarps warps (4; 16 when the grid is too
// small to fill the GPU, as in decode). The scaled query sits in
// shared memory; warp w takes keys w, w + kWarps, ...; a key's score is a lane-split dot
// product and a butterfly sum, then the warp updates its online softmax state (running max,
// running sum, and a dv-wide accumulator spread over the lanes, kMaxChunks values each).
// The warps' states are merged in shared memory, the output divided and rounded once.
// Fully masked keys (causal) are skipped, as the reference gives them probability 0;
// additive-mask keys at bf16's lowest get exp(lowest - max) = 0 once any real key is seen.
// AttentionVecKernel is the same design for dk = dv in {64, 128, 256} with each warp keeping
// a batch of keys' rows in flight. Its decode grid (L * hq blocks: 16 for Qwen3-0.6B) leaves
// most SMs idle and walks every key in one block, so long rows (AttentionVecKeySplit: at
// least 256 keys a split, up to two blocks per SM in all) run on a (row, split) grid:
// each block walks one range of keys and writes its merged state (max, sum, unnormalised
// accumulator) as a partial, and SplitCombineKernel merges a row's partials in split order,
// divides and rounds, as the single pass would. Keys a split's row cannot see (causal) make
// an empty partial (sum 0) that the merge skips; a split whose keys all carry the mask's
// lowest gets weight exp(lowest - max) = 0 like the keys themselves.
//
// The MLA composition follows cpu::MlaAttention step by step; see attention.cuh.
//
// MlaDecodeKernel (absorbed decode, one query row, K = V = the latent cache): the 64 heads
// of a token all read the same latent rows, so a block takes 8 heads and a split of the keys
// in chunks of 32: the chunk's latent and rope-key rows (through the top-k indices when
// sparse, no gathered copy) are copied into shared memory by cp.async, 16 bytes a copy with
// all of a thread's copies in flight; each latent score is summed over 8 slices of the
// latent (one per warp, eight heads per thread as independent FMA chains) plus the rope
// score rounded exactly as the reference's pe_scores; each head keeps an online softmax over
// its block's chunks and each block writes one partial (max, sum, kvl-wide accumulator) per
// head; SplitCombineKernel merges the partials of a head and rounds. The split count gives
// every SM two blocks. The previous version filled its rows with scalar loads one after
// another and ran the 512-long dot as one FMA chain per lane: latency-bound at ~10x its
// shared-memory and FMA time. With bf16 activations at kvl 512 / rope 64 (GLM-5,
// DeepSeek-V3) MlaDecodeMmaKernel does the same work on the tensor cores (see there;
// RING_ATTN_MMA=0 keeps this kernel).
//
// MlaSparsePrefillKernel: a prompt's rows that select their keys by the DSA top-k, each in
// the absorbed form as its decode step (one block per row and 64 heads; see there;
// RING_MLA_SPARSE_PREFILL=0 keeps such rows on the expanded form).
#include "kernels/cuda/attention.cuh"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_format.h"
#include "kernels/cuda/act_round.cuh"
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/indexer.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/linear.cuh"
#include "kernels/cuda/qgemv_internal.cuh"
#include "kernels/cuda/quant_decode.cuh"
#include "kernels/cuda/warp_scan.cuh"
#include "kernels/status.h"

namespace ring::cuda {
namespace {

using internal::CpAsync16;
using internal::CpAsyncCommit;
using internal::CpAsyncWait;
using internal::CpAsyncWaitAll;
using internal::LdMatrixX4;
using internal::WarpSum;

unsigned Blocks(int64_t n, int threads) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + threads - 1) / threads, 1, 65535 * 4));
}


// Warps per (query, head) block: 4, or 16 when there are too few blocks to fill the GPU
// (decode: one query row), so each warp walks a quarter as many keys.
constexpr int kNarrowWarps = 4;
constexpr int kWideWarps = 16;
constexpr int kMaxChunks = kMaxAttentionDv / 32;
// Long decode rows on AttentionVecKernel are split over blocks (AttentionVecKeySplit) into
// splits of at least kSplitMinKeys keys, so a split's key walk stays long against its fixed
// cost (query load, warp merge, partial written and read back by the combine) and rows under
// 2 * kSplitMinKeys keys keep the single pass; splits are whole multiples of kSplitKeyAlign
// keys, one round of the wide kernel's 16 warps at 8 keys each (two rounds at d = 256, 4
// keys each), so the warps of a full split walk equal shares.
constexpr int64_t kSplitMinKeys = 256;
constexpr int64_t kSplitKeyAlign = kWideWarps * 8;
constexpr float kBf16Lowest = -3.3895313892515355e38f;  // finfo(bfloat16).min

// sum_d a[d] * b[d], sequential in d like the scalar loops and the reference, read 16 bytes
// at a time (n a multiple of 4, a and b 16-byte aligned).
__device__ __forceinline__ float DotSeq4(const float* a, const float* b, int n) {
  float dot = 0.f;
  for (int d = 0; d < n; d += 4) {
    const float4 x = *reinterpret_cast<const float4*>(a + d);
    const float4 y = *reinterpret_cast<const float4*>(b + d);
    dot = fmaf(x.x, y.x, dot);
    dot = fmaf(x.y, y.y, dot);
    dot = fmaf(x.z, y.z, dot);
    dot = fmaf(x.w, y.w, dot);
  }
  return dot;
}

// One key's score `sc` into an online softmax state (running max m, running sum l): the
// factor `cold` the accumulators are rescaled by and the key's weight `pnew`.
__device__ __forceinline__ void OnlineSoftmaxStep(float sc, float& m, float& l, float& cold,
                                                  float& pnew) {
  if (sc == -INFINITY) {  // a key masked with -inf: weight 0 as in the reference, even as the
    cold = 1.f;           // first key (exp(-inf - -inf) would be NaN)
    pnew = 0.f;
  } else if (sc > m) {
    cold = expf(m - sc);
    pnew = 1.f;
    m = sc;
  } else {
    cold = 1.f;
    pnew = expf(sc - m);
  }
  l = l * cold + pnew;
}

// The end of a (query, head) block: each warp has written its state (m, l, dv accumulators)
// at part + w * (dv + 2); merges them and writes the rounded output row (and its bf16 bits),
// or, when `split` is set (a block over one split of the keys), the merged state unrounded
// and undivided as [max, sum, acc[dv]] there for SplitCombineKernel. A block that saw no
// key (a split past a row's causal end) writes max -inf and sum 0, which the combine skips.
template <int kWarps>
__device__ __forceinline__ void MergeWarpStates(const float* part, int64_t dv,
                                                cpu::ActDType rt, float* o, uint16_t* o_bf16,
                                                float* split = nullptr) {
  float M = -INFINITY;
  for (int w = 0; w < kWarps; ++w) {
    const float* pw = part + w * (dv + 2);
    if (pw[1] > 0.f) M = fmaxf(M, pw[0]);
  }
  float denom = 0.f;
  float f[kWarps];
  for (int w = 0; w < kWarps; ++w) {
    const float* pw = part + w * (dv + 2);
    f[w] = pw[1] > 0.f ? expf(pw[0] - M) : 0.f;
    denom += pw[1] * f[w];
  }
  if (split != nullptr && threadIdx.x == 0) {
    split[0] = M;
    split[1] = denom;
  }
  const float inv = 1.f / denom;
  for (int64_t d = threadIdx.x; d < dv; d += blockDim.x) {
    float s = 0.f;
    for (int w = 0; w < kWarps; ++w) {
      if (f[w] != 0.f) s += part[w * (dv + 2) + 2 + d] * f[w];
    }
    if (split != nullptr) {
      split[2 + d] = s;
      continue;
    }
    const float r = DevRoundAct(s * inv, rt);
    o[d] = r;
    if (o_bf16 != nullptr) o_bf16[d] = static_cast<uint16_t>(qdec::F32ToBf16Bits(r));
  }
}

template <int kWarps>
__global__ void __launch_bounds__(kWarps * 32)
    AttentionKernel(AttentionParams p, cpu::ActDType rt) {
  PdlBegin();
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
    OnlineSoftmaxStep(dot, m, l, cold, pnew);
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
  const int64_t row = (i * p.hq + h) * p.dv;
  MergeWarpStates<kWarps>(part, p.dv, rt, p.out + row,
                          p.out_bf16 != nullptr ? p.out_bf16 + row : nullptr);
}

// AttentionKernel for dk = dv = D in {64, 128, 256} with 16-byte aligned K/V rows (Qwen3,
// Llama-like heads; the launcher picks it): the same block per (query, head) and the same
// merge, but each warp takes kBatch consecutive keys at a time and issues all their K and V loads (one 8 to 32
// byte vector per lane and row) before the dots, so a warp has kBatch rows in flight
// instead of one dependent load chain per key (the generic kernel above: ~52 us per layer
// for Qwen3-0.6B's 16 heads over ~300 keys, latency-bound). Lane l holds dims
// [l * V, l * V + V) of q, K, V and the accumulator; a key's dot sums the lane's V products
// in order, then the butterfly; keys update the online softmax in ascending order.
// Long decode rows are split over blocks (AttentionVecKeySplit): block (r, s) takes keys
// [s * split_keys, (s + 1) * split_keys) of row r and, with `partials` set, writes its
// merged state to partial (s, r) for SplitCombineKernel; with `partials` null (one split,
// split_keys >= S) it is the single pass and writes the output itself.
template <int D, int kWarps>
__global__ void __launch_bounds__(kWarps * 32)
    AttentionVecKernel(AttentionParams p, cpu::ActDType rt, int64_t split_keys, float* partials) {
  PdlBegin();
  constexpr int V = D / 32;  // floats per lane: 2, 4 or 8
  constexpr int kBatch = V >= 8 ? 4 : 8;  // keys in flight per warp (registers: 2 x kBatch x V)
  extern __shared__ float smem[];
  const int64_t h = blockIdx.x / p.L, i = blockIdx.x % p.L;
  const int64_t kh = h / (p.hq / p.hkv);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* part = smem;  // [kWarps][D + 2]
  const float* qi = p.q + i * p.q_tok + h * p.q_head;
  float q[V];
#pragma unroll
  for (int e = 0; e < V; ++e) q[e] = qi[lane * V + e] * p.scale;
  float acc[V];
#pragma unroll
  for (int e = 0; e < V; ++e) acc[e] = 0.f;
  float m = -INFINITY, l = 0.f;
  const int64_t S = p.pos_at != nullptr ? LoadProduced(p.pos_at) + p.L : p.S;
  const int64_t jbeg = blockIdx.y * split_keys;
  const int64_t jend = min(p.causal_offset >= 0 ? min(S, p.causal_offset + i + 1) : S,
                           jbeg + split_keys);
  const float* mask = p.add_mask != nullptr ? p.add_mask + (h * p.L + i) * p.S : nullptr;
  const float* kbase = p.k + kh * p.k_head + lane * V;
  const float* vbase = p.v + kh * p.v_head + lane * V;
  for (int64_t j0 = jbeg + static_cast<int64_t>(warp) * kBatch; j0 < jend;
       j0 += kWarps * kBatch) {
    float kr[kBatch][V], vr[kBatch][V];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t j = min(j0 + b, jend - 1);  // past the end: a valid row, not used
      const float* kj = kbase + j * p.k_tok;
      const float* vj = vbase + j * p.v_tok;
#pragma unroll
      for (int e = 0; e < V; e += 4 <= V ? 4 : V) {
        if constexpr (V >= 4) {
          const float4 a = *reinterpret_cast<const float4*>(kj + e);
          const float4 c = *reinterpret_cast<const float4*>(vj + e);
          kr[b][e] = a.x, kr[b][e + 1] = a.y, kr[b][e + 2] = a.z, kr[b][e + 3] = a.w;
          vr[b][e] = c.x, vr[b][e + 1] = c.y, vr[b][e + 2] = c.z, vr[b][e + 3] = c.w;
        } else {
          const float2 a = *reinterpret_cast<const float2*>(kj + e);
          const float2 c = *reinterpret_cast<const float2*>(vj + e);
          kr[b][e] = a.x, kr[b][e + 1] = a.y;
          vr[b][e] = c.x, vr[b][e + 1] = c.y;
        }
      }
    }
    float dot[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      dot[b] = 0.f;
#pragma unroll
      for (int e = 0; e < V; ++e) dot[b] = fmaf(q[e], kr[b][e], dot[b]);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
      for (int b = 0; b < kBatch; ++b) dot[b] += __shfl_xor_sync(0xffffffffu, dot[b], off);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t j = j0 + b;
      if (j >= jend) break;
      float sc = dot[b];
      if (mask != nullptr) sc += mask[j];
      float cold, pnew;
      OnlineSoftmaxStep(sc, m, l, cold, pnew);
#pragma unroll
      for (int e = 0; e < V; ++e) acc[e] = acc[e] * cold + pnew * vr[b][e];
    }
  }
  float* mine = part + warp * (D + 2);
  if (lane == 0) {
    mine[0] = m;
    mine[1] = l;
  }
#pragma unroll
  for (int e = 0; e < V; ++e) mine[2 + lane * V + e] = acc[e];
  __syncthreads();
  const int64_t r = i * p.hq + h;
  if (partials != nullptr) {
    const int64_t s = blockIdx.y;
    MergeWarpStates<kWarps>(part, D, rt, nullptr, nullptr,
                            partials + (s * gridDim.x + r) * (D + 2));
  } else {
    MergeWarpStates<kWarps>(part, D, rt, p.out + r * D,
                            p.out_bf16 != nullptr ? p.out_bf16 + r * D : nullptr);
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

// kVec: K and V rows copied by cp.async, 16 bytes a copy with all of a thread's copies in
// flight (widths multiples of 4, strides and bases 16-byte aligned), the rows padded by 4
// so the 16-byte reads of the score loop fall on distinct banks; otherwise scalar loads into
// rows padded by 1.
int TilePad(bool vec) { return vec ? 4 : 1; }
size_t AttentionTileSmem(int64_t dk, int64_t dv, bool vec) {
  return sizeof(float) * (32 * (dk + TilePad(vec)) + 32 * (dv + TilePad(vec)) + kTileQ * dk);
}

template <bool kVec>
__global__ void __launch_bounds__(256) AttentionTileKernel(AttentionParams p, cpu::ActDType rt) {
  extern __shared__ __align__(16) float sm[];
  const int dk = static_cast<int>(p.dk), dv = static_cast<int>(p.dv);
  const int kst = dk + (kVec ? 4 : 1), vst = dv + (kVec ? 4 : 1);
  float* ks = sm;                    // [32][kst]
  float* vs = ks + 32 * kst;         // [32][vst]
  float* qs = vs + 32 * vst;         // [kTileQ][dk], scaled
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
    if constexpr (kVec) {
      const int k4 = dk / 4, v4 = dv / 4;
      for (int e = threadIdx.x; e < n * k4; e += blockDim.x) {
        const int r = e / k4, c = 4 * (e % k4);
        CpAsync16(ks + r * kst + c, p.k + (j0 + r) * p.k_tok + kh * p.k_head + c, true);
      }
      for (int e = threadIdx.x; e < n * v4; e += blockDim.x) {
        const int r = e / v4, c = 4 * (e % v4);
        CpAsync16(vs + r * vst + c, p.v + (j0 + r) * p.v_tok + kh * p.v_head + c, true);
      }
      CpAsyncWaitAll();
    } else {
      for (int e = threadIdx.x; e < n * dk; e += blockDim.x) {
        ks[(e / dk) * kst + e % dk] = p.k[(j0 + e / dk) * p.k_tok + kh * p.k_head + e % dk];
      }
      for (int e = threadIdx.x; e < n * dv; e += blockDim.x) {
        vs[(e / dv) * vst + e % dv] = p.v[(j0 + e / dv) * p.v_tok + kh * p.v_head + e % dv];
      }
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
        const float* kr = ks + lane * kst;
        float dot = 0.f;
        if constexpr (kVec) {
          dot = DotSeq4(qv, kr, dk);
        } else {
          for (int d = 0; d < dk; ++d) dot = fmaf(qv[d], kr[d], dot);
        }
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
      const float* vr = vs + jj * vst + lane;
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
        const float r = DevRoundAct(acc[a][c] * inv, rt);
        o[d] = r;
        if (p.out_bf16 != nullptr) {
          p.out_bf16[(i * p.hq + h) * p.dv + d] = static_cast<uint16_t>(qdec::F32ToBf16Bits(r));
        }
      }
    }
  }
}

// Prefill attention on the tensor cores (bf16 activations: q, k and v hold bf16 values, so
// their bf16 copies are exact). K and V are first copied to bf16, head-major and dense
// (KvToBf16Kernel: [hkv][S][d]), so that a key tile is contiguous rows a cp.async pipeline
// can move. A block takes kMmaQ queries of one head (16 per warp) and a DVC-wide slice of the
// value dims (blockIdx.z; the scores are recomputed per slice, which the tensor cores afford
// and which keeps the output accumulators at DVC / 2 registers), and walks the keys in tiles
// of kMmaKeys (32 where a block's shared memory holds no more: MmaFormFor), two tiles in
// flight (the next is copied while this one is used): the tile's K rows and V rows (bf16,
// row-major, padded) in shared memory, read as mma fragments by ldmatrix (V transposed by
// it); S = Q K^T by bf16 mma (exact products, fp32 sums), times
// the scale, plus the additive mask, causal keys at -inf; an online softmax per row in
// registers (rows g and g + 8 of the warp's 16 per lane, quad shuffles for the row max and
// sum); O += P V by bf16 mma with P split into two bf16 halves (hi = bf16(p), lo =
// bf16(p - hi)), so P keeps ~16 significant bits. The result differs from the fp32 kernels
// by summation order and that split (~1e-12 NMSE before the final bf16 rounding, which the
// harness bounds at 1e-6 like every bf16 attention); fp32 activations keep the tiled kernel.
constexpr int kMmaWarps = 4;
constexpr int kMmaQ = 16 * kMmaWarps;
constexpr int kMmaKeys = 64;

__device__ __forceinline__ uint32_t PackBf16x2(float lo, float hi) {
  return qdec::F32ToBf16Bits(lo) | (qdec::F32ToBf16Bits(hi) << 16);
}
// (a, b) as bf16 pairs hi = bf16(a, b) and lo = bf16(a - hi.a, b - hi.b): hi's halves read
// back from its own bits rather than rounded a second time.
__device__ __forceinline__ void SplitBf16x2(float a, float b, uint32_t* hi, uint32_t* lo) {
  *hi = PackBf16x2(a, b);
  *lo = PackBf16x2(a - __uint_as_float(*hi << 16), b - __uint_as_float(*hi & 0xffff0000u));
}

// One key tile of an online softmax over a warp's 16 query rows held as mma C fragments
// (element e of sc[nt]: row g + 8 (e >> 1), key nt * 8 + 2t + (e & 1)); mx[r] is this lane's
// maximum of its row-r scores. Updates the rows' maxima m and sums l, turns sc into the
// tile's weights (masked scores, -inf, weigh 0, also while a row's maximum is still -inf)
// and rescales the accumulators o by the change of maximum.
template <int kNt, int kDt>
__device__ __forceinline__ void OnlineSoftmaxTile(float (&sc)[kNt][4], float (&mx)[2], float (&m)[2],
                                                  float (&l)[2], float (&o)[kDt][4]) {
  float cold[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    const float mn = fmaxf(m[r], mx[r]);
    // expf(-inf) = 0: the old row had no score yet (m = -inf, mn >= m[r] otherwise). A
    // select, not a branch around expf.
    cold[r] = expf(m[r] == -INFINITY ? -INFINITY : m[r] - mn);
    m[r] = mn;
  }
  float ls[2] = {0.f, 0.f};
#pragma unroll
  for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1;
      const float pe = expf(sc[nt][e] == -INFINITY ? -INFINITY : sc[nt][e] - m[r]);
      sc[nt][e] = pe;
      ls[r] += pe;
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    ls[r] += __shfl_xor_sync(0xffffffffu, ls[r], 1);
    ls[r] += __shfl_xor_sync(0xffffffffu, ls[r], 2);
    l[r] = l[r] * cold[r] + ls[r];
  }
#pragma unroll
  for (int dt = 0; dt < kDt; ++dt) {
    o[dt][0] *= cold[0];
    o[dt][1] *= cold[0];
    o[dt][2] *= cold[1];
    o[dt][3] *= cold[1];
  }
}

// o += P V over the tile's 8 kNt keys, 16 at a time: P's C fragments of n8 tiles 2kc and
// 2kc + 1, split into bf16 halves hi and lo, are the A fragments of keys [16 kc, 16 kc + 16);
// V's B fragments by ldmatrix.trans from bf16 rows kStride apart starting at `vs` (the tile's
// first key at the warp's first output dim): matrices (keys 16 kc + 8 (lq & 1), dims
// 8 (dt + (lq >> 1))) = b0, b1 of dt, then dt + 1.
template <int kStride, int kNt, int kDt>
__device__ __forceinline__ void AccumulatePV(float (&o)[kDt][4], const float (&sc)[kNt][4],
                                             const uint16_t* vs, int lq, int lr) {
#pragma unroll
  for (int kc = 0; kc < kNt / 2; ++kc) {
    const float* pa = sc[2 * kc];
    const float* pb = sc[2 * kc + 1];
    uint32_t h0, h1, h2, h3, l0, l1, l2, l3;
    SplitBf16x2(pa[0], pa[1], &h0, &l0);
    SplitBf16x2(pa[2], pa[3], &h1, &l1);
    SplitBf16x2(pb[0], pb[1], &h2, &l2);
    SplitBf16x2(pb[2], pb[3], &h3, &l3);
    const uint16_t* vr = vs + (kc * 16 + 8 * (lq & 1) + lr) * kStride + 8 * (lq >> 1);
#pragma unroll
    for (int dt = 0; dt < kDt; dt += 2) {
      uint32_t b[4];
      LdMatrixX4<true>(b, vr + dt * 8);
      internal::MmaBf16(o[dt], h0, h1, h2, h3, b[0], b[1]);
      internal::MmaBf16(o[dt], l0, l1, l2, l3, b[0], b[1]);
      internal::MmaBf16(o[dt + 1], h0, h1, h2, h3, b[2], b[3]);
      internal::MmaBf16(o[dt + 1], l0, l1, l2, l3, b[2], b[3]);
    }
  }
}

// dst[(h * S + j) * d + c] = bf16(src[j * tok + h * head + c]) for the S rows of the hkv heads
// (rows 16-byte aligned, d % 8 == 0). A block of kKvRows x 32 threads takes kKvRows
// destination rows (threadIdx.y), each row's lanes 4 values at a time: one 32-bit division
// a row instead of two 64-bit ones per 4 values (which held this copy at ~1/6 of the
// bandwidth).
constexpr int kKvRows = 8;
__global__ void KvToBf16Kernel(const float* src, int64_t tok, int64_t head, int64_t S, int64_t hkv, int64_t d,
                               uint16_t* dst) {
  PdlBegin();
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kKvRows + threadIdx.y;
  if (r >= hkv * S) return;
  const int64_t h = r / S, j = r - h * S;
  const float* srow = src + j * tok + h * head;
  uint16_t* drow = dst + r * d;
  for (int64_t c = 4 * threadIdx.x; c < d; c += 4 * 32) {
    const float4 v = LoadProduced(reinterpret_cast<const float4*>(srow + c));
    *reinterpret_cast<uint2*>(drow + c) = make_uint2(PackBf16x2(v.x, v.y), PackBf16x2(v.z, v.w));
  }
}
absl::Status LaunchKvToBf16(const float* src, int64_t tok, int64_t head, int64_t S, int64_t hkv,
                            int64_t d, uint16_t* dst, cudaStream_t stream) {
  const int64_t blocks = (hkv * S + kKvRows - 1) / kKvRows;
  if (blocks > 0x7fffffff) return absl::InvalidArgumentError("attention: too many key rows");
  RING_LAUNCH_PDL(KvToBf16Kernel, dim3(static_cast<unsigned>(blocks)), dim3(32, kKvRows), 0, stream,
                  src, tok, head, S, hkv, d, dst);
  return absl::OkStatus();
}

// Shared memory: two stages of (K, V[, k_pe]) rows of `keys` keys, then (RD > 0) the block's
// scaled q_pe rows.
int64_t MmaSmemBytes(int64_t dk, int64_t dvc, int64_t rd, int64_t keys = kMmaKeys) {
  const int64_t pe = rd > 0 ? rd + 8 : 0;
  return static_cast<int64_t>(sizeof(uint16_t)) * (2 * keys * ((dk + 8) + (dvc + 8) + pe) + kMmaQ * pe);
}

// kb: [hkv][S][DK], vb: [hkv][S][dv], both bf16 (KvToBf16Kernel); with RD > 0 (the rope
// scores in the kernel, AttentionParams::q_pe) also pb: [S][RD] bf16.
// KT: keys a tile (kMmaKeys, or 32 where a ~99 KB block holds no 64-key tile of MLA's
// 128-dim value slice; see MmaFormFor).
template <int DK, int DVC, int RD, int KT = kMmaKeys>
__global__ void __launch_bounds__(kMmaWarps * 32, 2)
    AttentionMmaKernel(AttentionParams p, const uint16_t* kb, const uint16_t* vb, const uint16_t* pb) {
  // Rows padded by 8 bf16 (16 bytes): the 8 rows an ldmatrix reads hit 32 distinct banks.
  constexpr int kKst = DK + 8, kVst = DVC + 8, kPst = RD + 8;
  constexpr int kNt = KT / 8;  // n8 tiles of scores per key tile
  constexpr int kDt = DVC / 8;       // n8 tiles of output
  constexpr int kTile = KT * (kKst + kVst + (RD > 0 ? kPst : 0));  // one stage's bf16 elements
  PdlBegin();
  extern __shared__ __align__(16) uint16_t msm[];
  uint16_t* qpe = msm + 2 * kTile;  // [kMmaQ][kPst] (RD > 0)
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t h = blockIdx.y, kh = h / (p.hq / p.hkv);
  const int64_t ib0 = static_cast<int64_t>(blockIdx.x) * kMmaQ;
  const int64_t row[2] = {ib0 + warp * 16 + g, ib0 + warp * 16 + g + 8};
  const int d0 = static_cast<int>(blockIdx.z) * DVC;
  const uint16_t* kh_rows = kb + kh * p.S * DK;
  const uint16_t* vh_rows = vb + kh * p.S * p.dv + d0;
  const int64_t ilast = min(p.L, ib0 + kMmaQ) - 1;
  const int64_t jend = p.causal_offset >= 0 ? min(p.S, p.causal_offset + ilast + 1) : p.S;
  // Queues the copies of the key tile at j0 into stage `st` (rows past jend: zeros). Eight
  // threads a row, kCopyRows rows a pass: thread (cr, cc) copies the 16-byte chunks cc + 8 i
  // of rows cr + kCopyRows * j, so each copy is a base pointer plus a compile-time offset
  // (a div/mod and a fresh address per chunk made the copies ~40% of the kernel's
  // instructions).
  constexpr int kCopyRows = kMmaWarps * 32 / 8;
  static_assert(KT % kCopyRows == 0 && DK % 64 == 0 && DVC % 64 == 0 && RD % 64 == 0);
  const int cr = threadIdx.x >> 3, cc = 8 * (threadIdx.x & 7);
  // A tile whose rows all exist (every one but a block's last) takes the copies without
  // predicates: one source pointer per array, the rest compile-time offsets (and, for V, a
  // stride computed once).
  const int64_t vstride = kCopyRows * p.dv;
  auto load_tile = [&](int64_t j0, int st) {
    uint16_t* const ks = msm + st * kTile + cr * kKst + cc;
    uint16_t* const vs = msm + st * kTile + KT * kKst + cr * kVst + cc;
    uint16_t* const ps = msm + st * kTile + KT * (kKst + kVst) + cr * kPst + cc;
    auto copy_rows = [&](auto whole_tag) {
      constexpr bool kWhole = decltype(whole_tag)::value;
      const int64_t left = jend - j0 - cr;  // rows cr + kCopyRows * j < jend - j0 exist
      const uint16_t* ksrc = kh_rows + (j0 + cr) * DK + cc;
      const uint16_t* vsrc = vh_rows + (j0 + cr) * p.dv + cc;
      [[maybe_unused]] const uint16_t* psrc = nullptr;
      if constexpr (RD > 0) psrc = pb + (j0 + cr) * RD + cc;
#pragma unroll
      for (int j = 0; j < KT / kCopyRows; ++j) {
        const bool ok = kWhole || kCopyRows * j < left;
        // A missing row copies nothing (zero fill) from the array's first row.
        const uint16_t* kq = ok ? ksrc + j * kCopyRows * DK : kh_rows;
        const uint16_t* vq = ok ? vsrc + j * vstride : vh_rows;
#pragma unroll
        for (int i = 0; i < DK / 64; ++i) CpAsync16(ks + j * kCopyRows * kKst + 64 * i, kq + 64 * i, ok);
#pragma unroll
        for (int i = 0; i < DVC / 64; ++i) CpAsync16(vs + j * kCopyRows * kVst + 64 * i, vq + 64 * i, ok);
        if constexpr (RD > 0) {
          const uint16_t* pq = ok ? psrc + j * kCopyRows * RD : pb;
#pragma unroll
          for (int i = 0; i < RD / 64; ++i) CpAsync16(ps + j * kCopyRows * kPst + 64 * i, pq + 64 * i, ok);
        }
      }
    };
    if (j0 + KT <= jend) {
      copy_rows(std::true_type{});
    } else {
      copy_rows(std::false_type{});
    }
    CpAsyncCommit();
  };
  if (jend > 0) load_tile(0, 0);
  if constexpr (RD > 0) {
    // The block's rope queries, scaled and rounded as cpu::MlaAttention's pe term; read by
    // ldmatrix as A fragments at every tile (kept out of registers, which the nope queries
    // and the accumulators fill). Visible after the first tile's barrier. Four values a
    // thread and step, all steps' loads issued before the first is used (one at a time,
    // each waiting for its load, this took ~8% of the kernel's time).
    constexpr int kQ4 = kMmaQ * RD / 4 / (kMmaWarps * 32);  // float4 per thread
    static_assert(kQ4 * 4 * kMmaWarps * 32 == kMmaQ * RD);
    float4 qv[kQ4];
#pragma unroll
    for (int k = 0; k < kQ4; ++k) {
      const int e = threadIdx.x + k * kMmaWarps * 32;
      const int r = e / (RD / 4), c = 4 * (e % (RD / 4));
      const int64_t i = ib0 + r;
      qv[k] = i < p.L ? LoadProduced(reinterpret_cast<const float4*>(p.q_pe + i * p.q_pe_tok +
                                                                     h * p.q_pe_head + c))
                      : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int k = 0; k < kQ4; ++k) {
      const int e = threadIdx.x + k * kMmaWarps * 32;
      const int r = e / (RD / 4), c = 4 * (e % (RD / 4));
      auto q = [&](float v) { return qdec::RoundToBf16(v * p.scale); };
      *reinterpret_cast<uint2*>(qpe + r * kPst + c) =
          make_uint2(PackBf16x2(q(qv[k].x), q(qv[k].y)), PackBf16x2(q(qv[k].z), q(qv[k].w)));
    }
  }
  // The warp's 16 query rows as A fragments, for the whole kernel (rows past L are zero).
  uint32_t qf[DK / 16][4];
  {
    const float* qr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      qr[r] = row[r] < p.L ? p.q + row[r] * p.q_tok + h * p.q_head : nullptr;
    }
#pragma unroll
    for (int kk = 0; kk < DK / 16; ++kk) {
      const int c = kk * 16 + 2 * t;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float* q = qr[r];
        qf[kk][r] = q != nullptr ? PackBf16x2(LoadProduced(q + c), LoadProduced(q + c + 1)) : 0u;
        qf[kk][2 + r] =
            q != nullptr ? PackBf16x2(LoadProduced(q + c + 8), LoadProduced(q + c + 9)) : 0u;
      }
    }
  }
  float o[kDt][4];
#pragma unroll
  for (int dt = 0; dt < kDt; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  // ldmatrix row addresses: lane = 8 q + r gives row r of matrix q.
  const int lq = lane >> 3, lr = lane & 7;
  int st = 0;
  for (int64_t j0 = 0; j0 < jend; j0 += KT, st ^= 1) {
    const int n = static_cast<int>(min(static_cast<int64_t>(KT), jend - j0));
    if (j0 + KT < jend) {
      load_tile(j0 + KT, st ^ 1);  // its stage was last read before the previous barrier
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();  // every thread's copies of this tile have landed
    const uint16_t* ks = msm + st * kTile;
    const uint16_t* vs = ks + KT * kKst;
    float sc[kNt][4];
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) {
      sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
      // Matrices (keys nt*8.., dims kk*16 + 8 lq): b0, b1 of step kk, then of kk + 1.
      const uint16_t* kr = ks + (nt * 8 + lr) * kKst + 8 * lq;
#pragma unroll
      for (int kk = 0; kk < DK / 16; kk += 2) {
        uint32_t b[4];
        LdMatrixX4<false>(b, kr + kk * 16);
        internal::MmaBf16(sc[nt], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b[0], b[1]);
        internal::MmaBf16(sc[nt], qf[kk + 1][0], qf[kk + 1][1], qf[kk + 1][2], qf[kk + 1][3], b[2], b[3]);
      }
      if constexpr (RD > 0) {
        // The rope term: its own fp32 sum, rounded to bf16, added to the scaled nope score.
        const uint16_t* pr = vs + KT * kVst + (nt * 8 + lr) * kPst + 8 * lq;
        const uint16_t* qa = qpe + (warp * 16 + 8 * (lq & 1) + lr) * kPst + 8 * (lq >> 1);
        float pe[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int kk = 0; kk < RD / 16; kk += 2) {
          uint32_t b[4], a0[4], a1[4];
          LdMatrixX4<false>(b, pr + kk * 16);
          LdMatrixX4<false>(a0, qa + kk * 16);
          LdMatrixX4<false>(a1, qa + kk * 16 + 16);
          internal::MmaBf16(pe, a0[0], a0[1], a0[2], a0[3], b[0], b[1]);
          internal::MmaBf16(pe, a1[0], a1[1], a1[2], a1[3], b[2], b[3]);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[nt][e] = sc[nt][e] * p.scale + qdec::RoundToBf16(pe[e]);
      }
    }
    // Scale, mask, and the tile's row maxima (element e: row e >> 1, key 2t + (e & 1)). A
    // tile whole for all the warp's rows (every key inside each row's causal range, no row
    // past L, no mask to read) needs no per-score checks: warp-uniform, same arithmetic.
    float mx[2] = {-INFINITY, -INFINITY};
    const int64_t wrow0 = ib0 + warp * 16;
    const bool whole = n == KT && wrow0 + 15 < p.L &&
                       (p.causal_offset < 0 || j0 + KT - 1 <= p.causal_offset + wrow0) &&
                       (RD > 0 ? p.allowed == nullptr : p.add_mask == nullptr);
    if (whole) {
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if constexpr (RD == 0) sc[nt][e] *= p.scale;
          mx[e >> 1] = fmaxf(mx[e >> 1], sc[nt][e]);
        }
      }
    } else {
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1;
          const int64_t i = row[r], j = j0 + nt * 8 + 2 * t + (e & 1);
          float v = -INFINITY;
          if (j < j0 + n && i < p.L && (p.causal_offset < 0 || j <= p.causal_offset + i)) {
            if constexpr (RD > 0) {
              if (p.allowed == nullptr || LoadProduced(p.allowed + i * p.S + j) != 0) v = sc[nt][e];
            } else {
              v = sc[nt][e] * p.scale;
              if (p.add_mask != nullptr) v += LoadProduced(p.add_mask + (h * p.L + i) * p.S + j);
            }
          }
          sc[nt][e] = v;
          mx[r] = fmaxf(mx[r], v);
        }
      }
    }
    OnlineSoftmaxTile(sc, mx, m, l, o);
    AccumulatePV<kVst>(o, sc, vs, lq, lr);
    __syncthreads();  // this stage is read: the next iteration's copies may overwrite it
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = row[r];
    if (i >= p.L) continue;
    const float inv = 1.f / l[r];
    const int64_t base = (i * p.hq + h) * p.dv + d0;
#pragma unroll
    for (int dt = 0; dt < kDt; ++dt) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int d = dt * 8 + 2 * t + c;
        const float v = qdec::RoundToBf16(o[dt][2 * r + c] * inv);
        p.out[base + d] = v;
        if (p.out_bf16 != nullptr) p.out_bf16[base + d] = static_cast<uint16_t>(qdec::F32ToBf16Bits(v));
      }
    }
  }
}

// RING_ATTN_MMA=0 in the environment keeps bf16 attention on the fp32 kernels (A/B runs):
// prefill on the tiled kernel, MLA decode on MlaDecodeKernel.
bool AttentionMmaEnabled() {
  static const bool on = EnvSwitchOn("RING_ATTN_MMA");
  return on;
}

// RING_ATTN_MMA_KEYS32 (read once): "0" keeps the 32-key tiles below out of the choice (A/B
// runs: a ~99 KB GPU then takes 64-dim value slices for MLA's rope form).
bool Keys32Enabled() {
  static const bool on = EnvSwitchOn("RING_ATTN_MMA_KEYS32");
  return on;
}

// The tensor-core kernel's form for (dk, dv, rope) on `dev`: its value slice (every slice
// recomputes the scores) and its key tile. 128-dim slices of kMmaKeys-key tiles where dv
// allows and the block fits. On a ~99 KB-a-block GPU MLA's rope form (dk 192, rope 64: 111
// KB) keeps the 128-dim slices with 32-key tiles (60 KB) rather than taking 64-dim ones (95
// KB), which would compute every score twice as often; elsewhere 64-dim slices. Without
// either the rope scores go through an additive mask of heads x rows x keys fp32. {0, 0}:
// nothing fits.
struct MmaForm {
  int dvc = 0, keys = 0;
};
MmaForm MmaFormFor(int64_t dk, int64_t dv, int64_t rd, const DeviceInfo& dev) {
  const int64_t cap = dev.smem_per_block_optin;
  if (dv % 128 == 0) {
    if (MmaSmemBytes(dk, 128, rd) <= cap) return {128, kMmaKeys};
    if (rd > 0 && Keys32Enabled() && MmaSmemBytes(dk, 128, rd, 32) <= cap) return {128, 32};
  }
  if (MmaSmemBytes(dk, 64, rd) <= cap) return {64, kMmaKeys};
  return {};
}
bool Aligned16(const void* ptr, int64_t a, int64_t b) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && a % 4 == 0 && b % 4 == 0;
}
// 16-byte aligned K and V rows (float4 loads).
bool AttentionVec(const AttentionParams& p) {
  return p.dk % 4 == 0 && p.dv % 4 == 0 && Aligned16(p.k, p.k_tok, p.k_head) && Aligned16(p.v, p.v_tok, p.v_head);
}

// Whether the tensor-core kernel takes p: bf16 activations, a prompt of at least kTileMinL
// rows, dk in {64, 128, 192, 256}, dv a multiple of 64 up to 256, 16-byte aligned K/V rows,
// rope scores in the kernel only for rope 64 with dk 128 or 192 (q_pe rows 16-byte aligned
// too), and its shared memory within the device's limit.
bool MmaTakes(const AttentionParams& p, cpu::ActDType round, const DeviceInfo& dev) {
  if (round != cpu::ActDType::kBF16 || !AttentionVec(p) || p.L < kTileMinL || p.hq > 65535 ||
      p.dv % 64 != 0 || p.dv > 256 || (p.L + kMmaQ - 1) / kMmaQ > 0x7fffffff || !AttentionMmaEnabled()) {
    return false;
  }
  if (p.dk != 64 && p.dk != 128 && p.dk != 192 && p.dk != 256) return false;
  if (p.rope > 0 && (p.rope != 64 || (p.dk != 128 && p.dk != 192) || p.q_pe == nullptr ||
                     !Aligned16(p.k_pe, p.rope, p.rope) ||
                     !Aligned16(p.q_pe, p.q_pe_tok, p.q_pe_head))) {
    return false;
  }
  return MmaFormFor(p.dk, p.dv, p.rope, dev).dvc != 0;
}

template <int DK, int DVC, int RD, int KT = kMmaKeys>
absl::Status LaunchAttentionMma(const AttentionParams& p, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(MmaSmemBytes(DK, DVC, RD, KT));
  RING_CUDA_RETURN_IF_ERROR(AllowDynamicSmem(AttentionMmaKernel<DK, DVC, RD, KT>, smem));
  // K and V as bf16, head-major: [hkv][S][DK] and [hkv][S][dv] (exact: they hold bf16
  // values); with RD, the rope keys [S][RD] after them.
  const int64_t kn = p.hkv * p.S * DK, vn = p.hkv * p.S * p.dv, pn = RD > 0 ? p.S * RD : 0;
  RING_ASSIGN_OR_RETURN(StreamBuffer kvb, StreamBuffer::Allocate((kn + vn + pn) * sizeof(uint16_t), stream));
  uint16_t* kb = kvb.as<uint16_t>();
  uint16_t* vb = kb + kn;
  uint16_t* pb = RD > 0 ? vb + vn : nullptr;
  RING_RETURN_IF_ERROR(LaunchKvToBf16(p.k, p.k_tok, p.k_head, p.S, p.hkv, DK, kb, stream));
  RING_RETURN_IF_ERROR(LaunchKvToBf16(p.v, p.v_tok, p.v_head, p.S, p.hkv, p.dv, vb, stream));
  if (RD > 0) {
    RING_RETURN_IF_ERROR(LaunchKvToBf16(p.k_pe, RD, 0, p.S, 1, RD, pb, stream));
  }
  const dim3 grid(static_cast<unsigned>((p.L + kMmaQ - 1) / kMmaQ), static_cast<unsigned>(p.hq),
                  static_cast<unsigned>(p.dv / DVC));
  RING_LAUNCH_PDL((AttentionMmaKernel<DK, DVC, RD, KT>), grid, kMmaWarps * 32, smem, stream, p,
                  static_cast<const uint16_t*>(kb), static_cast<const uint16_t*>(vb),
                  static_cast<const uint16_t*>(pb));
  return absl::OkStatus();  // kvb is freed in stream order, after the kernel
}
template <int DK, int RD>
absl::Status LaunchAttentionMmaDk(const AttentionParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  const MmaForm f = MmaFormFor(DK, p.dv, RD, dev);
  if (f.dvc == 128) {
    if constexpr (RD > 0) {
      if (f.keys == 32) return LaunchAttentionMma<DK, 128, RD, 32>(p, stream);
    }
    return LaunchAttentionMma<DK, 128, RD>(p, stream);
  }
  return LaunchAttentionMma<DK, 64, RD>(p, stream);
}

// The tensor-core kernel for this call if it takes it (MmaTakes); else *taken = false.
absl::Status MaybeAttentionMma(const AttentionParams& p, cpu::ActDType round, const DeviceInfo& dev,
                               cudaStream_t stream, bool* taken) {
  *taken = MmaTakes(p, round, dev);
  if (!*taken) return absl::OkStatus();
  if (p.rope > 0) {
    return p.dk == 128 ? LaunchAttentionMmaDk<128, 64>(p, dev, stream)
                       : LaunchAttentionMmaDk<192, 64>(p, dev, stream);
  }
  switch (p.dk) {
    case 64: return LaunchAttentionMmaDk<64, 0>(p, dev, stream);
    case 128: return LaunchAttentionMmaDk<128, 0>(p, dev, stream);
    case 192: return LaunchAttentionMmaDk<192, 0>(p, dev, stream);
    default: return LaunchAttentionMmaDk<256, 0>(p, dev, stream);
  }
}

// pe[h, i, j] = round(sum_d round(q[i, h, off + d] * scale) * kpe[j, d]) over d < rope,
// sequential in d like cpu::MatMulABt; bf16's lowest where key j is not allowed. A block
// takes kPeKeys keys (their rope keys in shared memory, kPeKeys / 32 per lane) for kPeRows
// (h, i) rows (kPeRows / 8 per warp), whose scaled and rounded queries it stages in shared
// memory once: a lane runs its 8 x 4 dot products side by side (one key read per row, 32
// independent FMA chains, each still in d order, so the bits are those of one chain at a
// time), and the writes of a row stay coalesced.
constexpr int kPeKeys = 128;
constexpr int kPeRows = 64;
size_t PeScoresSmem(int64_t rope) { return sizeof(float) * (kPeKeys * (rope + 1) + kPeRows * rope); }

__global__ void __launch_bounds__(256)
    PeScoresKernel(const float* q, int64_t q_tok, int64_t q_head, int64_t q_off, float scale,
                   const float* kpe, int64_t rope, int64_t T, int64_t H, int64_t Sk,
                   const uint8_t* allowed, int64_t causal_offset, cpu::ActDType rt, float* out) {
  constexpr int kPerWarp = kPeRows / 8, kPerLane = kPeKeys / 32;
  extern __shared__ float kt[];  // [kPeKeys][rope + 1], then the rows' queries [kPeRows][rope]
  float* qsm = kt + kPeKeys * (rope + 1);
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kPeKeys;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kPeRows;
  if (causal_offset >= 0) {
    // Keys past every row's causal limit: the attention never reads their scores (it
    // skips them by the same limit), so they are not computed.
    const int64_t r_last = min(r0 + kPeRows, H * T) - 1;
    const int64_t i_max = r0 / T == r_last / T ? r_last % T : T - 1;
    if (j0 > causal_offset + i_max) return;
  }
  const int n = static_cast<int>(min(static_cast<int64_t>(kPeKeys), Sk - j0));
  for (int64_t e = threadIdx.x; e < n * rope; e += blockDim.x) {
    kt[(e / rope) * (rope + 1) + e % rope] = kpe[(j0 + e / rope) * rope + e % rope];
  }
  for (int64_t e = threadIdx.x; e < kPeRows * rope; e += blockDim.x) {
    const int64_t r = r0 + e / rope;
    float v = 0.f;
    if (r < H * T) {
      const int64_t h = r / T, i = r % T;
      v = DevRoundAct(q[i * q_tok + h * q_head + q_off + e % rope] * scale, rt);
    }
    qsm[e] = v;
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // Keys past n read stale shared memory; their results are never written.
  float dot[kPerWarp][kPerLane];
#pragma unroll
  for (int w = 0; w < kPerWarp; ++w)
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) dot[w][c] = 0.f;
  const float* qw = qsm + warp * kPerWarp * rope;
  for (int64_t d = 0; d < rope; ++d) {
    float kd[kPerLane];
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) kd[c] = kt[(lane + 32 * c) * (rope + 1) + d];
#pragma unroll
    for (int w = 0; w < kPerWarp; ++w) {
      const float qv = qw[w * rope + d];
#pragma unroll
      for (int c = 0; c < kPerLane; ++c) dot[w][c] = fmaf(qv, kd[c], dot[w][c]);
    }
  }
#pragma unroll
  for (int w = 0; w < kPerWarp; ++w) {
    const int64_t r = r0 + warp * kPerWarp + w;
    if (r >= H * T) break;
    const int64_t i = r % T;
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) {
      const int jl = lane + 32 * c;
      if (jl >= n) continue;
      const int64_t j = j0 + jl;
      const bool ok = (causal_offset < 0 || j <= causal_offset + i) &&
                      (allowed == nullptr || allowed[i * Sk + j] != 0);
      out[r * Sk + j] = ok ? DevRoundAct(dot[w][c], rt) : kBf16Lowest;
    }
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

// Key splits merged by SplitCombineKernel (MLA decode, long GQA decode rows): at most
// kMaxSplits partials per output row (their weights sit in the combine's shared memory).
constexpr int kMaxSplits = 256;
constexpr int kCombineThreads = 128;

// Absorbed MLA decode (file comment). Partial p of head h at part + (p * H + h) * (kvl + 2):
// [max, sum, acc[kvl]].
constexpr int kMlaChunk = 32;         // keys per chunk: one per lane in the score pass
constexpr int kMlaHeadsPerBlock = 8;  // one per warp in the softmax pass
constexpr int kMlaThreads = kMlaHeadsPerBlock * 32;
constexpr int kMlaMaxKvl = 2 * kMlaThreads;  // the value pass: two latent dims per thread
constexpr int kMlaMaxRope = 128;

struct MlaDecodeParams {
  const float* qlat = nullptr;  // [H, kvl], rounded
  const float* q = nullptr;     // [H, qd]: the rope part at + nope
  int64_t qd = 0, nope = 0;
  const float* lat = nullptr;   // [S, kvl], 16-byte aligned
  const float* pe = nullptr;    // [S, rope], 16-byte aligned
  const int32_t* topk = nullptr;  // [Sk] or null (key j is row j)
  int64_t S = 0, Sk = 0, H = 0;
  int kvl = 0, rope = 0;
  int chunks_per_split = 1;
  float scale = 1.f;
  float* part = nullptr;
  // The key count on the device (*pos_at + 1, MlaAttention's pos_at): S (and, dense, Sk) is
  // then the grid's bound, replaced by the count once the kernel has waited (MlaDeviceCount).
  const int32_t* pos_at = nullptr;
};
// With p.pos_at set: the cache length the kernel reads on the device, in place of the bound.
__device__ __forceinline__ void MlaDeviceCount(MlaDecodeParams& p) {
  if (p.pos_at == nullptr) return;
  p.S = LoadProduced(p.pos_at) + 1;
  if (p.topk == nullptr) p.Sk = p.S;
}

// Shared memory of MlaDecodeKernel, in floats: the chunk's latent rows [chunk][kvl + 4]
// (rows 16-byte aligned; the +4 keeps a quarter-warp's 16-byte reads of 8 rows on distinct
// banks), then a region that holds the rope-key rows [chunk][rope + 4] until the rope scores
// are done and the per-warp latent score partials [warps][heads][chunk] after, then the
// scaled queries [heads][kvl] and rope queries [heads][rope], the probabilities
// [chunk][heads] and the rescale factors [heads].
struct MlaSmem {
  int ks, ps, kpe, qs, qp, pt, cold, total;
};
__host__ __device__ inline MlaSmem MlaLayout(int kvl, int rope) {
  MlaSmem s;
  s.ks = kvl + 4;
  s.ps = rope + 4;
  s.kpe = kMlaChunk * s.ks;
  s.qs = s.kpe + max(kMlaChunk * s.ps, kMlaHeadsPerBlock * kMlaHeadsPerBlock * kMlaChunk);
  s.qp = s.qs + kMlaHeadsPerBlock * kvl;
  s.pt = s.qp + kMlaHeadsPerBlock * rope;
  s.cold = s.pt + kMlaChunk * kMlaHeadsPerBlock;
  s.total = s.cold + kMlaHeadsPerBlock;
  return s;
}

size_t MlaDecodeSmem(int kvl, int rope) { return sizeof(float) * MlaLayout(kvl, rope).total; }

// The row of the cache that key j of the selection reads, in two steps so that a top-k index
// can be loaded well before it is checked (the check is what waits for the load): the raw
// index (-1 past the end), then the row or -1 (out of range). MlaRow does both at once.
__device__ __forceinline__ int MlaRawRow(const MlaDecodeParams& p, int64_t j, int64_t jend) {
  if (j >= jend) return -1;
  return p.topk != nullptr ? p.topk[j] : static_cast<int>(j);
}
__device__ __forceinline__ int MlaCheckRow(const MlaDecodeParams& p, int r) {
  return r >= 0 && r < p.S ? r : -1;
}
__device__ __forceinline__ int MlaRow(const MlaDecodeParams& p, int64_t j, int64_t jend) {
  return MlaCheckRow(p, MlaRawRow(p, j, jend));
}

// Queues the cp.async copies of one chunk's latent and rope-key rows (`rows`: -1 = zeros).
__device__ __forceinline__ void MlaIssueChunk(const MlaDecodeParams& p, const MlaSmem& L,
                                              float* keys, float* kpe, const int* rows) {
  const int kv4 = p.kvl / 4, pe4 = p.rope / 4;
  for (int i = threadIdx.x; i < kMlaChunk * kv4; i += kMlaThreads) {
    const int r = i / kv4, c = i % kv4, row = rows[r];
    CpAsync16(keys + r * L.ks + 4 * c, p.lat + static_cast<int64_t>(max(row, 0)) * p.kvl + 4 * c,
              row >= 0);
  }
  for (int i = threadIdx.x; i < kMlaChunk * pe4; i += kMlaThreads) {
    const int r = i / pe4, c = i % pe4, row = rows[r];
    CpAsync16(kpe + r * L.ps + 4 * c, p.pe + static_cast<int64_t>(max(row, 0)) * p.rope + 4 * c,
              row >= 0);
  }
}

// A block: kMlaHeadsPerBlock heads x chunks_per_split chunks of kMlaChunk keys. Per chunk:
// cp.async copies the selected latent and rope-key rows (16 bytes a copy, all of a thread's
// copies in flight at once; rows past the end or unselected read as zeros) while the next
// chunk's row indices load; thread (w, j) computes the rope score of head w and key j
// (sequential in d like the reference, then rounded) and the latent dot of key j with all
// 8 heads over the latent slice [w * kvl / 8, (w + 1) * kvl / 8) (eight independent FMA
// chains, 16-byte shared reads: the key's slice once, the queries' as broadcasts); the
// slices are summed in fixed order; warp w updates head w's online softmax; then thread t
// accumulates latent dims 2t and 2t + 1 of all 8 heads over the chunk's keys. Two blocks
// fit an SM and overlap each other's copies (measured faster on the H200 than one block that
// double-buffers its chunks: 24 against 28 us per layer at 2k keys).
__global__ void __launch_bounds__(kMlaThreads, 2) MlaDecodeKernel(MlaDecodeParams p, cpu::ActDType rt) {
  PdlBegin();
  MlaDeviceCount(p);
  extern __shared__ __align__(16) float sm[];
  const int kvl = p.kvl, rope = p.rope;
  const MlaSmem L = MlaLayout(kvl, rope);
  float* qs = sm + L.qs;
  float* qp = sm + L.qp;
  float* pt = sm + L.pt;
  float* colds = sm + L.cold;
  __shared__ int rows[kMlaChunk];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t h0 = static_cast<int64_t>(blockIdx.y) * kMlaHeadsPerBlock;
  const int kv4 = kvl / 4;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * p.chunks_per_split * kMlaChunk;
  const int64_t last = min(p.Sk, first + static_cast<int64_t>(p.chunks_per_split) * kMlaChunk);
  int next_row = tid < kMlaChunk ? MlaRow(p, first + tid, last) : -1;
  // The queries: a thread's loads all issued before its shared stores (kvl <= 512: at most
  // 4 float4 per thread).
  {
    constexpr int kQ = kMlaHeadsPerBlock * kMlaMaxKvl / 4 / kMlaThreads;
    float4 v[kQ];
#pragma unroll
    for (int u = 0; u < kQ; ++u) {
      const int i = tid + u * kMlaThreads;
      const int64_t h = h0 + i / kv4;
      v[u] = i < kMlaHeadsPerBlock * kv4 && h < p.H
                 ? reinterpret_cast<const float4*>(p.qlat + h * kvl)[i % kv4]
                 : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < kQ; ++u) {
      const int i = tid + u * kMlaThreads;
      if (i < kMlaHeadsPerBlock * kv4) {
        reinterpret_cast<float4*>(qs)[i] =
            make_float4(v[u].x * p.scale, v[u].y * p.scale, v[u].z * p.scale, v[u].w * p.scale);
      }
    }
  }
  for (int i = tid; i < kMlaHeadsPerBlock * rope; i += kMlaThreads) {
    const int64_t h = h0 + i / rope;
    qp[i] = h < p.H ? DevRoundAct(p.q[h * p.qd + p.nope + i % rope] * p.scale, rt) : 0.f;
  }
  const int slice = kvl / kMlaHeadsPerBlock, d0 = 2 * tid;
  float acc[kMlaHeadsPerBlock][2];
#pragma unroll
  for (int h = 0; h < kMlaHeadsPerBlock; ++h) acc[h][0] = acc[h][1] = 0.f;
  float m = -INFINITY, l = 0.f;  // head `warp`'s softmax state, uniform over the warp
  float* keys = sm;
  float* kpe = sm + L.kpe;
  float* red = kpe;  // aliases kpe once the rope scores are read
  for (int64_t j0 = first; j0 < last; j0 += kMlaChunk) {
    __syncthreads();  // the previous chunk's readers are done
    if (tid < kMlaChunk) rows[tid] = next_row;
    __syncthreads();
    MlaIssueChunk(p, L, keys, kpe, rows);
    if (tid < kMlaChunk) next_row = MlaRow(p, j0 + kMlaChunk + tid, last);
    CpAsyncWaitAll();
    __syncthreads();
    const bool valid = rows[lane] >= 0;
    const float pes = DotSeq4(qp + warp * rope, kpe + lane * L.ps, rope);
    float sc[kMlaHeadsPerBlock];
#pragma unroll
    for (int h = 0; h < kMlaHeadsPerBlock; ++h) sc[h] = 0.f;
    {
      const float* kr = keys + lane * L.ks + warp * slice;
      const float* qv = qs + warp * slice;
#pragma unroll 4
      for (int d = 0; d < slice; d += 4) {
        const float4 k4 = *reinterpret_cast<const float4*>(kr + d);
#pragma unroll
        for (int h = 0; h < kMlaHeadsPerBlock; ++h) {
          const float4 q4 = *reinterpret_cast<const float4*>(qv + h * kvl + d);
          sc[h] = fmaf(q4.x, k4.x, sc[h]);
          sc[h] = fmaf(q4.y, k4.y, sc[h]);
          sc[h] = fmaf(q4.z, k4.z, sc[h]);
          sc[h] = fmaf(q4.w, k4.w, sc[h]);
        }
      }
    }
    __syncthreads();  // rope keys read: red may overwrite them
#pragma unroll
    for (int h = 0; h < kMlaHeadsPerBlock; ++h) red[(warp * kMlaHeadsPerBlock + h) * kMlaChunk + lane] = sc[h];
    __syncthreads();
    float s = -INFINITY;
    if (valid) {
      float dot = 0.f;
#pragma unroll
      for (int w = 0; w < kMlaHeadsPerBlock; ++w) dot += red[(w * kMlaHeadsPerBlock + warp) * kMlaChunk + lane];
      s = dot + DevRoundAct(pes, rt);
    }
    float mc = s;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mc = fmaxf(mc, __shfl_xor_sync(0xffffffffu, mc, off));
    const float mn = fmaxf(m, mc);
    float cold = 1.f, pj = 0.f;
    if (mn != -INFINITY) {  // uniform over the warp
      cold = m == -INFINITY ? 0.f : expf(m - mn);
      pj = s == -INFINITY ? 0.f : expf(s - mn);
      l = l * cold + WarpSum(pj);
      m = mn;
    }
    pt[lane * kMlaHeadsPerBlock + warp] = pj;
    if (lane == 0) colds[warp] = cold;
    __syncthreads();
    if (d0 < kvl) {
#pragma unroll
      for (int h = 0; h < kMlaHeadsPerBlock; ++h) {
        acc[h][0] *= colds[h];
        acc[h][1] *= colds[h];
      }
#pragma unroll 4
      for (int j = 0; j < kMlaChunk; ++j) {
        const float2 k2 = *reinterpret_cast<const float2*>(keys + j * L.ks + d0);
        const float4 pa = *reinterpret_cast<const float4*>(pt + j * kMlaHeadsPerBlock);
        const float4 pb = *reinterpret_cast<const float4*>(pt + j * kMlaHeadsPerBlock + 4);
        const float pr[kMlaHeadsPerBlock] = {pa.x, pa.y, pa.z, pa.w, pb.x, pb.y, pb.z, pb.w};
#pragma unroll
        for (int h = 0; h < kMlaHeadsPerBlock; ++h) {
          acc[h][0] = fmaf(pr[h], k2.x, acc[h][0]);
          acc[h][1] = fmaf(pr[h], k2.y, acc[h][1]);
        }
      }
    }
  }
  const int64_t part_row = kvl + 2;
  float* out = p.part + (static_cast<int64_t>(blockIdx.x) * p.H + h0) * part_row;
  if (lane == 0 && h0 + warp < p.H) {
    out[warp * part_row] = m;
    out[warp * part_row + 1] = l;
  }
  if (d0 < kvl) {
#pragma unroll
    for (int h = 0; h < kMlaHeadsPerBlock; ++h) {
      if (h0 + h < p.H) {
        *reinterpret_cast<float2*>(out + h * part_row + 2 + d0) = make_float2(acc[h][0], acc[h][1]);
      }
    }
  }
}

// MlaDecodeMmaKernel: MlaDecodeKernel's work on the tensor cores, for bf16 activations with
// kvl = KVL and rope = RD (GLM-5's and DeepSeek-V3's 512 and 64). q_lat, the latent cache
// and the rope keys hold bf16 values then, so their bf16 copies are exact and every product
// of the mma is; only fp32 summation order differs (and P's split, below). A block takes 16
// heads (one mma row tile; heads past H are zero rows) and a split of the keys in chunks of
// 32. A chunk's fp32 latent and rope-key rows are loaded into the copying threads'
// registers (72 a thread) and converted into one bf16 tile [32][KVL + RD + 8] (the +8 puts
// the 8 rows an ldmatrix reads on distinct banks), after which the next chunk's loads go out
// while this one is used. (Until session 33 the rows landed by cp.async in a shared staging
// area: 130 KB of shared memory a block, more than sm_120 / sm_121's ~99 KB; in registers
// the block needs 58 KB, and on the H200 the kernel took 10.9 us a launch against 11.2 in
// the same decode trace.) Warp w sums the latent scores of the 16 heads x 32 keys over the
// dims [w, w + 1) * KVL / 8 (its q_lat A fragments held for the whole kernel, the keys' B
// fragments by ldmatrix); warps 0-3 the rope scores of keys [8w, 8w + 8), rounded as the
// reference's pe_scores. The eight latent partials are summed in warp order in shared memory; warp w
// runs the online softmax of heads 2w and 2w + 1 (lane = key) as MlaDecodeKernel does; then
// warp w accumulates O[16 heads][its KVL / 8 dims] += P V by mma, P split into bf16 halves
// hi = bf16(p) and lo = bf16(p - hi) as in AttentionMmaKernel, V's fragments by the
// transposing ldmatrix from the same tile. Each block writes MlaDecodeKernel's partials,
// merged by SplitCombineKernel (harness: at most 6.6e-7 NMSE against the CPU at GLM-5.2's
// dims, the bf16 MLA bound 1e-5). The fp32 kernel (8 heads a block) read every key row once
// per 8 heads and ran ~0.3 GFLOP of FMAs a layer: ~23 us per GLM-5 layer at 2k keys on the
// H200, this one ~14.
constexpr int kMlaMmaWarps = 8;
constexpr int kMlaMmaHeads = 16;

// c += A B over kSteps k16 steps: A the warp's row fragments, B the 8 key rows whose
// ldmatrix row address for this lane is `rows` (row lr, column 8 lq; two steps a load).
template <int kSteps>
__device__ __forceinline__ void MmaKeyRows(float (&c)[4], const uint32_t (&a)[kSteps][4],
                                           const uint16_t* rows) {
  static_assert(kSteps % 2 == 0);
#pragma unroll
  for (int kk = 0; kk < kSteps; kk += 2) {
    uint32_t b[4];
    LdMatrixX4<false>(b, rows + kk * 16);
    internal::MmaBf16(c, a[kk][0], a[kk][1], a[kk][2], a[kk][3], b[0], b[1]);
    internal::MmaBf16(c, a[kk + 1][0], a[kk + 1][1], a[kk + 1][2], a[kk + 1][3], b[2], b[3]);
  }
}

template <int KVL, int RD>
struct MlaMmaLayout {
  static constexpr int kTst = KVL + RD + 8;     // a tile row, bf16
  static constexpr int kRst = kMlaChunk + 1;    // score rows, fp32
  static constexpr int kPst = kMlaChunk + 8;    // P rows, bf16 (16-byte aligned, banks apart)
  // Byte offsets: tile, latent score partials [warps][16][kRst], rope scores [16][kRst],
  // P hi and lo [16][kPst] each, rescale factors [16].
  static constexpr size_t kTile = 0;
  static constexpr size_t kRed = kTile + sizeof(uint16_t) * kMlaChunk * kTst;
  static constexpr size_t kRope = kRed + sizeof(float) * kMlaMmaWarps * kMlaMmaHeads * kRst;
  static constexpr size_t kP = kRope + sizeof(float) * kMlaMmaHeads * kRst;
  static constexpr size_t kCold = kP + 2 * sizeof(uint16_t) * kMlaMmaHeads * kPst;
  static constexpr size_t kTotal = kCold + sizeof(float) * kMlaMmaHeads;
  static_assert(kTile % 16 == 0 && kRed % 16 == 0 && kP % 16 == 0 && (kTst * 2) % 16 == 0);
};

template <int KVL, int RD>
__global__ void __launch_bounds__(kMlaMmaWarps * 32, 1) MlaDecodeMmaKernel(MlaDecodeParams p) {
  using L = MlaMmaLayout<KVL, RD>;
  constexpr int kThreads = kMlaMmaWarps * 32;
  constexpr int kSlice = KVL / kMlaMmaWarps;  // a warp's latent dims, for scores and values
  constexpr int kKs = kSlice / 16;            // its k16 steps of the latent scores
  constexpr int kDt = kSlice / 8;             // its n8 tiles of the output
  static_assert(kSlice % 32 == 0 && RD % 32 == 0 && kMlaChunk == 32 &&
                kMlaMmaHeads == 2 * kMlaMmaWarps);
  extern __shared__ __align__(16) unsigned char mdm[];
  uint16_t* tile = reinterpret_cast<uint16_t*>(mdm + L::kTile);
  float* red = reinterpret_cast<float*>(mdm + L::kRed);
  float* rsc = reinterpret_cast<float*>(mdm + L::kRope);
  uint16_t* phi = reinterpret_cast<uint16_t*>(mdm + L::kP);
  uint16_t* plo = phi + kMlaMmaHeads * L::kPst;
  float* colds = reinterpret_cast<float*>(mdm + L::kCold);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int lq = lane >> 3, lr = lane & 7;
  const int64_t h0 = static_cast<int64_t>(blockIdx.y) * kMlaMmaHeads;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * p.chunks_per_split * kMlaChunk;
  int64_t last = min(p.Sk, first + static_cast<int64_t>(p.chunks_per_split) * kMlaChunk);
  // Loads: kCopyT threads a key row, thread (cr, cc) takes rows cr + kCopyRows * pass and
  // in them the 16-byte pieces cc + kCopyT * k of the latent and of the rope key, so that
  // every load is a row base plus a compile-time offset; it converts the same pieces into
  // the tile.
  constexpr int kCopyT = 16;
  constexpr int kCopyRows = kThreads / kCopyT;
  constexpr int kPasses = kMlaChunk / kCopyRows;
  static_assert(kMlaChunk % kCopyRows == 0 && KVL % (4 * kCopyT) == 0 && RD % (4 * kCopyT) == 0);
  const int cr = tid / kCopyT, cc = 4 * (tid % kCopyT);
  constexpr int kPieces = (KVL + RD) / (4 * kCopyT);  // a thread's 16-byte pieces of a row
  float4 held[kPasses][kPieces];  // the next chunk's pieces, in flight
  // Loads the rows `rw` (raw indices, MlaRawRow; invalid ones give zeros) into `held`.
  auto issue = [&](const int (&rw)[kPasses]) {
#pragma unroll
    for (int ps = 0; ps < kPasses; ++ps) {
      const int checked = MlaCheckRow(p, rw[ps]);
      const int64_t row = max(checked, 0);
      const bool ok = checked >= 0;
      const float* ls = p.lat + row * KVL + cc;
      const float* es = p.pe + row * RD + cc;
      const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int k = 0; k < KVL / (4 * kCopyT); ++k) {
        held[ps][k] = ok ? LoadProduced(reinterpret_cast<const float4*>(ls + 4 * kCopyT * k)) : z;
      }
#pragma unroll
      for (int k = 0; k < RD / (4 * kCopyT); ++k) {
        held[ps][KVL / (4 * kCopyT) + k] = ok ? LoadProduced(reinterpret_cast<const float4*>(es + 4 * kCopyT * k)) : z;
      }
    }
  };
  PdlBegin();
  if (p.pos_at != nullptr) {
    MlaDeviceCount(p);
    last = min(p.Sk, first + static_cast<int64_t>(p.chunks_per_split) * kMlaChunk);
  }
  // Row indices run ahead of their use (top-k loads would otherwise stall the chunk they
  // serve): the copy rows of the next chunk and the mask of this one are loaded a chunk early.
  int nrow[kPasses];
#pragma unroll
  for (int ps = 0; ps < kPasses; ++ps) nrow[ps] = MlaRawRow(p, first + cr + ps * kCopyRows, last);
  issue(nrow);
#pragma unroll
  for (int ps = 0; ps < kPasses; ++ps) nrow[ps] = MlaRawRow(p, first + kMlaChunk + cr + ps * kCopyRows, last);
  int vnext = MlaRawRow(p, first + lane, last);
  // The warp's q_lat fragments (rows h0 + g and h0 + g + 8, its latent slice) and, for the
  // rope warps, the scaled and rounded rope queries, all loads issued before any is packed.
  uint32_t qf[kKs][4];
  uint32_t qpf[RD / 16][4];
  {
    const int64_t ha = h0 + g, hb = h0 + g + 8;
    float2 v[kKs][4];
#pragma unroll
    for (int kk = 0; kk < kKs; ++kk) {
      const int c = warp * kSlice + kk * 16 + 2 * t;
      const float2 z = make_float2(0.f, 0.f);
      v[kk][0] = ha < p.H ? *reinterpret_cast<const float2*>(p.qlat + ha * KVL + c) : z;
      v[kk][1] = hb < p.H ? *reinterpret_cast<const float2*>(p.qlat + hb * KVL + c) : z;
      v[kk][2] = ha < p.H ? *reinterpret_cast<const float2*>(p.qlat + ha * KVL + c + 8) : z;
      v[kk][3] = hb < p.H ? *reinterpret_cast<const float2*>(p.qlat + hb * KVL + c + 8) : z;
    }
    float e[RD / 16][4][2];
#pragma unroll
    for (int kk = 0; kk < RD / 16; ++kk) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int64_t h = (r & 1) ? hb : ha;
        const int c = kk * 16 + 2 * t + 8 * (r >> 1);
        const bool ok = warp < kMlaChunk / 8 && h < p.H;
        const float* q = p.q + h * p.qd + p.nope + c;
        e[kk][r][0] = ok ? q[0] : 0.f;
        e[kk][r][1] = ok ? q[1] : 0.f;
      }
    }
#pragma unroll
    for (int kk = 0; kk < kKs; ++kk) {
#pragma unroll
      for (int r = 0; r < 4; ++r) qf[kk][r] = PackBf16x2(v[kk][r].x, v[kk][r].y);
    }
#pragma unroll
    for (int kk = 0; kk < RD / 16; ++kk) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        qpf[kk][r] = PackBf16x2(qdec::RoundToBf16(e[kk][r][0] * p.scale),
                                qdec::RoundToBf16(e[kk][r][1] * p.scale));
      }
    }
  }
  float acc[kDt][4];
#pragma unroll
  for (int dt = 0; dt < kDt; ++dt) acc[dt][0] = acc[dt][1] = acc[dt][2] = acc[dt][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // heads 2 warp + i, warp-uniform
  for (int64_t j0 = first; j0 < last; j0 += kMlaChunk) {
    const int vrow = vnext;
    vnext = MlaRawRow(p, j0 + kMlaChunk + lane, last);
    int nrow2[kPasses];
#pragma unroll
    for (int ps = 0; ps < kPasses; ++ps) nrow2[ps] = MlaRawRow(p, j0 + 2 * kMlaChunk + cr + ps * kCopyRows, last);
    __syncthreads();  // the tile's readers of the previous chunk are done
#pragma unroll
    for (int ps = 0; ps < kPasses; ++ps) {
      const int r = cr + ps * kCopyRows;
#pragma unroll
      for (int k = 0; k < kPieces; ++k) {
        const float4 v = held[ps][k];
        *reinterpret_cast<uint2*>(tile + r * L::kTst + cc + 4 * kCopyT * k) =
            make_uint2(PackBf16x2(v.x, v.y), PackBf16x2(v.z, v.w));
      }
    }
    if (j0 + kMlaChunk < last) issue(nrow);
#pragma unroll
    for (int ps = 0; ps < kPasses; ++ps) nrow[ps] = nrow2[ps];
    __syncthreads();  // the tile is complete
    // Latent scores over the warp's slice: n8 tiles of keys.
#pragma unroll
    for (int nt = 0; nt < kMlaChunk / 8; ++nt) {
      float sc[4] = {0.f, 0.f, 0.f, 0.f};
      MmaKeyRows(sc, qf, tile + (nt * 8 + lr) * L::kTst + warp * kSlice + 8 * lq);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        red[(warp * kMlaMmaHeads + g + 8 * (e >> 1)) * L::kRst + nt * 8 + 2 * t + (e & 1)] = sc[e];
      }
    }
    if (warp < kMlaChunk / 8) {
      float pe[4] = {0.f, 0.f, 0.f, 0.f};
      MmaKeyRows(pe, qpf, tile + (warp * 8 + lr) * L::kTst + KVL + 8 * lq);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        rsc[(g + 8 * (e >> 1)) * L::kRst + warp * 8 + 2 * t + (e & 1)] = qdec::RoundToBf16(pe[e]);
      }
    }
    __syncthreads();  // every partial score is in
    const bool valid = MlaCheckRow(p, vrow) >= 0;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int hh = 2 * warp + i;
      float s = -INFINITY;
      if (valid) {
        float dot = 0.f;
#pragma unroll
        for (int w = 0; w < kMlaMmaWarps; ++w) dot += red[(w * kMlaMmaHeads + hh) * L::kRst + lane];
        s = dot * p.scale + rsc[hh * L::kRst + lane];
      }
      float mc = s;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) mc = fmaxf(mc, __shfl_xor_sync(0xffffffffu, mc, off));
      const float mn = fmaxf(m[i], mc);
      float cold = 1.f, pj = 0.f;
      if (mn != -INFINITY) {  // uniform over the warp
        cold = m[i] == -INFINITY ? 0.f : expf(m[i] - mn);
        pj = s == -INFINITY ? 0.f : expf(s - mn);
        l[i] = l[i] * cold + WarpSum(pj);
        m[i] = mn;
      }
      const uint32_t hi = qdec::F32ToBf16Bits(pj);
      phi[hh * L::kPst + lane] = static_cast<uint16_t>(hi);
      plo[hh * L::kPst + lane] = static_cast<uint16_t>(qdec::F32ToBf16Bits(pj - __uint_as_float(hi << 16)));
      if (lane == 0) colds[hh] = cold;
    }
    __syncthreads();  // P and the rescale factors are in
    {
      const float c0 = colds[g], c1 = colds[g + 8];
#pragma unroll
      for (int dt = 0; dt < kDt; ++dt) {
        acc[dt][0] *= c0;
        acc[dt][1] *= c0;
        acc[dt][2] *= c1;
        acc[dt][3] *= c1;
      }
    }
#pragma unroll
    for (int kc = 0; kc < kMlaChunk / 16; ++kc) {
      uint32_t ah[4], al[4], b[4];
      const int pa = (8 * (lq & 1) + lr) * L::kPst + kc * 16 + 8 * (lq >> 1);
      LdMatrixX4<false>(ah, phi + pa);
      LdMatrixX4<false>(al, plo + pa);
      const uint16_t* vr = tile + (kc * 16 + 8 * (lq & 1) + lr) * L::kTst + warp * kSlice + 8 * (lq >> 1);
#pragma unroll
      for (int dt = 0; dt < kDt; dt += 2) {
        LdMatrixX4<true>(b, vr + dt * 8);
        internal::MmaBf16(acc[dt], ah[0], ah[1], ah[2], ah[3], b[0], b[1]);
        internal::MmaBf16(acc[dt], al[0], al[1], al[2], al[3], b[0], b[1]);
        internal::MmaBf16(acc[dt + 1], ah[0], ah[1], ah[2], ah[3], b[2], b[3]);
        internal::MmaBf16(acc[dt + 1], al[0], al[1], al[2], al[3], b[2], b[3]);
      }
    }
  }
  constexpr int64_t kPartRow = KVL + 2;
  float* out = p.part + (static_cast<int64_t>(blockIdx.x) * p.H + h0) * kPartRow;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int hh = 2 * warp + i;
    if (lane == 0 && h0 + hh < p.H) {
      out[hh * kPartRow] = m[i];
      out[hh * kPartRow + 1] = l[i];
    }
  }
#pragma unroll
  for (int dt = 0; dt < kDt; ++dt) {
    const int c = 2 + warp * kSlice + dt * 8 + 2 * t;
    if (h0 + g < p.H) *reinterpret_cast<float2*>(out + g * kPartRow + c) = make_float2(acc[dt][0], acc[dt][1]);
    if (h0 + g + 8 < p.H) {
      *reinterpret_cast<float2*>(out + (g + 8) * kPartRow + c) = make_float2(acc[dt][2], acc[dt][3]);
    }
  }
}

// The merge of key splits, for MLA decode (rows = heads, width = kvl) and the split GQA
// decode (rows = L * hq output rows in [L, hq] order, width = dv): partial (s, r) of row r at
// part + (s * rows + r) * (width + 2) holds [max, sum, acc[width]], unnormalised; a split
// that saw no key has sum 0 and is left out.
// out[r, :] = round(sum_s acc_s * e^(m_s - M) / sum_s l_s * e^(m_s - M)), and its bf16 bits
// in out_bf16 when set. Block (r, c) takes row r's dims [c * 128, c * 128 + 128): the split
// weights by a block reduction, then one dim per thread over the splits in split order, 16
// loads in flight at a time (the first 16 issued before the reduction), two FMA chains;
// every sum has a fixed order, so a run repeats bit for bit.
__global__ void __launch_bounds__(kCombineThreads)
    SplitCombineKernel(const float* part, int splits, int64_t rows, int width,
                       cpu::ActDType rt, float* __restrict__ out,
                       uint16_t* __restrict__ out_bf16) {
  PdlBegin();
  __shared__ float f[kMaxSplits];
  __shared__ float wred[kCombineThreads / 32];
  const int64_t r = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t stride = width + 2;
  // The first batch of this thread's accumulator loads goes out before the weights are
  // known (they do not depend on them), so its latency hides behind the two reductions.
  const int d = blockIdx.y * kCombineThreads + tid;
  const bool live = d < width;
  const float* pd = part + r * stride + 2 + d;
  constexpr int kBatch = 16;  // loads in flight per thread
  float v[kBatch];
#pragma unroll
  for (int u = 0; u < kBatch; ++u) v[u] = live && u < splits ? pd[u * rows * stride] : 0.f;
  float M = -INFINITY;
  for (int s = tid; s < splits; s += kCombineThreads) {
    const float* ps = part + (s * rows + r) * stride;
    if (ps[1] > 0.f) M = fmaxf(M, ps[0]);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, off));
  if (lane == 0) wred[warp] = M;
  __syncthreads();
  M = wred[0];
  for (int w = 1; w < kCombineThreads / 32; ++w) M = fmaxf(M, wred[w]);
  __syncthreads();
  float den = 0.f;
  for (int s = tid; s < splits; s += kCombineThreads) {
    const float* ps = part + (s * rows + r) * stride;
    const float fs = ps[1] > 0.f ? expf(ps[0] - M) : 0.f;
    f[s] = fs;
    den += ps[1] * fs;
  }
  den = WarpSum(den);
  if (lane == 0) wred[warp] = den;
  __syncthreads();
  den = 0.f;
  for (int w = 0; w < kCombineThreads / 32; ++w) den += wred[w];
  const float inv = 1.f / den;
  if (!live) return;
  float a0 = 0.f, a1 = 0.f;
  for (int s0 = 0; s0 < splits; s0 += kBatch) {
    if (s0 > 0) {
#pragma unroll
      for (int u = 0; u < kBatch; ++u) v[u] = s0 + u < splits ? pd[(s0 + u) * rows * stride] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kBatch; u += 2) {
      if (s0 + u < splits) a0 = fmaf(v[u], f[s0 + u], a0);
      if (s0 + u + 1 < splits) a1 = fmaf(v[u + 1], f[s0 + u + 1], a1);
    }
  }
  const float o = DevRoundAct((a0 + a1) * inv, rt);
  out[r * width + d] = o;
  if (out_bf16 != nullptr) out_bf16[r * width + d] = static_cast<uint16_t>(qdec::F32ToBf16Bits(o));
}

// MLA decode's split combine and its unembedding in one launch (MlaDecodeAttend, bf16
// activations, an mxfp4 W_UV at GLM-5's widths): block (h, c) merges head h's key splits into
// o_lat in shared memory, with SplitCombineKernel's sums in its order (so the same bf16
// values), then computes outputs [c * kCuRows, (c + 1) * kCuRows) of head h,
// out = round_bf16(sum_d o_lat[d] * W_UV[h][v][d]), 4 threads a row, each a quarter of the
// row's chunks: fp32 products (exact: bf16 times E2M1), a sum a chunk scaled by its E8M0
// factor (exact), then the chunks and the quarters in a fixed order. That is another order
// than the decode GEMV's tensor cores, so a sum may differ in its last bits. The row's words
// and scales are loaded before the PDL wait (weights). Against the combine kernel and the
// GEMV: one launch and one round trip through memory fewer.
constexpr int kCuRows = 128;
constexpr int kCuThreads = 4 * kCuRows;
constexpr int kCuKvl = 512;               // the latent width it is built for
constexpr int kCuQuarter = kCuKvl / 4;    // elements a thread's quarter of a row
constexpr int kCuPad = 4;                 // floats between quarters (no bank conflicts)
__global__ void __launch_bounds__(kCuThreads)
    MlaCombineUnembedKernel(const float* part, int splits, int64_t H, int64_t vd,
                            const uint32_t* __restrict__ w, const uint8_t* __restrict__ scales,
                            float* __restrict__ out, uint16_t* __restrict__ out_bf16) {
  static_assert(kCuKvl == kCuThreads, "one latent dim a thread in the combine");
  __shared__ float f[32];
  __shared__ float inv_sh;
  __shared__ __align__(16) float olat[kCuKvl + 4 * kCuPad];
  const int64_t h = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, q = tid & 3;
  const int64_t v = static_cast<int64_t>(blockIdx.y) * kCuRows + (tid >> 2);
  constexpr int kWords = kCuQuarter / 8;  // 16: 4 chunks of 4 words
  uint4 wq[kWords / 4];
  const uint4* wp = reinterpret_cast<const uint4*>(w + (h * vd + v) * (kCuKvl / 8) + q * kWords);
#pragma unroll
  for (int i = 0; i < kWords / 4; ++i) wq[i] = __ldg(wp + i);
  const uint32_t sc = __ldg(reinterpret_cast<const uint32_t*>(scales + (h * vd + v) * (kCuKvl / 32)) + q);
  PdlBegin();
  const int64_t stride = kCuKvl + 2;
  const float* pd = part + h * stride + 2 + tid;
  float a[32];
#pragma unroll
  for (int s = 0; s < 32; ++s) a[s] = s < splits ? pd[s * H * stride] : 0.f;
  if (tid < 32) {  // the split weights, as SplitCombineKernel forms them
    const float* ps = part + (static_cast<int64_t>(lane) * H + h) * stride;
    const float m = lane < splits ? ps[0] : 0.f, l = lane < splits ? ps[1] : 0.f;
    float M = l > 0.f ? m : -INFINITY;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, off));
    const float fs = l > 0.f ? expf(m - M) : 0.f;
    f[lane] = fs;
    const float den = WarpSum(l * fs);
    if (lane == 0) inv_sh = 1.f / den;
  }
  __syncthreads();
  float a0 = 0.f, a1 = 0.f;
#pragma unroll
  for (int s = 0; s < 32; s += 2) {
    if (s < splits) a0 = fmaf(a[s], f[s], a0);
    if (s + 1 < splits) a1 = fmaf(a[s + 1], f[s + 1], a1);
  }
  olat[tid + (tid / kCuQuarter) * kCuPad] = DevRoundAct((a0 + a1) * inv_sh, cpu::ActDType::kBF16);
  __syncthreads();
  // Word j of the quarter holds elements 8j .. 8j + 7; its pair k is (8j + k, 8j + k + 4).
  const float* xo = olat + q * (kCuQuarter + kCuPad);
  float sum = 0.f;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const uint32_t words[4] = {wq[c].x, wq[c].y, wq[c].z, wq[c].w};
    float cs = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float4 lo = *reinterpret_cast<const float4*>(xo + (4 * c + j) * 8);
      const float4 hi = *reinterpret_cast<const float4*>(xo + (4 * c + j) * 8 + 4);
      const float xl[4] = {lo.x, lo.y, lo.z, lo.w}, xh[4] = {hi.x, hi.y, hi.z, hi.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t pr = qdec::Mxfp4::PairTiny(words[j], k);  // E2M1 * 2^-126, bf16x2
        cs = fmaf(xl[k], qdec::Bf16ToF32(pr) * 0x1p126f, cs);
        cs = fmaf(xh[k], qdec::Bf16ToF32(pr >> 16) * 0x1p126f, cs);
      }
    }
    sum = fmaf(cs, qdec::E8M0ToF32((sc >> (8 * c)) & 0xffu), sum);
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  if (q == 0) {
    const float o = qdec::RoundToBf16(sum);
    out[h * vd + v] = o;
    if (out_bf16 != nullptr) out_bf16[h * vd + v] = static_cast<uint16_t>(qdec::F32ToBf16Bits(o));
  }
}

}  // namespace

// As many splits as keep the grid within two blocks per SM (as MlaDecode; rounded down, as
// a 512-thread block of the wide kernel may fill an SM's registers by itself and a third
// partial wave would cost a whole split's time), no more than the keys allow at
// kSplitMinKeys each, then even splits rounded up to kSplitKeyAlign keys. The key range is
// the one the longest row sees (causal: up to offset + L), so a causal chunk after a short
// prefix does not spend blocks on keys no row reads.
AttentionKeySplit AttentionVecKeySplit(const AttentionParams& p, int sm_count) {
  AttentionKeySplit split;
  split.keys_per_split = p.S;
  const int64_t blocks = p.L * p.hq;
  const int64_t fill = 2 * static_cast<int64_t>(std::max(sm_count, 1));
  if (blocks <= 0 || blocks >= fill) return split;  // the narrow kernel's grid fills the GPU
  const int64_t keys = p.causal_offset >= 0 ? std::min(p.S, p.causal_offset + p.L) : p.S;
  const int64_t splits = std::min({fill / blocks, keys / kSplitMinKeys, int64_t{kMaxSplits}});
  if (splits < 2) return split;
  const int64_t per = ((keys + splits - 1) / splits + kSplitKeyAlign - 1) / kSplitKeyAlign *
                      kSplitKeyAlign;
  split.splits = (keys + per - 1) / per;
  split.keys_per_split = per;
  return split;
}

bool AttentionTakesDevicePos(const AttentionParams& p) {
  return p.L == 1 && p.add_mask == nullptr && p.causal_offset < 0 && p.rope == 0 &&
         p.dk == p.dv && (p.dk == 64 || p.dk == 128 || p.dk == 256) && AttentionVec(p);
}

bool AttentionTakesPe(const AttentionParams& p, cpu::ActDType round) {
  absl::StatusOr<const DeviceInfo*> dev = CurrentDevice();
  return p.rope > 0 && dev.ok() && MmaTakes(p, round, **dev);
}

absl::Status Attention(const AttentionParams& p, cpu::ActDType round, cudaStream_t stream) {
  if (p.q == nullptr || p.k == nullptr || p.v == nullptr || p.out == nullptr) {
    return absl::InvalidArgumentError("attention: null operand");
  }
  if (p.L <= 0 || p.S <= 0) return absl::OkStatus();
  if (p.pos_at != nullptr && !AttentionTakesDevicePos(p)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "attention: a key count on the device needs one query row without masks and dk = dv "
        "in {64, 128, 256} (got L %d, dk %d, dv %d)", p.L, p.dk, p.dv));
  }
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
  const bool vec = AttentionVec(p);
  bool mma = false;
  RING_RETURN_IF_ERROR(MaybeAttentionMma(p, round, **dev, stream, &mma));
  if (mma) return absl::OkStatus();
  if (p.rope > 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "attention: rope scores in the kernel need the tensor-core path (bf16, rope 64, dk 128 or 192; "
        "got rope %d, dk %d, L %d)", p.rope, p.dk, p.L));
  }
  const size_t tile_smem = AttentionTileSmem(p.dk, p.dv, vec);
  if (p.L >= kTileMinL && p.dk <= kTileMaxD && p.dv <= kTileMaxD && p.hq <= 65535 &&
      static_cast<int64_t>(tile_smem) <= (*dev)->smem_per_block_optin) {
    const void* fn = vec ? reinterpret_cast<const void*>(AttentionTileKernel<true>)
                         : reinterpret_cast<const void*>(AttentionTileKernel<false>);
    RING_CUDA_RETURN_IF_ERROR(AllowDynamicSmem(fn, tile_smem));
    const dim3 grid(static_cast<unsigned>((p.L + kTileQ - 1) / kTileQ), static_cast<unsigned>(p.hq));
    if (vec) {
      AttentionTileKernel<true><<<grid, 256, tile_smem, stream>>>(p, round);
    } else {
      AttentionTileKernel<false><<<grid, 256, tile_smem, stream>>>(p, round);
    }
    RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  }
  const bool wide = blocks < 2 * static_cast<int64_t>((*dev)->sm_count);
  const int warps = wide ? kWideWarps : kNarrowWarps;
  if (vec && p.dk == p.dv && (p.dk == 64 || p.dk == 128 || p.dk == 256)) {
    const size_t vsmem = static_cast<size_t>(warps) * (p.dk + 2) * sizeof(float);
    // Split rows (only where the grid is wide): partials [splits][L * hq][dv + 2], merged
    // by SplitCombineKernel into out.
    const AttentionKeySplit split = AttentionVecKeySplit(p, (*dev)->sm_count);
    StreamBuffer partials;
    if (split.splits > 1) {
      RING_ASSIGN_OR_RETURN(partials, StreamBuffer::Allocate(split.splits * blocks * (p.dv + 2) *
                                                                 sizeof(float),
                                                             stream));
    }
    const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(split.splits));
    auto launch = [&](auto kernel) {
      return LaunchPdlRaw(kernel, grid, dim3(warps * 32), vsmem, stream, 0, p, round,
                          split.keys_per_split, partials.as<float>());
    };
    cudaError_t e;
    switch (p.dk * (wide ? 1 : -1)) {
      case 64: e = launch(AttentionVecKernel<64, kWideWarps>); break;
      case 128: e = launch(AttentionVecKernel<128, kWideWarps>); break;
      case 256: e = launch(AttentionVecKernel<256, kWideWarps>); break;
      case -64: e = launch(AttentionVecKernel<64, kNarrowWarps>); break;
      case -128: e = launch(AttentionVecKernel<128, kNarrowWarps>); break;
      default: e = launch(AttentionVecKernel<256, kNarrowWarps>); break;
    }
    RING_CUDA_RETURN_IF_ERROR(e);
    if (split.splits > 1) {
      const dim3 cgrid(static_cast<unsigned>(blocks),
                       static_cast<unsigned>((p.dv + kCombineThreads - 1) / kCombineThreads));
      RING_LAUNCH_PDL(SplitCombineKernel, cgrid, kCombineThreads, 0, stream, partials.as<float>(),
                      static_cast<int>(split.splits), blocks, static_cast<int>(p.dv), round,
                      p.out, p.out_bf16);
    }
    return absl::OkStatus();
  }
  const size_t smem = (p.dk + warps * (p.dv + 2)) * sizeof(float);
  const void* fn = wide ? reinterpret_cast<const void*>(AttentionKernel<kWideWarps>)
                        : reinterpret_cast<const void*>(AttentionKernel<kNarrowWarps>);
  RING_CUDA_RETURN_IF_ERROR(AllowDynamicSmem(fn, smem));
  if (wide) {
    RING_LAUNCH_PDL((AttentionKernel<kWideWarps>), static_cast<unsigned>(blocks), warps * 32, smem,
                    stream, p, round);
  } else {
    RING_LAUNCH_PDL((AttentionKernel<kNarrowWarps>), static_cast<unsigned>(blocks), warps * 32,
                    smem, stream, p, round);
  }
  return absl::OkStatus();
}

namespace {

AttentionParams ParamsOf(const cpu::AttentionArgs& a) {
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
  return p;
}

}  // namespace

bool AttentionTakesDevicePos(const cpu::AttentionArgs& a) {
  return AttentionTakesDevicePos(ParamsOf(a));
}

absl::Status Attention(const cpu::AttentionArgs& a, cpu::ActDType round, float* out,
                       cudaStream_t stream, uint16_t* out_bf16, const int32_t* pos_at) {
  AttentionParams p = ParamsOf(a);
  p.pos_at = pos_at;
  p.out = out;
  p.out_bf16 = out_bf16;
  return Attention(p, round, stream);
}

namespace {

// The absorbed decode's launch shape and its one scratch block: q_lat, o_lat, the partials,
// then (bf16 mode) o_lat's bf16 bits (the combine writes them, so the unembed GEMV needs no
// conversion launch of its own) and q_nope's bf16 copy (the embed GEMV's input).
struct MlaDecodePlan {
  bool mma = false;
  int64_t head_blocks = 0, per_split = 0, splits = 0;
  int64_t olat_bf16_at = 0, qnope_bf16_at = 0, qnope_n = 0, bytes = 0;  // byte offsets, sizes
};

absl::StatusOr<MlaDecodePlan> PlanMlaDecode(const cpu::MlaAttentionArgs& a, cpu::ActDType t,
                                            int64_t Sk, const DeviceInfo& dev) {
  MlaDecodePlan pl;
  const int64_t H = a.H, kvl = a.kvl, qd = a.nope + a.rope;
  const int64_t chunks = (Sk + kMlaChunk - 1) / kMlaChunk;
  // The tensor-core kernel where the activations are bf16 and the dims are GLM-5's.
  const MlaDecodeForm form =
      t == cpu::ActDType::kBF16 && kvl == 512 && a.rope == 64 ? ChooseMlaDecodeForm(dev) : MlaDecodeForm::kSimt;
  pl.mma = form != MlaDecodeForm::kSimt;
  const int64_t heads_per_block = pl.mma ? kMlaMmaHeads : kMlaHeadsPerBlock;
  pl.head_blocks = (H + heads_per_block - 1) / heads_per_block;
  // Splits enough for every SM's blocks (two of the fp32 kernel fit, one of the tensor-core
  // kernel), no more: each split adds a partial per head that the combine reads back.
  const int64_t fill = (pl.mma ? 1 : 2) * static_cast<int64_t>(std::max(dev.sm_count, 1));
  // (Longer splits on the tensor-core kernel, 3 or 4 chunks instead of 2 at 2k keys, measured
  // no faster: fewer partials, but half the SMs idle.)
  pl.per_split = std::max({int64_t{1}, (chunks * pl.head_blocks + fill - 1) / fill,
                           (chunks + kMaxSplits - 1) / kMaxSplits});
  pl.splits = (chunks + pl.per_split - 1) / pl.per_split;
  if (pl.per_split > 0x7fffffff || pl.head_blocks > 65535) {
    return absl::InvalidArgumentError("mla decode: too many keys or heads");
  }
  const bool bf16 = t == cpu::ActDType::kBF16;
  const auto up = [](int64_t b) { return (b + 255) / 256 * 256; };  // 16-byte rows and more
  pl.olat_bf16_at = up((2 * H * kvl + pl.splits * H * (kvl + 2)) * 4);
  pl.qnope_bf16_at = up(pl.olat_bf16_at + (bf16 ? H * kvl * 2 : 0));
  pl.qnope_n = bf16 ? (H - 1) * qd + a.nope : 0;  // LinearT's span of x over the H problems
  pl.bytes = pl.qnope_bf16_at + pl.qnope_n * 2;
  return pl;
}

// Whether MlaDecodeAttend (bf16 activations) merges the splits and unembeds in one launch
// (MlaCombineUnembedKernel): an mxfp4 W_UV [H, vd, 512] in 32-element groups, vd a multiple
// of kCuRows, at most 32 splits; RING_CUDA_MLA_COMBINE_UNEMBED=0 (read once, A/B runs) keeps
// the combine kernel and the GEMV.
bool MlaCombineUnembedTakes(const DeviceQuantWeight& uo, const cpu::MlaAttentionArgs& a, int64_t splits) {
  static const bool on = EnvSwitchOn("RING_CUDA_MLA_COMBINE_UNEMBED");
  return on && uo.spec.mode == QuantMode::kMxfp4 && uo.spec.group_size == 32 && uo.batch == a.H &&
         uo.rows == a.vd && uo.cols == kCuKvl && a.kvl == kCuKvl && a.vd % kCuRows == 0 && splits >= 1 &&
         splits <= 32 && reinterpret_cast<uintptr_t>(uo.weight) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(uo.scales) % 4 == 0 && a.H <= 0x7fffffff;
}

// Absorbed decode through MlaDecodeKernel (file comment), in two parts that share the plan's
// scratch block at `base`: MlaDecodeQuery, q_lat = round(q_nope @ W_UK_h^T) per head (with
// q_nope's bf16 copy first in bf16 mode), which does not read the cache or the top-k; then
// MlaDecodeAttend, the split attention and its combine, out = round(o_lat @ W_UV_h^T).
absl::Status MlaDecodeQuery(const cpu::MlaAttentionArgs& a, const DeviceQuantWeight& embed_q,
                            cpu::ActDType t, const MlaDecodePlan& pl, char* base, cudaStream_t stream) {
  QMatmulArgs qa;
  qa.x = a.q;  // q_nope of head h at h * qd
  qa.m = 1;
  qa.y = reinterpret_cast<float*>(base);  // q_lat
  qa.problems = a.H;
  qa.x_problem_stride = a.nope + a.rope;
  qa.y_problem_stride = a.kvl;
  if (t == cpu::ActDType::kBF16) {
    // The copy LinearT would make (same conversion, so the same bits), in the scratch block.
    uint16_t* qb = reinterpret_cast<uint16_t*>(base + pl.qnope_bf16_at);
    RING_RETURN_IF_ERROR(ToBf16(a.q, pl.qnope_n, qb, stream));
    qa.x = qb;
    qa.x_dtype = DType::kBF16;
  }
  return LinearT(embed_q, qa, t, stream);
}

absl::Status MlaDecodeAttend(const cpu::MlaAttentionArgs& a, const DeviceQuantWeight& unembed_out,
                             cpu::ActDType t, float* out, uint16_t* out_bf16, bool* wrote_bf16,
                             int64_t Sk, size_t smem, const MlaDecodePlan& pl, char* base,
                             cudaStream_t stream, const int32_t* pos_at) {
  const int64_t H = a.H, kvl = a.kvl, qd = a.nope + a.rope;
  const bool bf16 = t == cpu::ActDType::kBF16;
  float* qlat = reinterpret_cast<float*>(base);
  float* olat = qlat + H * kvl;
  uint16_t* olat_bf16 = bf16 ? reinterpret_cast<uint16_t*>(base + pl.olat_bf16_at) : nullptr;
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
  p.chunks_per_split = static_cast<int>(pl.per_split);
  p.scale = a.scale;
  p.part = olat + H * kvl;
  p.pos_at = pos_at;
  const dim3 grid(static_cast<unsigned>(pl.splits), static_cast<unsigned>(pl.head_blocks));
  if (pl.mma) {
    constexpr auto kKernel = MlaDecodeMmaKernel<512, 64>;
    constexpr size_t kSmem = MlaMmaLayout<512, 64>::kTotal;
    RING_CUDA_RETURN_IF_ERROR(AllowDynamicSmem(kKernel, kSmem));
    RING_LAUNCH_PDL(kKernel, grid, kMlaMmaWarps * 32, kSmem, stream, p);
  } else {
    RING_CUDA_RETURN_IF_ERROR(AllowDynamicSmem(MlaDecodeKernel, smem));
    RING_LAUNCH_PDL(MlaDecodeKernel, grid, kMlaThreads, smem, stream, p, t);
  }
  if (bf16 && MlaCombineUnembedTakes(unembed_out, a, pl.splits)) {
    RING_LAUNCH_PDL(MlaCombineUnembedKernel,
                    dim3(static_cast<unsigned>(H), static_cast<unsigned>(a.vd / kCuRows)), kCuThreads, 0,
                    stream, p.part, static_cast<int>(pl.splits), H, a.vd,
                    static_cast<const uint32_t*>(unembed_out.weight),
                    static_cast<const uint8_t*>(unembed_out.scales), out, out_bf16);
    *wrote_bf16 = out_bf16 != nullptr;
    return absl::OkStatus();
  }
  RING_LAUNCH_PDL(SplitCombineKernel,
                  dim3(static_cast<unsigned>(H),
                       static_cast<unsigned>((kvl + kCombineThreads - 1) / kCombineThreads)),
                  kCombineThreads, 0, stream, p.part, static_cast<int>(pl.splits), H, p.kvl, t,
                  olat, olat_bf16);
  QMatmulArgs oa;
  oa.x = olat;
  oa.m = 1;
  oa.y = out;
  oa.problems = H;
  oa.x_problem_stride = kvl;
  oa.y_problem_stride = a.vd;
  if (bf16) {
    // The bits the combine wrote (o_lat is rounded to bf16, so they are exactly the copy
    // LinearT would make, and it makes none).
    oa.x = olat_bf16;
    oa.x_dtype = DType::kBF16;
    // o_proj's input as a side copy, without a conversion launch, where the decode GEMV runs
    // the unembedding (the only kernel with the side copy); the path as LinearT will resolve
    // it, with the rounding it sets.
    oa.round_bf16 = true;
    const absl::StatusOr<QmmPath> path = ResolveQmmPath(unembed_out, oa);
    if (out_bf16 != nullptr && path.ok() && *path == QmmPath::kTensorCore) {
      oa.y_bf16 = out_bf16;
      *wrote_bf16 = true;
    }
  }
  return LinearT(unembed_out, oa, t, stream);
}

// `scratch` (optional): the caller's PlanMlaDecode(...).bytes, in place of a stream-ordered
// allocation (which, in a graph, is a node between the kernels that costs the next one its
// PDL start).
absl::Status MlaDecode(const cpu::MlaAttentionArgs& a, const DeviceQuantWeight& embed_q,
                       const DeviceQuantWeight& unembed_out, cpu::ActDType t, float* out,
                       uint16_t* out_bf16, bool* wrote_bf16, int64_t Sk, size_t smem,
                       const DeviceInfo& dev, cudaStream_t stream, const int32_t* pos_at,
                       void* scratch) {
  RING_ASSIGN_OR_RETURN(const MlaDecodePlan pl, PlanMlaDecode(a, t, Sk, dev));
  StreamBuffer owned;
  if (scratch == nullptr) {
    RING_ASSIGN_OR_RETURN(owned, StreamBuffer::Allocate(pl.bytes, stream));
    scratch = owned.data();
  }
  char* const base = static_cast<char*>(scratch);
  RING_RETURN_IF_ERROR(MlaDecodeQuery(a, embed_q, t, pl, base, stream));
  return MlaDecodeAttend(a, unembed_out, t, out, out_bf16, wrote_bf16, Sk, smem, pl, base, stream,
                         pos_at);
}

}  // namespace

namespace {

// Sparse MLA prefill in the absorbed form (MlaSparsePrefillKernel). The reference computes a
// prompt's MLA in the expanded form (K and V per head from every cached latent row, dense
// attention with the top-k as a mask): at a 16k prompt that is 64 heads x 16k x 8k x 512
// multiply-adds a layer of which 7/8 are masked, and a chunked prefill re-expands every
// cached row for each chunk. A row whose keys are a top-k set instead runs as the
// reference's decode step would run it (absorbed: q_lat = round(q_nope @ W_UK_h^T), attention
// over the shared latent rows, out = round(round(o_lat) @ W_UV_h^T)): its work no longer
// grows with the context. The two forms round different intermediates (q_lat instead of the
// expanded keys and values), a difference of the size of one bf16 rounding of a score that
// the whole-model parity bounds (docs/correctness.md); RING_MLA_SPARSE_PREFILL=0 keeps the
// expanded form. A row with at most K causal keys has all of them selected (the indexer masks
// the others to -inf), so it walks [0, offset + i] directly, as the reference's dense decode.
//
// One block a query row and 64 heads (blockIdx.y: heads past 64), 4 x kMlaPfParts warps: warp w
// takes the 16 heads of row tile w % 4 and part w / 4 of the latent dims, for the scores (its
// part's dims; part 0 also the rope dims, rounded as the reference's pe_scores) and for the
// values (its part's output dims: 256 / kMlaPfParts fp32 accumulators a thread). (Where a
// block may not have the 174 KB of shared memory this takes, as on sm_120 / sm_121 with
// ~99 KB, MlaPfNarrow: 32 heads a block, 2 row tiles, key tiles of 16, 79 KB.) Keys come in
// tiles of 32 from a bf16 copy of the cache (KvToBf16Kernel), gathered through the row's
// top-k indices by cp.async, the next tile's copies in flight while this one is used, the
// indices loaded a tile ahead. The warps of a row tile swap their partial scores through
// shared memory (a named barrier over those warps); each sums them in part order, so all run
// the same online softmax on the same bits, and accumulates O += P V with P split into bf16
// halves as in AttentionMmaKernel. q_lat and
// the scaled, rounded rope queries sit in shared memory as bf16 and are read by ldmatrix
// (held in registers they would not leave room for the accumulators).
// Heads a block (16 a row tile) and keys a tile; kTotal of MlaPfLayout gives its shared memory.
template <int kHeadsT, int kKeysT>
struct MlaPfShape {
  static constexpr int kHeads = kHeadsT;
  static constexpr int kKeys = kKeysT;
  static constexpr int kRowTiles = kHeads / 16;
  static constexpr int kRowTileBits = kRowTiles == 4 ? 2 : 1;
  static_assert(kRowTiles == 4 || kRowTiles == 2);
};
using MlaPfWide = MlaPfShape<64, 32>;
using MlaPfNarrow = MlaPfShape<32, 16>;
// The latent split over a row tile's warps. 4 (16 warps, 64 accumulators a thread) measured
// slower than 2 at a 16k prompt on the H200 (379 vs 345 ms a slice prefill, session 32): each
// warp then sums four partials and the softmax runs four times instead of twice.
constexpr int kMlaPfParts = 2;

struct MlaPrefillParams {
  const float* qlat = nullptr;    // [T, H, kvl], rounded
  const float* q = nullptr;       // [T, H, qd]: the rope part at + nope
  int64_t qd = 0, nope = 0;
  const uint16_t* lat = nullptr;  // [S, kvl] bf16
  const uint16_t* pe = nullptr;   // [S, rope] bf16
  const int32_t* topk = nullptr;  // [T, K]
  int64_t T = 0, K = 0, offset = 0, H = 0;
  float scale = 1.f;
  uint16_t* out = nullptr;        // [T, H, kvl]: bf16 bits of the rounded o_lat
};

template <int KVL, int RD, class Sh>
struct MlaPfLayout {
  static constexpr int kParts = kMlaPfParts;
  static constexpr int kThreads = Sh::kRowTiles * kParts * 32;
  static constexpr int kRow = KVL + RD + 8;  // a Q or key row, bf16 (+8: ldmatrix rows on distinct banks)
  static constexpr int kSwap = 16 * Sh::kKeys;  // one warp's fragment of 16 x kKeys scores, fp32
  // Byte offsets: Q [kHeads][kRow], two key tiles [kKeys][kRow], per row tile the swapped
  // scores (one per part of the latent, then the rounded rope) and per stage the keys'
  // additive masks (0 or -inf).
  static constexpr size_t kQ = 0;
  static constexpr size_t kTiles = kQ + sizeof(uint16_t) * Sh::kHeads * kRow;
  static constexpr size_t kSwapAt = kTiles + sizeof(uint16_t) * 2 * Sh::kKeys * kRow;
  static constexpr size_t kMask = kSwapAt + sizeof(float) * Sh::kRowTiles * (kParts + 1) * kSwap;
  static constexpr size_t kTotal = kMask + sizeof(float) * 2 * Sh::kKeys;
  static_assert(kTiles % 16 == 0 && kSwapAt % 16 == 0 && (kRow * 2) % 16 == 0);
};

// Barrier `id` (1..15; 0 is __syncthreads') over the `threads` threads of the warps that use it.
__device__ __forceinline__ void NamedBarrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// c[nt] += A B over kSteps k16 steps for kNt n8 tiles of keys, two steps a load of A: A by
// ldmatrix at `qa` (this lane's row address in the warp's 16 query rows), B from key rows
// kStride apart at `kr` (this lane's row lr and column 8 lq of the first key).
template <int kSteps, int kNt, int kStride>
__device__ __forceinline__ void MlaPfScores(float (&c)[kNt][4], const uint16_t* qa, const uint16_t* kr) {
  static_assert(kSteps % 2 == 0);
#pragma unroll
  for (int kk = 0; kk < kSteps; kk += 2) {
    uint32_t a0[4], a1[4];
    LdMatrixX4<false>(a0, qa + kk * 16);
    LdMatrixX4<false>(a1, qa + kk * 16 + 16);
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) {
      uint32_t b[4];
      LdMatrixX4<false>(b, kr + nt * 8 * kStride + kk * 16);
      internal::MmaBf16(c[nt], a0[0], a0[1], a0[2], a0[3], b[0], b[1]);
      internal::MmaBf16(c[nt], a1[0], a1[1], a1[2], a1[3], b[2], b[3]);
    }
  }
}

template <int KVL, int RD, class Sh>
__global__ void __launch_bounds__(MlaPfLayout<KVL, RD, Sh>::kThreads, 1)
    MlaSparsePrefillKernel(MlaPrefillParams p) {
  using L = MlaPfLayout<KVL, RD, Sh>;
  constexpr int kParts = kMlaPfParts;
  constexpr int kThreads = L::kThreads;
  constexpr int kKeys = Sh::kKeys;
  constexpr int kHeads = Sh::kHeads;
  constexpr int kSlice = KVL / kParts;      // a warp's latent dims
  constexpr int kKs = kSlice / 16;          // its k16 steps of the scores
  constexpr int kDt = kSlice / 8;           // its n8 tiles of the output
  constexpr int kNt = kKeys / 8;            // n8 tiles of scores a key tile
  constexpr int kCopyT = kThreads / kKeys;  // threads a key row
  static_assert(kThreads % kKeys == 0 && RD == 8 * kCopyT && KVL % (8 * kCopyT) == 0 &&
                kKs % 2 == 0 && (RD / 16) % 2 == 0);
  extern __shared__ __align__(16) unsigned char mpm[];
  uint16_t* qs = reinterpret_cast<uint16_t*>(mpm + L::kQ);
  uint16_t* tiles = reinterpret_cast<uint16_t*>(mpm + L::kTiles);
  float* swap = reinterpret_cast<float*>(mpm + L::kSwapAt);
  float* kmask = reinterpret_cast<float*>(mpm + L::kMask);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int lq = lane >> 3, lr = lane & 7;
  // Shifts, not / and %: on signed ints those cost the registers that made this kernel spill.
  const int ht = warp & (Sh::kRowTiles - 1), part = warp >> Sh::kRowTileBits, d0 = part * kSlice;
  // The last rows first: they have the most keys (a dense row's count grows with i).
  const int64_t i = p.T - 1 - static_cast<int64_t>(blockIdx.x);
  const int64_t h0 = static_cast<int64_t>(blockIdx.y) * kHeads;
  const int64_t visible = p.offset + i + 1;
  const bool dense = visible <= p.K;
  const int64_t nk = dense ? visible : p.K;
  const int32_t* sel = p.topk + i * p.K;
  const int cr = tid / kCopyT, cc = 8 * (tid % kCopyT);
  PdlBegin();
  // Key of entry e of the row's list, -1 past the list or outside the causal range.
  auto key_of = [&](int64_t e) -> int64_t {
    if (e >= nk) return -1;
    const int64_t j = dense ? e : static_cast<int64_t>(LoadProduced(sel + e));
    return j >= 0 && j < visible ? j : -1;
  };
  // Thread (cr, cc) copies row cr's 16-byte pieces at cc + 8 kCopyT k of the latent and at
  // cc of the rope key.
  auto issue = [&](int64_t j, int st) {
    const bool ok = j >= 0;
    const int64_t row = ok ? j : 0;
    uint16_t* dst = tiles + (st * kKeys + cr) * L::kRow + cc;
    const uint16_t* ls = p.lat + row * KVL + cc;
#pragma unroll
    for (int k = 0; k < KVL / (8 * kCopyT); ++k) CpAsync16(dst + 8 * kCopyT * k, ls + 8 * kCopyT * k, ok);
    CpAsync16(dst + KVL, p.pe + row * RD + cc, ok);
    CpAsyncCommit();
    if (cc == 0) kmask[st * kKeys + cr] = ok ? 0.f : -INFINITY;
  };
  issue(key_of(cr), 0);
  int64_t jnext = key_of(kKeys + cr);
  // Q: the 64 heads' q_lat and scaled, rounded rope queries as bf16 rows (heads past H zero),
  // eight loads in flight a thread before they are packed.
  {
    constexpr int kQ4 = kHeads * KVL / 4;  // float4s of q_lat
    constexpr int kBatch = 8;
    static_assert(kQ4 % (kThreads * kBatch) == 0);
    const float* qrow = p.qlat + (i * p.H + h0) * KVL;
    for (int b = 0; b < kQ4; b += kThreads * kBatch) {
      float4 v[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int e = b + tid + k * kThreads, hh = e / (KVL / 4), c = 4 * (e % (KVL / 4));
        v[k] = h0 + hh < p.H ? LoadProduced(reinterpret_cast<const float4*>(qrow + hh * KVL + c))
                             : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int e = b + tid + k * kThreads, hh = e / (KVL / 4), c = 4 * (e % (KVL / 4));
        *reinterpret_cast<uint2*>(qs + hh * L::kRow + c) =
            make_uint2(PackBf16x2(v[k].x, v[k].y), PackBf16x2(v[k].z, v[k].w));
      }
    }
    constexpr int kP4 = kHeads * RD / 4;
    static_assert(kP4 % (kThreads) == 0);
    float4 v[kP4 / (kThreads)];
#pragma unroll
    for (int k = 0; k < kP4 / (kThreads); ++k) {
      const int e = tid + k * kThreads, hh = e / (RD / 4), c = 4 * (e % (RD / 4));
      v[k] = h0 + hh < p.H ? LoadProduced(reinterpret_cast<const float4*>(
                                 p.q + (i * p.H + h0 + hh) * p.qd + p.nope + c))
                           : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    auto sq = [&](float x) { return qdec::RoundToBf16(x * p.scale); };
#pragma unroll
    for (int k = 0; k < kP4 / (kThreads); ++k) {
      const int e = tid + k * kThreads, hh = e / (RD / 4), c = 4 * (e % (RD / 4));
      *reinterpret_cast<uint2*>(qs + hh * L::kRow + KVL + c) =
          make_uint2(PackBf16x2(sq(v[k].x), sq(v[k].y)), PackBf16x2(sq(v[k].z), sq(v[k].w)));
    }
  }
  float o[kDt][4];
#pragma unroll
  for (int dt = 0; dt < kDt; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  // ldmatrix addresses: A (q rows of the warp's tile), B (key rows, lane row lr, column 8 lq).
  const uint16_t* qa = qs + (ht * 16 + 8 * (lq & 1) + lr) * L::kRow + 8 * (lq >> 1);
  float* sw = swap + ht * (kParts + 1) * L::kSwap;
  const int ntiles = static_cast<int>((nk + kKeys - 1) / kKeys);
  for (int tile = 0; tile < ntiles; ++tile) {
    const int st = tile & 1;
    CpAsyncWaitAll();
    __syncthreads();  // this tile has landed everywhere; the other stage's readers are done
    if (tile + 1 < ntiles) {
      issue(jnext, st ^ 1);
      jnext = key_of(static_cast<int64_t>(tile + 2) * kKeys + cr);
    }
    const uint16_t* ts = tiles + st * kKeys * L::kRow;
    float sc[kNt][4], pe[kNt][4];
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[nt][e] = pe[nt][e] = 0.f;
    }
    // Partial latent scores over the warp's part; part 0 also the rope scores.
    const uint16_t* kr = ts + lr * L::kRow + 8 * lq;
    MlaPfScores<kKs, kNt, L::kRow>(sc, qa + d0, kr + d0);
    if (part == 0) {  // rounded as pe_scores
      MlaPfScores<RD / 16, kNt, L::kRow>(pe, qa + KVL, kr + KVL);
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          pe[nt][e] = qdec::RoundToBf16(pe[nt][e]);
          sw[kParts * L::kSwap + (nt * 4 + e) * 32 + lane] = pe[nt][e];
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) sw[part * L::kSwap + (nt * 4 + e) * 32 + lane] = sc[nt][e];
    }
    NamedBarrier(1 + ht, kParts * 32);  // every part's partials are in
    // Scores (element e: head row g + 8 (e >> 1), key nt * 8 + 2t + (e & 1)) and their maxima.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) {
      const float2 km = *reinterpret_cast<const float2*>(kmask + st * kKeys + nt * 8 + 2 * t);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int x = (nt * 4 + e) * 32 + lane;
        const float rp = part == 0 ? pe[nt][e] : sw[kParts * L::kSwap + x];
        // The parts in part order (a warp's own partial is the bits it wrote).
        float dot = part == 0 ? sc[nt][e] : sw[x];
#pragma unroll
        for (int q = 1; q < kParts; ++q) dot += q == part ? sc[nt][e] : sw[q * L::kSwap + x];
        const float s = dot * p.scale + rp + ((e & 1) ? km.y : km.x);
        sc[nt][e] = s;
        mx[e >> 1] = fmaxf(mx[e >> 1], s);
      }
    }
    OnlineSoftmaxTile(sc, mx, m, l, o);
    // O += P V over the warp's output dims.
    AccumulatePV<L::kRow>(o, sc, ts + d0, lq, lr);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t h = h0 + ht * 16 + g + 8 * r;
    if (h >= p.H) continue;
    const float inv = 1.f / l[r];
    uint16_t* orow = p.out + (i * p.H + h) * KVL + d0 + 2 * t;
#pragma unroll
    for (int dt = 0; dt < kDt; ++dt) {
      *reinterpret_cast<uint32_t*>(orow + dt * 8) = PackBf16x2(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
    }
  }
}

// RING_MLA_SPARSE_PREFILL=0 keeps sparse prefill rows in the expanded form (A/B runs).
bool MlaSparsePrefillEnabled() {
  static const bool on = EnvSwitchOn("RING_MLA_SPARSE_PREFILL");
  return on;
}

// Whether MlaSparsePrefill takes a: a prefill chunk (T > 1) with top-k rows, bf16
// activations, GLM-5's and DeepSeek-V3's latent and rope widths, 16-byte aligned caches.
bool MlaSparsePrefillTakes(const cpu::MlaAttentionArgs& a, cpu::ActDType t, const DeviceInfo& dev) {
  return a.T > 1 && a.topk != nullptr && t == cpu::ActDType::kBF16 && a.kvl == 512 && a.rope == 64 &&
         a.nope % 4 == 0 && reinterpret_cast<uintptr_t>(a.q) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(a.latent) % 16 == 0 && reinterpret_cast<uintptr_t>(a.k_pe) % 16 == 0 &&
         a.T <= 0x7fffffff && (a.H + MlaPfNarrow::kHeads - 1) / MlaPfNarrow::kHeads <= 65535 &&
         MlaSparsePrefillHeadsPerBlock(dev) > 0;
}

template <int KVL, int RD, class Sh>
absl::Status LaunchMlaSparsePrefill(const MlaPrefillParams& p, cudaStream_t stream) {
  using L = MlaPfLayout<KVL, RD, Sh>;
  constexpr auto kKernel = MlaSparsePrefillKernel<KVL, RD, Sh>;
  RING_CUDA_RETURN_IF_ERROR(AllowDynamicSmem(kKernel, L::kTotal));
  RING_LAUNCH_PDL(kKernel,
                  dim3(static_cast<unsigned>(p.T), static_cast<unsigned>((p.H + Sh::kHeads - 1) / Sh::kHeads)),
                  L::kThreads, L::kTotal, stream, p);
  return absl::OkStatus();
}

// q_lat for every row by one GEMM over the heads, the kernel above, the unembedding by one
// GEMM on its bf16 output.
absl::Status MlaSparsePrefill(const cpu::MlaAttentionArgs& a, const DeviceQuantWeight& embed_q,
                              const DeviceQuantWeight& unembed_out, float* out, const DeviceInfo& dev,
                              cudaStream_t stream) {
  constexpr int KVL = 512, RD = 64;
  const int64_t T = a.T, H = a.H, S = a.S, qd = a.nope + a.rope;
  const int64_t lat_n = S * KVL, pe_n = S * RD, olat_n = T * H * KVL;
  // One scratch block: q_lat (fp32), then the bf16 latent and rope keys and o_lat.
  RING_ASSIGN_OR_RETURN(StreamBuffer scratch,
                        StreamBuffer::Allocate(olat_n * sizeof(float) + (lat_n + pe_n + olat_n) * sizeof(uint16_t),
                                               stream));
  float* qlat = scratch.as<float>();
  uint16_t* lat_b = reinterpret_cast<uint16_t*>(qlat + olat_n);
  uint16_t* pe_b = lat_b + lat_n;
  uint16_t* olat_b = pe_b + pe_n;
  RING_RETURN_IF_ERROR(LaunchKvToBf16(a.latent, KVL, 0, S, 1, KVL, lat_b, stream));
  RING_RETURN_IF_ERROR(LaunchKvToBf16(a.k_pe, RD, 0, S, 1, RD, pe_b, stream));
  QMatmulArgs qa;
  qa.x = a.q;  // q_nope of (row r, head h) at (r * H + h) * qd
  qa.m = T;
  qa.ldx = H * qd;
  qa.x_problem_stride = qd;
  qa.y = qlat;
  qa.ldy = H * KVL;
  qa.y_problem_stride = KVL;
  qa.problems = H;
  RING_RETURN_IF_ERROR(LinearT(embed_q, qa, cpu::ActDType::kBF16, stream));
  MlaPrefillParams p;
  p.qlat = qlat;
  p.q = a.q;
  p.qd = qd;
  p.nope = a.nope;
  p.lat = lat_b;
  p.pe = pe_b;
  p.topk = a.topk;
  p.T = T;
  p.K = a.K;
  p.offset = a.offset;
  p.H = H;
  p.scale = a.scale;
  p.out = olat_b;
  if (MlaSparsePrefillHeadsPerBlock(dev) == MlaPfWide::kHeads) {
    RING_RETURN_IF_ERROR((LaunchMlaSparsePrefill<KVL, RD, MlaPfWide>(p, stream)));
  } else {
    RING_RETURN_IF_ERROR((LaunchMlaSparsePrefill<KVL, RD, MlaPfNarrow>(p, stream)));
  }
  QMatmulArgs oa;
  oa.x = olat_b;
  oa.x_dtype = DType::kBF16;
  oa.m = T;
  oa.ldx = H * KVL;
  oa.x_problem_stride = KVL;
  oa.y = out;
  oa.ldy = H * a.vd;
  oa.y_problem_stride = a.vd;
  oa.problems = H;
  return LinearT(unembed_out, oa, cpu::ActDType::kBF16, stream);
}

// MlaAttention but for out_bf16: *wrote_bf16 tells whether the decode path wrote it.
// Whether a decode row (T == 1) runs on the split decode kernels (MlaDecode).
bool MlaDecodeTakes(const cpu::MlaAttentionArgs& a, const DeviceInfo& dev) {
  const bool aligned = reinterpret_cast<uintptr_t>(a.latent) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(a.k_pe) % 16 == 0;
  const size_t smem = MlaDecodeSmem(static_cast<int>(a.kvl), static_cast<int>(a.rope));
  return a.T == 1 && a.kvl % 32 == 0 && a.kvl <= kMlaMaxKvl && a.rope % 4 == 0 && a.rope > 0 &&
         a.rope <= kMlaMaxRope && (a.nope + a.rope) % 8 == 0 && aligned &&
         static_cast<int64_t>(smem) <= dev.smem_per_block_optin;
}

// The sizes MlaAttention's arguments must agree on (T > 0).
absl::Status CheckMlaArgs(const cpu::MlaAttentionArgs& a, const DeviceQuantWeight& embed_q,
                          const DeviceQuantWeight& unembed_out) {
  const int64_t K = a.topk != nullptr ? a.K : 0;
  if (a.S != a.offset + a.T || (a.topk != nullptr && (K <= 0 || K > a.S))) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "mla attention: S %d, offset %d, T %d, K %d inconsistent", a.S, a.offset, a.T, K));
  }
  if (embed_q.batch != a.H || embed_q.rows != a.kvl || embed_q.cols != a.nope ||
      unembed_out.batch != a.H || unembed_out.rows != a.vd || unembed_out.cols != a.kvl) {
    return absl::InvalidArgumentError("mla attention: embed_q / unembed_out shapes do not match");
  }
  return absl::OkStatus();
}

absl::Status MlaAttentionOut(const cpu::MlaAttentionArgs& a, const DeviceQuantWeight& embed_q,
                             const DeviceQuantWeight& unembed_out, cpu::ActDType t, float* out,
                             uint16_t* out_bf16, bool* wrote_bf16, cudaStream_t stream,
                             const int32_t* pos_at, void* scratch) {
  const int64_t T = a.T, H = a.H, nope = a.nope, rope = a.rope, vd = a.vd, kvl = a.kvl;
  const int64_t qd = nope + rope;
  const bool sparse = a.topk != nullptr;
  const int64_t K = sparse ? a.K : 0;
  if (T <= 0) return absl::OkStatus();
  RING_RETURN_IF_ERROR(CheckMlaArgs(a, embed_q, unembed_out));
  const bool gather = sparse && T == 1;
  const int64_t Sk = gather ? K : a.S;
  if (T == 1) {
    absl::StatusOr<const DeviceInfo*> dev = CurrentDevice();
    if (!dev.ok()) return dev.status();
    if (MlaDecodeTakes(a, **dev)) {
      const size_t smem = MlaDecodeSmem(static_cast<int>(kvl), static_cast<int>(rope));
      return MlaDecode(a, embed_q, unembed_out, t, out, t == cpu::ActDType::kBF16 ? out_bf16 : nullptr,
                       wrote_bf16, Sk, smem, **dev, stream, pos_at, scratch);
    }
  }
  if (pos_at != nullptr) {
    return absl::InvalidArgumentError(
        "mla attention: a key count on the device needs the decode kernels (one query row)");
  }
  if (T > 1 && sparse) {
    absl::StatusOr<const DeviceInfo*> dev = CurrentDevice();
    if (!dev.ok()) return dev.status();
    if (MlaSparsePrefillTakes(a, t, **dev)) return MlaSparsePrefill(a, embed_q, unembed_out, out, **dev, stream);
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
  // The rope scores as an additive mask [H, T, Sk] (where the attention does not compute them
  // itself).
  auto make_pe_scores = [&]() -> absl::Status {
    RING_ASSIGN_OR_RETURN(pe_scores, StreamBuffer::Allocate(H * T * Sk * sizeof(float), stream));
    const int64_t pe_row_blocks = (H * T + kPeRows - 1) / kPeRows;
    if (pe_row_blocks > 65535 || (Sk + kPeKeys - 1) / kPeKeys > 0x7fffffff) {
      return absl::InvalidArgumentError("mla attention: too many query rows or keys");
    }
    const size_t pe_smem = PeScoresSmem(rope);
    RING_CUDA_RETURN_IF_ERROR(AllowDynamicSmem(PeScoresKernel, pe_smem));
    PeScoresKernel<<<dim3(static_cast<unsigned>((Sk + kPeKeys - 1) / kPeKeys),
                          static_cast<unsigned>(pe_row_blocks)),
                     256, pe_smem, stream>>>(
        a.q, H * qd, qd, nope, a.scale, pe, rope, T, H, Sk,
        allowed.data() != nullptr ? allowed.as<uint8_t>() : nullptr, T > 1 ? a.offset : -1, t,
        pe_scores.as<float>());
    RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  };
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
    // The rope scores past each row's causal limit are masked; saying so lets the kernels
    // skip those keys (half of a fresh prompt's) instead of weighing them at 0.
    p.causal_offset = a.offset;
    p.out = out;
    // The tensor-core kernel computes the rope scores itself (no [H, T, Sk] mask in memory).
    p.q_pe = a.q + nope;
    p.q_pe_tok = H * qd;
    p.q_pe_head = qd;
    p.k_pe = pe;
    p.rope = rope;
    p.allowed = allowed.data() != nullptr ? allowed.as<uint8_t>() : nullptr;
    if (AttentionTakesPe(p, t)) return Attention(p, t, stream);
    p.q_pe = nullptr;
    p.k_pe = nullptr;
    p.rope = 0;
    p.allowed = nullptr;
    RING_RETURN_IF_ERROR(make_pe_scores());
    p.add_mask = pe_scores.as<float>();
    return Attention(p, t, stream);
  }
  // Absorbed form: q_lat = round(q_nope @ W_UK_h^T) [H, kvl]; attention over the latent
  // (K = V, one KV head); out = round(out_lat @ W_UV_h^T) [H, vd].
  RING_RETURN_IF_ERROR(make_pe_scores());
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

}  // namespace

bool MlaAttentionTakesDevicePos(const cpu::MlaAttentionArgs& a) {
  absl::StatusOr<const DeviceInfo*> dev = CurrentDevice();
  return dev.ok() && MlaDecodeTakes(a, **dev);
}

int64_t MlaAttentionScratchBytes(const cpu::MlaAttentionArgs& a, cpu::ActDType t) {
  absl::StatusOr<const DeviceInfo*> dev = CurrentDevice();
  if (a.T != 1 || !dev.ok() || !MlaDecodeTakes(a, **dev)) return 0;
  const int64_t Sk = a.topk != nullptr ? a.K : a.S;  // MlaAttentionOut's key count
  absl::StatusOr<MlaDecodePlan> pl = PlanMlaDecode(a, t, Sk, **dev);
  return pl.ok() ? pl->bytes : 0;
}

MlaDecodeForm ChooseMlaDecodeForm(const DeviceInfo& dev) {
  if (dev.cc < 80 || !AttentionMmaEnabled()) return MlaDecodeForm::kSimt;
  return static_cast<int64_t>(MlaMmaLayout<512, 64>::kTotal) <= dev.smem_per_block_optin
             ? MlaDecodeForm::kTensorCore
             : MlaDecodeForm::kSimt;
}

int MlaSparsePrefillHeadsPerBlock(const DeviceInfo& dev) {
  if (dev.cc < 80 || !AttentionMmaEnabled() || !MlaSparsePrefillEnabled()) return 0;
  if (static_cast<int64_t>(MlaPfLayout<512, 64, MlaPfWide>::kTotal) <= dev.smem_per_block_optin) {
    return MlaPfWide::kHeads;
  }
  if (static_cast<int64_t>(MlaPfLayout<512, 64, MlaPfNarrow>::kTotal) <= dev.smem_per_block_optin) {
    return MlaPfNarrow::kHeads;
  }
  return 0;
}

MlaPrefillForm ChooseMlaPrefillForm(const DeviceInfo& dev, int64_t nope, int64_t vd) {
  constexpr int64_t kRope = 64;
  if (dev.cc < 80 || !AttentionMmaEnabled() || (nope != 128 && nope != 192) || vd % 64 != 0 ||
      vd > 256) {
    return {};
  }
  const MmaForm f = MmaFormFor(nope, vd, kRope, dev);
  return {f.dvc, f.keys};
}

std::string MlaKernelForms(const DeviceInfo& dev) {
  std::string decode;
  switch (ChooseMlaDecodeForm(dev)) {
    case MlaDecodeForm::kTensorCore:
      decode = absl::StrFormat("tensor cores (%d B a block)", MlaMmaLayout<512, 64>::kTotal);
      break;
    case MlaDecodeForm::kSimt:
      decode = "portable SIMT";
      break;
  }
  const int heads = MlaSparsePrefillHeadsPerBlock(dev);
  const std::string prefill =
      heads == 0 ? std::string("expanded form")
                 : absl::StrFormat("absorbed rows, %d heads a block (%d B)", heads,
                                   heads == MlaPfWide::kHeads ? MlaPfLayout<512, 64, MlaPfWide>::kTotal
                                                              : MlaPfLayout<512, 64, MlaPfNarrow>::kTotal);
  const MlaPrefillForm f = ChooseMlaPrefillForm(dev, 192, 256);
  const std::string dense =
      f.value_slice == 0
          ? std::string("rope scores as an additive mask")
          : absl::StrFormat("rope in the kernel, %d-dim value slices, %d-key tiles (%d B)", f.value_slice,
                            f.key_tile, MmaSmemBytes(192, f.value_slice, 64, f.key_tile));
  return absl::StrFormat("MLA (bf16, kv_lora 512): decode %s; sparse prefill %s; dense prefill (nope 192, v 256) %s",
                         decode, prefill, dense);
}

bool MlaAttentionAbsorbsRows(const cpu::MlaAttentionArgs& a, cpu::ActDType round) {
  absl::StatusOr<const DeviceInfo*> dev = CurrentDevice();
  return dev.ok() && MlaSparsePrefillTakes(a, round, **dev);
}

absl::Status MlaAttention(const cpu::MlaAttentionArgs& a, const DeviceQuantWeight& embed_q,
                          const DeviceQuantWeight& unembed_out, cpu::ActDType t, float* out,
                          cudaStream_t stream, uint16_t* out_bf16, const int32_t* pos_at,
                          void* scratch) {
  bool wrote = false;
  RING_RETURN_IF_ERROR(
      MlaAttentionOut(a, embed_q, unembed_out, t, out, out_bf16, &wrote, stream, pos_at, scratch));
  if (out_bf16 != nullptr && !wrote && a.T > 0) {
    RING_RETURN_IF_ERROR(ToBf16(out, a.T * a.H * a.vd, out_bf16, stream));
  }
  return absl::OkStatus();
}


bool IndexedMlaDecodeApplies(const cpu::MlaAttentionArgs& a) {
  absl::StatusOr<const DeviceInfo*> dev = CurrentDevice();
  return a.T == 1 && a.topk != nullptr && dev.ok() && MlaDecodeTakes(a, **dev);
}

absl::Status IndexedMlaDecode(const cpu::IndexerArgs& ix, int32_t* topk, void* ix_scratch,
                              const cpu::MlaAttentionArgs& a, const DeviceQuantWeight& embed_q,
                              const DeviceQuantWeight& unembed_out, cpu::ActDType t, float* out,
                              cudaStream_t stream, uint16_t* out_bf16, const int32_t* pos_at,
                              void* scratch, const SideStream& side) {
  if (!IndexedMlaDecodeApplies(a) || a.topk != topk || topk == nullptr || scratch == nullptr ||
      ix_scratch == nullptr || side.stream == nullptr || ix.T != 1 || ix.S != a.S || ix.K != a.K) {
    return absl::InvalidArgumentError(
        "indexed mla decode: needs one sparse decode row on the split decode kernels, the "
        "indexer's row and key bound with MLA's, MLA reading the indexer's top-k, both "
        "scratch blocks and a side stream");
  }
  RING_RETURN_IF_ERROR(CheckMlaArgs(a, embed_q, unembed_out));
  RING_ASSIGN_OR_RETURN(const DeviceInfo* dev, CurrentDevice());
  RING_ASSIGN_OR_RETURN(const MlaDecodePlan pl, PlanMlaDecode(a, t, a.K, *dev));
  char* const base = static_cast<char*>(scratch);
  // The side branch forks once the indexer's scores are queued, beside its top-k (~10 us on
  // the H200, longer than the branch): forked before them, the runtime may start the query
  // GEMV's 64-problem grid first in a graph replay (it orders a graph's branches itself), and
  // the scores then started late (session 37 traces). On the indexer's error nothing forks.
  RING_RETURN_IF_ERROR(IndexerTopK(ix, t, topk, stream, pos_at, ix_scratch, side.fork));
  RING_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side.stream, side.fork, 0));
  const absl::Status query_st = [&]() -> absl::Status {
    RING_RETURN_IF_ERROR(SideStreamTestDelay(side.stream));
    return MlaDecodeQuery(a, embed_q, t, pl, base, side.stream);
  }();
  // Joined whatever happened, so that a capture is never left forked.
  RING_CUDA_RETURN_IF_ERROR(cudaEventRecord(side.join, side.stream));
  RING_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, side.join, 0));
  RING_RETURN_IF_ERROR(query_st);
  bool wrote = false;
  const bool bf16 = t == cpu::ActDType::kBF16;
  RING_RETURN_IF_ERROR(MlaDecodeAttend(a, unembed_out, t, out, bf16 ? out_bf16 : nullptr, &wrote, a.K,
                                       MlaDecodeSmem(static_cast<int>(a.kvl), static_cast<int>(a.rope)),
                                       pl, base, stream, pos_at));
  if (out_bf16 != nullptr && !wrote) RING_RETURN_IF_ERROR(ToBf16(out, a.H * a.vd, out_bf16, stream));
  return absl::OkStatus();
}

}  // namespace ring::cuda
