// File: kernels/cuda/qgemv.cu
//
// Quantized GEMV/GEMM kernels (API and numerics in qgemv.cuh, decoders in quant_decode.cuh):
// the host API and dispatch, the prefill GEMM, the SIMT kernels, transpose=false and the
// embedding gather. The decode GEMV (M <= 8 on the tensor cores) is in qgemv_gemv.cu.
//
// Tensor-core GEMM (QmmTcKernel, M > 8): a warp owns row tiles of 16*WR weight rows and
// 8*NT activation rows over all of K; four warps per block share the weight tile through
// L1. Lane (g = lane/4, t = lane%4) loads chunk c = 4*kc + t (32 elements, e.g. one 16-byte
// load for 4-bit) of weight rows g and g+8 and decodes it into bf16 pairs. The k order
// inside an mma is free as long as A and B agree, so instead of shuffling weights into the
// textbook fragment order, each thread feeds its own chunk: for word group W and j in
// {0,2}, the mma's logical k slots (2t, 2t+1 | 2t+8, 2t+9) carry the chunk's elements
// (8W+j, 8W+j+4 | 8W+j+1, 8W+j+5), and the B operand (activations of token g) is permuted
// identically with two byte-permutes per pair. One 128-element k-slice (4 lanes x 32)
// therefore takes 8 mma.m16n8k16 per 16 rows with no shared memory.
// SIMT family (QmmSimtKernel): a warp owns 2 weight rows, lanes stride over chunks, each
// element is dequantized exactly (fp32) and FMAed with up to MB activation rows, then a
// butterfly reduction. QmmNKernel (transpose=false) and EmbedKernel use the same decoders.
#include "kernels/cuda/qgemv.cuh"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/qgemv_internal.cuh"
#include "kernels/cuda/quant_decode.cuh"
#include "kernels/status.h"

namespace ring::cuda {
namespace {

using namespace internal;

// ---- tensor-core kernel --------------------------------------------------------------
constexpr int kMaxTcThreads = 512;

// GEMM blocks are 4 warps, so they may use up to 255 registers per thread.
constexpr int kGemmThreads = 128;

template <class F, int WR, int NT, bool kGemv>
__global__ void __launch_bounds__(kGemv ? kMaxTcThreads : kGemmThreads)
    QmmTcKernel(QmmParams p, int warps_k) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // Chunks in flight per lane: ~32 registers of raw weights, at most 4 chunks (more only
  // spills for the narrow formats; ptxas -v shows none at these settings for 4-bit).
  constexpr int kU = 16 / (WR * F::kWords);
  constexpr int U = kGemv ? (kU < 1 ? 1 : (kU > 4 ? 4 : kU)) : 1;
  constexpr int KW = F::kWords;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int warps_tok = nwarps / warps_k;
  const int wt = warp % warps_tok, wk = warp / warps_tok;
  const int64_t prob = blockIdx.z;
  int64_t b = 0;
  const bool bad = !ProblemBatch(p, prob, &b);
  const int64_t row_base = static_cast<int64_t>(blockIdx.x) * (16 * WR);
  const int64_t tok_base = (static_cast<int64_t>(blockIdx.y) * warps_tok + wt) * (8 * NT);
  const int64_t nchunks = p.w.cols / kChunk;
  const int64_t nkc = (nchunks + 3) / 4;

  const uint32_t* wp[WR][2];
  int64_t sp[WR][2];
  bool rv[WR][2];
#pragma unroll
  for (int wr = 0; wr < WR; ++wr) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = row_base + wr * 16 + g + 8 * h;
      rv[wr][h] = !bad && row < p.w.rows;
      const int64_t r = rv[wr][h] ? row : 0;
      wp[wr][h] = RowPtr(p.w, b, r);
      sp[wr][h] = ScaleRow(p.w, b, r);
    }
  }
  const uint16_t* xp[NT];
  bool tv[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int64_t tok = tok_base + nt * 8 + g;
    tv[nt] = tok < p.m;
    xp[nt] = static_cast<const uint16_t*>(XRow(p, prob, tv[nt] ? tok : 0));
  }

  float acc[WR][NT][4];
