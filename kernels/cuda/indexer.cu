// Kernels behind indexer.cuh.
//
// IndexerScoresKernel (prefill rows; decode where IndexerScoresDecodeKernel's shared memory
// does not fit): block = kScoreWarps warps for one query row r and a range of 64 keys
// (8 in decode); the row's queries [heads, dim] sit in shared memory. A warp owns one key at
// a time: per head a lane-split dot product and butterfly sum, then lane 0 applies the
// reference's rounding (round, relu, round(* w_h)) and accumulates over heads in head order
// (T > 1: each partial sum rounded; T == 1: fp32 then one rounding), masking future keys to
// -inf for T > 1. IndexerScoresDecodeKernel: see there.
//
// TopKRowsKernel: see indexer.cuh.
#include "kernels/cuda/indexer.cuh"

#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_format.h"
#include "kernels/cuda/act_round.cuh"
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/qgemv_internal.cuh"
#include "kernels/cuda/quant_decode.cuh"
#include "kernels/cuda/warp_scan.cuh"
#include "kernels/status.h"

namespace ring::cuda {
namespace {

using internal::DigitPick;
using internal::OrderKey;
using internal::PickDigitFromTop;
using internal::WarpHistogramAdd;
using internal::WarpInclusiveSum;

constexpr int kScoreWarps = 8;
constexpr int kKeysPerBlock = 64;
// Decode (one query row): fewer keys per block, so that the grid fills the GPU.
constexpr int kKeysPerBlockDecode = 8;
constexpr int kTopKThreads = 512;
// Key elements per lane held in registers by IndexerScoresKernel (index dims up to 256).
constexpr int kKeyRegs = 8;

__global__ void __launch_bounds__(kScoreWarps * 32)
    IndexerScoresKernel(cpu::IndexerArgs a, cpu::ActDType rt, int keys_per_block, float* scores) {
  PdlBegin();
  extern __shared__ float qs[];  // [heads, dim]
  const int64_t r = blockIdx.y;
  const int64_t hd = a.heads * a.dim;
  // The row's queries: independent loads, several in flight per thread (a decode block's
  // whole time was this fill done one dependent load at a time).
  constexpr int kBatch = 8;
  for (int64_t i0 = threadIdx.x; i0 < hd; i0 += kBatch * blockDim.x) {
    float v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t i = i0 + static_cast<int64_t>(u) * blockDim.x;
      v[u] = i < hd ? a.q[r * hd + i] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t i = i0 + static_cast<int64_t>(u) * blockDim.x;
      if (i < hd) qs[i] = v[u];
    }
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * keys_per_block;
  const int64_t j1 = min(a.S, j0 + keys_per_block);
  const bool kreg = a.dim <= 32 * kKeyRegs;
  for (int64_t j = j0 + warp; j < j1; j += kScoreWarps) {
    const float* kj = a.keys + j * a.dim;
    // The key's elements lane, lane + 32, ... in registers once, not re-read per head.
    float kv[kKeyRegs];
#pragma unroll
    for (int c = 0; c < kKeyRegs; ++c) {
      const int64_t d = lane + 32 * c;
      kv[c] = kreg && d < a.dim ? kj[d] : 0.f;
    }
    float tot = 0.f;
    for (int64_t h = 0; h < a.heads; ++h) {
      const float* qh = qs + h * a.dim;
      float dot = 0.f;
      if (kreg) {
#pragma unroll
        for (int c = 0; c < kKeyRegs; ++c) {
          if (lane + 32 * c < a.dim) dot = fmaf(qh[lane + 32 * c], kv[c], dot);
        }
      } else {
        for (int64_t d = lane; d < a.dim; d += 32) dot = fmaf(qh[d], kj[d], dot);
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
      dot = fmaxf(DevRoundAct(dot, rt), 0.f);
      const float sc = DevRoundAct(dot * a.w[r * a.heads + h], rt);
      if (a.T > 1) {
        tot = h == 0 ? sc : DevRoundAct(tot + sc, rt);
      } else {
        tot = h == 0 ? sc : tot + sc;
      }
    }
    if (lane == 0) {
      if (a.T == 1) {
        tot = DevRoundAct(tot, rt);
      } else if (j > a.offset + r) {
        tot = -INFINITY;
      }
      scores[r * a.S + j] = tot;
    }
  }
}

// IndexerScoresDecodeKernel: the decode row (T = 1) with a lane per key: block b takes keys
// [32 b, 32 b + 32) and all heads. The query [heads, dim] and the block's 32 key rows (padded
// by one float, so that lane j's reads of row j fall on distinct banks) sit in shared memory;
// warp w computes the dots of heads w, w + W, ... for its lane's key, two heads at a time as
// independent chains, each sequential in d like the reference; each term is rounded as in
// IndexerScoresKernel and kept in shared memory, and warp 0 sums a key's terms in head order
// (fp32, one rounding). The warp-per-key kernel spent its time in one dependent chain per
// key of 32 heads x (dot, butterfly, rounding): 12.9 us for GLM-5.2's 32 x 128 over 2064
// keys on the H200.
constexpr int kDecodeKeys = 32;
constexpr int kDecodeWarps = 16;
__host__ __device__ inline size_t IndexerDecodeSmem(int64_t heads, int64_t dim) {
  return sizeof(float) * (heads * dim + kDecodeKeys * (dim + 1) + heads * (kDecodeKeys + 1));
}

__global__ void __launch_bounds__(kDecodeWarps * 32)
    IndexerScoresDecodeKernel(cpu::IndexerArgs a, cpu::ActDType rt, const int32_t* pos_at,
                              float* scores) {
  PdlBegin();
  // With the position on the device, a.S is the grid's bound and the row has *pos_at + 1 keys.
  if (pos_at != nullptr) a.S = LoadProduced(pos_at) + 1;
  extern __shared__ __align__(16) float dsm[];
  const int heads = static_cast<int>(a.heads), dim = static_cast<int>(a.dim);
  const int ks = dim + 1;
  float* qs = dsm;                              // [heads][dim]
  float* kr = qs + heads * dim;                 // [32][dim + 1]
  float* terms = kr + kDecodeKeys * ks;         // [heads][33]
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kDecodeKeys;
  if (j0 >= a.S) return;
  const int nk = static_cast<int>(min(static_cast<int64_t>(kDecodeKeys), a.S - j0));
  constexpr int kThreads = kDecodeWarps * 32;
  // Query and key rows, 16 bytes a load (dim % 4 == 0, rows 16-byte aligned), a thread's
  // loads in batches of 4, all issued before their stores.
  constexpr int kBatch = 4;
  const int d4 = dim / 4, nq4 = heads * d4, n4 = nq4 + nk * d4;
  const float4* q4 = reinterpret_cast<const float4*>(a.q);
  const float4* k4 = reinterpret_cast<const float4*>(a.keys + j0 * dim);
  for (int i0 = tid; i0 < n4; i0 += kBatch * kThreads) {
    float4 v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = i0 + u * kThreads;
      v[u] = i < nq4 ? q4[i] : i < n4 ? k4[i - nq4] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = i0 + u * kThreads;
      if (i < nq4) {
        reinterpret_cast<float4*>(qs)[i] = v[u];
      } else if (i < n4) {
        const int e = i - nq4, r = e / d4, c = 4 * (e - r * d4);
        float* dst = kr + r * ks + c;
        dst[0] = v[u].x;
        dst[1] = v[u].y;
        dst[2] = v[u].z;
        dst[3] = v[u].w;
      }
    }
  }
  __syncthreads();
  // Warp w: heads w, w + W, ... two at a time (two independent chains; the queries read 4
  // dims at a time, their rows 16-byte aligned as dim % 4 == 0).
  const float* key = kr + lane * ks;
  for (int h0 = warp; h0 < heads; h0 += 2 * kDecodeWarps) {
    const int h1 = h0 + kDecodeWarps;
    const float4* qa = reinterpret_cast<const float4*>(qs + h0 * dim);
    const float4* qb = reinterpret_cast<const float4*>(qs + min(h1, heads - 1) * dim);
    float da = 0.f, db = 0.f;
    for (int c = 0; c < d4; ++c) {
      const float4 a4 = qa[c], b4 = qb[c];
      const float k0 = key[4 * c], k1 = key[4 * c + 1], k2 = key[4 * c + 2], k3 = key[4 * c + 3];
      da = fmaf(a4.x, k0, da);
      db = fmaf(b4.x, k0, db);
      da = fmaf(a4.y, k1, da);
      db = fmaf(b4.y, k1, db);
      da = fmaf(a4.z, k2, da);
      db = fmaf(b4.z, k2, db);
      da = fmaf(a4.w, k3, da);
      db = fmaf(b4.w, k3, db);
    }
    const float ra = fmaxf(DevRoundAct(da, rt), 0.f);
    terms[h0 * (kDecodeKeys + 1) + lane] = DevRoundAct(ra * a.w[h0], rt);
    if (h1 < heads) {
      const float rb = fmaxf(DevRoundAct(db, rt), 0.f);
      terms[h1 * (kDecodeKeys + 1) + lane] = DevRoundAct(rb * a.w[h1], rt);
    }
  }
  __syncthreads();
  if (warp == 0 && lane < nk) {
    float tot = terms[lane];
    for (int h = 1; h < heads; ++h) tot += terms[h * (kDecodeKeys + 1) + lane];
    scores[j0 + lane] = DevRoundAct(tot, rt);
  }
}

// IndexerScoresMmaKernel: the scores with bf16 activations on the tensor cores, for prefill
// rows and for the decode row (blockIdx.y splits the key tiles, tiles_per_block each: every
// decode tile, and prefill rows when they are few; the decode row's key count may come from
// the device, as IndexerScoresDecodeKernel's). q and the keys hold bf16 values then, so their bf16 copies are exact and so is every
// product of the mma; only a dot's fp32 summation order differs from the reference's (as it
// does in IndexerScoresKernel). A block takes kIdxRows (query row, head) pairs in q's memory
// order, i.e. kIdxRows / heads whole query rows, and walks the keys in tiles of kIdxKeys up to
// its last row's causal limit. Warp w holds the pairs [16 w, 16 w + 16) as mma A fragments for
// the whole walk (read once from q and converted); a tile's fp32 key rows are loaded into
// registers while the previous tile is used, then stored as bf16 into shared memory, where
// the B fragments come from by ldmatrix. Each dot gets the reference's roundings in
// registers (round, relu, round(* w_h)) and lands, bf16-exact, in a [kIdxRows][kIdxKeys]
// tile, from which thread (query row, key) sums its heads in head order (T > 1: each partial
// sum rounded; T = 1: an fp32 sum rounded once). Keys past a block's causal limit are
// written -inf without being read. The fp32 kernel above ran the ~2.2 TFLOP of a GLM-5.2
// layer's 16k-token prompt on the CUDA cores: 0.87 s a layer on the H200, this one 8 ms.
constexpr int kIdxRows = 128;  // (query row, head) pairs a block: 8 warps x 16
constexpr int kIdxKeys = 64;   // keys a tile
constexpr int kIdxDim = 128;   // index head dim (GLM-5, DeepSeek-V3.2)
constexpr int kIdxWarps = kIdxRows / 16;
constexpr int kIdxKst = kIdxDim + 8;   // bf16 key row stride: ldmatrix rows on distinct banks
constexpr int kIdxSst = kIdxKeys + 8;  // bf16 score row stride
constexpr size_t kIdxSmem = sizeof(uint16_t) * (kIdxKeys * kIdxKst + kIdxRows * kIdxSst);
constexpr int kIdxLoads = kIdxKeys * kIdxDim / 4 / (kIdxWarps * 32);  // float4 a thread a tile

__global__ void __launch_bounds__(kIdxWarps * 32, 2)
    IndexerScoresMmaKernel(cpu::IndexerArgs a, const int32_t* pos_at, int tiles_per_block,
                           float* scores) {
  PdlBegin();
  // With the position on the device (one row): a.S is the grid's bound, the row has
  // *pos_at + 1 keys.
  if (pos_at != nullptr) {
    a.S = LoadProduced(pos_at) + 1;
    a.offset = a.S - 1;
  }
  extern __shared__ __align__(16) uint16_t ism[];
  uint16_t* kt = ism;                        // [kIdxKeys][kIdxKst]
  uint16_t* st = ism + kIdxKeys * kIdxKst;   // [kIdxRows][kIdxSst]
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int heads = static_cast<int>(a.heads);
  const int R = kIdxRows / heads;  // query rows a block
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * R;
  const int64_t pairs = a.T * a.heads;
  const int64_t p0 = r0 * heads;  // the block's first (row, head) pair
  const int64_t r_last = min(a.T - 1, r0 + R - 1);
  const int64_t j_end = min(a.S, a.offset + r_last + 1);  // keys any of the rows sees
  const int tiles = static_cast<int>((j_end + kIdxKeys - 1) / kIdxKeys);
  const int t_begin = static_cast<int>(blockIdx.y) * tiles_per_block;
  const int t_end = min(tiles, t_begin + tiles_per_block);
  if (t_begin >= tiles) return;  // a decode block past the row's keys
  // Warps whose 16 pairs are all past the last one (a decode row's 32 heads fill 2 of 8)
  // only stage keys.
  const bool live = 16 * warp < pairs - p0;
  // A fragments of pairs pa = p0 + 16 warp + g and pb = pa + 8 (zero past the last pair).
  const int64_t pa = p0 + 16 * warp + g, pb = pa + 8;
  uint32_t af[kIdxDim / 16][4];
  {
    const float* qa = a.q + pa * kIdxDim + 2 * t4;
    const float* qb = a.q + pb * kIdxDim + 2 * t4;
#pragma unroll
    for (int ks = 0; ks < kIdxDim / 16; ++ks) {
      const float2 z = make_float2(0.f, 0.f);
      const float2 x0 = pa < pairs ? *reinterpret_cast<const float2*>(qa + 16 * ks) : z;
      const float2 x1 = pb < pairs ? *reinterpret_cast<const float2*>(qb + 16 * ks) : z;
      const float2 x2 = pa < pairs ? *reinterpret_cast<const float2*>(qa + 16 * ks + 8) : z;
      const float2 x3 = pb < pairs ? *reinterpret_cast<const float2*>(qb + 16 * ks + 8) : z;
      af[ks][0] = qdec::PackBf16x2(x0.x, x0.y);
      af[ks][1] = qdec::PackBf16x2(x1.x, x1.y);
      af[ks][2] = qdec::PackBf16x2(x2.x, x2.y);
      af[ks][3] = qdec::PackBf16x2(x3.x, x3.y);
    }
  }
  const float wa = pa < pairs ? a.w[pa] : 0.f, wb = pb < pairs ? a.w[pb] : 0.f;
  constexpr cpu::ActDType kRt = cpu::ActDType::kBF16;
  float4 kr[kIdxLoads];
  auto load_tile = [&](int tile) {
#pragma unroll
    for (int u = 0; u < kIdxLoads; ++u) {
      const int f = tid + u * kIdxWarps * 32, key = f / (kIdxDim / 4), c4 = f % (kIdxDim / 4);
      const int64_t j = static_cast<int64_t>(tile) * kIdxKeys + key;
      kr[u] = j < a.S ? reinterpret_cast<const float4*>(a.keys + j * kIdxDim)[c4]
                      : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  load_tile(t_begin);
  for (int tile = t_begin; tile < t_end; ++tile) {
    // The key tile was last read before the previous barrier; the score tile is rewritten
    // only after the next one, once every thread has summed its previous contents.
#pragma unroll
    for (int u = 0; u < kIdxLoads; ++u) {
      const int f = tid + u * kIdxWarps * 32, key = f / (kIdxDim / 4), c4 = f % (kIdxDim / 4);
      *reinterpret_cast<uint2*>(kt + key * kIdxKst + 4 * c4) =
          make_uint2(qdec::PackBf16x2(kr[u].x, kr[u].y), qdec::PackBf16x2(kr[u].z, kr[u].w));
    }
    __syncthreads();
    if (tile + 1 < t_end) load_tile(tile + 1);
    // Per n8 tile of keys: the dots (c0, c1: pair pa, keys 2 t4 and 2 t4 + 1 of the tile; c2,
    // c3: pair pb), then their roundings into the score tile.
    uint16_t* sa = st + (16 * warp + g) * kIdxSst + 2 * t4;
    uint16_t* sb = sa + 8 * kIdxSst;
#pragma unroll
    for (int nt = 0; nt < (live ? kIdxKeys / 8 : 0); ++nt) {
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
      const uint16_t* rows = kt + (nt * 8 + (lane & 7)) * kIdxKst + 8 * (lane >> 3);
#pragma unroll
      for (int ks = 0; ks < kIdxDim / 16; ks += 2) {
        uint32_t b[4];
        internal::LdMatrixX4<false>(b, rows + ks * 16);
        internal::MmaBf16(acc, af[ks][0], af[ks][1], af[ks][2], af[ks][3], b[0], b[1]);
        internal::MmaBf16(acc, af[ks + 1][0], af[ks + 1][1], af[ks + 1][2], af[ks + 1][3], b[2],
                          b[3]);
      }
      float v[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float d = fmaxf(DevRoundAct(acc[i], kRt), 0.f);
        v[i] = DevRoundAct(d * (i < 2 ? wa : wb), kRt);
      }
      *reinterpret_cast<uint32_t*>(sa + nt * 8) = qdec::PackBf16x2(v[0], v[1]);
      *reinterpret_cast<uint32_t*>(sb + nt * 8) = qdec::PackBf16x2(v[2], v[3]);
    }
    __syncthreads();
    const int64_t j0 = static_cast<int64_t>(tile) * kIdxKeys;
    for (int o = tid; o < R * kIdxKeys; o += kIdxWarps * 32) {
      const int r = o / kIdxKeys, n = o % kIdxKeys;
      const int64_t row = r0 + r, j = j0 + n;
      if (row >= a.T || j >= a.S) continue;
      float tot = -INFINITY;
      if (j <= a.offset + row) {
        const uint16_t* col = st + r * heads * kIdxSst + n;
        tot = qdec::Bf16ToF32(col[0]);
        if (a.T > 1) {
          for (int h = 1; h < heads; ++h) tot = DevRoundAct(tot + qdec::Bf16ToF32(col[h * kIdxSst]), kRt);
        } else {
          for (int h = 1; h < heads; ++h) tot += qdec::Bf16ToF32(col[h * kIdxSst]);
          tot = DevRoundAct(tot, kRt);
        }
      }
      scores[row * a.S + j] = tot;
    }
  }
  // Keys past the causal limit of every row of the block, by the block with the last tile.
  if (t_end < tiles || a.T == 1) return;
  for (int r = 0; r < R && r0 + r < a.T; ++r) {
    float* srow = scores + (r0 + r) * a.S;
    for (int64_t j = static_cast<int64_t>(tiles) * kIdxKeys + tid; j < a.S; j += kIdxWarps * 32) {
      srow[j] = -INFINITY;
    }
  }
}

bool IndexerMmaEnabled() {
  static const bool on = EnvSwitchOn("RING_CUDA_INDEXER_MMA");
  return on;
}

// Where IndexerScoresMmaKernel computes the scores of a prefill call.
bool IndexerTakesMma(const cpu::IndexerArgs& a, cpu::ActDType round, const DeviceInfo& dev) {
  return IndexerMmaEnabled() && round == cpu::ActDType::kBF16 && a.dim == kIdxDim &&
         a.heads >= 16 && a.heads % 16 == 0 && kIdxRows % a.heads == 0 && dev.cc >= 80 &&
         reinterpret_cast<uintptr_t>(a.q) % 16 == 0 && reinterpret_cast<uintptr_t>(a.keys) % 16 == 0 &&
         static_cast<int64_t>(kIdxSmem) <= dev.smem_per_block_optin &&
         (a.T * a.heads + kIdxRows - 1) / kIdxRows <= 0x7fffffff &&
         (a.S + kIdxKeys - 1) / kIdxKeys <= 65535;
}

// Exclusive block scan of a pair of ints per thread (component-wise). Two barriers.
__device__ int2 BlockExclusiveScan2(int2 v, int2* sh /* [32] */) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int2 x = make_int2(WarpInclusiveSum(v.x), WarpInclusiveSum(v.y));
  if (lane == 31) sh[warp] = x;
  __syncthreads();
  int2 before = make_int2(0, 0);
  for (int w = 0; w < warp; ++w) {
    before.x += sh[w].x;
    before.y += sh[w].y;
  }
  __syncthreads();  // sh may be reused
  return make_int2(before.x + x.x - v.x, before.y + x.y - v.y);
}

// A pass whose byte every key shares (same_bits: the bits equal in the keys' OR and AND)
// needs no histogram: the prefix takes that byte, and the caller skips the pass.
__device__ __forceinline__ bool TakeSharedDigit(uint32_t same_bits, uint32_t all_and, int shift,
                                                uint32_t& prefix, uint32_t& mask) {
  if (((same_bits >> shift) & 255u) != 255u) return false;
  prefix |= all_and & (255u << shift);
  mask |= 255u << shift;
  return true;
}

// A radix-select pass's digit (TopKRowsKernel, TopKRowsClusterKernel), after a barrier that
// completes `bins` (the pass's histogram of the keys matching `prefix`): warp 0 finds the
// digit where the count from the top reaches `need` and publishes the longer prefix and the
// rank left inside it, while the other warps clear `next` (the other pass's histogram); then
// every thread takes the new prefix, need and mask. One more barrier.
__device__ __forceinline__ void PickPassDigit(const unsigned* bins, unsigned* next, int shift,
                                              uint32_t* s_prefix, int64_t* s_need,
                                              uint32_t& prefix, uint32_t& mask, int64_t& need) {
  if ((threadIdx.x >> 5) == 0) {
    DigitPick d;
    if (PickDigitFromTop(bins, need, &d)) {
      *s_prefix = prefix | (static_cast<uint32_t>(d.digit) << shift);
      *s_need = d.rank;
    }
  } else {
    for (int i = static_cast<int>(threadIdx.x) - 32; i < 256; i += blockDim.x - 32) next[i] = 0;
  }
  __syncthreads();
  prefix = *s_prefix;
  need = *s_need;
  mask |= 255u << shift;
}

// The compaction's two halves over a thread's keys [j0, j1) (key_at(j)), with `prefix` the
// k-th largest key: the (larger, equal) counts; then, given the (larger, equal) keys before
// j0 over the whole row, each larger key and the first `need` equal ones written at their
// places in index order (element j is index base + j).
template <class KeyAt>
__device__ __forceinline__ int2 CountAgainst(KeyAt key_at, int j0, int j1, uint32_t prefix) {
  int2 cnt = make_int2(0, 0);
  for (int j = j0; j < j1; ++j) {
    const uint32_t key = key_at(j);
    cnt.x += key > prefix;
    cnt.y += key == prefix;
  }
  return cnt;
}
template <class KeyAt>
__device__ __forceinline__ void PlaceSelected(KeyAt key_at, int j0, int j1, uint32_t prefix,
                                              int64_t need, int64_t gt, int64_t eq, int base,
                                              int32_t* o) {
  for (int j = j0; j < j1; ++j) {
    const uint32_t key = key_at(j);
    if (key > prefix) {
      o[gt + min(eq, need)] = base + j;
      ++gt;
    } else if (key == prefix) {
      if (eq < need) o[gt + eq] = base + j;
      ++eq;
    }
  }
}

// TopKRowsKernel (indexer.cuh): one block per row. Keys of a row up to `cap` long are kept
// in dynamic shared memory across the passes and the compaction (decode rows: the cached
// context); longer rows re-read global memory. A pass costs two barriers: the histogram
// (into one of two buffers), then warp 0 finds the digit while the other warps clear the
// other buffer. The compaction gives thread t the keys [t * per, (t + 1) * per): one scan of
// its (larger, equal) counts places them, element j landing at (larger keys before j) +
// min(equal keys before j, need).
__global__ void __launch_bounds__(kTopKThreads)
    TopKRowsKernel(const float* scores, int64_t n, int64_t k, int64_t cap, const int32_t* pos_at,
                   int32_t* out) {
  PdlBegin();
  // With the position on the device (one row): n is the bound, the row has *pos_at + 1 keys.
  if (pos_at != nullptr) n = LoadProduced(pos_at) + 1;
  __shared__ unsigned hist[2][256];
  __shared__ uint32_t s_prefix, s_or, s_and;
  __shared__ int64_t s_need;
  __shared__ int2 scan_sh[32];
  extern __shared__ uint32_t cache[];
  const int tid = threadIdx.x, lane = tid & 31;
  const float* x = scores + static_cast<int64_t>(blockIdx.x) * n;
  int32_t* o = out + static_cast<int64_t>(blockIdx.x) * k;
  const bool cached = n <= cap;
  // Bits that are equal in every key (AND == OR there): a pass whose byte is one of those
  // has a single digit and needs no histogram (bf16 scores: the last two passes).
  for (int i = tid; i < 512; i += blockDim.x) (&hist[0][0])[i] = 0;
  if (tid == 0) {
    s_or = 0u;
    s_and = ~0u;
  }
  __syncthreads();
  if (cached) {
    uint32_t kor = 0u, kand = ~0u;
#pragma unroll 4
    for (int j = tid; j < static_cast<int>(n); j += blockDim.x) {
      const uint32_t key = OrderKey(x[j]);
      cache[j] = key;
      kor |= key;
      kand &= key;
    }
    kor = __reduce_or_sync(0xffffffffu, kor);
    kand = __reduce_and_sync(0xffffffffu, kand);
    if (lane == 0) {
      atomicOr(&s_or, kor);
      atomicAnd(&s_and, kand);
    }
    __syncthreads();
  }
  const uint32_t same_bits = cached ? ~(s_or ^ s_and) : 0u;
  const uint32_t all_and = s_and;
  auto key_at = [&](int j) { return cached ? cache[j] : OrderKey(x[j]); };
  uint32_t prefix = 0, mask = 0;
  int64_t need = k;  // how many of the elements matching `prefix` still to take
  int cur = 0;
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    if (TakeSharedDigit(same_bits, all_and, shift, prefix, mask)) continue;
    // Whole warps walk the row (lanes past n hold no key), so the match covers the warp.
    for (int b = tid - lane; b < static_cast<int>(n); b += blockDim.x) {
      const int j = b + lane;
      const uint32_t key = j < n ? key_at(j) : 0u;
      WarpHistogramAdd(hist[cur], (key >> shift) & 255u, j < n && (key & mask) == prefix);
    }
    __syncthreads();
    PickPassDigit(hist[cur], hist[cur ^ 1], shift, &s_prefix, &s_need, prefix, mask, need);
    cur ^= 1;
  }
  // prefix = key of the k-th largest value; take every larger key and the first `need`
  // (lowest-index) equal ones, in index order.
  // 32-bit arithmetic: n < 2^31 (TopKRows checks), and a 64-bit division costs ~100
  // instructions.
  const int n32 = static_cast<int>(n);
  const int per = (n32 + static_cast<int>(blockDim.x) - 1) / static_cast<int>(blockDim.x);
  const int j0 = min(n32, tid * per), j1 = min(n32, j0 + per);
  const int2 before = BlockExclusiveScan2(CountAgainst(key_at, j0, j1, prefix), scan_sh);
  PlaceSelected(key_at, j0, j1, prefix, need, before.x, before.y, 0, o);
}

// TopKRowsClusterKernel: TopKRowsKernel's selection for a row on a thread-block cluster of
// kTopKCluster blocks (sm_90+), for long decode rows: one block walked a 16k-key row in ~36 us
// on the H200, the histogram passes one SM's work. Block b keeps the contiguous slice b of
// the row in its shared memory; each pass histograms the slices, and every block sums the
// cluster's histograms in rank order (distributed shared memory) and picks the same digit.
// The skip of bytes every key shares uses the cluster's OR and AND. The compaction places a
// block's keys after the lower ranks' larger and equal counts, so the output is the same
// index-ordered set.
constexpr int kTopKCluster = 8;
// Rows at least this long (the launch's bound) take the cluster kernel.
constexpr int64_t kTopKClusterMinKeys = 4096;

__global__ void __launch_bounds__(kTopKThreads)
    TopKRowsClusterKernel(const float* scores, int64_t n, int64_t k, const int32_t* pos_at,
                          int32_t* out) {
  namespace cg = cooperative_groups;
  PdlBegin();
  if (pos_at != nullptr) n = LoadProduced(pos_at) + 1;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  // A compile-time count, so that the loops over the cluster's shared memory unroll and
  // their remote loads are in flight together (one after another they cost ~1 us a loop).
  constexpr int blocks = kTopKCluster;
  __shared__ unsigned hist[2][256];
  __shared__ unsigned tot[256];
  __shared__ uint32_t s_or, s_and, s_prefix;
  __shared__ int64_t s_need;
  __shared__ int2 s_cnt;  // this block's (larger, equal) counts, read by the higher ranks
  __shared__ int2 scan_sh[32];
  extern __shared__ uint32_t cache[];
  const int tid = threadIdx.x, lane = tid & 31;
  const int64_t row = blockIdx.x / blocks;
  const float* x = scores + row * n;
  int32_t* o = out + row * k;
  // 32-bit positions: n < 2^31 (TopKRows checks).
  const int n32 = static_cast<int>(n);
  const int per = (n32 + blocks - 1) / blocks;
  const int begin = min(n32, rank * per), end = min(n32, begin + per), len = end - begin;
  for (int i = tid; i < 512; i += blockDim.x) (&hist[0][0])[i] = 0;
  uint32_t kor = 0u, kand = ~0u;
#pragma unroll 4
  for (int j = tid; j < len; j += blockDim.x) {
    const uint32_t key = OrderKey(x[begin + j]);
    cache[j] = key;
    kor |= key;
    kand &= key;
  }
  if (tid == 0) {
    s_or = 0u;
    s_and = ~0u;
  }
  __syncthreads();
  kor = __reduce_or_sync(0xffffffffu, kor);
  kand = __reduce_and_sync(0xffffffffu, kand);
  if (lane == 0) {
    atomicOr(&s_or, kor);
    atomicAnd(&s_and, kand);
  }
  cluster.sync();  // every slice cached, every block's OR / AND and zeroed histograms ready
  uint32_t all_or = 0u, all_and = ~0u;
#pragma unroll
  for (int r = 0; r < blocks; ++r) {
    all_or |= *cluster.map_shared_rank(&s_or, r);
    all_and &= *cluster.map_shared_rank(&s_and, r);
  }
  const uint32_t same_bits = ~(all_or ^ all_and);
  uint32_t prefix = 0, mask = 0;
  int64_t need = k;
  int cur = 0;
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    if (TakeSharedDigit(same_bits, all_and, shift, prefix, mask)) continue;
    for (int b = tid - lane; b < len; b += blockDim.x) {
      const int j = b + lane;
      const uint32_t key = j < len ? cache[j] : 0u;
      WarpHistogramAdd(hist[cur], (key >> shift) & 255u, j < len && (key & mask) == prefix);
    }
    // Every slice's histogram is complete. This buffer is next cleared two passes on, after
    // the next pass's sync, which every block reaches only once its reads below are done.
    cluster.sync();
    for (int d = tid; d < 256; d += blockDim.x) {
      unsigned c = 0;
#pragma unroll
      for (int r = 0; r < blocks; ++r) c += cluster.map_shared_rank(hist[cur], r)[d];
      tot[d] = c;
    }
    __syncthreads();
    PickPassDigit(tot, hist[cur ^ 1], shift, &s_prefix, &s_need, prefix, mask, need);
    cur ^= 1;
  }
  // As TopKRowsKernel's compaction, after the lower ranks' counts.
  const int tper = (len + static_cast<int>(blockDim.x) - 1) / static_cast<int>(blockDim.x);
  const int j0 = min(len, tid * tper), j1 = min(len, j0 + tper);
  auto cached_key = [&](int j) { return cache[j]; };
  const int2 cnt = CountAgainst(cached_key, j0, j1, prefix);
  const int2 before = BlockExclusiveScan2(cnt, scan_sh);
  if (tid == static_cast<int>(blockDim.x) - 1) s_cnt = make_int2(before.x + cnt.x, before.y + cnt.y);
  cluster.sync();
  int64_t gt = before.x, eq = before.y;
#pragma unroll
  for (int r = 0; r < blocks; ++r) {
    if (r < rank) {
      const int2 c = *cluster.map_shared_rank(&s_cnt, r);
      gt += c.x;
      eq += c.y;
    }
  }
  PlaceSelected(cached_key, j0, j1, prefix, need, gt, eq, begin, o);
  cluster.sync();  // no block leaves while another may read its shared memory
}

bool TopKClusterEnabled() {
  static const bool on = EnvSwitchOn("RING_CUDA_TOPK_CLUSTER");
  return on;
}

}  // namespace

