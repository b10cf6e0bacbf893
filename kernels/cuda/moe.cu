// Kernels behind moe.cuh.
#include "kernels/cuda/moe.cuh"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_format.h"
#include "kernels/cuda/act_round.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/linear.cuh"
#include "kernels/cuda/quant_decode.cuh"
#include "kernels/cuda/warp_scan.cuh"
#include "kernels/status.h"

namespace ring::cuda {
namespace {

constexpr int kRouteThreads = 64;
constexpr int kMaxK = 64;

// cpu::TopKIndices on x[0..n): the k best (higher value, then lower index), ascending ids.
// `taken` is scratch of n flags.
__device__ void TopKSmall(const float* x, int n, int k, bool* taken, int32_t* ids) {
  for (int i = 0; i < n; ++i) taken[i] = false;
  for (int s = 0; s < k; ++s) {
    int best = -1;
    for (int i = 0; i < n; ++i) {
      if (taken[i]) continue;
      if (best < 0 || x[i] > x[best]) best = i;  // ties keep the lower index
    }
    taken[best] = true;
  }
  int c = 0;
  for (int i = 0; i < n && c < k; ++i)
    if (taken[i]) ids[c++] = i;
}

// The chosen ids (ascending) and their weights: sigmoid scores, normalised over the k
// (summed in id order) when asked, times the scaling factor.
__device__ void WriteSigmoidRoute(const float* s, const int32_t* ids, int K,
                                  const cpu::SigmoidRouting& r, int32_t* ids_out, float* w_out) {
  float wts[kMaxK];
  float denom = 0.f;
  for (int k = 0; k < K; ++k) denom += (wts[k] = s[ids[k]]);
  for (int k = 0; k < K; ++k) {
    if (K > 1 && r.norm_topk_prob) wts[k] /= denom;
    wts[k] *= r.routed_scaling_factor;
    ids_out[k] = ids[k];
    w_out[k] = wts[k];
  }
}

__global__ void RouteSigmoidKernel(const float* logits, const float* bias, int64_t T,
                                   cpu::SigmoidRouting r, int32_t* ids_out, float* w_out) {
  PdlBegin();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= T) return;
  const int E = static_cast<int>(r.E), K = static_cast<int>(r.k);
  float s[kMaxRoutedExperts], sel[kMaxRoutedExperts];
  bool taken[kMaxRoutedExperts];
  int32_t ids[kMaxK];
  for (int e = 0; e < E; ++e) {
    s[e] = 1.f / (1.f + expf(-logits[row * E + e]));
    sel[e] = s[e] + bias[e];
  }
  if (r.n_group > 1) {
    const int G = static_cast<int>(r.n_group), gs = E / G;
    float gscore[kMaxK], neg[kMaxK];
    for (int g = 0; g < G; ++g) {
      int32_t top2[2];
      TopKSmall(sel + g * gs, gs, 2, taken, top2);
      gscore[g] = 0.f;
      for (int i = 0; i < 2; ++i) gscore[g] += sel[g * gs + top2[i]];
      neg[g] = -gscore[g];
    }
    int32_t drop[kMaxK];
    const int ndrop = G - static_cast<int>(r.topk_group);
    TopKSmall(neg, G, ndrop, taken, drop);
    for (int i = 0; i < ndrop; ++i)
      for (int e = 0; e < gs; ++e) sel[drop[i] * gs + e] = 0.f;
  }
  TopKSmall(sel, E, K, taken, ids);
  WriteSigmoidRoute(s, ids, K, r, ids_out + row * K, w_out + row * K);
}


// RouteSigmoidKernel for n_group == 1, one block per row and a thread per expert. Expert e
// is chosen when fewer than k experts beat it (a higher selection score, or an equal one at a
// lower index): the set TopKSmall takes. Found in two rounds instead of every thread
// comparing its score with all E (E^2 comparisons on one SM: most of the kernel's ~5.7 us for
// GLM-5.2's 8 of 256 experts on the H200): first each expert's rank among its own warp's 32
// (shuffles), and only those ranked below k there become candidates; then each candidate's
// rank among the candidates. That finds the same set: an expert of the top k has fewer than k
// experts beating it anywhere, so also in its warp, and every expert that beats it is itself
// in the top k (the order is total), so a candidate of the top k is beaten by fewer than k
// candidates and any other candidate by all k of them. The chosen ids are placed in ascending
// order by a ballot and thread 0 forms the weights with WriteSigmoidRoute, as the one-thread
// kernel does, so ids and weights are bit-identical to it.
// RouteSigmoidRankRow's shared memory.
struct RankShared {
  float s[kMaxRoutedExperts], cand_sel[kMaxRoutedExperts];
  int32_t cand_id[kMaxRoutedExperts];
  int32_t ids[kMaxK];
  int warp_count[kMaxRoutedExperts / 32];
};

// One row's routing by the whole block (whole warps, at least E threads): thread e < E holds
// expert e's logit and bias. Ends with a barrier, so that the block may route its next row.
__device__ void RouteSigmoidRankRow(float logit, float b, const cpu::SigmoidRouting& r, RankShared& sh,
                                    int32_t* ids_out, float* w_out) {
  const int E = static_cast<int>(r.E), K = static_cast<int>(r.k);
  const int e = threadIdx.x, lane = e & 31, warp = e >> 5, nwarps = blockDim.x >> 5;
  float sel = 0.f;
  if (e < E) {
    const float sv = 1.f / (1.f + expf(-logit));
    sel = sv + b;
    sh.s[e] = sv;
  }
  // Whether expert j with score v beats expert i with score sv (a total order).
  const auto beats = [](float v, int j, float sv, int i) { return v > sv || (v == sv && j < i); };
  int local = 0;
#pragma unroll 8
  for (int j = 0; j < 32; ++j) {
    const float v = __shfl_sync(0xffffffffu, sel, j);
    const int ej = warp * 32 + j;
    local += ej < E && beats(v, ej, sel, e) ? 1 : 0;
  }
  const bool cand = e < E && local < K;
  const unsigned cballot = __ballot_sync(0xffffffffu, cand);
  if (lane == 0) sh.warp_count[warp] = __popc(cballot);
  __syncthreads();
  int ncand = 0, at = 0;
  for (int w = 0; w < nwarps; ++w) {
    at += w < warp ? sh.warp_count[w] : 0;
    ncand += sh.warp_count[w];
  }
  if (cand) {
    at += __popc(cballot & ((1u << lane) - 1));
    sh.cand_sel[at] = sel;
    sh.cand_id[at] = e;
  }
  __syncthreads();
  int rank = 0;
  if (cand) {
    for (int c = 0; c < ncand; ++c) rank += beats(sh.cand_sel[c], sh.cand_id[c], sel, e) ? 1 : 0;
  }
  const bool chosen = cand && rank < K;
  const unsigned ballot = __ballot_sync(0xffffffffu, chosen);
  __syncthreads();  // every thread has read warp_count
  if (lane == 0) sh.warp_count[warp] = __popc(ballot);
  __syncthreads();
  if (chosen) {
    int before = __popc(ballot & ((1u << lane) - 1));
    for (int w = 0; w < warp; ++w) before += sh.warp_count[w];
    sh.ids[before] = e;
  }
  __syncthreads();
  if (e == 0) WriteSigmoidRoute(sh.s, sh.ids, K, r, ids_out, w_out);
  __syncthreads();
}

__global__ void __launch_bounds__(static_cast<int>(kMaxRoutedExperts))
    RouteSigmoidRankKernel(const float* logits, const float* bias, int64_t T,
                           cpu::SigmoidRouting r, int32_t* ids_out, float* w_out) {
  __shared__ RankShared sh;
  const int64_t row = blockIdx.x;
  const int E = static_cast<int>(r.E), K = static_cast<int>(r.k);
  const int e = threadIdx.x;
  const float b = e < E ? bias[e] : 0.f;  // a weight: read before waiting for the logits
  PdlBegin();
  const float logit = e < E ? LoadProduced(logits + row * E + e) : 0.f;
  RouteSigmoidRankRow(logit, b, r, sh, ids_out + row * K, w_out + row * K);
}

// RouterRouteKernel (RouterRoute, moe.cuh): block b computes the logits of experts
// [kRouterRows b, kRouterRows b + kRouterRows) for the T tokens, each thread a strided set of
// 16-byte vectors of the rows (loaded before the PDL wait: weights), fp32 products and sums,
// reduced over the block in a fixed order, rounded to bf16 as the bf16 GEMV's outputs are.
// Each block then takes a ticket; the last one (every other block's logits visible, by the
// fences around the ticket) routes the T rows as RouteSigmoidRankKernel does and clears the
// ticket for the next launch.
constexpr int kRouterRows = 2;
constexpr int kRouterVecs = 4;  // 16-byte vectors a thread holds per row: hidden <= 8 * 4 * threads
__global__ void __launch_bounds__(static_cast<int>(kMaxRoutedExperts))
    RouterRouteKernel(const uint16_t* __restrict__ w, int hidden, const uint16_t* x, int T,
                      const float* bias, cpu::SigmoidRouting r, float* logits, int32_t* ids_out,
                      float* w_out, unsigned* ticket) {
  __shared__ RankShared sh;
  __shared__ float red[kMaxRoutedExperts / 32][kMoeBlockMaxTokens * kRouterRows];
  __shared__ bool last;
  const int E = static_cast<int>(r.E), K = static_cast<int>(r.k);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
  const int e0 = blockIdx.x * kRouterRows;
  const int nvec = hidden / 8;
  uint4 wv[kRouterRows][kRouterVecs];
#pragma unroll
  for (int rr = 0; rr < kRouterRows; ++rr) {
    const int e = min(e0 + rr, E - 1);
#pragma unroll
    for (int i = 0; i < kRouterVecs; ++i) {
      const int v = tid + i * blockDim.x;
      wv[rr][i] = v < nvec ? __ldg(reinterpret_cast<const uint4*>(w + static_cast<int64_t>(e) * hidden) + v)
                           : make_uint4(0u, 0u, 0u, 0u);
    }
  }
  const float b = tid < E ? bias[tid] : 0.f;
  PdlBegin();
  float acc[kMoeBlockMaxTokens][kRouterRows];
#pragma unroll
  for (int t = 0; t < kMoeBlockMaxTokens; ++t) {
    if (t >= T) break;
    acc[t][0] = acc[t][1] = 0.f;
#pragma unroll
    for (int i = 0; i < kRouterVecs; ++i) {
      const int v = tid + i * blockDim.x;
      if (v >= nvec) break;
      const uint4 xv = LoadProduced(reinterpret_cast<const uint4*>(x + static_cast<int64_t>(t) * hidden) + v);
      const uint32_t xs[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
      for (int rr = 0; rr < kRouterRows; ++rr) {
        const uint32_t ws[4] = {wv[rr][i].x, wv[rr][i].y, wv[rr][i].z, wv[rr][i].w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          acc[t][rr] = fmaf(__uint_as_float(xs[j] << 16), __uint_as_float(ws[j] << 16), acc[t][rr]);
          acc[t][rr] = fmaf(__uint_as_float(xs[j] & 0xffff0000u), __uint_as_float(ws[j] & 0xffff0000u),
                            acc[t][rr]);
        }
      }
    }
#pragma unroll
    for (int rr = 0; rr < kRouterRows; ++rr) {
      const float v = internal::WarpSum(acc[t][rr]);
      if (lane == 0) red[warp][t * kRouterRows + rr] = v;
    }
  }
  __syncthreads();
  if (tid < T * kRouterRows) {
    const int t = tid / kRouterRows, e = e0 + tid % kRouterRows;
    float v = 0.f;
    for (int wi = 0; wi < nwarps; ++wi) v += red[wi][tid];
    if (e < E) logits[static_cast<int64_t>(t) * E + e] = qdec::RoundToBf16(v);
  }
  // Release this block's logits, then take a ticket; the last block acquires everyone's.
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(ticket, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int t = 0; t < T; ++t) {
    const float logit = tid < E ? __ldcg(logits + static_cast<int64_t>(t) * E + tid) : 0.f;
    RouteSigmoidRankRow(logit, b, r, sh, ids_out + t * K, w_out + t * K);
  }
  if (tid == 0) *ticket = 0u;
}

__global__ void RouteSoftmaxKernel(const float* gates, int64_t T, int E, int K, bool norm,
                                   cpu::ActDType rt, int32_t* ids_out, float* sc_out) {
  PdlBegin();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= T) return;
  float p[kMaxRoutedExperts];
  bool taken[kMaxRoutedExperts];
  int32_t ids[kMaxK];
  const float* g = gates + row * E;
  float mx = g[0];
  for (int e = 1; e < E; ++e) mx = fmaxf(mx, g[e]);
  float sum = 0.f;
  for (int e = 0; e < E; ++e) sum += (p[e] = expf(g[e] - mx));
  for (int e = 0; e < E; ++e) p[e] = DevRoundAct(p[e] / sum, rt);
  TopKSmall(p, E, K, taken, ids);
  float sc[kMaxK];
  float denom = 0.f;
  for (int k = 0; k < K; ++k) denom += (sc[k] = p[ids[k]]);
  if (norm) {
    denom = DevRoundAct(denom, rt);
    for (int k = 0; k < K; ++k) sc[k] = DevRoundAct(sc[k] / denom, rt);
  }
  for (int k = 0; k < K; ++k) {
    ids_out[row * K + k] = ids[k];
    sc_out[row * K + k] = sc[k];
  }
}

__global__ void CombineKernel(const float* y, const float* w, const float* shared, int64_t T,
                              int64_t K, int64_t hidden, int rounded_products, cpu::ActDType rt,
                              float* out) {
  PdlBegin();
  const int64_t n = T * hidden;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / hidden, d = idx % hidden;
    const float* yr = y + r * K * hidden + d;
    const float* wr = w + r * K;
    float acc = 0.f;
    if (rounded_products) {
      for (int64_t s = 0; s < K; ++s) acc += DevRoundAct(yr[s * hidden] * wr[s], rt);
    } else {
      for (int64_t s = 0; s < K; ++s) acc = fmaf(yr[s * hidden], wr[s], acc);
    }
    float v = DevRoundAct(acc, rt);
    if (shared != nullptr) v = DevRoundAct(v + shared[idx], rt);
    out[idx] = v;
  }
}

