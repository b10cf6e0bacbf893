// Kernels behind attention.cuh.
//
// AttentionKernel: one block per (query, head), kWarps warps (4; 16 when the grid is too
// small to fill the GPU, as in decode). The scaled query sits in
// shared memory; warp w takes keys w, w + kWarps, ...; a key's score is a lane-split dot
// product and a butterfly sum, then the warp updates its online softmax state (running max,
// running sum, and a dv-wide accumulator spread over the lanes, kMaxChunks values each).
// The warps' states are merged in shared memory, the output divided and rounded once.
// Fully masked keys (causal) are skipped, as the reference gives them probability 0;
// additive-mask keys at bf16's lowest get exp(lowest - max) = 0 once any real key is seen.
//
// The MLA composition follows cpu::MlaAttention step by step; see attention.cuh.
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

// pe[h, i, j] = round(sum_d round(q[i, h, off + d] * scale) * kpe[j, d]) over d < rope,
// sequential in d like cpu::MatMulABt; bf16's lowest where key j is not allowed.
__global__ void PeScoresKernel(const float* q, int64_t q_tok, int64_t q_head, int64_t q_off,
                               float scale, const float* kpe, int64_t rope, int64_t T,
                               int64_t H, int64_t Sk, const uint8_t* allowed,
                               int64_t causal_offset, cpu::ActDType rt, float* out) {
  const int64_t n = H * T * Sk;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = idx % Sk, i = (idx / Sk) % T, h = idx / (Sk * T);
    const float* qv = q + i * q_tok + h * q_head + q_off;
    const float* kv = kpe + j * rope;
    float dot = 0.f;
    for (int64_t d = 0; d < rope; ++d) dot = fmaf(RoundActDev(qv[d] * scale, rt), kv[d], dot);
    float v = RoundActDev(dot, rt);
    const bool ok = (causal_offset < 0 || j <= causal_offset + i) &&
                    (allowed == nullptr || allowed[i * Sk + j] != 0);
    out[idx] = ok ? v : kBf16Lowest;
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
  PeScoresKernel<<<Blocks(H * T * Sk, 256), 256, 0, stream>>>(
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
