// Kernels behind sampling.cuh.
//
// ArgMaxRows: one block per row; each thread scans a strided slice, then a shared-memory
// reduction of (value, index) pairs that prefers the larger value and, among equal values,
// the lower index (cpu::ArgMax's `x[i] > x[best]` scan).
//
// SampleRow, one row, each kernel one block of 1024 threads (a row is ~600 KB: it sits in
// L2 and one SM streams it in a few microseconds; several blocks would need a grid-wide
// sync per phase for no gain at batch 1):
//   1. Penalize (only with counts): a copy of the row minus the penalties.
//   2. Stats: max and first argmax of the penalized row (the greedy answer), log-sum-exp of
//      the raw row (logprobs), sum of the weights w = exp((l - max) / T) (top-p's mass
//      without top-k).
//   3. SelectTop (truncation only): the candidates, i.e. the first min(K, 4096) ids in the
//      CPU's candidate order (logit descending, id ascending), without sorting the row: a
//      radix select over order-preserving 32-bit keys (4 passes of 8 bits, histograms in
//      shared memory) finds the K-th key T; the ids with key >= T are compacted (ties at T
//      in id order when they overflow the list) and bitonic-sorted on chip by (key, id).
//   4. Walk: over the candidates (or the whole row in id order when nothing truncates, as
//      the CPU draws then) each thread owns a contiguous chunk of positions; one block scan
//      of the chunk sums gives every position's exclusive prefix, so the top-p / min-p cut
//      and the draw are each one pass over the chunks plus a block minimum. When the cut
//      falls beyond the candidate list it raises `fallback`; the host then sorts the row in
//      full (cub radix sort, stable, so ties stay in id order) and walks that instead.
//   5. Finish (logprobs only): the chosen id's logprob and the top_logprobs, whose ids come
//      from step 3 run over the raw logits.
// Arithmetic mirrors cpu::SampleToken: penalties and `l - max` in float without FMA
// contraction, weights in double, the same comparisons; only summation order differs (see
// the tolerance note in sampling.cuh).
#include "kernels/cuda/sampling.cuh"

#include <algorithm>
#include <cstring>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <vector>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/status.h"

namespace ring::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ bool Better(float v, int64_t i, float bv, int64_t bi) {
  return v > bv || (v == bv && i < bi);
}

__global__ void __launch_bounds__(kThreads) ArgMaxKernel(const float* x, int64_t n, int32_t* out) {
  __shared__ float sv[kThreads];
  __shared__ int64_t si[kThreads];
  const float* row = x + static_cast<int64_t>(blockIdx.x) * n;
  float bv = -INFINITY;
  int64_t bi = n;  // "none yet"
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const float v = row[i];
    if (bi == n || v > bv) {
      bv = v;
      bi = i;
    }
  }
  sv[threadIdx.x] = bv;
  si[threadIdx.x] = bi;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const float v = sv[threadIdx.x + s];
      const int64_t i = si[threadIdx.x + s];
      if (i < n && (si[threadIdx.x] == n || Better(v, i, sv[threadIdx.x], si[threadIdx.x]))) {
        sv[threadIdx.x] = v;
        si[threadIdx.x] = i;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<int32_t>(si[0] == n ? 0 : si[0]);
}

// ---- SampleRow ----------------------------------------------------------------------------
constexpr int kBlock = 1024;
constexpr int kMaxTop = 20;
constexpr int kCands = kSampleCandidates;
static_assert((kCands & (kCands - 1)) == 0, "bitonic sort needs a power of two");

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

// Larger float -> larger key; -0 and +0 share a key because the CPU compares values (they
// tie and the lower id wins).
__device__ __forceinline__ uint32_t OrderKey(float v) {
  uint32_t b = __float_as_uint(v);
  if (b == 0x80000000u) b = 0;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// cpu::SampleToken's weight: exp(double(l - m) * inv_t), the subtraction in float.
struct Weight {
  float m, inv_t;
  __device__ __forceinline__ double operator()(float l) const {
    return exp(static_cast<double>(__fsub_rn(l, m)) * static_cast<double>(inv_t));
  }
};

struct MaxAt {
  float v;
  int32_t i;
};
struct MaxAtOp {
  __device__ __forceinline__ MaxAt operator()(const MaxAt& a, const MaxAt& b) const {
    return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a;
  }
};

__global__ void PenalizeKernel(float* adj, const int2* counts, int n, float frequency,
                               float presence) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int2 c = counts[i];  // (token, occurrences), tokens distinct
  // adj -= frequency * n + presence, rounded as the CPU does (no FMA).
  adj[c.x] = __fsub_rn(adj[c.x], __fadd_rn(__fmul_rn(frequency, static_cast<float>(c.y)), presence));
}