// ---- grouped experts (prefill) ---------------------------------------------------------------
// Slots s = t * k + j sorted by expert, stably: bucket e in [0, E) holds expert e's slots in
// slot order, bucket E the slots whose id is out of range. One block: warp w counts the
// buckets of its contiguous slot range (lanes with the same expert found by match_any, the
// lowest adds their number), the per-warp counts become each warp's base inside a bucket
// and the bucket totals the offsets, then a second pass places every slot at bucket offset
// + warp base + rank among the earlier lanes of its step. Writes off[0..E+1] and, per
// position, the slot's token (gather) and the slot itself (scatter).
constexpr int kGroupWarps = 16;

__global__ void __launch_bounds__(kGroupWarps * 32)
    GroupSlotsKernel(const int32_t* ids, int64_t S, int E, int64_t k, int32_t* off,
                     int32_t* pos_tok, int32_t* pos_slot) {
  extern __shared__ int32_t group_smem[];
  const int nb = E + 1;
  int32_t* const cnt = group_smem;                      // [kGroupWarps][nb]
  int32_t* const base = group_smem + kGroupWarps * nb;  // [nb]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int i = threadIdx.x; i < kGroupWarps * nb; i += blockDim.x) cnt[i] = 0;
  __syncthreads();
  const int64_t per = (S + kGroupWarps - 1) / kGroupWarps;
  const int64_t s0 = warp * per, s1 = min(S, s0 + per);
  auto bucket = [&](int64_t s) {
    const int32_t e = __ldg(ids + s);
    return e >= 0 && e < E ? e : E;
  };
  for (int64_t st = s0; st < s1; st += 32) {
    const int64_t s = st + lane;
    const bool live = s < s1;
    const int e = live ? bucket(s) : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    if (live && lane == __ffs(peers) - 1) cnt[warp * nb + e] += __popc(peers);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < nb; e += blockDim.x) {
    int32_t run = 0;
    for (int w = 0; w < kGroupWarps; ++w) {
      const int32_t c = cnt[w * nb + e];
      cnt[w * nb + e] = run;
      run += c;
    }
    base[e] = run;
  }
  __syncthreads();
  if (warp == 0) {
    // Exclusive scan of the bucket totals: lane l owns a contiguous segment of buckets.
    const int seg = (nb + 31) / 32, e0 = min(nb, lane * seg), e1 = min(nb, e0 + seg);
    int32_t sum = 0;
    for (int e = e0; e < e1; ++e) sum += base[e];
    const int32_t inc = internal::WarpInclusiveSum(sum);
    int32_t run = inc - sum;
    for (int e = e0; e < e1; ++e) {
      const int32_t c = base[e];
      base[e] = off[e] = run;
      run += c;
    }
    if (lane == 31) off[nb] = inc;
  }
  __syncthreads();
  for (int64_t st = s0; st < s1; st += 32) {
    const int64_t s = st + lane;
    const bool live = s < s1;
    const int e = live ? bucket(s) : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    if (live) {
      const int32_t pos = base[e] + cnt[warp * nb + e] + __popc(peers & ((1u << lane) - 1));
      pos_tok[pos] = static_cast<int32_t>(s / k);
      pos_slot[pos] = static_cast<int32_t>(s);
    }
    __syncwarp();
    if (live && lane == __ffs(peers) - 1) cnt[warp * nb + e] += __popc(peers);
    __syncwarp();
  }
}