#pragma unroll
  for (int wr = 0; wr < WR; ++wr)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[wr][nt][i] = 0.f;

  for (int64_t kc0 = wk; kc0 < nkc; kc0 += static_cast<int64_t>(U) * warps_k) {
    uint32_t raw[U][WR][2][KW];
    typename F::Scale sc[U][WR][2];
    bool cv[U];
    int64_t cc[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t kc = kc0 + static_cast<int64_t>(u) * warps_k;
      cc[u] = kc * 4 + t;
      cv[u] = kc < nkc && cc[u] < nchunks;
#pragma unroll
      for (int wr = 0; wr < WR; ++wr) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (cv[u] && rv[wr][h]) {
            LoadRaw<KW, kGemv>(wp[wr][h] + cc[u] * KW, raw[u][wr][h]);
            sc[u][wr][h] = ScaleLoader<F>::Load(p.w, sp[wr][h], cc[u]);
          } else {
#pragma unroll
            for (int i = 0; i < KW; ++i) raw[u][wr][h][i] = 0u;
            sc[u][wr][h] = F::ZeroScale();
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        uint32_t xq[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          if (cv[u] && tv[nt]) {
            const uint4 v = __ldg(reinterpret_cast<const uint4*>(xp[nt] + cc[u] * kChunk + 8 * w));
            qdec::PairsOf16bitQuad(v.x, v.y, v.z, v.w, xq[nt]);
          } else {
            xq[nt][0] = xq[nt][1] = xq[nt][2] = xq[nt][3] = 0u;
          }
        }
        uint32_t a[WR][2][4];
#pragma unroll
        for (int wr = 0; wr < WR; ++wr) {
          F::Pairs(raw[u][wr][0], w, sc[u][wr][0], a[wr][0]);
          F::Pairs(raw[u][wr][1], w, sc[u][wr][1], a[wr][1]);
        }
        // Decoding may branch per lane (e.g. mxfp4's rare slow scales); mma.sync.aligned
        // needs the whole warp converged.
        __syncwarp();
#pragma unroll
        for (int wr = 0; wr < WR; ++wr) {
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            MmaBf16(acc[wr][nt], a[wr][0][0], a[wr][1][0], a[wr][0][1], a[wr][1][1], xq[nt][0],
                    xq[nt][1]);
            MmaBf16(acc[wr][nt], a[wr][0][2], a[wr][1][2], a[wr][0][3], a[wr][1][3], xq[nt][2],
                    xq[nt][3]);
          }
        }
      }
    }
  }

  constexpr int V = WR * NT * 4;
  if (warps_k > 1) {
    extern __shared__ float red[];  // [nwarps][32][V]
    float* mine = red + (static_cast<int64_t>(warp) * 32 + lane) * V;
#pragma unroll
    for (int wr = 0; wr < WR; ++wr)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) mine[(wr * NT + nt) * 4 + i] = acc[wr][nt][i];
    __syncthreads();
    if (wk != 0) return;
    for (int j = 1; j < warps_k; ++j) {
      const float* other = red + (static_cast<int64_t>(j * warps_tok + wt) * 32 + lane) * V;
#pragma unroll
      for (int wr = 0; wr < WR; ++wr)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[wr][nt][i] += other[(wr * NT + nt) * 4 + i];
    }
  }
  float* ybase = p.y + prob * p.y_pstride;
#pragma unroll
  for (int wr = 0; wr < WR; ++wr) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t row = row_base + wr * 16 + g + (i >= 2 ? 8 : 0);
        const int64_t tok = tok_base + nt * 8 + 2 * t + (i & 1);
        if (row < p.w.rows && tok < p.m) {
          ybase[tok * p.ldy + row] = FinishOutput(acc[wr][nt][i], bad, p.round_bf16);
        }
      }
    }
  }
#else
  __trap();  // host dispatch never selects this kernel below sm_80
#endif
}

// ---- SIMT kernel ---------------------------------------------------------------------------
constexpr int kSimtWarps = 8;
constexpr int kSimtRowsPerWarp = 2;

template <class F, int MB>
__global__ void __launch_bounds__(kSimtWarps * 32) QmmSimtKernel(QmmParams p) {
  constexpr int R = kSimtRowsPerWarp;
  constexpr int KW = F::kWords;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t prob = blockIdx.z;
  int64_t b = 0;
  const bool bad = !ProblemBatch(p, prob, &b);
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kSimtWarps + warp) * R;
  const int64_t tok0 = static_cast<int64_t>(blockIdx.y) * MB;
  const int mt = static_cast<int>(min(static_cast<int64_t>(MB), p.m - tok0));
  const int64_t nchunks = p.w.cols / kChunk;

  const uint32_t* wp[R];
  int64_t sp[R];
  bool rv[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    rv[r] = !bad && row0 + r < p.w.rows;
    wp[r] = RowPtr(p.w, b, rv[r] ? row0 + r : 0);
    sp[r] = ScaleRow(p.w, b, rv[r] ? row0 + r : 0);
  }
  const void* xr[MB];
