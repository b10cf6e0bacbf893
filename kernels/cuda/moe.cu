// Kernels behind moe.cuh.
#include "kernels/cuda/moe.cuh"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/linear.cuh"
#include "kernels/cuda/quant_decode.cuh"
#include "kernels/status.h"

namespace ring::cuda {
namespace {

constexpr int kRouteThreads = 64;
constexpr int kMaxK = 64;

__device__ __forceinline__ float RoundActDev(float v, cpu::ActDType t) {
  switch (t) {
    case cpu::ActDType::kBF16: return qdec::RoundToBf16(v);
    case cpu::ActDType::kF16: return qdec::RoundToF16(v);
    default: return v;
  }
}

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


// RouteSigmoidKernel for n_group == 1, one block of kRouteBlockThreads per row: the scores in
// shared memory, then k rounds of a block arg-max over the untaken experts (higher value,
// then lower index: the set TopKSmall takes); thread 0 forms the weights in ascending id
// order as the one-thread kernel does, so ids and weights are bit-identical to it.
constexpr int kRouteBlockThreads = 256;

__global__ void __launch_bounds__(kRouteBlockThreads)
    RouteSigmoidBlockKernel(const float* logits, const float* bias, int64_t T,
                            cpu::SigmoidRouting r, int32_t* ids_out, float* w_out) {
  __shared__ float s[kMaxRoutedExperts], sel[kMaxRoutedExperts];
  __shared__ bool taken[kMaxRoutedExperts];
  __shared__ float wv[kRouteBlockThreads / 32];
  __shared__ int wi[kRouteBlockThreads / 32];
  const int64_t row = blockIdx.x;
  const int E = static_cast<int>(r.E), K = static_cast<int>(r.k);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    s[e] = 1.f / (1.f + expf(-logits[row * E + e]));
    sel[e] = s[e] + bias[e];
    taken[e] = false;
  }
  __syncthreads();
  for (int k = 0; k < K; ++k) {
    float bv = -INFINITY;
    int bi = -1;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      if (taken[e]) continue;
      if (bi < 0 || sel[e] > bv) {  // ascending e per thread: ties keep the lower index
        bv = sel[e];
        bi = e;
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
      if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) {
        bv = ov;
        bi = oi;
      }
    }
    if (lane == 0) {
      wv[warp] = bv;
      wi[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float v = wv[0];
      int i = wi[0];
      for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) {
        if (wi[w] >= 0 && (i < 0 || wv[w] > v || (wv[w] == v && wi[w] < i))) {
          v = wv[w];
          i = wi[w];
        }
      }
      taken[i] = true;
    }
    __syncthreads();
  }
  if (threadIdx.x != 0) return;
  int32_t ids[kMaxK];
  int c = 0;
  for (int e = 0; e < E && c < K; ++e)
    if (taken[e]) ids[c++] = e;
  WriteSigmoidRoute(s, ids, K, r, ids_out + row * K, w_out + row * K);
}

__global__ void RouteSoftmaxKernel(const float* gates, int64_t T, int E, int K, bool norm,
                                   cpu::ActDType rt, int32_t* ids_out, float* sc_out) {
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
  for (int e = 0; e < E; ++e) p[e] = RoundActDev(p[e] / sum, rt);
  TopKSmall(p, E, K, taken, ids);
  float sc[kMaxK];
  float denom = 0.f;
  for (int k = 0; k < K; ++k) denom += (sc[k] = p[ids[k]]);
  if (norm) {
    denom = RoundActDev(denom, rt);
    for (int k = 0; k < K; ++k) sc[k] = RoundActDev(sc[k] / denom, rt);
  }
  for (int k = 0; k < K; ++k) {
    ids_out[row * K + k] = ids[k];
    sc_out[row * K + k] = sc[k];
  }
}