// xg[pos, :] = bf16(x[pos_tok[pos], :]) (exact: x holds bf16 values); hidden % 8 == 0.
__global__ void GatherBf16Kernel(const float* x, const int32_t* pos_tok, int64_t S,
                                 int64_t hidden, uint16_t* xg) {
  const int64_t units = hidden / 8;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < S * units;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t pos = i / units, u = i % units;
    const float4* src = reinterpret_cast<const float4*>(x + __ldg(pos_tok + pos) * hidden) + 2 * u;
    const float4 a = __ldg(src), b = __ldg(src + 1);
    reinterpret_cast<uint4*>(xg + pos * hidden)[u] =
        make_uint4(qdec::PackBf16x2(a.x, a.y), qdec::PackBf16x2(a.z, a.w),
                   qdec::PackBf16x2(b.x, b.y), qdec::PackBf16x2(b.z, b.w));
  }
}

// NaN rows of y for the slots in bucket E (ids out of range), as the per-slot path gives.
__global__ void NanSlotsKernel(const int32_t* off, int E, const int32_t* pos_slot,
                               int64_t hidden, float* y) {
  const int32_t p0 = off[E], p1 = off[E + 1];
  for (int64_t i = p0 * hidden + threadIdx.x; i < p1 * hidden; i += blockDim.x) {
    y[pos_slot[i / hidden] * hidden + i % hidden] = __int_as_float(0x7fc00000);
  }
}