__global__ void __launch_bounds__(kBlock)
    StatsKernel(const float* logits, const float* adj, int n, float inv_t, bool want_lse,
                bool want_total, RowStats* st, DeviceResult* res) {
  using MaxReduce = cub::BlockReduce<MaxAt, kBlock>;
  using SumReduce = cub::BlockReduce<double, kBlock>;
  __shared__ union {
    typename MaxReduce::TempStorage max;
    typename SumReduce::TempStorage sum;
  } tmp;
  __shared__ MaxAt s_adj;
  __shared__ float s_raw;
  MaxAt a{-INFINITY, n};
  float raw = -INFINITY;
  for (int i = threadIdx.x; i < n; i += kBlock) {
    const float v = adj[i];
    if (v > a.v || a.i == n) a = {v, i};
    raw = fmaxf(raw, logits[i]);
  }
  const MaxAt best = MaxReduce(tmp.max).Reduce(a, MaxAtOp());
  __syncthreads();
  const MaxAt raw_best = MaxReduce(tmp.max).Reduce(MaxAt{raw, 0}, MaxAtOp());
  if (threadIdx.x == 0) {
    s_adj = best;
    s_raw = raw_best.v;
  }
  __syncthreads();
  const float m_raw = s_raw;
  const Weight w{s_adj.v, inv_t};
  // Double exps are the expensive part of a single block's pass: only those asked for.
  double se = 0, sw = 0;
  if (want_lse) {
    for (int i = threadIdx.x; i < n; i += kBlock) se += exp(static_cast<double>(logits[i]) - m_raw);
  }
  if (want_total) {
    for (int i = threadIdx.x; i < n; i += kBlock) sw += w(adj[i]);
  }
  const double sum_e = SumReduce(tmp.sum).Sum(se);
  __syncthreads();
  const double sum_w = SumReduce(tmp.sum).Sum(sw);
  if (threadIdx.x == 0) {
    st->max_adj = s_adj.v;
    st->argmax_adj = s_adj.i == n ? 0 : s_adj.i;
    st->lse = isfinite(m_raw) ? m_raw + log(sum_e) : m_raw;
    st->total = sum_w;
    res->id = st->argmax_adj;
    res->fallback = 0;
    res->logprob = 0;
    res->n_top = 0;
  }
}