absl::Status TopKRows(const float* scores, int64_t rows, int64_t n, int64_t k, int32_t* out,
                      cudaStream_t stream, const int32_t* pos_at) {
  if (rows <= 0) return absl::OkStatus();
  if (scores == nullptr || out == nullptr) return absl::InvalidArgumentError("topk: null pointer");
  if (k <= 0 || k > n) {
    return absl::InvalidArgumentError(absl::StrFormat("topk: k = %d of n = %d", k, n));
  }
  if (rows > 0x7fffffff || n > 0x7fffffff) return absl::InvalidArgumentError("topk: too large");
  if (pos_at != nullptr && rows != 1) {
    return absl::InvalidArgumentError("topk: a length on the device takes one row");
  }
  // The row's keys in shared memory when they fit beside the kernel's static ~4 KB (n is the
  // bound when the length is on the device): the kernel caches rows up to smem / 4 keys.
  absl::StatusOr<const DeviceInfo*> dev = CurrentDevice();
  if (!dev.ok()) return dev.status();
  const int64_t cap = std::max<int64_t>(0, ((*dev)->smem_per_block_optin - 8 * 1024) / 4);
  // Long rows, few of them (decode): a cluster per row, each block caching a slice.
  const int64_t slice = (n + kTopKCluster - 1) / kTopKCluster;
  if (TopKClusterEnabled() && (*dev)->cc >= 90 && n >= kTopKClusterMinKeys && slice <= cap &&
      rows * kTopKCluster <= (*dev)->sm_count) {
    const size_t csmem = static_cast<size_t>(slice) * 4;
    RING_CUDA_RETURN_IF_ERROR(AllowDynamicSmem(TopKRowsClusterKernel, csmem));
    RING_CUDA_RETURN_IF_ERROR(LaunchPdlRaw(TopKRowsClusterKernel,
                                           dim3(static_cast<unsigned>(rows * kTopKCluster)),
                                           dim3(kTopKThreads), csmem, stream, kTopKCluster, scores,
                                           n, k, pos_at, out));
    return absl::OkStatus();
  }
  const size_t smem = n <= cap ? static_cast<size_t>(n) * 4 : 0;
  RING_CUDA_RETURN_IF_ERROR(AllowDynamicSmem(TopKRowsKernel, smem));
  RING_LAUNCH_PDL(TopKRowsKernel, static_cast<unsigned>(rows), kTopKThreads, smem, stream, scores,
                  n, k, static_cast<int64_t>(smem / 4), pos_at, out);
  return absl::OkStatus();
}

