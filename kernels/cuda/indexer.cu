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

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_format.h"
#include "kernels/cuda/act_round.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/launch.cuh"
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
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
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
    if (((same_bits >> shift) & 255u) == 255u) {
      // Every key (so every one matching the prefix) has this digit.
      prefix |= all_and & (255u << shift);
      mask |= 255u << shift;
      continue;
    }
    // Whole warps walk the row (lanes past n hold no key), so the match covers the warp.
    for (int b = tid - lane; b < static_cast<int>(n); b += blockDim.x) {
      const int j = b + lane;
      const uint32_t key = j < n ? key_at(j) : 0u;
      WarpHistogramAdd(hist[cur], (key >> shift) & 255u, j < n && (key & mask) == prefix);
    }
    __syncthreads();
    if (warp == 0) {
      DigitPick d;
      if (PickDigitFromTop(hist[cur], need, &d)) {
        s_prefix = prefix | (static_cast<uint32_t>(d.digit) << shift);
        s_need = d.rank;
      }
    } else {
      for (int i = tid - 32; i < 256; i += blockDim.x - 32) hist[cur ^ 1][i] = 0;
    }
    __syncthreads();
    prefix = s_prefix;
    need = s_need;
    mask |= 255u << shift;
    cur ^= 1;
  }
  // prefix = key of the k-th largest value; take every larger key and the first `need`
  // (lowest-index) equal ones, in index order.
  // 32-bit arithmetic: n < 2^31 (TopKRows checks), and a 64-bit division costs ~100
  // instructions.
  const int n32 = static_cast<int>(n);
  const int per = (n32 + static_cast<int>(blockDim.x) - 1) / static_cast<int>(blockDim.x);
  const int j0 = min(n32, tid * per), j1 = min(n32, j0 + per);
  int2 cnt = make_int2(0, 0);
  for (int j = j0; j < j1; ++j) {
    const uint32_t key = key_at(j);
    cnt.x += key > prefix;
    cnt.y += key == prefix;
  }
  const int2 before = BlockExclusiveScan2(cnt, scan_sh);
  int64_t gt = before.x, eq = before.y;
  for (int j = j0; j < j1; ++j) {
    const uint32_t key = key_at(j);
    if (key > prefix) {
      o[gt + min(eq, need)] = static_cast<int32_t>(j);
      ++gt;
    } else if (key == prefix) {
      if (eq < need) o[gt + eq] = static_cast<int32_t>(j);
      ++eq;
    }
  }
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
  const size_t smem = n <= cap ? static_cast<size_t>(n) * 4 : 0;
  if (smem > 48 * 1024) {
    RING_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
        TopKRowsKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
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

absl::Status IndexerTopK(const cpu::IndexerArgs& a, cpu::ActDType round, int32_t* topk,
                         cudaStream_t stream, const int32_t* pos_at) {
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
  if (smem > 48 * 1024) {
    RING_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(IndexerScoresKernel,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(smem)));
  }
  RING_ASSIGN_OR_RETURN(StreamBuffer scores,
                        StreamBuffer::Allocate(a.T * a.S * sizeof(float), stream));
  if (IndexerTakesDevicePos(a)) {
    const size_t dsmem = IndexerDecodeSmem(a.heads, a.dim);
    if (dsmem > 48 * 1024) {
      RING_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(IndexerScoresDecodeKernel,
                                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                     static_cast<int>(dsmem)));
    }
    RING_LAUNCH_PDL(IndexerScoresDecodeKernel,
                    static_cast<unsigned>((a.S + kDecodeKeys - 1) / kDecodeKeys),
                    kDecodeWarps * 32, dsmem, stream, a, round, pos_at, scores.as<float>());
    return TopKRows(scores.as<float>(), a.T, a.S, a.K, topk, stream, pos_at);
  }
  const int kpb = a.T == 1 ? kKeysPerBlockDecode : kKeysPerBlock;
  const dim3 grid(static_cast<unsigned>((a.S + kpb - 1) / kpb), static_cast<unsigned>(a.T));
  RING_LAUNCH_PDL(IndexerScoresKernel, grid, kScoreWarps * 32, smem, stream, a, round, kpb,
                  scores.as<float>());
  return TopKRows(scores.as<float>(), a.T, a.S, a.K, topk, stream);
}

}  // namespace ring::cuda