#pragma unroll
  for (int mm = 0; mm < MB; ++mm) xr[mm] = XRow(p, prob, tok0 + (mm < mt ? mm : 0));

  float acc[R][MB];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int mm = 0; mm < MB; ++mm) acc[r][mm] = 0.f;

  for (int64_t c = lane; c < nchunks; c += 32) {
    uint32_t raw[R][KW];
    typename F::Scale sc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (rv[r]) {
        LoadRaw<KW, true>(wp[r] + c * KW, raw[r]);
        sc[r] = ScaleLoader<F>::Load(p.w, sp[r], c);
      } else {
#pragma unroll
        for (int i = 0; i < KW; ++i) raw[r][i] = 0u;
        sc[r] = F::ZeroScale();
      }
    }
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      float wv[R][8];
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int e = 0; e < 8; ++e) wv[r][e] = qdec::MatElem<F>(raw[r], 8 * w + e, sc[r]);
#pragma unroll
      for (int mm = 0; mm < MB; ++mm) {
        if (mm < mt) {
          float xv[8];
          LoadX8(xr[mm], p.x_bf16, c * kChunk + 8 * w, xv);
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[r][mm] = fmaf(wv[r][e], xv[e], acc[r][mm]);
        }
      }
    }
  }
  float* ybase = p.y + prob * p.y_pstride;
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int mm = 0; mm < MB; ++mm) {
      float v = acc[r][mm];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      const int64_t row = row0 + r;
      if (lane == ((r * MB + mm) & 31) && mm < mt && row < p.w.rows) {
        ybase[(tok0 + mm) * p.ldy + row] = FinishOutput(v, bad, p.round_bf16);
      }
    }
  }
}

// Elements 8w..8w+7 of a chunk, w only known at run time (transpose=false, embedding).
// kMat: the matmul's weight value (MatElem) rather than the dequantized one (Elem).
template <class F, bool kMat>
__device__ __forceinline__ float ElemOf(const uint32_t* raw, int e, const typename F::Scale& sc) {
  if constexpr (kMat) {
    return qdec::MatElem<F>(raw, e, sc);
  } else {
    return F::Elem(raw, e, sc);
  }
}
template <class F, bool kMat>
__device__ __forceinline__ void DecodeWord(const uint32_t* raw, int w, const typename F::Scale& sc,
                                           float v[8]) {
  switch (w) {
#define RING_DECODE_CASE(W)                                                              \
  case W:                                                                                \
    _Pragma("unroll") for (int e = 0; e < 8; ++e) v[e] = ElemOf<F, kMat>(raw, 8 * W + e, sc); \
    break;
    RING_DECODE_CASE(0)
    RING_DECODE_CASE(1)
    RING_DECODE_CASE(2)
    default:
      _Pragma("unroll") for (int e = 0; e < 8; ++e) v[e] = ElemOf<F, kMat>(raw, 24 + e, sc);
      break;
#undef RING_DECODE_CASE
  }
}

// ---- transpose=false --------------------------------------------------------------------------
// y[m, cols] = x[m, rows] @ W. Thread (tx, ks): output columns 8*(unit) .. +8 of the block's
// 256-column tile, summing over weight rows ks, ks+8, ...; the 8 partial sums are reduced
// through shared memory in a fixed order.
constexpr int kNCols = 32, kNSlices = 8, kNTok = 4;

template <class F>
__global__ void __launch_bounds__(kNCols * kNSlices) QmmNKernel(QmmParams p) {
  constexpr int KW = F::kWords;
  __shared__ float red[kNSlices][kNCols][kNTok * 8 + 1];
  const int tx = threadIdx.x, ks = threadIdx.y;
  const int64_t unit = static_cast<int64_t>(blockIdx.x) * kNCols + tx;
  const int64_t chunk = unit >> 2;
  const int w = static_cast<int>(unit & 3);
  const int64_t nchunks = p.w.cols / kChunk;
  const int64_t prob = blockIdx.z;
  int64_t b = 0;
  const bool bad = !ProblemBatch(p, prob, &b);
  const bool valid = !bad && chunk < nchunks;
  const int64_t tok0 = static_cast<int64_t>(blockIdx.y) * kNTok;
  const int mt = static_cast<int>(min(static_cast<int64_t>(kNTok), p.m - tok0));
  float acc[kNTok][8];
#pragma unroll
  for (int mm = 0; mm < kNTok; ++mm)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[mm][e] = 0.f;
  if (valid) {
    const void* xr[kNTok];
#pragma unroll
    for (int mm = 0; mm < kNTok; ++mm) xr[mm] = XRow(p, prob, tok0 + (mm < mt ? mm : 0));
    for (int64_t r = ks; r < p.w.rows; r += kNSlices) {
      uint32_t raw[KW];
      LoadRaw<KW, false>(RowPtr(p.w, b, r) + chunk * KW, raw);
      const typename F::Scale sc = ScaleLoader<F>::Load(p.w, ScaleRow(p.w, b, r), chunk);
      float v[8];
      DecodeWord<F, true>(raw, w, sc, v);
#pragma unroll
      for (int mm = 0; mm < kNTok; ++mm) {
        if (mm < mt) {
          const float xv = LoadX1(xr[mm], p.x_bf16, r);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[mm][e] = fmaf(xv, v[e], acc[mm][e]);
        }
      }
    }
  }
#pragma unroll
  for (int mm = 0; mm < kNTok; ++mm)
#pragma unroll
    for (int e = 0; e < 8; ++e) red[ks][tx][mm * 8 + e] = acc[mm][e];
  __syncthreads();
  if (ks != 0 || chunk >= nchunks) return;
  float* ybase = p.y + prob * p.y_pstride;
  for (int mm = 0; mm < mt; ++mm) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      float s = 0.f;
      for (int j = 0; j < kNSlices; ++j) s += red[j][tx][mm * 8 + e];
      ybase[(tok0 + mm) * p.ldy + chunk * kChunk + 8 * w + e] = FinishOutput(s, bad, p.round_bf16);
    }
  }
}