unsigned Blocks(int64_t n, int threads) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + threads - 1) / threads, 1, 65535 * 4));
}

absl::Status CheckRouting(int64_t E, int64_t k) {
  if (E <= 0 || E > kMaxRoutedExperts || k <= 0 || k > E || k > kMaxK) {
    return absl::UnimplementedError(absl::StrFormat(
        "routing: %d experts, top-%d (this build handles up to %d experts, top-%d)", E, k,
        kMaxRoutedExperts, kMaxK));
  }
  return absl::OkStatus();
}

// RouterRouteKernel's block: a thread per expert for the routing, and enough threads that
// each holds at most kRouterVecs vectors of a row; 0 past the kernel's bound.
int RouterThreads(int64_t E, int64_t hidden) {
  const int64_t by_rows = (hidden + 8 * kRouterVecs - 1) / (8 * kRouterVecs);
  const int64_t t = (std::max<int64_t>({32, E, by_rows}) + 31) / 32 * 32;
  return t <= kMaxRoutedExperts ? static_cast<int>(t) : 0;
}

}  // namespace

absl::Status RouteSigmoid(const float* logits, const float* bias, int64_t T,
                          const cpu::SigmoidRouting& r, int32_t* ids, float* weights,
                          cudaStream_t stream) {
  RING_RETURN_IF_ERROR(CheckRouting(r.E, r.k));
  if (r.n_group <= 0 || r.E % r.n_group != 0 || r.topk_group > r.n_group || r.n_group > kMaxK ||
      (r.n_group > 1 && r.E / r.n_group < 2)) {
    return absl::InvalidArgumentError("routing: bad n_group / topk_group");
  }
  if (T <= 0) return absl::OkStatus();
  if (r.n_group == 1 && T <= 0x7fffffff) {
    const int threads = static_cast<int>(std::max<int64_t>(32, (r.E + 31) / 32 * 32));
    RING_LAUNCH_PDL(RouteSigmoidRankKernel, static_cast<unsigned>(T), threads, 0, stream, logits,
                    bias, T, r, ids, weights);
  } else {
    RING_LAUNCH_PDL(RouteSigmoidKernel, Blocks(T, kRouteThreads), kRouteThreads, 0, stream, logits,
                    bias, T, r, ids, weights);
  }
  return absl::OkStatus();
}

bool RouterRouteApplies(const DeviceQuantWeight& router, const cpu::SigmoidRouting& r, int64_t T) {
  return router.spec.mode == QuantMode::kNone && router.dtype == DType::kBF16 && router.batch == 1 &&
         router.rows == r.E && router.cols % 8 == 0 && RouterThreads(r.E, router.cols) > 0 &&
         reinterpret_cast<uintptr_t>(router.weight) % 16 == 0 && CheckRouting(r.E, r.k).ok() &&
         r.n_group == 1 && T >= 1 && T <= kMoeBlockMaxTokens;
}

absl::Status RouterRoute(const DeviceQuantWeight& router, const uint16_t* x_bf16, int64_t T,
                         const float* bias, const cpu::SigmoidRouting& r, float* logits, int32_t* ids,
                         float* weights, unsigned* ticket, cudaStream_t stream) {
  if (!RouterRouteApplies(router, r, T) || x_bf16 == nullptr || ticket == nullptr ||
      reinterpret_cast<uintptr_t>(x_bf16) % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "router + routing: needs bf16 router weights [E, hidden] (hidden %% 8 == 0, at most %d), "
        "sigmoid routing without groups, 1 <= T <= %d 16-byte aligned bf16 rows and a ticket",
        8 * kRouterVecs * kMaxRoutedExperts, kMoeBlockMaxTokens));
  }
  const int threads = RouterThreads(r.E, router.cols);
  const unsigned blocks = static_cast<unsigned>((r.E + kRouterRows - 1) / kRouterRows);
  RING_LAUNCH_PDL(RouterRouteKernel, blocks, threads, 0, stream,
                  static_cast<const uint16_t*>(router.weight), static_cast<int>(router.cols), x_bf16,
                  static_cast<int>(T), bias, r, logits, ids, weights, ticket);
  return absl::OkStatus();
}

absl::Status RouteSoftmax(const float* gates, int64_t T, int64_t E, int64_t k,
                          bool norm_topk_prob, cpu::ActDType round, int32_t* ids, float* scores,
                          cudaStream_t stream) {
  RING_RETURN_IF_ERROR(CheckRouting(E, k));
  if (T <= 0) return absl::OkStatus();
  RING_LAUNCH_PDL(RouteSoftmaxKernel, Blocks(T, kRouteThreads), kRouteThreads, 0, stream, gates, T,
                  static_cast<int>(E), static_cast<int>(k), norm_topk_prob, round, ids, scores);
  return absl::OkStatus();
}

