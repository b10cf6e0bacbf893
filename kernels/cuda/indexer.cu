// Kernels behind indexer.cuh.
//
// IndexerScoresKernel: block = kScoreWarps warps for one query row r and a range of keys (64;
// 8 in decode, one per warp, so that one row's grid fills the GPU); the
// row's queries [heads, dim] sit in shared memory. A warp owns one key at a time: per head a
// lane-split dot product and butterfly sum, then lane 0 applies the reference's rounding
// (round, relu, round(* w_h)) and accumulates over heads in head order (T > 1: each partial
// sum rounded; T == 1: fp32 then one rounding), masking future keys to -inf for T > 1.
//
// TopKRowsKernel: see indexer.cuh.
#include "kernels/cuda/indexer.cuh"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/quant_decode.cuh"
#include "kernels/status.h"

namespace ring::cuda {
namespace {

constexpr int kScoreWarps = 8;
constexpr int kKeysPerBlock = 64;
// Decode (one query row): fewer keys per block, so that the grid fills the GPU.
constexpr int kKeysPerBlockDecode = 8;
constexpr int kTopKThreads = 512;
// Key elements per lane held in registers by IndexerScoresKernel (index dims up to 256).
constexpr int kKeyRegs = 8;

__device__ __forceinline__ float RoundActDev(float v, cpu::ActDType t) {
  switch (t) {
    case cpu::ActDType::kBF16: return qdec::RoundToBf16(v);
    case cpu::ActDType::kF16: return qdec::RoundToF16(v);
    default: return v;
  }
}

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
      dot = fmaxf(RoundActDev(dot, rt), 0.f);
      const float sc = RoundActDev(dot * a.w[r * a.heads + h], rt);
      if (a.T > 1) {
        tot = h == 0 ? sc : RoundActDev(tot + sc, rt);
      } else {
        tot = h == 0 ? sc : tot + sc;
      }
    }
    if (lane == 0) {
      if (a.T == 1) {
        tot = RoundActDev(tot, rt);
      } else if (j > a.offset + r) {
        tot = -INFINITY;
      }
      scores[r * a.S + j] = tot;
    }
  }
}

// Order-preserving image of a float: larger float, larger key; -0 maps with +0.
__device__ __forceinline__ uint32_t Key(float f) {
  if (f == 0.f) f = 0.f;
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exclusive block scan of one int per thread; returns the prefix, *total the block sum.
__device__ int BlockExclusiveScan(int v, int* total, int* sh /* [32] */) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  int x = v;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, off);
    if (lane >= off) x += y;
  }
  __syncthreads();
  if (lane == 31) sh[warp] = x;
  __syncthreads();
  int before = 0, sum = 0;
  for (int w = 0; w < nw; ++w) {
    if (w < warp) before += sh[w];
    sum += sh[w];
  }
  *total = sum;
  return before + x - v;
}

// Rows up to this long keep their keys in shared memory across the 4 histogram passes and
// the compaction (decode rows: the cached context); longer rows re-read global memory.
constexpr int kTopKCache = 8192;

__global__ void __launch_bounds__(kTopKThreads)
    TopKRowsKernel(const float* scores, int64_t n, int64_t k, int32_t* out) {
  PdlBegin();
  __shared__ unsigned hist[256];
  __shared__ uint32_t s_prefix;
  __shared__ int64_t s_need;
  __shared__ int scan_sh[32];
  __shared__ uint32_t cache[kTopKCache];
  const float* x = scores + static_cast<int64_t>(blockIdx.x) * n;
  int32_t* o = out + static_cast<int64_t>(blockIdx.x) * k;
  const bool cached = n <= kTopKCache;
  if (cached) {
#pragma unroll 4
    for (int j = threadIdx.x; j < n; j += blockDim.x) cache[j] = Key(x[j]);
  }
  auto key_at = [&](int64_t j) { return cached ? cache[j] : Key(x[j]); };
  uint32_t prefix = 0, mask = 0;
  int64_t need = k;  // how many of the elements matching `prefix` still to take
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
#pragma unroll 4
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const uint32_t key = key_at(j);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    // The digit: bins from 255 down, the one where the count of larger elements first
    // reaches `need` (a block scan; exactly one thread sees the crossing).
    const int c = threadIdx.x < 256 ? static_cast<int>(hist[255 - threadIdx.x]) : 0;
    int total;
    const int above = BlockExclusiveScan(c, &total, scan_sh);
    if (threadIdx.x < 256 && above < need && above + c >= need) {
      s_prefix = prefix | (static_cast<uint32_t>(255 - threadIdx.x) << shift);
      s_need = need - above;
    }
    __syncthreads();
    prefix = s_prefix;
    need = s_need;
    mask |= 255u << shift;
  }
  // prefix = key of the k-th largest value; take every larger key and the first `need`
  // (lowest-index) equal ones, in index order.
  int written = 0, ties = 0;
  for (int64_t base = 0; base < n; base += blockDim.x) {
    const int64_t j = base + threadIdx.x;
    const uint32_t key = j < n ? key_at(j) : 0u;
    const int eq = (j < n && key == prefix) ? 1 : 0;
    int eq_total;
    const int eq_before = BlockExclusiveScan(eq, &eq_total, scan_sh);
    const int take = (j < n && (key > prefix || (eq && ties + eq_before < need))) ? 1 : 0;
    int take_total;
    const int pos = BlockExclusiveScan(take, &take_total, scan_sh);
    if (take) o[written + pos] = static_cast<int32_t>(j);
    written += take_total;
    ties += eq_total;
    if (written >= k) break;  // uniform: every thread sees the same totals
  }
}

}  // namespace

absl::Status TopKRows(const float* scores, int64_t rows, int64_t n, int64_t k, int32_t* out,
                      cudaStream_t stream) {
  if (rows <= 0) return absl::OkStatus();
  if (scores == nullptr || out == nullptr) return absl::InvalidArgumentError("topk: null pointer");
  if (k <= 0 || k > n) {
    return absl::InvalidArgumentError(absl::StrFormat("topk: k = %d of n = %d", k, n));
  }
  if (rows > 0x7fffffff || n > 0x7fffffff) return absl::InvalidArgumentError("topk: too large");
  RING_LAUNCH_PDL(TopKRowsKernel, static_cast<unsigned>(rows), kTopKThreads, 0, stream, scores, n,
                  k, out);
  return absl::OkStatus();
}

absl::Status IndexerTopK(const cpu::IndexerArgs& a, cpu::ActDType round, int32_t* topk,
                         cudaStream_t stream) {
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
  const size_t smem = a.heads * a.dim * sizeof(float);
  if (smem > 48 * 1024) {
    RING_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(IndexerScoresKernel,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(smem)));
  }
  RING_ASSIGN_OR_RETURN(StreamBuffer scores,
                        StreamBuffer::Allocate(a.T * a.S * sizeof(float), stream));
  const int kpb = a.T == 1 ? kKeysPerBlockDecode : kKeysPerBlock;
  const dim3 grid(static_cast<unsigned>((a.S + kpb - 1) / kpb), static_cast<unsigned>(a.T));
  RING_LAUNCH_PDL(IndexerScoresKernel, grid, kScoreWarps * 32, smem, stream, a, round, kpb,
                  scores.as<float>());
  return TopKRows(scores.as<float>(), a.T, a.S, a.K, topk, stream);
}

}  // namespace ring::cuda