// ---- embedding rows ---------------------------------------------------------------------------
template <class F>
__global__ void EmbedKernel(WeightView v, const int32_t* ids, void* out, int out_bf16) {
  constexpr int KW = F::kWords;
  const int64_t unit = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t chunk = unit >> 2;
  const int w = static_cast<int>(unit & 3);
  if (chunk >= v.cols / kChunk) return;
  const int64_t tok = blockIdx.y;
  const int64_t id = __ldg(ids + tok);
  const bool bad = id < 0 || id >= v.rows;
  float val[8];
  if (bad) {
#pragma unroll
    for (int e = 0; e < 8; ++e) val[e] = __int_as_float(0x7fc00000);
  } else {
    uint32_t raw[KW];
    LoadRaw<KW, false>(RowPtr(v, 0, id) + chunk * KW, raw);
    DecodeWord<F, false>(raw, w, ScaleLoader<F>::Load(v, ScaleRow(v, 0, id), chunk), val);
  }
  const int64_t o = tok * v.cols + chunk * kChunk + 8 * w;
  if (out_bf16) {
    uint4 q;
    q.x = qdec::PackBf16x2(val[0], val[1]);
    q.y = qdec::PackBf16x2(val[2], val[3]);
    q.z = qdec::PackBf16x2(val[4], val[5]);
    q.w = qdec::PackBf16x2(val[6], val[7]);
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(out) + o) = q;
  } else {
    float4* q = reinterpret_cast<float4*>(static_cast<float*>(out) + o);
    q[0] = make_float4(val[0], val[1], val[2], val[3]);
    q[1] = make_float4(val[4], val[5], val[6], val[7]);
  }
}

// ---- fast-decoder self check ------------------------------------------------------------------
template <class F>
__global__ void FastDecodeCheckKernel(WeightView v, unsigned long long* mismatches) {
  const int64_t nchunks = v.cols / kChunk;
  const int64_t total = v.rows * nchunks;
  unsigned long long bad = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / nchunks, c = i % nchunks;
    uint32_t raw[F::kWords];
    LoadRaw<F::kWords, false>(RowPtr(v, 0, row) + c * F::kWords, raw);
    const typename F::Scale sc = ScaleLoader<F>::Load(v, ScaleRow(v, 0, row), c);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      uint32_t fast[4], ref[4];
      F::Pairs(raw, w, sc, fast);
      qdec::GenericPairs<F>(raw, w, sc, ref);
#pragma unroll
      for (int j = 0; j < 4; ++j) bad += fast[j] != ref[j];
    }
  }
  if (bad) atomicAdd(mismatches, bad);
}

// ---- host side ------------------------------------------------------------------------------
int BitsOf(const DeviceQuantWeight& w) {
  if (w.spec.mode == QuantMode::kNone) return DTypeSize(w.dtype) * 8;
  return w.spec.bits;
}