__global__ void CombineKernel(const float* y, const float* w, const float* shared, int64_t T,
                              int64_t K, int64_t hidden, int rounded_products, cpu::ActDType rt,
                              float* out) {
  const int64_t n = T * hidden;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / hidden, d = idx % hidden;
    const float* yr = y + r * K * hidden + d;
    const float* wr = w + r * K;
    float acc = 0.f;
    if (rounded_products) {
      for (int64_t s = 0; s < K; ++s) acc += RoundActDev(yr[s * hidden] * wr[s], rt);
    } else {
      for (int64_t s = 0; s < K; ++s) acc = fmaf(yr[s * hidden], wr[s], acc);
    }
    float v = RoundActDev(acc, rt);
    if (shared != nullptr) v = RoundActDev(v + shared[idx], rt);
    out[idx] = v;
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
    RouteSigmoidBlockKernel<<<static_cast<unsigned>(T), kRouteBlockThreads, 0, stream>>>(
        logits, bias, T, r, ids, weights);
  } else {
    RouteSigmoidKernel<<<Blocks(T, kRouteThreads), kRouteThreads, 0, stream>>>(logits, bias, T,
                                                                                r, ids, weights);
  }
  RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status RouteSoftmax(const float* gates, int64_t T, int64_t E, int64_t k,
                          bool norm_topk_prob, cpu::ActDType round, int32_t* ids, float* scores,
                          cudaStream_t stream) {
  RING_RETURN_IF_ERROR(CheckRouting(E, k));
  if (T <= 0) return absl::OkStatus();
  RouteSoftmaxKernel<<<Blocks(T, kRouteThreads), kRouteThreads, 0, stream>>>(
      gates, T, static_cast<int>(E), static_cast<int>(k), norm_topk_prob, round, ids, scores);
  RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status ExpertsSwiGlu(const DeviceQuantWeight& gate, const DeviceQuantWeight& up,
                           const DeviceQuantWeight& down, const float* x, int64_t T,
                           const int32_t* ids, int64_t k, cpu::ActDType round, float* y,
                           cudaStream_t stream) {
  const int64_t inter = gate.rows, hidden = down.rows;
  if (up.rows != inter || gate.cols != hidden || up.cols != hidden || down.cols != inter ||
      gate.batch != up.batch || gate.batch != down.batch) {
    return absl::InvalidArgumentError("experts: gate/up/down shapes do not match");
  }
  if (T <= 0) return absl::OkStatus();
  // Problems per launch are capped (65535): whole tokens per chunk.
  const int64_t tok_per_chunk = std::max<int64_t>(1, 65535 / k);
  for (int64_t t0 = 0; t0 < T; t0 += tok_per_chunk) {
    const int64_t nt = std::min(tok_per_chunk, T - t0), np = nt * k;
    RING_ASSIGN_OR_RETURN(StreamBuffer g, StreamBuffer::Allocate(np * inter * sizeof(float), stream));
    RING_ASSIGN_OR_RETURN(StreamBuffer u, StreamBuffer::Allocate(np * inter * sizeof(float), stream));
    QMatmulArgs a;
    a.x = x + t0 * hidden;
    a.m = 1;
    a.problems = np;
    a.expert_ids = ids + t0 * k;
    a.x_problem_stride = hidden;
    a.x_problem_div = k;  // gate/up: a token's row serves its k slots
    a.y_problem_stride = inter;
    a.y = u.as<float>();
    RING_RETURN_IF_ERROR(LinearT(up, a, round, stream));
    a.y = g.as<float>();
    RING_RETURN_IF_ERROR(LinearT(gate, a, round, stream));
    RING_RETURN_IF_ERROR(SwiGlu(DevArray{g.data(), DType::kF32}, DevArray{u.data(), DType::kF32},
                                np * inter, round, DevMutArray{g.data(), DType::kF32}, stream));
    QMatmulArgs d;
    d.x = g.data();
    d.m = 1;
    d.problems = np;
    d.expert_ids = ids + t0 * k;
    d.x_problem_stride = inter;
    d.x_problem_div = 1;  // down: one row per slot
    d.y_problem_stride = hidden;
    d.y = y + t0 * k * hidden;
    RING_RETURN_IF_ERROR(LinearT(down, d, round, stream));
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
  CombineKernel<<<Blocks(T * hidden, 256), 256, 0, stream>>>(
      y, w, shared, T, k, hidden, mode == cpu::CombineMode::kRoundedProducts, round, out);
  RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace ring::cuda