bool IndexerTakesDevicePos(const cpu::IndexerArgs& a) {
  absl::StatusOr<const DeviceInfo*> dev = CurrentDevice();
  const bool aligned = reinterpret_cast<uintptr_t>(a.q) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(a.keys) % 16 == 0;
  return dev.ok() && a.T == 1 && a.dim % 4 == 0 && aligned &&
         static_cast<int64_t>(IndexerDecodeSmem(a.heads, a.dim)) <= (*dev)->smem_per_block_optin &&
         a.S / kDecodeKeys < 0x7fffffff;
}

int64_t IndexerTopKScratchBytes(const cpu::IndexerArgs& a) {
  return a.T > 0 && a.S > 0 ? a.T * a.S * static_cast<int64_t>(sizeof(float)) : 0;
}

absl::Status IndexerTopK(const cpu::IndexerArgs& a, cpu::ActDType round, int32_t* topk,
                         cudaStream_t stream, const int32_t* pos_at, void* scratch,
                         cudaEvent_t scores_done) {
  if (a.T <= 0) return absl::OkStatus();
  if (a.q == nullptr || a.keys == nullptr || a.w == nullptr || topk == nullptr) {
    return absl::InvalidArgumentError("indexer: null pointer");
  }
  if (a.S != a.offset + a.T || a.K <= 0 || a.K > a.S || a.heads <= 0 || a.dim <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "indexer: T %d, S %d, offset %d, K %d, heads %d, dim %d inconsistent", a.T, a.S,
        a.offset, a.K, a.heads, a.dim));
  }
  if (a.T > 65535) return absl::InvalidArgumentError("indexer: more than 65535 query rows");
  if (pos_at != nullptr && !IndexerTakesDevicePos(a)) {
    return absl::InvalidArgumentError(
        "indexer: a length on the device takes one query row with dim % 4 == 0, 16-byte "
        "aligned queries and keys, and the decode kernel's shared memory");
  }
  const size_t smem = a.heads * a.dim * sizeof(float);
  RING_CUDA_RETURN_IF_ERROR(AllowDynamicSmem(IndexerScoresKernel, smem));
  StreamBuffer owned;
  if (scratch == nullptr) {
    RING_ASSIGN_OR_RETURN(owned, StreamBuffer::Allocate(IndexerTopKScratchBytes(a), stream));
    scratch = owned.data();
  }
  float* const scores = static_cast<float*>(scratch);
  // After the scores launch, before the selection's.
  const auto top_k = [&](const int32_t* count_at) -> absl::Status {
    if (scores_done != nullptr) RING_CUDA_RETURN_IF_ERROR(cudaEventRecord(scores_done, stream));
    return TopKRows(scores, a.T, a.S, a.K, topk, stream, count_at);
  };
  absl::StatusOr<const DeviceInfo*> dev = CurrentDevice();
  if (!dev.ok()) return dev.status();
  if (IndexerTakesMma(a, round, **dev)) {
    RING_CUDA_RETURN_IF_ERROR(AllowDynamicSmem(IndexerScoresMmaKernel, kIdxSmem));
    // Decode: a key tile a block (the grid sized for a.S, the bound when the count is on
    // the device). Prefill: a block walks the key tiles of its rows, split over blocks too
    // when the rows alone give fewer than two blocks an SM (a server's 512-row chunks of a
    // long prompt: 128 row blocks).
    const int64_t blocks = (a.T * a.heads + kIdxRows - 1) / kIdxRows;
    const int64_t key_tiles = (a.S + kIdxKeys - 1) / kIdxKeys;
    const int64_t want = 2 * static_cast<int64_t>(std::max((*dev)->sm_count, 1));
    const int64_t split =
        a.T == 1 ? key_tiles : std::min(key_tiles, blocks >= want ? 1 : (want + blocks - 1) / blocks);
    const int64_t per_block = (key_tiles + split - 1) / split;
    const int64_t ygrid = (key_tiles + per_block - 1) / per_block;
    RING_LAUNCH_PDL(IndexerScoresMmaKernel,
                    dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(ygrid)),
                    kIdxWarps * 32, kIdxSmem, stream, a, pos_at, static_cast<int>(per_block),
                    scores);
    return top_k(pos_at);
  }
  if (IndexerTakesDevicePos(a)) {
    const size_t dsmem = IndexerDecodeSmem(a.heads, a.dim);
    RING_CUDA_RETURN_IF_ERROR(AllowDynamicSmem(IndexerScoresDecodeKernel, dsmem));
    RING_LAUNCH_PDL(IndexerScoresDecodeKernel,
                    static_cast<unsigned>((a.S + kDecodeKeys - 1) / kDecodeKeys),
                    kDecodeWarps * 32, dsmem, stream, a, round, pos_at, scores);
    return top_k(pos_at);
  }
  const int kpb = a.T == 1 ? kKeysPerBlockDecode : kKeysPerBlock;
  const dim3 grid(static_cast<unsigned>((a.S + kpb - 1) / kpb), static_cast<unsigned>(a.T));
  RING_LAUNCH_PDL(IndexerScoresKernel, grid, kScoreWarps * 32, smem, stream, a, round, kpb,
                  scores);
  return top_k(nullptr);
}

}  // namespace ring::cuda