absl::Status ValidateWeight(const DeviceQuantWeight& w) {
  // Formatted here rather than by QuantSpec::ToString so this library does not need the CPU
  // reference's object code.
  const std::string what =
      absl::StrFormat("weight (mode %d, %d bits, group %d) [%d, %d, %d]",
                      static_cast<int>(w.spec.mode), w.spec.bits, w.spec.group_size, w.batch,
                      w.rows, w.cols);
  if (w.weight == nullptr) return absl::InvalidArgumentError(what + ": no data");
  if (w.batch <= 0 || w.rows <= 0 || w.cols <= 0) {
    return absl::InvalidArgumentError(what + ": empty shape");
  }
  if (w.cols % kChunk != 0) {
    return absl::UnimplementedError(what + ": the quantized axis must be a multiple of 32");
  }
  switch (w.spec.mode) {
    case QuantMode::kNone:
      if (w.dtype != DType::kF32 && w.dtype != DType::kF16 && w.dtype != DType::kBF16) {
        return absl::InvalidArgumentError(what + ": unquantized weights must be F32/F16/BF16");
      }
      return absl::OkStatus();
    case QuantMode::kAffine: {
      const int bits = w.spec.bits, g = w.spec.group_size;
      if (bits != 2 && bits != 3 && bits != 4 && bits != 5 && bits != 6 && bits != 8) {
        return absl::InvalidArgumentError(what + ": affine bits must be 2,3,4,5,6 or 8");
      }
      if (g != 32 && g != 64 && g != 128) {
        return absl::InvalidArgumentError(what + ": affine group must be 32, 64 or 128");
      }
      if (w.scale_dtype != DType::kF32 && w.scale_dtype != DType::kF16 &&
          w.scale_dtype != DType::kBF16) {
        return absl::InvalidArgumentError(what + ": affine scales must be F32/F16/BF16");
      }
      if (w.scales == nullptr || w.biases == nullptr) {
        return absl::InvalidArgumentError(what + ": affine needs scales and biases");
      }
      return absl::OkStatus();
    }
    case QuantMode::kMxfp4:
    case QuantMode::kMxfp8:
    case QuantMode::kNvfp4: {
      const int want_bits = w.spec.mode == QuantMode::kMxfp8 ? 8 : 4;
      const int want_g = w.spec.mode == QuantMode::kNvfp4 ? 16 : 32;
      if (w.spec.bits != want_bits || w.spec.group_size != want_g) {
        return absl::InvalidArgumentError(what + ": wrong bits/group for the mode");
      }
      if (w.scales == nullptr || w.scale_dtype != DType::kU8) {
        return absl::InvalidArgumentError(what + ": fp modes need U8 scales");
      }
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(what + ": unknown mode");
}

WeightView MakeView(const DeviceQuantWeight& w) {
  WeightView v{};
  v.w = static_cast<const uint32_t*>(w.weight);
  v.scales = w.scales;
  v.biases = w.biases;
  v.batch = w.batch;
  v.rows = w.rows;
  v.cols = w.cols;
  v.row_words = w.cols * BitsOf(w) / 32;
  v.scale_cols = w.spec.mode == QuantMode::kNone ? 0 : w.cols / w.spec.group_size;
  v.group_shift = 0;
  if (w.spec.mode == QuantMode::kAffine) {
    for (int g = w.spec.group_size / kChunk; g > 1; g >>= 1) ++v.group_shift;
  }
  // As the CPU reference: fp32(global_scale / 2688); 0 marks "no global scale".
  v.gs_factor = (w.spec.mode == QuantMode::kNvfp4 && w.global_scale != 0.f)
                    ? w.global_scale / 2688.0f
                    : 0.f;
  return v;
}

// THE dispatch point from a runtime weight description to a decoder type: every op in this
// file instantiates its kernels through here and nowhere else.
template <class Fn>
absl::Status WithFormat(const DeviceQuantWeight& w, Fn&& fn) {
  RING_RETURN_IF_ERROR(ValidateWeight(w));
  switch (w.spec.mode) {
    case QuantMode::kMxfp4:
      return fn(qdec::Mxfp4{});
    case QuantMode::kNvfp4:
      return fn(qdec::Nvfp4{});
    case QuantMode::kMxfp8:
      return fn(qdec::Mxfp8{});
    case QuantMode::kNone:
      switch (w.dtype) {
        case DType::kBF16: return fn(qdec::DenseBf16{});
        case DType::kF16: return fn(qdec::DenseF16{});
        default: return fn(qdec::DenseF32{});
      }
    case QuantMode::kAffine: {
      auto by_bits = [&](auto scale_tag) -> absl::Status {
        using ST = decltype(scale_tag);
        switch (w.spec.bits) {
          case 2: return fn(qdec::Affine<2, ST>{});
          case 3: return fn(qdec::Affine<3, ST>{});
          case 4: return fn(qdec::Affine<4, ST>{});
          case 5: return fn(qdec::Affine<5, ST>{});
          case 6: return fn(qdec::Affine<6, ST>{});
          default: return fn(qdec::Affine<8, ST>{});
        }
      };
      switch (w.scale_dtype) {
        case DType::kBF16: return by_bits(qdec::ScaleBf16{});
        case DType::kF16: return by_bits(qdec::ScaleF16{});
        default: return by_bits(qdec::ScaleF32{});
      }
    }
  }
  return absl::InternalError("unreachable quant mode");
}

absl::Status CheckPtr(const void* p, int64_t ld, int elem_bytes, const char* what) {
  if (p == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, " is null"));
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0 || (ld * elem_bytes) % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s must be 16-byte aligned with a row stride of a multiple of 16 bytes (ld = %d)", what,
        ld));
  }
  return absl::OkStatus();
}

