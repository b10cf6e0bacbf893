// Kernels behind sampling.cuh.
//
// Every pass over a row runs on a thread-block cluster (kCluster blocks on as many SMs): a
// single SM streams a 600 KB row at a fraction of the chip's bandwidth, and a cluster's
// blocks can meet in each other's shared memory (cluster.sync between phases) where a grid
// would need a kernel boundary or a global-memory scratch per phase. Each block takes a
// contiguous slice of the row, so "lower id" across blocks is "lower block rank", and
// cross-block partials are combined in rank order, the same in every block.
//
// ArgMaxRows: one cluster per row; each thread keeps the max of a packed (order key, ~id)
// over its part of the block's slice, so the larger value wins and, among equal values, the
// lower id (cpu::ArgMax's `x[i] > x[best]` scan); NaN is below every number, and a NaN in
// column 0 is the answer, as that scan makes it.
//
// SampleRow, one row:
//   1. Penalize (only with counts): a copy of the row minus the penalties.
//   2. Stats: max and first argmax of the penalized row (the greedy answer), log-sum-exp of
//      the raw row (logprobs), sum of the weights w = exp((l - max) / T) (top-p's mass
//      without top-k).
//   3. SelectTop (truncation only): the candidates, i.e. the first min(K, 4096) ids in the
//      CPU's candidate order (logit descending, id ascending), without sorting the row: a
//      radix select over order-preserving 32-bit keys (4 passes of 8 bits; each block
//      histograms its slice in shared memory, every block sums the cluster's histograms)
//      finds the K-th key T; the ids with key >= T are compacted into block 0's shared
//      memory (ties at T in id order when they overflow the list: each block's ties go after
//      the lower ranks') and block 0 bitonic-sorts them by (key, id), in registers and warp
//      shuffles except for partners 128 or more positions apart.
//   4. Walk: over the candidates (or the whole row in id order when nothing truncates, as
//      the CPU draws then) each thread owns a contiguous chunk of positions; a block scan of
//      the chunk sums plus the lower blocks' totals gives every position's exclusive prefix,
//      so the top-p / min-p cut and the draw are each one pass over the chunks plus a
//      cluster minimum. When the cut falls beyond the candidate list it raises `fallback`;
//      the host then sorts the row in full (cub radix sort, stable, so ties stay in id
//      order) and walks that instead.
//   5. Finish (logprobs only): the chosen id's logprob and the top_logprobs, whose ids come
//      from step 3 run over the raw logits.
// Arithmetic mirrors cpu::SampleToken: penalties and `l - max` in float without FMA
// contraction, weights in double, the same comparisons; only summation order differs (see
// the tolerance note in sampling.cuh).
#include "kernels/cuda/sampling.cuh"

#include <cooperative_groups.h>

#include <algorithm>
#include <cstring>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <vector>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/warp_scan.cuh"
#include "kernels/status.h"