namespace {

// The grouped launches' arguments for `slots` rows over E experts (pointers filled later).
QMatmulArgs GroupedArgs(int64_t slots, int64_t E) {
  QMatmulArgs a;
  a.x_dtype = DType::kBF16;
  a.m = slots;
  a.problems = E;
  a.round_bf16 = true;
  return a;
}

// Whether the grouped GEMM takes all three matrices (DescribeQmm checks what the launch
// would check, on the host).
bool GroupedApplies(const DeviceQuantWeight& gate, const DeviceQuantWeight& up,
                    const DeviceQuantWeight& down, int64_t slots) {
  QMatmulArgs a = GroupedArgs(slots, gate.batch);
  alignas(16) static const int32_t kDummy[4] = {};
  a.row_offsets = kDummy;
  for (const DeviceQuantWeight* w : {&gate, &up, &down}) {
    if (!DescribeQmm(*w, a).ok()) return false;
  }
  return true;
}

// Tokens [0, T) of one grouped chunk (file comment of moe.cuh).
absl::Status ExpertsGrouped(const DeviceQuantWeight& gate, const DeviceQuantWeight& up,
                            const DeviceQuantWeight& down, const float* x, int64_t T,
                            const int32_t* ids, int64_t k, cpu::ActDType round, float* y,
                            cudaStream_t stream) {
  const int64_t inter = gate.rows, hidden = down.rows, E = gate.batch, S = T * k;
  RING_ASSIGN_OR_RETURN(StreamBuffer off, StreamBuffer::Allocate((E + 2) * sizeof(int32_t), stream));
  RING_ASSIGN_OR_RETURN(StreamBuffer pos_tok, StreamBuffer::Allocate(S * sizeof(int32_t), stream));
  RING_ASSIGN_OR_RETURN(StreamBuffer pos_slot, StreamBuffer::Allocate(S * sizeof(int32_t), stream));
  const size_t smem = (kGroupWarps + 1) * (E + 1) * sizeof(int32_t);
  GroupSlotsKernel<<<1, kGroupWarps * 32, smem, stream>>>(
      ids, S, static_cast<int>(E), k, off.as<int32_t>(), pos_tok.as<int32_t>(),
      pos_slot.as<int32_t>());
  RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  RING_ASSIGN_OR_RETURN(StreamBuffer xg, StreamBuffer::Allocate(S * hidden * 2, stream));
  GatherBf16Kernel<<<Blocks(S * hidden / 8, 256), 256, 0, stream>>>(
      x, pos_tok.as<int32_t>(), S, hidden, xg.as<uint16_t>());
  RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  pos_tok = StreamBuffer();
  RING_ASSIGN_OR_RETURN(StreamBuffer g, StreamBuffer::Allocate(S * inter * sizeof(float), stream));
  RING_ASSIGN_OR_RETURN(StreamBuffer u, StreamBuffer::Allocate(S * inter * sizeof(float), stream));
  QMatmulArgs a = GroupedArgs(S, E);
  a.x = xg.data();
  a.row_offsets = off.as<int32_t>();
  a.y = u.as<float>();
  RING_RETURN_IF_ERROR(QMatmulT(up, a, stream));
  a.y = g.as<float>();
  RING_RETURN_IF_ERROR(QMatmulT(gate, a, stream));
  xg = StreamBuffer();
  RING_ASSIGN_OR_RETURN(StreamBuffer h, StreamBuffer::Allocate(S * inter * 2, stream));
  RING_RETURN_IF_ERROR(SwiGlu(DevArray{g.data(), DType::kF32}, DevArray{u.data(), DType::kF32},
                              S * inter, round, DevMutArray{h.data(), DType::kBF16}, stream));
  g = StreamBuffer();
  u = StreamBuffer();
  QMatmulArgs d = GroupedArgs(S, E);
  d.x = h.data();
  d.row_offsets = off.as<int32_t>();
  d.y_rows = pos_slot.as<int32_t>();
  d.y = y;
  RING_RETURN_IF_ERROR(QMatmulT(down, d, stream));
  NanSlotsKernel<<<1, 256, 0, stream>>>(off.as<int32_t>(), static_cast<int>(E),
                                        pos_slot.as<int32_t>(), hidden, y);
  RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

// Slots per grouped chunk: bounds the gathered rows and the gate/up/SwiGLU scratch
// (32768 slots of GLM-5.2: 0.4 GB of bf16 rows, 2 x 0.27 GB fp32 gate/up).
constexpr int64_t kMaxGroupedSlots = 32768;

// Whether ExpertsSwiGlu takes the grouped GEMM (ExpertsPath).
bool UseGrouped(const DeviceQuantWeight& gate, const DeviceQuantWeight& up,
                const DeviceQuantWeight& down, int64_t T, int64_t k, cpu::ActDType round,
                ExpertsPath path) {
  if (path == ExpertsPath::kPerSlot || round != cpu::ActDType::kBF16 || k <= 0 ||
      gate.batch > kMaxRoutedExperts || k > kMaxGroupedSlots) {
    return false;
  }
  const bool affine = gate.spec.mode == QuantMode::kAffine ||
                      up.spec.mode == QuantMode::kAffine || down.spec.mode == QuantMode::kAffine;
  // Decode batches (T <= 8) keep the per-slot GEMV whatever the expert count.
  const bool worth = T > 8 && T * k >= kGroupedMinSlotsPerExpert * gate.batch;
  return (path == ExpertsPath::kGrouped || (worth && !affine)) &&
         GroupedApplies(gate, up, down, std::min(T * k, kMaxGroupedSlots));
}

}  // namespace

bool ExpertsTakeShared(const DeviceQuantWeight& gate, const DeviceQuantWeight& up,
                       const DeviceQuantWeight& down, const SharedExpertWeights& shared,
                       int64_t T, int64_t k, cpu::ActDType round, ExpertsPath path) {
  if (shared.gate == nullptr || shared.up == nullptr || shared.down == nullptr || T <= 0 ||
      k <= 0 || round != cpu::ActDType::kBF16 || T * (k + 1) > 65535 ||
      UseGrouped(gate, up, down, T, k, round, path) || !SameSliceLayout(gate, *shared.gate) ||
      !SameSliceLayout(up, *shared.up) || !SameSliceLayout(down, *shared.down)) {
    return false;
  }
  // The alt problems exist on the decode GEMV only (formats whose one-row bf16 matmul runs
  // on the tensor cores).
  QMatmulArgs probe;
  probe.x_dtype = DType::kBF16;
  for (const DeviceQuantWeight* w : {&gate, &up, &down}) {
    const absl::StatusOr<QmmPath> fam = ResolveQmmPath(*w, probe);
    if (!fam.ok() || *fam != QmmPath::kTensorCore) return false;
  }
  return true;
}

namespace {

// Problems per per-slot launch: whole tokens, at most 65535.
int64_t TokensPerSlotChunk(int64_t k) { return std::max<int64_t>(1, 65535 / k); }

// The per-slot launches' scratch of one chunk of np problems: g (gate, then SwiGLU) and u
// fp32, gb bf16, each 256-byte aligned.
struct SlotScratch {
  static size_t Piece(size_t bytes) { return (bytes + 255) / 256 * 256; }
  static size_t Bytes(int64_t np, int64_t inter) {
    return 2 * Piece(np * inter * sizeof(float)) + Piece(np * inter * sizeof(uint16_t));
  }
  SlotScratch(void* base, int64_t np, int64_t inter)
      : g(static_cast<float*>(base)),
        u(reinterpret_cast<float*>(static_cast<char*>(base) + Piece(np * inter * sizeof(float)))),
        gb(reinterpret_cast<uint16_t*>(static_cast<char*>(base) + 2 * Piece(np * inter * sizeof(float)))) {}
  float* g;
  float* u;
  uint16_t* gb;
};

}  // namespace

size_t ExpertsScratchBytes(const DeviceQuantWeight& gate, const DeviceQuantWeight& up,
                           const DeviceQuantWeight& down, int64_t T, int64_t k,
                           cpu::ActDType round, ExpertsPath path, bool with_shared) {
  if (T <= 0 || k <= 0 || UseGrouped(gate, up, down, T, k, round, path)) return 0;
  const int64_t nt = std::min(T, TokensPerSlotChunk(k));
  return SlotScratch::Bytes(nt * k + (with_shared ? nt : 0), gate.rows);
}

absl::Status ExpertsSwiGlu(const DeviceQuantWeight& gate, const DeviceQuantWeight& up,
                           const DeviceQuantWeight& down, const float* x, int64_t T,
                           const int32_t* ids, int64_t k, cpu::ActDType round, float* y,
                           cudaStream_t stream, ExpertsPath path, const uint16_t* x_bf16,
                           const SharedExpertWeights* shared, void* scratch) {
  const int64_t inter = gate.rows, hidden = down.rows;
  if (up.rows != inter || gate.cols != hidden || up.cols != hidden || down.cols != inter ||
      gate.batch != up.batch || gate.batch != down.batch) {
    return absl::InvalidArgumentError("experts: gate/up/down shapes do not match");
  }
  if (T <= 0) return absl::OkStatus();
  if (shared != nullptr && !ExpertsTakeShared(gate, up, down, *shared, T, k, round, path)) {
    return absl::InvalidArgumentError(
        "experts: the shared expert rides along only on the per-slot launches with bf16 "
        "activations, T * (k + 1) <= 65535, and matrices laid out as one expert slice");
  }
  const bool grouped = UseGrouped(gate, up, down, T, k, round, path);
  if (path == ExpertsPath::kGrouped && !grouped) {
    return absl::InvalidArgumentError(
        "experts: the grouped GEMM needs bf16 activations, at most 512 experts and formats "
        "the prefill GEMM takes");
  }
  if (grouped) {
    const int64_t tok_per_chunk = std::max<int64_t>(1, kMaxGroupedSlots / k);
    for (int64_t t0 = 0; t0 < T; t0 += tok_per_chunk) {
      const int64_t nt = std::min(tok_per_chunk, T - t0);
      RING_RETURN_IF_ERROR(ExpertsGrouped(gate, up, down, x + t0 * hidden, nt, ids + t0 * k, k,
                                          round, y + t0 * k * hidden, stream));
    }
    return absl::OkStatus();
  }
  // Problems per launch are capped (65535): whole tokens per chunk.
  const int64_t tok_per_chunk = TokensPerSlotChunk(k);
  // The caller's scratch serves every chunk in turn (one stream), else one allocation each.
  StreamBuffer owned;
  if (scratch == nullptr) {
    const int64_t nt = std::min(tok_per_chunk, T);
    RING_ASSIGN_OR_RETURN(owned, StreamBuffer::Allocate(
                                     SlotScratch::Bytes(nt * k + (shared != nullptr ? nt : 0), inter),
                                     stream));
    scratch = owned.data();
  }
  for (int64_t t0 = 0; t0 < T; t0 += tok_per_chunk) {
    // With the shared expert (one chunk: ExpertsTakeShared), its nt problems follow the
    // routed ones.
    const int64_t nt = std::min(tok_per_chunk, T - t0), nr = nt * k;
    const int64_t alt = shared != nullptr ? nt : 0, np = nr + alt;
    const SlotScratch sc(scratch, std::min(tok_per_chunk, T) * k + alt, inter);
    // The GEMVs may become resident while the kernel before them drains (overlap 1: they
    // wait for it before reading the ids or x): gpu_gemv_bench --moe, H200, one token:
    // gate+up 36.8 -> 35.4 us, down 21.3 -> 20.2 (session 16).
    QMatmulArgs a;
    a.overlap = 1;
    a.x = x + t0 * hidden;
    a.m = 1;
    a.problems = np;
    a.expert_ids = ids + t0 * k;
    a.x_problem_stride = hidden;
    a.x_problem_div = k;  // gate/up: a token's row serves its k slots
    a.y_problem_stride = inter;
    if (alt > 0) {
      a.alt_problems = alt;
      a.alt[0] = shared->gate;
      a.alt[1] = shared->up;
      a.alt_x_row0 = 0;  // the shared expert of token j reads x row j
    }
    // bf16 activations: SwiGLU also writes the bf16 copy down's GEMV reads (LinearT would
    // make the same copy in a launch of its own; same bits, the products are bf16 numbers).
    uint16_t* const gb = round == cpu::ActDType::kBF16 ? sc.gb : nullptr;
    const bool bf16_x = x_bf16 != nullptr && round == cpu::ActDType::kBF16;
    if (bf16_x) {
      // What LinearTMany runs after its own conversion of x.
      a.x = x_bf16 + t0 * hidden;
      a.x_dtype = DType::kBF16;
      a.round_bf16 = true;
    }
    // Where the GEMV can give SwiGLU's output itself (QMatmulTSwiGlu: the same bits as the
    // two launches below), gate and up never reach memory and SwiGLU has no launch.
    bool fused = false;
    if (bf16_x && FusedSwiGluEnabled()) {
      QMatmulArgs f = a;
      f.y = sc.g;
      f.y_bf16 = gb;
      const absl::Status st = QMatmulTSwiGlu(gate, up, f, stream);
      if (!absl::IsFailedPrecondition(st)) {
        RING_RETURN_IF_ERROR(st);
        fused = true;
      }
    }
    if (!fused) {
      const DeviceQuantWeight* gu[] = {&gate, &up};
      float* gu_out[] = {sc.g, sc.u};
      if (bf16_x) {
        RING_RETURN_IF_ERROR(QMatmulTMany(gu, gu_out, a, stream));
      } else {
        RING_RETURN_IF_ERROR(LinearTMany(gu, gu_out, a, round, stream));
      }
      RING_RETURN_IF_ERROR(SwiGlu(DevArray{sc.g, DType::kF32}, DevArray{sc.u, DType::kF32},
                                  np * inter, round, DevMutArray{sc.g, DType::kF32}, stream, gb));
    }
    QMatmulArgs d;
    d.overlap = 1;
    d.x = sc.g;
    d.m = 1;
    d.problems = np;
    d.expert_ids = ids + t0 * k;
    d.x_problem_stride = inter;
    d.x_problem_div = 1;  // down: one row per slot
    d.y_problem_stride = hidden;
    if (alt > 0) {
      d.alt_problems = alt;
      d.alt[0] = shared->down;
      d.alt_x_row0 = nr;  // its SwiGLU rows follow the routed slots'
    }
    d.y = y + t0 * k * hidden;
    if (round == cpu::ActDType::kBF16) {
      d.x = gb;
      d.x_dtype = DType::kBF16;
      d.round_bf16 = true;
      RING_RETURN_IF_ERROR(QMatmulT(down, d, stream));
    } else {
      RING_RETURN_IF_ERROR(LinearT(down, d, round, stream));
    }
  }
  return absl::OkStatus();
}

absl::Status MoeCombine(const float* y, const float* w, const float* shared, int64_t T,
                        int64_t k, int64_t hidden, cpu::CombineMode mode, cpu::ActDType round,
                        float* out, cudaStream_t stream) {
  if (T <= 0) return absl::OkStatus();
  if (y == nullptr || w == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("combine: null pointer");
  }
  RING_LAUNCH_PDL(CombineKernel, Blocks(T * hidden, 256), 256, 0, stream, y, w, shared, T, k,
                  hidden, mode == cpu::CombineMode::kRoundedProducts, round, out);
  return absl::OkStatus();
}

namespace {

constexpr int64_t kMoeBlockMaxT = kMoeBlockMaxTokens;

// MoeBlock's scratch, carved from one caller buffer (256-byte aligned pieces).
struct BlockScratch {
  float* logits;   // [T, E]
  int32_t* ids;    // [T, k]
  float* wts;      // [T, k]
  float* y;        // [T, k, hidden]
  float* ys;       // [T, hidden], the shared expert's output
  float* g;        // [T, inter], the shared expert's gate (then SwiGLU) and up
  float* u;
  uint16_t* gb;    // [T, inter], SwiGLU's bf16 copy
  void* experts;   // the routed experts' (ExpertsScratchBytes)
};
size_t CarveScratch(const MoeBlockArgs& a, void* base, BlockScratch* out) {
  const int64_t T = a.T, k = a.routing.k, E = a.routing.E, hidden = a.down->rows,
                inter = a.shared.gate->rows;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    void* p = base == nullptr ? nullptr : static_cast<char*>(base) + off;
    off += (bytes + 255) / 256 * 256;
    return p;
  };
  BlockScratch b;
  b.logits = static_cast<float*>(take(T * E * sizeof(float)));
  b.ids = static_cast<int32_t*>(take(T * k * sizeof(int32_t)));
  b.wts = static_cast<float*>(take(T * k * sizeof(float)));
  b.y = static_cast<float*>(take(T * k * hidden * sizeof(float)));
  b.ys = static_cast<float*>(take(T * hidden * sizeof(float)));
  b.g = static_cast<float*>(take(T * inter * sizeof(float)));
  b.u = static_cast<float*>(take(T * inter * sizeof(float)));
  b.gb = static_cast<uint16_t*>(take(T * inter * sizeof(uint16_t)));
  b.experts = take(ExpertsScratchBytes(*a.gate, *a.up, *a.down, T, k, cpu::ActDType::kBF16,
                                       ExpertsPath::kPerSlot));
  if (out != nullptr) *out = b;
  return off;
}

// A GEMV on m bf16 rows x with outputs rounded to bf16, as the CUDA backend's Linear runs it.
QMatmulArgs Bf16Gemv(const void* x, int64_t m, float* y, int overlap) {
  QMatmulArgs q;
  q.x = x;
  q.x_dtype = DType::kBF16;
  q.m = m;
  q.round_bf16 = true;
  q.overlap = overlap;
  q.y = y;
  return q;
}

// The shared expert's SwiGLU MLP on `stream`, as the CUDA backend's LinearSwiGlu and Linear
// run it (the fused SwiGLU GEMV where it takes the launch, else gate/up and SwiGlu).
absl::Status SharedMlp(const MoeBlockArgs& a, const BlockScratch& b, cudaStream_t stream) {
  const SharedExpertWeights& sh = a.shared;
  const int64_t T = a.T, inter = sh.gate->rows;
  const QMatmulArgs q = Bf16Gemv(a.x_bf16, T, b.g, 0);
  bool fused = false;
  if (FusedSwiGluEnabled()) {
    QMatmulArgs f = q;
    f.y_bf16 = b.gb;
    const absl::Status st = QMatmulTSwiGlu(*sh.gate, *sh.up, f, stream);
    if (!absl::IsFailedPrecondition(st)) {
      RING_RETURN_IF_ERROR(st);
      fused = true;
    }
  }
  if (!fused) {
    const DeviceQuantWeight* gu[] = {sh.gate, sh.up};
    float* gu_out[] = {b.g, b.u};
    RING_RETURN_IF_ERROR(QMatmulTMany(gu, gu_out, q, stream));
    RING_RETURN_IF_ERROR(SwiGlu(DevArray{b.g, DType::kF32}, DevArray{b.u, DType::kF32}, T * inter,
                                cpu::ActDType::kBF16, DevMutArray{b.g, DType::kF32}, stream, b.gb));
  }
  // overlap 2: after the gate/up launch on the same stream.
  return QMatmulT(*sh.down, Bf16Gemv(b.gb, T, b.ys, 2), stream);
}

}  // namespace