// Shared argument checks; fills the kernel parameters. `k` is the contraction length.
absl::StatusOr<QmmParams> MakeParams(const DeviceQuantWeight& w, const QMatmulArgs& a,
                                     int64_t k, int64_t n_out) {
  if (a.x_dtype != DType::kF32 && a.x_dtype != DType::kBF16) {
    return absl::InvalidArgumentError("x must be F32 or BF16");
  }
  if (a.m <= 0 || a.problems <= 0) return absl::InvalidArgumentError("empty matmul");
  if (a.problems > 65535) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d problems in one launch (max 65535)", a.problems));
  }
  if (a.x_problem_div <= 0) return absl::InvalidArgumentError("x_problem_div must be >= 1");
  if (a.expert_ids == nullptr && w.batch > 1 && a.batch_begin + a.problems > w.batch) {
    return absl::InvalidArgumentError("batch range past the stacked weight");
  }
  QmmParams p{};
  p.w = MakeView(w);
  p.x = a.x;
  p.x_bf16 = a.x_dtype == DType::kBF16;
  p.ldx = a.ldx > 0 ? a.ldx : k;
  p.m = a.m;
  p.y = a.y;
  p.ldy = a.ldy > 0 ? a.ldy : n_out;
  p.ids = a.expert_ids;
  p.batch_begin = a.batch_begin;
  p.x_pstride = a.x_problem_stride;
  p.x_pdiv = a.x_problem_div;
  p.y_pstride = a.y_problem_stride;
  p.round_bf16 = a.round_bf16;
  if (p.ldx < k || p.ldy < n_out) return absl::InvalidArgumentError("row stride below width");
  RING_RETURN_IF_ERROR(CheckPtr(a.x, p.ldx, p.x_bf16 ? 2 : 4, "x"));
  if ((p.x_pstride * (p.x_bf16 ? 2 : 4)) % 16 != 0) {
    return absl::InvalidArgumentError("x_problem_stride must keep 16-byte alignment");
  }
  if (a.y == nullptr) return absl::InvalidArgumentError("y is null");
  return p;
}

enum class Family { kSimt, kTcGemv, kTcGemm };

// bf16_exact: the format's values are bf16 (F::kBf16Exact) for this weight; nvfp4 with a
// global scale is not (its dequantized values stay fp32).
bool Bf16Exact(bool format_exact, const DeviceQuantWeight& w) {
  return format_exact && !(w.spec.mode == QuantMode::kNvfp4 && w.global_scale != 0.f);
}

// Auto: M <= 8 takes the decode GEMV where it has a kernel for the format, else the exact
// SIMT kernel (never the GEMM, whose affine weights are rounded to bf16); M > 8 takes the
// GEMM for formats with bf16 values, else SIMT. Forced kTensorCore: the GEMV where it
// applies, else the GEMM.
absl::StatusOr<Family> PickFamily(bool bf16_exact, const DeviceQuantWeight& w, const QMatmulArgs& a) {
  if (a.path == QmmPath::kSimt) return Family::kSimt;
  absl::StatusOr<const DeviceInfo*> dev = CurrentDevice();
  if (!dev.ok()) return dev.status();
  const bool hw = UseTensorCoreMatmul(**dev);
  const bool bf16_x = a.x_dtype == DType::kBF16;
  const bool gemv = hw && bf16_x && a.m <= 8 && GemvSupports(w);
  const bool gemm = hw && bf16_x && bf16_exact;
  if (a.path == QmmPath::kTensorCore) {
    if (gemv) return Family::kTcGemv;
    if (gemm) return Family::kTcGemm;
    return absl::InvalidArgumentError(
        "tensor-core path needs bf16 x, sm_80+ code and a format with exact bf16 values (or "
        "4-bit affine at M <= 8)");
  }
  if (a.m <= 8) return gemv ? Family::kTcGemv : Family::kSimt;
  return gemm ? Family::kTcGemm : Family::kSimt;
}