namespace ring::cuda {
namespace {

using internal::DigitPick;
using internal::OrderKey;
using internal::PickDigitFromTop;
using internal::WarpHistogramAdd;

namespace cg = cooperative_groups;

// Blocks per cluster: 8 is the size every cluster-capable GPU guarantees (portable).
constexpr int kCluster = 8;

// Launches `kernel` on `clusters` clusters of `blocks` blocks. A GPU whose SM groups cannot
// hold `blocks` such blocks at once rejects the launch; one block per cluster then gives the
// same answer (the kernels read the cluster's size), only slower.
template <typename... Params, typename... Args>
absl::Status LaunchClusters(void (*kernel)(Params...), int clusters, int blocks, int threads,
                            cudaStream_t stream, Args... args) {
  for (int b : {blocks, 1}) {
    const cudaError_t e = LaunchPdlRaw(kernel, dim3(static_cast<unsigned>(clusters) * b),
                                       dim3(threads), 0, stream, b, args...);
    if (e == cudaSuccess || b == 1) {
      RING_CUDA_RETURN_IF_ERROR(e);
      return absl::OkStatus();
    }
    (void)cudaGetLastError();  // clear the rejected launch before the single-block retry
  }
  return absl::OkStatus();
}

// [begin, end) of a row of n that block `rank` of `blocks` owns.
struct Slice {
  int64_t begin, end;
};
__device__ __forceinline__ Slice BlockSlice(int64_t n, int rank, int blocks) {
  const int64_t per = (n + blocks - 1) / blocks;
  const int64_t begin = min(n, rank * per);
  return {begin, min(n, begin + per)};
}

// OrderKey (warp_scan.cuh): -0 and +0 share a key because the CPU compares values (they tie
// and the lower id wins).

// (value, id) as one integer whose maximum is the CPU scan's winner: the larger value, then
// the lower id. NaN gets key 0, below -inf (key 0x007fffff): `x > best` never picks it.
__device__ __forceinline__ unsigned long long PackMax(float v, int64_t i) {
  const uint32_t key = isnan(v) ? 0u : OrderKey(v);
  return (static_cast<unsigned long long>(key) << 32) | (0xffffffffu - static_cast<uint32_t>(i));
}
__device__ __forceinline__ int32_t PackedId(unsigned long long p) {
  return static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(p));
}
__device__ __forceinline__ bool PackedIsNan(unsigned long long p) { return (p >> 32) == 0; }

struct MaxOp {
  template <typename T>
  __device__ __forceinline__ T operator()(const T& a, const T& b) const {
    return a < b ? b : a;
  }
};

// Writes `v` into this block's slot `*mine`, waits for the cluster, and returns the values
// of all blocks' slots combined in rank order with `op`. Callers keep the slot unchanged
// until the cluster syncs again (each block reads the others' slots).
template <typename T, typename Op>
__device__ T ClusterCombine(cg::cluster_group& cluster, T* mine, T v, Op op) {
  if (threadIdx.x == 0) *mine = v;
  cluster.sync();
  T acc = *cluster.map_shared_rank(mine, 0);
  for (unsigned r = 1; r < cluster.num_blocks(); ++r) acc = op(acc, *cluster.map_shared_rank(mine, r));
  return acc;
}

constexpr int kThreads = 512;

__global__ void __launch_bounds__(kThreads) ArgMaxKernel(const float* x, int64_t n, int32_t* out) {
  PdlBegin();
  using Reduce = cub::BlockReduce<unsigned long long, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ unsigned long long s_best;
  cg::cluster_group cluster = cg::this_cluster();
  const int blocks = static_cast<int>(cluster.num_blocks());
  const int64_t row = blockIdx.x / blocks;
  const float* xr = x + row * n;
  const Slice s = BlockSlice(n, static_cast<int>(cluster.block_rank()), blocks);
  unsigned long long best = 0;  // below every element, NaN included
  // The slice's 16-byte aligned middle in float4 loads (a logits row is ~600 KB: the scalar
  // loop's latency was most of the kernel), its ends one element a thread. A max of packed
  // keys does not depend on the order of the visits, so the result is the scalar scan's.
  int64_t mid = s.begin, mid_end = s.begin;
  if (reinterpret_cast<uintptr_t>(xr) % 16 == 0) {
    mid = min(s.end, (s.begin + 3) & ~int64_t{3});
    mid_end = max(mid, s.end & ~int64_t{3});
  }
  for (int64_t i = s.begin + threadIdx.x; i < mid; i += kThreads) best = max(best, PackMax(xr[i], i));
  for (int64_t i = mid_end + threadIdx.x; i < s.end; i += kThreads) best = max(best, PackMax(xr[i], i));
  const float4* x4 = reinterpret_cast<const float4*>(xr);
#pragma unroll 4
  for (int64_t j = mid / 4 + threadIdx.x; j < mid_end / 4; j += kThreads) {
    const float4 v = x4[j];
    const int64_t i = 4 * j;
    best = max(best, max(max(PackMax(v.x, i), PackMax(v.y, i + 1)),
                         max(PackMax(v.z, i + 2), PackMax(v.w, i + 3))));
  }
  best = Reduce(tmp).Reduce(best, MaxOp());
  best = ClusterCombine(cluster, &s_best, best, MaxOp());
  if (cluster.block_rank() == 0 && threadIdx.x == 0) out[row] = isnan(xr[0]) ? 0 : PackedId(best);
  cluster.sync();  // the other blocks' s_best outlives block 0's reads
}

// ---- SampleRow ----------------------------------------------------------------------------
constexpr int kBlock = 1024;
constexpr int kMaxTop = 20;
constexpr int kCands = kSampleCandidates;
static_assert((kCands & (kCands - 1)) == 0, "bitonic sort needs a power of two");
static_assert(kCands == 4 * kBlock, "the on-chip sort holds 4 candidates per thread");

struct RowStats {
  float max_adj;
  int32_t argmax_adj;
  double lse;    // log-sum-exp of the raw row
  double total;  // sum of the weights over the row
};

// What comes back to the host.
struct DeviceResult {
  int32_t id;
  int32_t fallback;  // the walk needs the fully sorted row
  float logprob;
  int32_t n_top;
  int32_t top_ids[kMaxTop];
  float top_logprobs[kMaxTop];
};

// cpu::SampleToken's weight: exp(double(l - m) * inv_t), the subtraction in float.
struct Weight {
  float m, inv_t;
  __device__ __forceinline__ double operator()(float l) const {
    return exp(static_cast<double>(__fsub_rn(l, m)) * static_cast<double>(inv_t));
  }
};

struct SumOp {
  __device__ __forceinline__ double operator()(double a, double b) const { return a + b; }
};

__global__ void PenalizeKernel(float* adj, const int2* counts, int n, float frequency,
                               float presence) {
  PdlBegin();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int2 c = counts[i];  // (token, occurrences), tokens distinct
  // adj -= frequency * n + presence, rounded as the CPU does (no FMA).
  adj[c.x] = __fsub_rn(adj[c.x], __fadd_rn(__fmul_rn(frequency, static_cast<float>(c.y)), presence));
}

__global__ void __launch_bounds__(kBlock)
    StatsKernel(const float* logits, const float* adj, int n, float inv_t, bool want_lse,
                bool want_total, RowStats* st, DeviceResult* res) {
  PdlBegin();
  using MaxReduce = cub::BlockReduce<unsigned long long, kBlock>;
  using RawReduce = cub::BlockReduce<float, kBlock>;
  using SumReduce = cub::BlockReduce<double, kBlock>;
  __shared__ union {
    typename MaxReduce::TempStorage max;
    typename RawReduce::TempStorage raw;
    typename SumReduce::TempStorage sum;
  } tmp;
  // One slot per exchange, so no exchange waits for the previous one's readers.
  __shared__ unsigned long long s_best;
  __shared__ float s_raw;
  __shared__ double s_e, s_w;
  cg::cluster_group cluster = cg::this_cluster();
  const Slice s = BlockSlice(n, static_cast<int>(cluster.block_rank()), static_cast<int>(cluster.num_blocks()));
  unsigned long long a = 0;
  float raw = -INFINITY;  // fmaxf skips NaN, as std::max from -inf does
  for (int64_t i = s.begin + threadIdx.x; i < s.end; i += kBlock) {
    a = max(a, PackMax(adj[i], i));
    raw = fmaxf(raw, logits[i]);
  }
  a = MaxReduce(tmp.max).Reduce(a, MaxOp());
  __syncthreads();
  raw = RawReduce(tmp.raw).Reduce(raw, MaxOp());
  a = ClusterCombine(cluster, &s_best, a, MaxOp());
  const float m_raw = ClusterCombine(cluster, &s_raw, raw, MaxOp());
  // The CPU's max skips NaN (std::max from -inf) while its argmax keeps a NaN in column 0.
  const float m_adj = PackedIsNan(a) ? -INFINITY : adj[PackedId(a)];
  const Weight w{m_adj, inv_t};
  // Double exps are the expensive part of a pass: only those asked for.
  double se = 0, sw = 0;
  if (want_lse) {
    for (int64_t i = s.begin + threadIdx.x; i < s.end; i += kBlock) se += exp(static_cast<double>(logits[i]) - m_raw);
  }
  if (want_total) {
    for (int64_t i = s.begin + threadIdx.x; i < s.end; i += kBlock) sw += w(adj[i]);
  }
  se = SumReduce(tmp.sum).Sum(se);
  __syncthreads();
  sw = SumReduce(tmp.sum).Sum(sw);
  se = ClusterCombine(cluster, &s_e, se, SumOp());
  sw = ClusterCombine(cluster, &s_w, sw, SumOp());
  if (cluster.block_rank() == 0 && threadIdx.x == 0) {
    st->max_adj = m_adj;
    st->argmax_adj = isnan(adj[0]) ? 0 : PackedId(a);
    st->lse = isfinite(m_raw) ? m_raw + log(se) : m_raw;
    st->total = sw;
    res->id = st->argmax_adj;
    res->fallback = 0;
    res->logprob = 0;
    res->n_top = 0;
  }
  cluster.sync();  // every block's slots outlive the others' reads
}

// Compare-exchange of positions i < p of a bitonic stage of span k: ascending where
// (i & k) == 0.
__device__ __forceinline__ void CompareSwap(unsigned long long& x, unsigned long long& y, bool ascending) {
  if ((x > y) == ascending) {
    const unsigned long long t = x;
    x = y;
    y = t;
  }
}

// Ascending bitonic sort of comp[0, size) by one block (size a power of two <= kCands;
// positions past it may hold anything and are sorted among themselves). Thread t holds
// positions 4t..4t+3 in registers: partners under 4 apart are in the same thread, under 128
// apart in the same warp (shuffles), and only the stages with wider partners go through
// shared memory, so a 4096-entry sort takes 15 block barriers instead of 78.
__device__ void SortCandidates(unsigned long long* comp, int size) {
  constexpr int kPer = kCands / kBlock;
  const int base = threadIdx.x * kPer;
  unsigned long long v[kPer];
#pragma unroll
  for (int e = 0; e < kPer; ++e) v[e] = comp[base + e];
  for (int k = 2; k <= size; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      if (j >= kPer * 32) {
        __syncthreads();  // the previous shared stage's reads are done
#pragma unroll
        for (int e = 0; e < kPer; ++e) comp[base + e] = v[e];
        __syncthreads();
#pragma unroll
        for (int e = 0; e < kPer; ++e) {
          const int i = base + e, p = i ^ j;
          const unsigned long long y = comp[p];
          const bool keep_min = ((i & k) == 0) == (i < p);
          v[e] = keep_min ? min(v[e], y) : max(v[e], y);
        }
      } else if (j >= kPer) {
#pragma unroll
        for (int e = 0; e < kPer; ++e) {
          const int i = base + e, p = i ^ j;
          const unsigned long long y = __shfl_xor_sync(0xffffffffu, v[e], j / kPer);
          const bool keep_min = ((i & k) == 0) == (i < p);
          v[e] = keep_min ? min(v[e], y) : max(v[e], y);
        }
      } else if (j == 2) {
        CompareSwap(v[0], v[2], ((base + 0) & k) == 0);
        CompareSwap(v[1], v[3], ((base + 1) & k) == 0);
      } else {
        CompareSwap(v[0], v[1], ((base + 0) & k) == 0);
        CompareSwap(v[2], v[3], ((base + 2) & k) == 0);
      }
    }
  }
  __syncthreads();
#pragma unroll
  for (int e = 0; e < kPer; ++e) comp[base + e] = v[e];
  __syncthreads();
}