size_t MoeBlockScratchBytes(const MoeBlockArgs& a) {
  return MoeBlockApplies(a) ? CarveScratch(a, nullptr, nullptr) : 0;
}

bool MoeBlockApplies(const MoeBlockArgs& a) {
  const auto& r = a.routing;
  if (a.router == nullptr || a.bias == nullptr || a.gate == nullptr || a.up == nullptr ||
      a.down == nullptr || a.x == nullptr || a.x_bf16 == nullptr || a.out == nullptr ||
      a.T < 1 || a.T > kMoeBlockMaxT || r.k < 1 || r.E != a.gate->batch ||
      a.router->batch != 1 || a.router->rows != r.E || a.router->cols != a.gate->cols ||
      a.down->rows != a.gate->cols) {
    return false;
  }
  for (const DeviceQuantWeight* w : {a.shared.gate, a.shared.up, a.shared.down}) {
    if (w == nullptr || w->batch != 1) return false;
  }
  if (!ExpertsTakeShared(*a.gate, *a.up, *a.down, a.shared, a.T, r.k, cpu::ActDType::kBF16)) {
    return false;
  }
  alignas(16) static float dummy_y[4];
  return DescribeQmm(*a.router, Bf16Gemv(nullptr, a.T, dummy_y, a.router_overlap)).ok();
}