template <class F>
absl::Status LaunchT(const DeviceQuantWeight& w, const QmmParams& p, const QMatmulArgs& a,
                     Family fam, cudaStream_t stream, std::string* describe) {
  const int64_t rows = p.w.rows;
  const int64_t problems = a.problems;
  if (fam == Family::kTcGemv) return LaunchGemv(w, p, problems, a.overlap, stream, describe);
  if (fam == Family::kTcGemm) {
    if constexpr (F::kBf16Exact) {
      constexpr int WR = F::kWords >= 8 ? 1 : 2;
      constexpr int NT = 4, kWarpsTok = 4;
      const dim3 grid(static_cast<unsigned>((rows + 16 * WR - 1) / (16 * WR)),
                      static_cast<unsigned>((p.m + 8 * NT * kWarpsTok - 1) / (8 * NT * kWarpsTok)),
                      static_cast<unsigned>(problems));
      if (grid.y > 65535) return absl::InvalidArgumentError("too many activation rows");
      if (describe != nullptr) {
        *describe = absl::StrFormat("gemm wr%d nt%d blk%d grid%dx%dx%d", WR, NT, kGemmThreads,
                                    grid.x, grid.y, grid.z);
        return absl::OkStatus();
      }
      static_assert(kWarpsTok * 32 == kGemmThreads);
      QmmTcKernel<F, WR, NT, false><<<grid, kGemmThreads, 0, stream>>>(p, 1);
      RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
      return absl::OkStatus();
    }
    return absl::InternalError("tensor-core path picked for a non-bf16 format");
  }
  const int64_t rows_per_block = kSimtWarps * kSimtRowsPerWarp;
  const int mb = p.m == 1 ? 1 : 8;
  const dim3 grid(static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block),
                  static_cast<unsigned>((p.m + mb - 1) / mb), static_cast<unsigned>(problems));
  if (grid.y > 65535) return absl::InvalidArgumentError("too many activation rows");
  if (describe != nullptr) {
    *describe = absl::StrFormat("simt mb%d blk%d grid%dx%dx%d", mb, kSimtWarps * 32, grid.x,
                                grid.y, grid.z);
    return absl::OkStatus();
  }
  if (mb == 1) {
    QmmSimtKernel<F, 1><<<grid, kSimtWarps * 32, 0, stream>>>(p);
  } else {
    QmmSimtKernel<F, 8><<<grid, kSimtWarps * 32, 0, stream>>>(p);
  }
  RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace

const char* QmmPathName(QmmPath p) {
  switch (p) {
    case QmmPath::kAuto: return "auto";
    case QmmPath::kSimt: return "simt";
    case QmmPath::kTensorCore: return "tc";
  }
  return "?";
}

absl::StatusOr<OwnedDeviceWeight> UploadQuantWeight(const QuantWeight& w) {
  OwnedDeviceWeight o;
  DeviceQuantWeight& v = o.view;
  v.spec = w.spec;
  v.dtype = w.weight.dtype;
  v.scale_dtype = w.scales.present() ? w.scales.dtype : DType::kU8;
  v.global_scale = w.global_scale;
  const Shape& s = w.weight.shape;
  if (s.size() < 2) return absl::InvalidArgumentError("weight must be at least 2-D: " + w.name);
  // Shapes are read off the views here (not through quant.cc) so the CUDA library does not
  // depend on the CPU reference's object code.
  v.rows = s[s.size() - 2];
  v.cols = w.spec.mode == QuantMode::kNone ? s.back() : s.back() * 32 / w.spec.bits;
  v.batch = 1;
  for (size_t i = 0; i + 2 < s.size(); ++i) v.batch *= s[i];
  RING_ASSIGN_OR_RETURN(o.weight, DeviceBuffer::FromHost(w.weight.data, w.weight.nbytes()));
  v.weight = o.weight.data();
  if (w.scales.present()) {
    RING_ASSIGN_OR_RETURN(o.scales, DeviceBuffer::FromHost(w.scales.data, w.scales.nbytes()));
    v.scales = o.scales.data();
  }
  if (w.biases.present()) {
    RING_ASSIGN_OR_RETURN(o.biases, DeviceBuffer::FromHost(w.biases.data, w.biases.nbytes()));
    v.biases = o.biases.data();
  }
  RING_RETURN_IF_ERROR(ValidateWeight(v));
  return o;
}

absl::StatusOr<QmmPath> ResolveQmmPath(const DeviceQuantWeight& w, const QMatmulArgs& a) {
  QmmPath out = QmmPath::kSimt;
  RING_RETURN_IF_ERROR(WithFormat(w, [&](auto fmt) -> absl::Status {
    using F = decltype(fmt);
    RING_ASSIGN_OR_RETURN(const Family fam, PickFamily(Bf16Exact(F::kBf16Exact, w), w, a));
    out = fam == Family::kSimt ? QmmPath::kSimt : QmmPath::kTensorCore;
    return absl::OkStatus();
  }));
  return out;
}