// Writes to ids[0..*n_out) the first ids of the row `vals` in candidate order (value
// descending, id ascending): all ids whose key is >= the need-th largest key T, or, when
// those are more than kCands, all above T and then ties at T in id order up to kCands.
// 1 <= need <= min(n, kCands).
__global__ void __launch_bounds__(kBlock)
    SelectTopKernel(const float* vals, int n, int need, int32_t* ids, int* n_out) {
  PdlBegin();
  using IntScan = cub::BlockScan<int, kBlock>;
  using IntReduce = cub::BlockReduce<int, kBlock>;
  __shared__ unsigned long long comp[kCands];  // block 0's: (~key << 32 | id), ascending = our order
  __shared__ int hist[2][256];                 // this block's, alternating per pass
  __shared__ int tot[256];                     // the cluster's
  __shared__ union {
    typename IntScan::TempStorage scan;
    typename IntReduce::TempStorage reduce;
  } tmp;
  __shared__ int s_digit, s_rank, s_ties, s_count, s_block_ties;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int blocks = static_cast<int>(cluster.num_blocks());
  const Slice s = BlockSlice(n, rank, blocks);
  const int lane = threadIdx.x & 31;
  if (threadIdx.x == 0) s_count = 0;  // block 0's is the cluster's; read after later syncs

  // Radix select of the need-th largest key, most significant byte first.
  uint32_t prefix = 0, mask = 0;
  int rank_t = need;  // 1-based rank of T among the keys matching `prefix`
  int ties = 0;
  for (int shift = 24, pass = 0; shift >= 0; shift -= 8, ++pass) {
    int* h = hist[pass & 1];
    for (int d = threadIdx.x; d < 256; d += kBlock) h[d] = 0;
    __syncthreads();
    for (int64_t base = s.begin; base < s.end; base += kBlock) {
      const int64_t i = base + threadIdx.x;
      const uint32_t key = i < s.end ? OrderKey(vals[i]) : 0u;
      // Logits share their top bits, so most of a warp hits one bin: one atomic per bin.
      WarpHistogramAdd(h, (key >> shift) & 255u, i < s.end && (key & mask) == prefix);
    }
    // Every block's histogram is complete; the buffer is next written two passes on, after
    // the next pass's sync, so the other blocks' reads below are done by then.
    cluster.sync();
    for (int d = threadIdx.x; d < 256; d += kBlock) {
      int c = 0;
      for (int r = 0; r < blocks; ++r) c += cluster.map_shared_rank(h, r)[d];
      tot[d] = c;
    }
    __syncthreads();
    DigitPick d;
    if (threadIdx.x < 32 && PickDigitFromTop(tot, rank_t, &d)) {
      s_digit = d.digit;
      s_rank = static_cast<int>(d.rank);
      s_ties = d.count;
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(s_digit) << shift;
    mask |= 255u << shift;
    rank_t = s_rank;
    ties = s_ties;
    __syncthreads();
  }
  const uint32_t t_key = prefix;
  const int above_t = need - rank_t;  // ids with key > T
  const bool all_ties = above_t + ties <= kCands;

  // Compaction into block 0: unordered (the sort orders), except overflowing ties, which go
  // in id order.
  unsigned long long* comp0 = cluster.map_shared_rank(comp, 0);
  int* count0 = cluster.map_shared_rank(&s_count, 0);
  int my_ties = 0;
  for (int64_t base = s.begin; base < s.end; base += kBlock) {
    const int64_t i = base + threadIdx.x;
    const uint32_t key = i < s.end ? OrderKey(vals[i]) : 0;
    const bool take = i < s.end && (key > t_key || (all_ties && key == t_key));
    my_ties += i < s.end && key == t_key;
    const unsigned ballot = __ballot_sync(0xffffffffu, take);
    int slot = 0;
    if (lane == 0 && ballot != 0) slot = atomicAdd(count0, __popc(ballot));
    slot = __shfl_sync(0xffffffffu, slot, 0) + __popc(ballot & ((1u << lane) - 1));
    if (take) comp0[slot] = (static_cast<unsigned long long>(~key) << 32) | static_cast<uint32_t>(i);
  }
  if (!all_ties) {
    // Ties at T fill the list after the above_t larger keys, block by block in rank order.
    my_ties = IntReduce(tmp.reduce).Sum(my_ties);
    if (threadIdx.x == 0) s_block_ties = my_ties;
    cluster.sync();
    int offset = above_t;
    for (int r = 0; r < rank; ++r) offset += *cluster.map_shared_rank(&s_block_ties, r);
    for (int64_t base = s.begin; base < s.end && offset < kCands; base += kBlock) {
      const int64_t i = base + threadIdx.x;
      const int tie = (i < s.end && OrderKey(vals[i]) == t_key) ? 1 : 0;
      int off, agg;
      __syncthreads();  // tmp is reused
      IntScan(tmp.scan).ExclusiveSum(tie, off, agg);
      if (tie && offset + off < kCands) {
        comp0[offset + off] = (static_cast<unsigned long long>(~t_key) << 32) | static_cast<uint32_t>(i);
      }
      offset += agg;
    }
  }
  cluster.sync();  // block 0 holds every candidate; no block reads another's memory after this
  if (rank != 0) return;
  const int count = all_ties ? s_count : kCands;
  int size = 1;
  while (size < count) size <<= 1;
  for (int i = count + threadIdx.x; i < size; i += kBlock) comp[i] = ~0ull;
  __syncthreads();
  SortCandidates(comp, size);
  for (int i = threadIdx.x; i < count; i += kBlock) ids[i] = static_cast<int32_t>(comp[i] & 0xffffffffu);
  if (threadIdx.x == 0) *n_out = count;
}

struct WalkArgs {
  const float* adj;
  const int32_t* order;  // positions -> ids; null: the identity (id order)
  const int* n_order;    // device: how many positions `order` holds; null: n
  int n;
  int universe;          // top-k's K (or the vocabulary): the mass top-p is a fraction of
  bool truncate;         // top-k, top-p or min-p in force (else no cut)
  bool top_k;            // universe is a top-k (its mass is summed here)
  float inv_t, top_p, min_p;
  double uniform;
};

// Cut and draw over the positions of `order` (file comment, step 4).
__global__ void __launch_bounds__(kBlock)
    WalkKernel(WalkArgs a, const RowStats* st, DeviceResult* res) {
  PdlBegin();
  using Scan = cub::BlockScan<double, kBlock>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ double s_agg;  // this block's weight sum
  __shared__ int s_stop;    // this block's first cut position (lim: none)
  __shared__ double s_cum;  // the prefix at s_stop
  __shared__ int s_draw;    // this block's first drawn position
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int blocks = static_cast<int>(cluster.num_blocks());
  const int n = a.n_order != nullptr ? *a.n_order : a.n;
  const Weight w{st->max_adj, a.inv_t};
  auto id_at = [&](int p) { return a.order != nullptr ? a.order[p] : p; };
  auto w_at = [&](int p) { return w(a.adj[id_at(p)]); };
  const int lim = min(n, a.universe);
  if (a.top_k && lim < a.universe) {  // the top-k mass is not all here (before any exchange)
    if (rank == 0 && threadIdx.x == 0) res->fallback = 1;
    return;
  }
  const int64_t threads = static_cast<int64_t>(blocks) * kBlock;
  const int64_t chunk = (lim + threads - 1) / threads;
  const int64_t lim64 = lim;
  const int begin = static_cast<int>(min(lim64, (rank * int64_t{kBlock} + threadIdx.x) * chunk));
  const int end = static_cast<int>(min(lim64, begin + chunk));
  double sum = 0;
  for (int p = begin; p < end; ++p) sum += w_at(p);
  double pre, agg;
  Scan(scan_tmp).ExclusiveSum(sum, pre, agg);
  // The lower blocks' sums and the cluster's, each added in rank order.
  if (threadIdx.x == 0) s_agg = agg;
  cluster.sync();
  double offset = 0, all = 0;
  for (int r = 0; r < blocks; ++r) {
    const double v = *cluster.map_shared_rank(&s_agg, r);
    if (r < rank) offset += v;
    all += v;
  }
  pre += offset;
  // Mass the top-p fraction is of: the top-k's (all here) or the whole row's (Stats).
  const double total = lim == a.universe ? all : st->total;

  int stop = lim;  // kept positions: [0, stop)
  double cum = all;
  if (a.truncate) {
    if (threadIdx.x == 0) s_stop = lim;
    __syncthreads();
    const double p_mass = static_cast<double>(a.top_p) * total;
    const double min_w = static_cast<double>(a.min_p) * w_at(0);
    double e = pre;
    int mine = lim;
    // Only a chunk that can hold the cut walks: top-p's prefix reaches p_mass inside it, or
    // its last weight is below min-p's (weights fall along the order).
    const bool walk = begin < end && (p_mass <= pre + sum || (a.min_p > 0 && w_at(end - 1) < min_w));
    for (int p = begin; walk && p < end; ++p) {
      const double wp = w_at(p);
      if ((a.min_p > 0 && wp < min_w) || (p > 0 && e >= p_mass)) {
        mine = p;
        break;
      }
      e += wp;
    }
    if (mine < lim) atomicMin(&s_stop, mine);
    __syncthreads();
    if (mine == s_stop && mine < lim) s_cum = e;
    cluster.sync();
    // Blocks hold ascending positions: the first block with a cut has the cluster's.
    for (int r = 0; r < blocks && stop == lim; ++r) {
      const int sr = *cluster.map_shared_rank(&s_stop, r);
      if (sr < lim) {
        stop = sr;
        cum = *cluster.map_shared_rank(&s_cum, r);
      }
    }
    if (stop == lim && lim < a.universe) {  // the cut lies past the candidates
      if (rank == 0 && threadIdx.x == 0) res->fallback = 1;
      cluster.sync();  // the others' s_stop outlives this block's reads
      return;
    }
  }

  // The draw: the first kept position whose inclusive prefix exceeds uniform * cum.
  const double r = a.uniform * cum;
  if (threadIdx.x == 0) s_draw = stop;
  __syncthreads();
  double rr = r - pre;
  // Chunks wholly before the draw's position skip (rr >= their sum); those after it stop at
  // their first position; the cluster minimum is the draw.
  const bool walk = rr < sum;
  for (int p = begin; walk && p < min(end, stop); ++p) {
    if ((rr -= w_at(p)) < 0) {
      atomicMin(&s_draw, p);
      break;
    }
  }
  cluster.sync();
  if (rank == 0 && threadIdx.x == 0) {
    int d = stop;
    for (int q = 0; q < blocks; ++q) d = min(d, *cluster.map_shared_rank(&s_draw, q));
    // Past the end only by rounding: the first candidate, which is the first argmax.
    res->id = d < stop ? id_at(d) : st->argmax_adj;
    res->fallback = 0;
  }
  cluster.sync();  // the others' s_draw outlives block 0's reads
}

__global__ void FinishKernel(const float* logits, const RowStats* st, const int32_t* top_ids,
                             int n_top, DeviceResult* res) {
  PdlBegin();
  const int j = threadIdx.x;
  if (j == 0) res->logprob = static_cast<float>(logits[res->id] - st->lse);
  if (j < n_top) {
    res->top_ids[j] = top_ids[j];
    res->top_logprobs[j] = static_cast<float>(logits[top_ids[j]] - st->lse);
  }
  if (j == 0) res->n_top = n_top;
}

__global__ void SortKeysKernel(const float* adj, int n, uint32_t* keys, int32_t* ids) {
  PdlBegin();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  keys[i] = ~OrderKey(adj[i]);  // ascending = candidate order
  ids[i] = i;
}

// `count` elements of T at the next 256-byte aligned offset of one scratch allocation
// (base 0: only measures).
template <typename T>
T* Carve(char* base, size_t& off, size_t count) {
  off = (off + 255) & ~size_t{255};
  T* p = reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(base) + off);
  off += count * sizeof(T);
  return p;
}