// Writes to ids[0..*n_out) the first ids of the row `vals` in candidate order (value
// descending, id ascending): all ids whose key is >= the need-th largest key T, or, when
// those are more than kCands, all above T and then ties at T in id order up to kCands.
// 1 <= need <= min(n, kCands).
__global__ void __launch_bounds__(kBlock)
    SelectTopKernel(const float* vals, int n, int need, int32_t* ids, int* n_out) {
  using IntScan = cub::BlockScan<int, kBlock>;
  __shared__ unsigned long long comp[kCands];  // (~key << 32 | id): ascending = our order
  __shared__ int hist[256];
  __shared__ typename IntScan::TempStorage scan_tmp;
  __shared__ int s_digit, s_rank, s_ties, s_count;
  const int lane = threadIdx.x & 31;

  // Radix select of the need-th largest key, most significant byte first.
  uint32_t prefix = 0, mask = 0;
  int rank = need;  // 1-based rank of T among the keys matching `prefix`
  int ties = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < 256; d += kBlock) hist[d] = 0;
    __syncthreads();
    for (int base = 0; base < n; base += kBlock) {
      const int i = base + threadIdx.x;
      int digit = 256;  // no bin
      if (i < n) {
        const uint32_t key = OrderKey(vals[i]);
        if ((key & mask) == prefix) digit = static_cast<int>((key >> shift) & 255u);
      }
      // Logits share their top bits, so most of a warp hits one bin: one atomic per bin.
      const unsigned peers = __match_any_sync(0xffffffffu, digit);
      if (digit < 256 && lane == __ffs(peers) - 1) atomicAdd(&hist[digit], __popc(peers));
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane l owns digits 255 - 8l .. 248 - 8l (descending); a warp scan finds the digit
      // where the count from the top reaches `rank`.
      int c[8], sum = 0;
      for (int j = 0; j < 8; ++j) sum += (c[j] = hist[255 - lane * 8 - j]);
      int incl = sum;
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
      }
      int above = incl - sum;
      if (above < rank && rank <= incl) {
        for (int j = 0; j < 8; ++j) {
          if (above + c[j] >= rank) {
            s_digit = 255 - lane * 8 - j;
            s_rank = rank - above;
            s_ties = c[j];
            break;
          }
          above += c[j];
        }
      }
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(s_digit) << shift;
    mask |= 255u << shift;
    rank = s_rank;
    ties = s_ties;
    __syncthreads();
  }
  const uint32_t t_key = prefix;
  const int above_t = need - rank;  // ids with key > T
  const bool all_ties = above_t + ties <= kCands;

  // Compaction: unordered (the sort orders), except overflowing ties, which go in id order.
  if (threadIdx.x == 0) s_count = 0;
  __syncthreads();
  for (int base = 0; base < n; base += kBlock) {
    const int i = base + threadIdx.x;
    const uint32_t key = i < n ? OrderKey(vals[i]) : 0;
    const bool take = i < n && (key > t_key || (all_ties && key == t_key));
    const unsigned ballot = __ballot_sync(0xffffffffu, take);
    int slot = 0;
    if (lane == 0 && ballot != 0) slot = atomicAdd(&s_count, __popc(ballot));
    slot = __shfl_sync(0xffffffffu, slot, 0) + __popc(ballot & ((1u << lane) - 1));
    if (take) comp[slot] = (static_cast<unsigned long long>(~key) << 32) | static_cast<uint32_t>(i);
  }
  __syncthreads();
  if (!all_ties) {
    for (int base = 0; base < n; base += kBlock) {
      const int count = s_count;  // uniform: written before the last barrier
      if (count >= kCands) break;
      const int i = base + threadIdx.x;
      const int tie = (i < n && OrderKey(vals[i]) == t_key) ? 1 : 0;
      int off, agg;
      IntScan(scan_tmp).ExclusiveSum(tie, off, agg);
      if (tie && count + off < kCands) {
        comp[count + off] = (static_cast<unsigned long long>(~t_key) << 32) | static_cast<uint32_t>(i);
      }
      __syncthreads();
      if (threadIdx.x == 0) s_count = min(kCands, count + agg);
      __syncthreads();
    }
  }
  const int count = s_count;
  int size = 1;
  while (size < count) size <<= 1;
  for (int i = count + threadIdx.x; i < size; i += kBlock) comp[i] = ~0ull;
  __syncthreads();
  // Bitonic sort, ascending.
  for (int k = 2; k <= size; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < size; i += kBlock) {
        const int p = i ^ j;
        if (p > i) {
          const unsigned long long x = comp[i], y = comp[p];
          if (((i & k) == 0) == (x > y)) {
            comp[i] = y;
            comp[p] = x;
          }
        }
      }
      __syncthreads();
    }
  }
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
  using Scan = cub::BlockScan<double, kBlock>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int s_stop;
  __shared__ double s_cum;
  const int n = a.n_order != nullptr ? *a.n_order : a.n;
  const Weight w{st->max_adj, a.inv_t};
  auto id_at = [&](int p) { return a.order != nullptr ? a.order[p] : p; };
  auto w_at = [&](int p) { return w(a.adj[id_at(p)]); };
  const int lim = min(n, a.universe);
  if (a.top_k && lim < a.universe) {  // the top-k mass is not all here
    if (threadIdx.x == 0) res->fallback = 1;
    return;
  }
  const int chunk = (lim + kBlock - 1) / kBlock;
  const int begin = min(lim, static_cast<int>(threadIdx.x) * chunk);
  const int end = min(lim, begin + chunk);
  double sum = 0;
  for (int p = begin; p < end; ++p) sum += w_at(p);
  double pre, agg;
  Scan(scan_tmp).ExclusiveSum(sum, pre, agg);
  // Mass the top-p fraction is of: the top-k's (all here) or the whole row's (Stats).
  const double total = lim == a.universe ? agg : st->total;

  int stop = lim;  // kept positions: [0, stop)
  double cum = agg;
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
    stop = s_stop;
    if (mine == stop && mine < lim) s_cum = e;
    __syncthreads();
    if (stop < lim) {
      cum = s_cum;
    } else if (lim < a.universe) {  // the cut lies past the candidates
      if (threadIdx.x == 0) res->fallback = 1;
      return;
    }
  }

  // The draw: the first kept position whose inclusive prefix exceeds uniform * cum.
  const double r = a.uniform * cum;
  if (threadIdx.x == 0) s_stop = stop;
  __syncthreads();
  double rr = r - pre;
  // Chunks wholly before the draw's position skip (rr >= their sum); those after it stop at
  // their first position; the block minimum is the draw.
  const bool walk = rr < sum;
  for (int p = begin; walk && p < min(end, stop); ++p) {
    if ((rr -= w_at(p)) < 0) {
      atomicMin(&s_stop, p);
      break;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    // Past the end only by rounding: the first candidate, which is the first argmax.
    res->id = s_stop < stop ? id_at(s_stop) : st->argmax_adj;
    res->fallback = 0;
  }
}