absl::Status QMatmulT(const DeviceQuantWeight& w, const QMatmulArgs& a, cudaStream_t stream) {
  return WithFormat(w, [&](auto fmt) -> absl::Status {
    using F = decltype(fmt);
    RING_ASSIGN_OR_RETURN(const QmmParams p, MakeParams(w, a, w.cols, w.rows));
    RING_ASSIGN_OR_RETURN(const Family fam, PickFamily(Bf16Exact(F::kBf16Exact, w), w, a));
    return LaunchT<F>(w, p, a, fam, stream, nullptr);
  });
}

absl::StatusOr<std::string> DescribeQmm(const DeviceQuantWeight& w, const QMatmulArgs& a) {
  std::string out;
  RING_RETURN_IF_ERROR(WithFormat(w, [&](auto fmt) -> absl::Status {
    using F = decltype(fmt);
    QMatmulArgs probe = a;
    // Parameter checks need pointers; describing needs none of the data.
    alignas(16) static const float kDummy[4] = {};
    if (probe.x == nullptr) probe.x = kDummy;
    if (probe.y == nullptr) probe.y = const_cast<float*>(kDummy);
    RING_ASSIGN_OR_RETURN(const QmmParams p, MakeParams(w, probe, w.cols, w.rows));
    RING_ASSIGN_OR_RETURN(const Family fam, PickFamily(Bf16Exact(F::kBf16Exact, w), w, probe));
    return LaunchT<F>(w, p, probe, fam, nullptr, &out);
  }));
  return out;
}

absl::Status QMatmulN(const DeviceQuantWeight& w, const QMatmulArgs& a, cudaStream_t stream) {
  return WithFormat(w, [&](auto fmt) -> absl::Status {
    using F = decltype(fmt);
    if (a.path == QmmPath::kTensorCore) {
      return absl::InvalidArgumentError("transpose=false has only the SIMT kernel");
    }
    RING_ASSIGN_OR_RETURN(const QmmParams p, MakeParams(w, a, w.rows, w.cols));
    const int64_t units = w.cols / 8;
    const dim3 grid(static_cast<unsigned>((units + kNCols - 1) / kNCols),
                    static_cast<unsigned>((a.m + kNTok - 1) / kNTok),
                    static_cast<unsigned>(a.problems));
    if (grid.y > 65535) return absl::InvalidArgumentError("too many activation rows");
    QmmNKernel<F><<<grid, dim3(kNCols, kNSlices), 0, stream>>>(p);
    RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  });
}

absl::Status EmbedRows(const DeviceQuantWeight& w, const int32_t* ids, int64_t n, void* out,
                       DType out_dtype, cudaStream_t stream) {
  return WithFormat(w, [&](auto fmt) -> absl::Status {
    using F = decltype(fmt);
    if (w.batch != 1) return absl::InvalidArgumentError("embedding weight must be 2-D");
    if (out_dtype != DType::kF32 && out_dtype != DType::kBF16) {
      return absl::InvalidArgumentError("embedding output must be F32 or BF16");
    }
    if (n <= 0) return absl::OkStatus();
    if (n > 65535) return absl::InvalidArgumentError("more than 65535 ids in one call");
    if (ids == nullptr || out == nullptr) return absl::InvalidArgumentError("null pointer");
    if (reinterpret_cast<uintptr_t>(out) % 16 != 0) {
      return absl::InvalidArgumentError("embedding output must be 16-byte aligned");
    }
    const int64_t units = w.cols / 8;
    const int threads = 128;
    const dim3 grid(static_cast<unsigned>((units + threads - 1) / threads),
                    static_cast<unsigned>(n));
    EmbedKernel<F><<<grid, threads, 0, stream>>>(MakeView(w), ids, out,
                                                 out_dtype == DType::kBF16);
    RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  });
}

absl::StatusOr<int64_t> TEST_CountFastDecodeMismatches(const DeviceQuantWeight& w) {
  int64_t result = 0;
  RING_RETURN_IF_ERROR(WithFormat(w, [&](auto fmt) -> absl::Status {
    using F = decltype(fmt);
    if constexpr (F::kBf16Exact) {
      if (!Bf16Exact(true, w)) return absl::OkStatus();
      RING_ASSIGN_OR_RETURN(DeviceBuffer counter, DeviceBuffer::Allocate(sizeof(unsigned long long)));
      RING_RETURN_IF_ERROR(counter.Zero());
      FastDecodeCheckKernel<F><<<256, 256>>>(MakeView(w), counter.as<unsigned long long>());
      RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
      unsigned long long host = 0;
      RING_RETURN_IF_ERROR(counter.CopyToHost(&host, sizeof(host)));
      result = static_cast<int64_t>(host);
    }
    return absl::OkStatus();
  }));
  return result;
}

}  // namespace ring::cuda