// The ids of the whole row in candidate order, in `*buf`: a stable radix sort of the order
// keys, so equal logits stay in id order.
absl::StatusOr<const int32_t*> SortRow(const float* adj, int n, cudaStream_t stream,
                                       StreamBuffer* buf) {
  size_t sort_bytes = 0;
  RING_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n, 0, 32, stream));
  uint32_t *k_in, *k_out;
  int32_t *i_in, *i_out;
  void* temp;
  auto layout = [&](char* base) {
    size_t off = 0;
    k_in = Carve<uint32_t>(base, off, n);
    k_out = Carve<uint32_t>(base, off, n);
    i_in = Carve<int32_t>(base, off, n);
    i_out = Carve<int32_t>(base, off, n);
    temp = Carve<char>(base, off, sort_bytes);
    return off;
  };
  RING_ASSIGN_OR_RETURN(*buf, StreamBuffer::Allocate(layout(nullptr), stream));
  layout(buf->as<char>());
  RING_LAUNCH_PDL(SortKeysKernel, (n + 255) / 256, 256, 0, stream, adj, n, k_in, i_in);
  RING_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(temp, sort_bytes, k_in, k_out, i_in,
                                                            i_out, n, 0, 32, stream));
  return i_out;
}

}  // namespace

absl::Status ArgMaxRows(const float* x, int64_t rows, int64_t n, int32_t* out,
                        cudaStream_t stream) {
  if (rows <= 0) return absl::OkStatus();
  if (x == nullptr || out == nullptr || n <= 0) {
    return absl::InvalidArgumentError("argmax: null pointer or empty row");
  }
  // A cluster per row, up to kCluster blocks, at least 8 elements per thread: a short row
  // stays in one block.
  const int blocks = static_cast<int>(std::clamp<int64_t>((n + kThreads * 8 - 1) / (kThreads * 8), 1, kCluster));
  if (rows > 0x7fffffff / kCluster || n > 0x7fffffff) {
    return absl::InvalidArgumentError("argmax: too large");
  }
  return LaunchClusters(ArgMaxKernel, static_cast<int>(rows), blocks, kThreads, stream, x, n, out);
}