absl::Status MoeBlock(const MoeBlockArgs& a, void* scratch, cudaStream_t stream,
                      const SideStream* side) {
  if (!MoeBlockApplies(a) || scratch == nullptr) {
    return absl::InvalidArgumentError(
        "moe block: needs 1 <= T <= 8 bf16 tokens, matching router / expert / shared-expert "
        "shapes, formats the decode GEMV takes (ExpertsTakeShared) and its scratch");
  }
  const int64_t T = a.T, k = a.routing.k, hidden = a.down->rows;
  const auto bf16 = cpu::ActDType::kBF16;
  BlockScratch b;
  CarveScratch(a, scratch, &b);
  // The fork point is x's producer, but the router is launched first: it is on the critical
  // path, keeps its PDL start under that producer, and a shared-expert launch queued ahead of
  // it would hold the SMs its cluster needs.
  if (side != nullptr) RING_CUDA_RETURN_IF_ERROR(cudaEventRecord(side->fork, stream));
  const bool fused = a.router_ticket != nullptr && RouterRouteApplies(*a.router, a.routing, T);
  const absl::Status router_st =
      fused ? RouterRoute(*a.router, a.x_bf16, T, a.bias, a.routing, b.logits, b.ids, b.wts,
                          a.router_ticket, stream)
            : QMatmulT(*a.router, Bf16Gemv(a.x_bf16, T, b.logits, a.router_overlap), stream);
  cudaStream_t s2 = stream;
  if (side != nullptr) {
    RING_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side->stream, side->fork, 0));
    s2 = side->stream;
  }
  const absl::Status shared_st = [&]() -> absl::Status {
    RING_RETURN_IF_ERROR(router_st);
    RING_RETURN_IF_ERROR(SideStreamTestDelay(s2));
    return SharedMlp(a, b, s2);
  }();
  // The side stream is joined whatever happened, so that a capture is never left forked.
  const cudaError_t rec = side != nullptr ? cudaEventRecord(side->join, s2) : cudaSuccess;
  const absl::Status st = [&]() -> absl::Status {
    RING_RETURN_IF_ERROR(shared_st);
    if (!fused) RING_RETURN_IF_ERROR(RouteSigmoid(b.logits, a.bias, T, a.routing, b.ids, b.wts, stream));
    return ExpertsSwiGlu(*a.gate, *a.up, *a.down, a.x, T, b.ids, k, bf16, b.y, stream,
                         ExpertsPath::kPerSlot, a.x_bf16, nullptr, b.experts);
  }();
  if (side != nullptr) {
    RING_CUDA_RETURN_IF_ERROR(rec);
    RING_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, side->join, 0));
  }
  RING_RETURN_IF_ERROR(st);
  return MoeCombine(b.y, b.wts, b.ys, T, k, hidden, cpu::CombineMode::kFp32Sum, bf16, a.out,
                    stream);
}

}  // namespace ring::cuda