__global__ void FinishKernel(const float* logits, const RowStats* st, const int32_t* top_ids,
                             int n_top, DeviceResult* res) {
  const int j = threadIdx.x;
  if (j == 0) res->logprob = static_cast<float>(logits[res->id] - st->lse);
  if (j < n_top) {
    res->top_ids[j] = top_ids[j];
    res->top_logprobs[j] = static_cast<float>(logits[top_ids[j]] - st->lse);
  }
  if (j == 0) res->n_top = n_top;
}

__global__ void SortKeysKernel(const float* adj, int n, uint32_t* keys, int32_t* ids) {
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
  SortKeysKernel<<<(n + 255) / 256, 256, 0, stream>>>(adj, n, k_in, i_in);
  RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
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
  if (rows > 0x7fffffff || n > 0x7fffffff) return absl::InvalidArgumentError("argmax: too large");
  ArgMaxKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, n, out);
  RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
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
    PenalizeKernel<<<(c + 255) / 256, 256, 0, stream>>>(adj_buf, counts, c, p.frequency_penalty,
                                                        p.presence_penalty);
    RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    adj = adj_buf;
  }
  const float inv_t = sample ? 1.0f / p.temperature : 1.0f;
  StatsKernel<<<1, kBlock, 0, stream>>>(logits, adj, n, inv_t, want_logprobs,
                                        sample && truncate && p.top_k == 0, st, res);
  RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());

  WalkArgs walk{adj, nullptr, nullptr, n, universe, truncate, p.top_k > 0, inv_t, p.top_p,
                p.min_p, req.uniform};
  // Top-k above the on-chip list goes straight to the full sort.
  const bool full_sort_first = sample && truncate && p.top_k > 0 && universe > kCands;
  if (sample && !full_sort_first) {
    if (truncate) {
      SelectTopKernel<<<1, kBlock, 0, stream>>>(adj, n, std::min(universe, kCands), cand, n_cand);
      RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
      walk.order = cand;
      walk.n_order = n_cand;
    }
    WalkKernel<<<1, kBlock, 0, stream>>>(walk, st, res);
    RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  if (n_top > 0) {
    SelectTopKernel<<<1, kBlock, 0, stream>>>(logits, n, n_top, top, n_top_dev);
    RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  auto finish_and_fetch = [&](DeviceResult* host) -> absl::Status {
    if (want_logprobs) {
      FinishKernel<<<1, 32, 0, stream>>>(logits, st, top, n_top, res);
      RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
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
    WalkKernel<<<1, kBlock, 0, stream>>>(walk, st, res);
    RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
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