absl::Status SampleRow(const float* logits, int64_t vocab, const SampleRequest& req,
                       SampledToken* out, cudaStream_t stream) {
  if (logits == nullptr || out == nullptr || vocab <= 0 || vocab > 0x7fffffff) {
    return absl::InvalidArgumentError("sample: null pointer, empty or too large row");
  }
  RING_RETURN_IF_ERROR(req.Validate(vocab));
  const SamplingParams& p = req.params;
  const int n = static_cast<int>(vocab);
  const bool sample = p.temperature > 0.0f;
  const bool truncate = p.top_k > 0 || p.top_p < 1.0f || p.min_p > 0.0f;
  const bool penalize = !req.counts.empty() && (p.frequency_penalty != 0 || p.presence_penalty != 0);
  const int n_top = std::min(p.top_logprobs, n);
  const bool want_logprobs = p.logprobs || n_top > 0;
  const int universe = p.top_k > 0 ? std::min(p.top_k, n) : n;

  // One scratch allocation, carved twice: with a null base to measure, then for real.
  RowStats* st;
  DeviceResult* res;
  int2* counts;
  float* adj_buf;
  int32_t *cand, *top;
  int *n_cand, *n_top_dev;
  auto layout = [&](char* base) {
    size_t off = 0;
    st = Carve<RowStats>(base, off, 1);
    res = Carve<DeviceResult>(base, off, 1);
    counts = Carve<int2>(base, off, penalize ? req.counts.size() : 0);
    adj_buf = Carve<float>(base, off, penalize ? n : 0);
    cand = Carve<int32_t>(base, off, kCands);
    n_cand = Carve<int>(base, off, 1);
    top = Carve<int32_t>(base, off, kCands);
    n_top_dev = Carve<int>(base, off, 1);
    return off;
  };
  RING_ASSIGN_OR_RETURN(StreamBuffer scratch, StreamBuffer::Allocate(layout(nullptr), stream));
  layout(scratch.as<char>());

  const float* adj = logits;
  if (penalize) {
    std::vector<int2> host(req.counts.size());
    for (size_t i = 0; i < host.size(); ++i) host[i] = {req.counts[i].first, req.counts[i].second};
    RING_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(counts, host.data(), host.size() * sizeof(int2),
                                              cudaMemcpyHostToDevice, stream));
    RING_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(adj_buf, logits, vocab * sizeof(float),
                                              cudaMemcpyDeviceToDevice, stream));
    const int c = static_cast<int>(host.size());
    RING_LAUNCH_PDL(PenalizeKernel, (c + 255) / 256, 256, 0, stream, adj_buf, counts, c,
                    p.frequency_penalty, p.presence_penalty);
    adj = adj_buf;
  }
  const float inv_t = sample ? 1.0f / p.temperature : 1.0f;
  RING_RETURN_IF_ERROR(LaunchClusters(StatsKernel, 1, kCluster, kBlock, stream, logits, adj, n,
                                      inv_t, want_logprobs, sample && truncate && p.top_k == 0,
                                      st, res));

  WalkArgs walk{adj, nullptr, nullptr, n, universe, truncate, p.top_k > 0, inv_t, p.top_p,
                p.min_p, req.uniform};
  // Top-k above the on-chip list goes straight to the full sort.
  const bool full_sort_first = sample && truncate && p.top_k > 0 && universe > kCands;
  if (sample && !full_sort_first) {
    if (truncate) {
      RING_RETURN_IF_ERROR(LaunchClusters(SelectTopKernel, 1, kCluster, kBlock, stream, adj, n,
                                          std::min(universe, kCands), cand, n_cand));
      walk.order = cand;
      walk.n_order = n_cand;
    }
    // At most kCands candidates are one block's work; the whole row in id order is not.
    RING_RETURN_IF_ERROR(
        LaunchClusters(WalkKernel, 1, truncate ? 1 : kCluster, kBlock, stream, walk, st, res));
  }
  if (n_top > 0) {
    RING_RETURN_IF_ERROR(
        LaunchClusters(SelectTopKernel, 1, kCluster, kBlock, stream, logits, n, n_top, top, n_top_dev));
  }
  auto finish_and_fetch = [&](DeviceResult* host) -> absl::Status {
    if (want_logprobs) {
      RING_LAUNCH_PDL(FinishKernel, 1, 32, 0, stream, logits, st, top, n_top, res);
    }
    RING_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host, res, sizeof(DeviceResult), cudaMemcpyDeviceToHost, stream));
    RING_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    return absl::OkStatus();
  };
  DeviceResult r;
  if (full_sort_first) {
    r.fallback = 1;
  } else {
    RING_RETURN_IF_ERROR(finish_and_fetch(&r));
  }
  if (r.fallback) {
    // The kept set is wider than the candidate list: sort the whole row (stable, so equal
    // logits stay in id order) and walk it.
    StreamBuffer sorted;
    RING_ASSIGN_OR_RETURN(walk.order, SortRow(adj, n, stream, &sorted));
    walk.n_order = nullptr;
    RING_RETURN_IF_ERROR(LaunchClusters(WalkKernel, 1, kCluster, kBlock, stream, walk, st, res));
    RING_RETURN_IF_ERROR(finish_and_fetch(&r));
    if (r.fallback) return absl::InternalError("sample: the fully sorted walk asked for more");
  }
  out->id = r.id;
  out->logprob = want_logprobs ? r.logprob : 0.0f;
  out->top_logprobs.clear();
  for (int j = 0; j < r.n_top; ++j) out->top_logprobs.emplace_back(r.top_ids[j], r.top_logprobs[j]);
  return absl::OkStatus();
}

}  // namespace ring::cuda
