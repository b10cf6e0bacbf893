// File: kernels/cuda/qgemv_gemv.cu
//
// The decode GEMV: y[m, rows] = x[m, cols] @ W^T for m <= 8 bf16 activation rows, on the
// tensor cores (bf16 mma.sync m16n8k16, fp32 accumulation). Memory-bound by design: every
// weight byte is read once with 16-byte (or 8-byte) streaming loads, whatever m is; the 8
// token columns of the mma are free, so m = 8 costs what m = 1 costs.
//
// Work split. A warp owns a tile of 16*WR weight rows (WR = 1 or 2) and a contiguous range
// of K steps; warps_k warps of a block share a tile and reduce their partial sums through
// shared memory in a fixed order (deterministic). Lane (g = lane/4, t = lane%4) holds rows
// g and g+8 of each 16-row sub-tile and, in step s, slice 4s+t of those rows; the 4 lanes of
// a quad therefore read 4 consecutive slices of a row (64 contiguous bytes for 4-bit
// formats). A lane issues all its loads of a batch of U steps (16-byte loads at constant
// offsets from one pointer per row) before decoding any (2-4 KB in flight per warp).
// A matrix of few row tiles (a MoE router: 16 tiles would leave 116 of 132 SMs idle) also
// splits each tile's K steps over a cluster of up to 8 blocks (sm_90+), whose sums rank 0
// adds through distributed shared memory in rank order (QmmParams::kblocks).
//
// Cost model (H200, ncu, lm_head mxfp4, session 8): the kernel is bound by instruction
// issue, not by DRAM: it executed ~3.0 instructions per weight per lane at ~63% issue
// efficiency, which capped it near 70% of the bandwidth probe. Since then mxfp4 weights sit
// in the GPU nibble order (qdec::Mxfp4, Repack at upload): the decode with the group scale
// folded in is 12 instructions per 8 weights (17 from the MLX order), and one trip of the
// full-batch loop on the fast path (256 weights per lane; bench/gpu/sass_loop_count.py on
// sm_90 SASS) is 617 instructions for WR = 2 and 642 for WR = 1 (777 / 802 before). 32-row
// tiles (WR = 2) halve the activation loads and permutes per weight.
//
// Operand order. The k order inside an mma is free as long as A and B agree: lane t feeds
// its own slice, pairing elements (8W+j, 8W+j+4) of each 8-element block W (the cheap order
// for packed nibbles, qdec::*Pairs); its B operand (activations of token g) is the same
// 8 elements permuted with byte permutes (qdec::PairsOf16bitQuad).
//
// Two decode policies:
//   OwnChunk<F>  mxfp4 / nvfp4 (no global scale) / mxfp8 / bf16: slice = one 32-element
//                chunk; the group scale is folded into the bf16 weights (exact: these
//                formats' values are bf16 numbers), accumulation straight into the mma.
//   Affine4<LW>  4-bit affine, group G = 32*LW: the quad shares one group per step (lane
//                slice = LW words), so an mma never mixes groups. A = 128 + q (exact), and
//                per group, in fp32: acc += s * sum x (128 + q) + (b - 128 s) * sum x, with
//                sum x from one extra mma against ones. No weight is ever rounded: the
//                result is the fp32 weights' dot product up to summation order (the CPU
//                reference computes w = fma(s, q, b) in fp32, MLX's CPU/Metal kernels do
//                the same per-group sums). At m <= 2 affine takes the column split instead
//                (QgemvColKernel<ColAffine4>, below).
//
// Programmatic dependent launch (QMatmulArgs::overlap, sm_90): every block triggers its
// dependents at once, so the next kernel in the stream can become resident while this one
// drains. overlap 1 waits (griddepcontrol.wait) before any memory access; overlap 2 issues
// the first batch of weight loads before waiting, hiding their latency under the previous
// kernel's tail (expert ids, x and y are only touched after the wait).
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "absl/strings/str_format.h"
#include "kernels/cuda/act_round.cuh"
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/qgemv_internal.cuh"
#include "kernels/cuda/quant_decode.cuh"

namespace ring::cuda {
namespace internal {
namespace {

constexpr int kGemvMaxThreads = 512;
constexpr uint32_t kFullMask = 0xffffffffu;

// Weight loads: read once, so they bypass L1 (no_allocate).
template <int kWords>
__device__ __forceinline__ void LoadStream(const uint32_t* p, uint32_t* raw) {
  if constexpr (kWords % 4 == 0) {
#pragma unroll
    for (int i = 0; i < kWords / 4; ++i) {
      asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
          : "=r"(raw[4 * i]), "=r"(raw[4 * i + 1]), "=r"(raw[4 * i + 2]), "=r"(raw[4 * i + 3])
          : "l"(p + 4 * i));
    }
  } else if constexpr (kWords == 2) {
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(raw[0]), "=r"(raw[1]) : "l"(p));
  } else {
    static_assert(kWords == 1);
    asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(raw[0]) : "l"(p));
  }
}

// ---- decode policies -----------------------------------------------------------------------
// Raw scale bits of one chunk (kept in one register while the loads are in flight).
template <class F>
struct ChunkScale {  // dense matrices: no scales
  static constexpr bool kHasFast = false;
  __device__ static uint32_t LoadAt(const uint8_t*, int) { return 0u; }
  __device__ static typename F::Scale Make(uint32_t, const WeightView&) { return F::ZeroScale(); }
};
template <>
struct ChunkScale<qdec::Mxfp4> {
  static constexpr bool kHasFast = true;
  // `row` points at the row's first scale byte.
  __device__ static uint32_t LoadAt(const uint8_t* row, int c) { return __ldg(row + c); }
  __device__ static bool Fast(uint32_t u) { return u <= 128u; }
  __device__ static qdec::Mxfp4::Scale Make(uint32_t u, const WeightView&) {
    return qdec::Mxfp4::MakeScale(u);
  }
};
template <>
struct ChunkScale<qdec::Mxfp8> {
  static constexpr bool kHasFast = false;
  __device__ static uint32_t LoadAt(const uint8_t* row, int c) { return __ldg(row + c); }
  __device__ static qdec::Mxfp8::Scale Make(uint32_t u, const WeightView&) {
    return qdec::Mxfp8::MakeScale(u);
  }
};
template <>
struct ChunkScale<qdec::Nvfp4> {
  static constexpr bool kHasFast = false;
  __device__ static uint32_t LoadAt(const uint8_t* row, int c) {
    return __ldg(reinterpret_cast<const uint16_t*>(row + 2 * c));
  }
  __device__ static qdec::Nvfp4::Scale Make(uint32_t two, const WeightView& v) {
    return qdec::Nvfp4::MakeScale(two, v.gs_factor);
  }
};

template <class F>
struct OwnChunk {
  static constexpr bool kAffine = false;
  static constexpr int kScaleEntryBytes = 1;  // u8 scales (dense: unused)
  static constexpr int kWords = F::kWords;  // words per lane slice (one chunk)
  static constexpr int kBlocks = 4;         // 8-element blocks per slice
  static constexpr int kSliceElems = qdec::kChunk;
  using Fmt = F;
};

template <int LW, class ST>
struct Affine4 {
  static constexpr bool kAffine = true;
  static constexpr int kWords = LW;
  static constexpr int kBlocks = LW;
  static constexpr int kSliceElems = 8 * LW;
  static constexpr int kScaleEntryBytes = 2;
  using Scale = ST;

  // Scale and bias of group `grp` packed as (bias << 16) | scale (16-bit dtypes only):
  // `row` points at the row's first scale, its bias sits `bdelta` bytes further.
  __device__ static uint32_t LoadAt(const uint8_t* row, int64_t bdelta, int grp) {
    const uint32_t sv = __ldg(reinterpret_cast<const uint16_t*>(row) + grp);
    const uint32_t bv = __ldg(reinterpret_cast<const uint16_t*>(row + bdelta) + grp);
    return sv | (bv << 16);
  }
  __device__ static float S(uint32_t sb) { return ST::Load(sb & 0xffffu); }
  __device__ static float B(uint32_t sb) { return ST::Load(sb >> 16); }
};

// Bytes between the scales of consecutive chunks as LoadAt(row, c) addresses them, so that
// LoadAt(row + c0 * bytes, c) == LoadAt(row, c0 + c).
template <class P>
__host__ __device__ constexpr int ScaleBytesPerChunk() {
  if constexpr (P::kAffine) {
    return 0;
  } else if constexpr (std::is_same_v<typename P::Fmt, qdec::Nvfp4>) {
    return 2;
  } else if constexpr (std::is_same_v<typename P::Fmt, qdec::Mxfp4> ||
                       std::is_same_v<typename P::Fmt, qdec::Mxfp8>) {
    return 1;
  } else {
    return 0;  // dense: no scales
  }
}

// A warp's steps of its K split: a contiguous range, a multiple of U long, so that only the
// warp holding the matrix's last steps has a partial batch; full_end ends the steps whose
// four slices all exist.
struct StepRange {
  int begin, end, full_end;
};
template <int U>
__device__ __forceinline__ StepRange WarpSteps(int nsteps, int nslices, int warps_k, int wk) {
  const int per0 = (nsteps + warps_k - 1) / warps_k;
  const int per = (per0 + U - 1) / U * U;
  const int begin = wk * per;
  const int end = min(nsteps, begin + per);
  return {begin, end, min(end, nslices >> 2)};
}

// The K split's partial sums, reduced through shared memory `red` ([warp][WR * 4][32]) in a
// fixed order (deterministic); false for the warps whose sums went to warp wk == 0.
template <int WR>
__device__ __forceinline__ bool KSplitReduce(float (&acc)[WR][4], float* red, int warps_k) {
  if (warps_k <= 1) return true;
  constexpr int V = WR * 4;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int wr = 0; wr < WR; ++wr)
#pragma unroll
    for (int i = 0; i < 4; ++i) red[(warp * V + wr * 4 + i) * 32 + lane] = acc[wr][i];
  __syncthreads();
  if (warp % warps_k != 0) return false;
  for (int j = 1; j < warps_k; ++j) {
#pragma unroll
    for (int wr = 0; wr < WR; ++wr)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[wr][i] += red[((warp + j) * V + wr * 4 + i) * 32 + lane];
  }
  return true;
}

// The K split across the blocks of a cluster (QmmParams::kblocks): each block's reduced sums
// (held by its `lead` warps, one per tile `tl`) go to its shared `xs` ([tiles][WR * 4][32]),
// and rank 0 adds the other ranks' in rank order (deterministic). Every thread of the
// cluster must call it; true for the warps that hold the tile's total (rank 0's leads).
template <int WR>
__device__ __forceinline__ bool ClusterKReduce(float (&acc)[WR][4], float* xs, bool lead, int tl) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  constexpr int V = WR * 4;
  const int lane = threadIdx.x & 31;
  if (lead) {
#pragma unroll
    for (int wr = 0; wr < WR; ++wr)
#pragma unroll
      for (int i = 0; i < 4; ++i) xs[(tl * V + wr * 4 + i) * 32 + lane] = acc[wr][i];
  }
  cluster.sync();
  const bool root = cluster.block_rank() == 0;
  if (root && lead) {
    for (unsigned r = 1; r < cluster.num_blocks(); ++r) {
      const float* o = cluster.map_shared_rank(xs, r);
#pragma unroll
      for (int wr = 0; wr < WR; ++wr)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[wr][i] += o[(tl * V + wr * 4 + i) * 32 + lane];
    }
  }
  cluster.sync();  // the other ranks' shared memory stays until rank 0 has read it
  return root && lead;
#else
  return lead;  // never launched with a cluster below sm_90
#endif
}

// Writes the mma accumulators: c0/c1 row g, tokens tok0 and tok0 + 1; c2/c3 row g + 8
// (tok0 = 2t in the mma's layout; the column split sums its quad into lane t = 0 first).
template <int WR>
__device__ __forceinline__ void StoreRowTokens(const float (&acc)[WR][4], const QmmParams& p, int part,
                                               int64_t prob, int64_t row_base, int64_t rows, bool bad,
                                               int tok0) {
  const int g = (threadIdx.x & 31) >> 2;
  float* yp = nullptr;
  int64_t ldy = 0;
  GemvPartOutput(p, part, &yp, &ldy);
  float* ybase = yp + prob * p.y_pstride;
  uint16_t* bbase = p.y_bf16 != nullptr ? p.y_bf16 + prob * p.y_pstride : nullptr;
#pragma unroll
  for (int wr = 0; wr < WR; ++wr) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t row = row_base + wr * 16 + g + (i >= 2 ? 8 : 0);
      const int64_t tok = tok0 + (i & 1);
      if (row < rows && tok < p.m) {
        const float v = FinishOutput(acc[wr][i], bad, p.round_bf16);
        ybase[tok * ldy + row] = v;
        // v is a bf16 number (round_bf16): its high half is its bf16 encoding.
        if (bbase != nullptr) bbase[tok * ldy + row] = static_cast<uint16_t>(__float_as_uint(v) >> 16);
      }
    }
  }
}

// The fused SwiGLU output of a paired tile (QmmParams::swiglu), for the column split's lane
// t = 0 (its sums of tokens 0 and 1): c0/c1 are gate's sums of row r_base + 8 wr + g, c2/c3
// up's of the same row. Each is finished as a plain output (bf16 rounding, NaN for a bad
// expert id), then combined as cpu::SwiGlu does; y and its bf16 copy as StoreRowTokens.
template <int WR>
__device__ __forceinline__ void StoreSwiGluRows(const float (&acc)[WR][4], const QmmParams& p, int64_t prob,
                                                int64_t r_base, int64_t rows, bool bad) {
  const int g = (threadIdx.x & 31) >> 2;
  const auto rt = static_cast<cpu::ActDType>(p.swiglu - 1);
  float* ybase = p.y + prob * p.y_pstride;
  uint16_t* bbase = p.y_bf16 != nullptr ? p.y_bf16 + prob * p.y_pstride : nullptr;
#pragma unroll
  for (int wr = 0; wr < WR; ++wr) {
    const int64_t row = r_base + wr * 8 + g;
#pragma unroll
    for (int tok = 0; tok < 2; ++tok) {
      if (row < rows && tok < p.m) {
        const float v = SwiGluOne(FinishOutput(acc[wr][tok], bad, p.round_bf16),
                                  FinishOutput(acc[wr][2 + tok], bad, p.round_bf16), rt);
        ybase[tok * p.ldy + row] = v;
        if (bbase != nullptr) bbase[tok * p.ldy + row] = static_cast<uint16_t>(qdec::F32ToBf16Bits(v));
      }
    }
  }
}

// ---- the kernel ------------------------------------------------------------------------------
// Indices of steps and slices are 32-bit (they count 16-byte pieces of one row); the few
// 64-bit row pointers are computed once. Rows past the matrix end read the last row (valid
// memory, results never written) and a bad expert id reads slice 0 (its outputs become
// NaN), so the loads of a full batch need no predicates; only the tail batch of a warp's
// step range (steps past the range, or slices past the row end when cols % 128 != 0) is
// predicated and zero-filled. pdl: 0 plain launch; 1 / 2 = QMatmulArgs::overlap.
template <class P, int WR, int U>
__global__ void __launch_bounds__(kGemvMaxThreads, 1)
    QgemvKernel(QmmParams p, int warps_k, int tiles_pb, int pdl) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int KW = P::kWords;
  constexpr int NB = P::kBlocks;
  constexpr int SE = P::kSliceElems;
  constexpr uint32_t kOnes = 0x3f803f80u;  // bf16x2 (1, 1)
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int warp = threadIdx.x >> 5;
  const int wk = warp % warps_k, tl = warp / warps_k;
  if (pdl != 0) PdlLaunchDependents();
  const bool early = pdl == 2 && p.ids == nullptr;
  if (pdl != 0 && !early) PdlWait();

  const int64_t prob = blockIdx.z;
  WeightView wv = p.w;
  int64_t bx = blockIdx.x;
  const int part = p.nparts > 1 ? SelectGemvPart(p, &wv, &bx) : 0;
  int64_t b = 0;
  const bool bad = !ProblemWeight(p, part, prob, &wv, &b);
  if (bad) b = 0;
  const int64_t row_base = (bx * tiles_pb + tl) * (16 * WR);
  const int nslices = static_cast<int>(wv.cols / SE);
  const int nsteps = (nslices + 3) >> 2;

  const uint32_t* wp[WR][2];
  const uint8_t* sp[WR][2];
#pragma unroll
  for (int wr = 0; wr < WR; ++wr) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = min(row_base + wr * 16 + g + 8 * h, wv.rows - 1);
      wp[wr][h] = RowPtr(wv, b, row) + t * KW;
      sp[wr][h] = static_cast<const uint8_t*>(wv.scales) + ScaleRow(wv, b, row) * P::kScaleEntryBytes;
    }
  }
  int64_t bdelta = 0;
  if constexpr (P::kAffine) {
    bdelta = static_cast<const uint8_t*>(wv.biases) - static_cast<const uint8_t*>(wv.scales);
  }
  const bool tv = g < p.m;
  // x of token g is read only after the dependency wait; the pointer itself is plain math.
  const uint16_t* xg = static_cast<const uint16_t*>(XRow(p, prob, tv ? g : 0)) + t * SE;

  float acc[WR][4];
#pragma unroll
  for (int wr = 0; wr < WR; ++wr)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[wr][i] = 0.f;

  const int kb = p.kblocks > 1 ? p.kblocks : 1;
  const StepRange range =
      WarpSteps<U>(nsteps, nslices, warps_k * kb, static_cast<int>(blockIdx.y) * warps_k + wk);
  const int s_begin = range.begin, s_end = range.end, full_end = range.full_end;

  auto batch = [&]<bool kFull>(int s0) {
    uint32_t raw[U][WR][2][KW];
    uint32_t sr[U][WR][2];
    bool sv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) sv[u] = kFull || (s0 + u < s_end && 4 * (s0 + u) + t < nslices);
#pragma unroll
    for (int wr = 0; wr < WR; ++wr) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // One pointer per row and batch; the U steps are constant offsets from it.
        const uint32_t* q = wp[wr][h] + static_cast<uint32_t>(s0 * (4 * KW));
        const uint8_t* sq = sp[wr][h] + static_cast<uint32_t>(
            P::kAffine ? s0 * P::kScaleEntryBytes : (4 * s0 + t) * ScaleBytesPerChunk<P>());
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (sv[u]) {
            LoadStream<KW>(q + u * (4 * KW), raw[u][wr][h]);
            if constexpr (P::kAffine) {
              sr[u][wr][h] = P::LoadAt(sq, bdelta, u);  // the quad's group
            } else {
              sr[u][wr][h] = ChunkScale<typename P::Fmt>::LoadAt(sq, 4 * u);
            }
          } else {
#pragma unroll
            for (int i = 0; i < KW; ++i) raw[u][wr][h][i] = 0u;
            sr[u][wr][h] = 0u;
          }
        }
      }
    }
    if (early) PdlWait();

    // mxfp4: one warp-wide vote per batch picks the fast decoder (every scale <= 2^1).
    bool fast = false;
    if constexpr (!P::kAffine) {
      if constexpr (ChunkScale<typename P::Fmt>::kHasFast) {
        bool mine = true;
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int wr = 0; wr < WR; ++wr)
            mine = mine && ChunkScale<typename P::Fmt>::Fast(sr[u][wr][0]) &&
                   ChunkScale<typename P::Fmt>::Fast(sr[u][wr][1]);
        fast = __all_sync(kFullMask, mine);
      }
    }
    (void)fast;

#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int xoff = (s0 + u) * (4 * SE);
      uint32_t xq[NB][4];
#pragma unroll
      for (int w = 0; w < NB; ++w) {
        if (sv[u] && tv) {
          const uint4 v = LoadProduced(reinterpret_cast<const uint4*>(xg + xoff + 8 * w));
          qdec::PairsOf16bitQuad(v.x, v.y, v.z, v.w, xq[w]);
        } else {
          xq[w][0] = xq[w][1] = xq[w][2] = xq[w][3] = 0u;
        }
      }
      if constexpr (P::kAffine) {
        float cg[WR][4], xs[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int wr = 0; wr < WR; ++wr)
#pragma unroll
          for (int i = 0; i < 4; ++i) cg[wr][i] = 0.f;
#pragma unroll
        for (int w = 0; w < NB; ++w) {
#pragma unroll
          for (int wr = 0; wr < WR; ++wr) {
            uint32_t a0[4], a1[4];
            qdec::Affine4BiasedPairs(raw[u][wr][0][w], a0);
            qdec::Affine4BiasedPairs(raw[u][wr][1][w], a1);
            MmaBf16(cg[wr], a0[0], a1[0], a0[1], a1[1], xq[w][0], xq[w][1]);
            MmaBf16(cg[wr], a0[2], a1[2], a0[3], a1[3], xq[w][2], xq[w][3]);
          }
          MmaBf16(xs, kOnes, kOnes, kOnes, kOnes, xq[w][0], xq[w][1]);
          MmaBf16(xs, kOnes, kOnes, kOnes, kOnes, xq[w][2], xq[w][3]);
        }
        // c0/c1: row g, tokens 2t/2t+1; c2/c3: row g+8. xs[0] = xs[2] = sum x of token 2t.
#pragma unroll
        for (int wr = 0; wr < WR; ++wr) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float sc = P::S(sr[u][wr][h]);
            const float bb = fmaf(-128.f, sc, P::B(sr[u][wr][h]));
            acc[wr][2 * h] = fmaf(bb, xs[0], fmaf(sc, cg[wr][2 * h], acc[wr][2 * h]));
            acc[wr][2 * h + 1] = fmaf(bb, xs[1], fmaf(sc, cg[wr][2 * h + 1], acc[wr][2 * h + 1]));
          }
        }
      } else {
        using F = typename P::Fmt;
        using CS = ChunkScale<F>;
        if (fast) {
          if constexpr (CS::kHasFast) {
            uint32_t f2[WR][2];
#pragma unroll
            for (int wr = 0; wr < WR; ++wr) {
              f2[wr][0] = F::FastFactor(sr[u][wr][0]);
              f2[wr][1] = F::FastFactor(sr[u][wr][1]);
            }
#pragma unroll
            for (int w = 0; w < NB; ++w) {
#pragma unroll
              for (int wr = 0; wr < WR; ++wr) {
                uint32_t a0[4], a1[4];
                F::PairsFast(raw[u][wr][0][w], f2[wr][0], a0);
                F::PairsFast(raw[u][wr][1][w], f2[wr][1], a1);
                MmaBf16(acc[wr], a0[0], a1[0], a0[1], a1[1], xq[w][0], xq[w][1]);
                MmaBf16(acc[wr], a0[2], a1[2], a0[3], a1[3], xq[w][2], xq[w][3]);
              }
            }
          }
        } else {
#pragma unroll
          for (int w = 0; w < NB; ++w) {
#pragma unroll
            for (int wr = 0; wr < WR; ++wr) {
              uint32_t a0[4], a1[4];
              // F::Pairs may branch per lane (mxfp4's rare huge scales take the generic path).
              F::Pairs(raw[u][wr][0], w, CS::Make(sr[u][wr][0], wv), a0);
              F::Pairs(raw[u][wr][1], w, CS::Make(sr[u][wr][1], wv), a1);
              __syncwarp();
              MmaBf16(acc[wr], a0[0], a1[0], a0[1], a1[1], xq[w][0], xq[w][1]);
              MmaBf16(acc[wr], a0[2], a1[2], a0[3], a1[3], xq[w][2], xq[w][3]);
            }
          }
        }
      }
    }
  };

  int s0 = s_begin;
  for (; s0 + U <= full_end; s0 += U) batch.template operator()<true>(s0);
  for (; s0 < s_end; s0 += U) batch.template operator()<false>(s0);
  if (early) PdlWait();  // warps that had no step still must not write before it

  extern __shared__ float red[];  // [warp][WR * 4][32] (warps_k > 1), then [tile][WR * 4][32]
  const bool lead = KSplitReduce<WR>(acc, red, warps_k);
  if (kb > 1) {
    float* xs = red + (warps_k > 1 ? (blockDim.x >> 5) * WR * 4 * 32 : 0);
    if (!ClusterKReduce<WR>(acc, xs, lead, tl)) return;
  } else if (!lead) {
    return;
  }
  StoreRowTokens<WR>(acc, p, part, prob, row_base, wv.rows, bad, 2 * t);
#else
  __trap();  // host dispatch never selects this kernel below sm_80
#endif
}

// ---- column-split kernel: mxfp4 (variants 2..6), 4-bit affine (4 and 6) ------------------
// The same work split, loads and operand order as QgemvKernel<OwnChunk<Mxfp4>, WR, U>, but
// the group scale leaves the weight decode: the mma gets scale-free E2M1 values and the
// scale is applied once per chunk, in fp32, on the accumulators. That is possible because
// each lane's slice is one whole chunk (one group): the 8 token columns of the mma (of
// which m <= 2 are used) are spent on keeping the 4 lanes of a quad apart. Column n =
// (quad lane n >> 1, token n & 1): lane (g, t) feeds its B operand (the activations of
// token g & 1 at its own slice) only when g >> 1 == t and zero otherwise, so column n sums
// lane n >> 1's chunk alone, and lane t's accumulators c0/c1 (columns 2t, 2t+1) are its own
// chunk's partial dot products for tokens 0 and 1 (rows g, g+8 in c2/c3): one scale per
// accumulator pair, the one the lane loads anyway. Per step: the mmas of a chunk go into a
// zeroed fragment, then acc += scale * fragment (4 FFMA per 16 rows). The quad's 4 chunks
// are summed once at the end (2 shuffles), after the K-split reduction.
// Per 8 weights this drops the bf16 multiply by the group scale (kSubnormal: 8 instead of
// 12 decode instructions in the GPU nibble order) and the per-chunk factor, and adds one
// FFMA per 16 weights; the activation permutes stay (plus, for kSubnormal, one bf16x2
// multiply per activation pair) unless kSmemX stages them. sm_90 SASS, one trip of the
// full-batch loop on the fast path (256 weights per lane; bench/gpu/sass_loop_count.py,
// session 15): QgemvKernel 617 (WR = 2) / 642 (WR = 1) instructions, kSubnormal 581 (WR = 1),
// kSubnormal + kSmemX 430 (WR = 2) / 427 (WR = 1), i.e. 2.41 / 2.51 / 2.27 / 1.68 / 1.67 per
// weight and lane (the MLX order gave 777, 802, -, 589, -). Timed on the H200
// (AutoVariant): the column split with 16-row tiles wins at m <= 2 where the 32-row kernel
// has too few warps, and with staged activations on tall matrices with short rows.
// Numerics: every product in the mma is exact and every scale multiply is a power of two,
// so the result is the CPU reference's function up to fp32 summation order, with two
// operand-range conditions for kSubnormal (not for kUnit):
//   kSubnormal: A = E2M1 * 2^-126 (Mxfp4::PairsTiny; +-0.5 is a bf16 subnormal, which the
//     mma must take as such: DeviceInfo::mma_bf16_subnormals probes it on every device,
//     and the harness checks whole matmuls) and B = x * 2^64, so the fragment is
//     2^-62 * sum(E2M1 x): |x| must stay below 2^64 (bf16 activations far below that in
//     practice), and the factor 2^(u-65) is a normal fp32 number for u <= 192; a batch
//     with a larger scale (weights >= 2^66, never in real checkpoints) takes two exact
//     multiplies instead (warp vote).
//   kUnit: A = E2M1 exactly (PairsUnit, a multiply by the constant 2^126), B = x, factor
//     2^(u-127) as the reference (E8M0ToF32; u = 0 and 255 included). The control variant:
//     it isolates the column split from the subnormal operand.
// kSmemX (variant 4, with kSubnormal): the block first writes its tokens' activations to
// shared memory once, already permuted to the pair order and scaled by 2^64, so the inner
// loop reads each lane's B operand with one 16-byte shared load per 8 activations instead
// of a global load, 4 byte permutes and 4 bf16x2 multiplies. It waits for the previous
// kernel before that (overlap 2 behaves as overlap 1) and needs m * cols * 2 bytes (+16
// per token) of shared memory.
// Only m <= 2 (two token columns per quad lane); Launch never selects it otherwise.
//
// The 4-bit affine formats take the same kernel (ColAffine4, variants 4 and 6 only): each
// chunk's A operand is 128 + q (exact, Affine4BiasedPairs) and its fragment c = sum x (128 +
// q) gets the group's s and b on the accumulators, acc += s c + (b - 128 s) sum x, where the
// chunk's sum x per token comes from shared memory (summed once per block while staging x,
// in a fixed order). Against QgemvKernel<Affine4> (a quad shares one group a step, 8-byte
// loads, sum x from extra mmas) a lane reads 16 bytes a row and step and the mma count per
// weight halves. Same numerics as the reference up to fp32 summation order, but not the same
// order as QgemvKernel<Affine4> at m >= 3 (batching changes the last bits, as for mxfp4).
//
// Fused SwiGLU (QmmParams::swiglu; QMatmulTSwiGlu): a launch of gate and up whose
// tiles hold 8 rows of gate in their first half (rows g) and the same 8 rows of up in their
// second (rows g + 8), so lane t = 0 ends with both products of its rows and stores
// SwiGLU(gate, up) instead of the two (StoreSwiGluRows). Each row's sum is the one the
// plain two-weight launch computes (same K split: the launch is shaped as the same number of
// weight rows), so the output equals that launch followed by the SwiGLU kernel bit for bit.
template <bool kSubnormal>
struct ColMxfp4 {
  static constexpr bool kAffine = false;
  static constexpr bool kVote = kSubnormal;   // batches with huge scales take two multiplies
  static constexpr bool kXTwo64 = kSubnormal;  // B = x * 2^64
  static constexpr bool kSumX = false;
  // Raw scale of chunk c of the row whose scales start at `row` (bdelta unused).
  __device__ static uint32_t LoadScale(const uint8_t* row, int64_t, uint32_t c) { return __ldg(row + c); }
  __device__ static bool Small(uint32_t su) { return su <= 192u; }
  __device__ static void Decode(uint32_t v, uint32_t (&a)[4]) {
    if constexpr (kSubnormal) {
      qdec::Mxfp4::PairsTiny(v, a);
    } else {
      qdec::Mxfp4::PairsUnit(v, a);
    }
  }
  // acc[0..1] += the chunk's fragment c[0..1] (tokens 0 and 1 of one row) scaled.
  template <bool kBig>
  __device__ static void Apply(float* acc, const float* c, uint32_t su, float2) {
    if constexpr (kSubnormal) {
      if constexpr (!kBig) {
        const float f = __uint_as_float((su + 62u) << 23);  // 2^(u-65), u <= 192
        acc[0] = fmaf(c[0], f, acc[0]);
        acc[1] = fmaf(c[1], f, acc[1]);
      } else {
        const float f = qdec::E8M0ToF32(su);
        acc[0] = fmaf(c[0] * 0x1p62f, f, acc[0]);
        acc[1] = fmaf(c[1] * 0x1p62f, f, acc[1]);
      }
    } else {
      const float f = qdec::E8M0ToF32(su);
      acc[0] = fmaf(c[0], f, acc[0]);
      acc[1] = fmaf(c[1], f, acc[1]);
    }
  }
};
template <int kGroupShift, class ST>
struct ColAffine4 {
  static constexpr bool kAffine = true;
  static constexpr bool kVote = false;
  static constexpr bool kXTwo64 = false;
  static constexpr bool kSumX = true;
  // (bias << 16) | scale of chunk c's group; the row's biases sit `bdelta` bytes after its
  // scales.
  __device__ static uint32_t LoadScale(const uint8_t* row, int64_t bdelta, uint32_t c) {
    const uint16_t* s = reinterpret_cast<const uint16_t*>(row) + (c >> kGroupShift);
    const uint32_t sv = __ldg(s);
    const uint32_t bv = __ldg(reinterpret_cast<const uint16_t*>(reinterpret_cast<const uint8_t*>(s) + bdelta));
    return sv | (bv << 16);
  }
  __device__ static bool Small(uint32_t) { return true; }
  __device__ static void Decode(uint32_t v, uint32_t (&a)[4]) { qdec::Affine4BiasedPairs(v, a); }
  template <bool kBig>
  __device__ static void Apply(float* acc, const float* c, uint32_t sb, float2 sx) {
    const float sc = ST::Load(sb & 0xffffu);
    const float bb = fmaf(-128.f, sc, ST::Load(sb >> 16));
    acc[0] = fmaf(bb, sx.x, fmaf(sc, c[0], acc[0]));
    acc[1] = fmaf(bb, sx.y, fmaf(sc, c[1], acc[1]));
  }
};

template <class C, int WR, int U, bool kSmemX>
__global__ void __launch_bounds__(kGemvMaxThreads, 1)
    QgemvColKernel(QmmParams p, int warps_k, int tiles_pb, int pdl) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  static_assert(kSmemX || !C::kSumX, "the chunks' sums of x are staged with x");
  constexpr int KW = 4;  // 4 words = one 32-element chunk per lane and row
  constexpr int NB = 4;
  constexpr int SE = qdec::kChunk;
  constexpr int kScaleBytes = C::kAffine ? 2 : 1;
  constexpr uint32_t kX2Two64 = 0x5f805f80u;  // bf16x2 (2^64, 2^64)
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int warp = threadIdx.x >> 5;
  const int wk = warp % warps_k, tl = warp / warps_k;
  if (pdl != 0) PdlLaunchDependents();
  const bool early = !kSmemX && pdl == 2 && p.ids == nullptr;
  // The staged 4-bit affine kernel under overlap 2 (no earlier kernel writes its weights):
  // the warp's first batch of weights is prefetched into L2 before the wait (below, once the
  // row pointers exist), so that it arrives while the previous kernel drains and x is staged.
  const bool prefetch = kSmemX && C::kAffine && pdl == 2 && p.ids == nullptr;
  if (pdl != 0 && !early && !prefetch) PdlWait();

  const int64_t prob = blockIdx.z;
  WeightView wv = p.w;
  int64_t bx = blockIdx.x;
  // Fused SwiGLU (QmmParams::swiglu): row half h of every tile reads part h (gate, up) at
  // the same 8 rows, so each lane ends with both sums of its rows.
  const bool paired = p.swiglu != 0;
  const int part = p.nparts > 1 && !paired ? SelectGemvPart(p, &wv, &bx) : 0;
  int64_t b = 0;
  bool bad = !ProblemWeight(p, part, prob, &wv, &b);
  WeightView wv_up = wv;
  int64_t b_up = b;
  if (paired) {
    wv_up.w = p.parts[1].w;
    wv_up.scales = p.parts[1].scales;
    wv_up.biases = p.parts[1].biases;
    wv_up.rows = p.parts[1].rows;
    bad = !ProblemWeight(p, 1, prob, &wv_up, &b_up) || bad;
  }
  if (bad) b = b_up = 0;
  const int64_t row_base = (bx * tiles_pb + tl) * (16 * WR);
  const int nslices = static_cast<int>(wv.cols / SE);
  const int nsteps = (nslices + 3) >> 2;
  constexpr int V = WR * 4;
  extern __shared__ uint4 dyn_smem[];  // [K-split reduction][staged x]

  const uint32_t* wp[WR][2];
  const uint8_t* sp[WR][2];
#pragma unroll
  for (int wr = 0; wr < WR; ++wr) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int64_t row = min(row_base + wr * 16 + g + 8 * h, wv.rows - 1);
      const WeightView* vh = &wv;
      int64_t bh = b;
      if (paired) {
        row = min(row_base / 2 + wr * 8 + g, wv.rows - 1);
        if (h == 1) {
          vh = &wv_up;
          bh = b_up;
        }
      }
      wp[wr][h] = RowPtr(*vh, bh, row) + t * KW;
      sp[wr][h] = static_cast<const uint8_t*>(vh->scales) + ScaleRow(*vh, bh, row) * kScaleBytes;
    }
  }
  if (prefetch) {
    // Then the wait the other staged launches do first; no registers stay held across it.
    // (The same prefetch on the staged mxfp4 kernels made GLM-5.2 slower end to end, session
    // 27; docs/benchmarks.md, session 30, for the affine figures.)
    const StepRange first = WarpSteps<U>(nsteps, nslices, warps_k, wk);
#pragma unroll
    for (int wr = 0; wr < WR; ++wr)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (first.begin + u < first.end) {
            asm volatile("prefetch.global.L2 [%0];" ::"l"(wp[wr][h] + (first.begin + u) * (4 * KW)));
          }
        }
    PdlWait();
  }
  // Affine: row half h's biases sit bdelta[h] bytes after its scales (paired: up's own).
  int64_t bdelta[2] = {0, 0};
  if constexpr (C::kAffine) {
    bdelta[0] = static_cast<const uint8_t*>(wv.biases) - static_cast<const uint8_t*>(wv.scales);
    bdelta[1] = paired ? static_cast<const uint8_t*>(wv_up.biases) - static_cast<const uint8_t*>(wv_up.scales)
                       : bdelta[0];
  }
  (void)bdelta;
  // B operand of lane (g, t): token g & 1 at the lane's own slice, only in column g when
  // g >> 1 == t (see above).
  const int xtok = g & 1;
  const bool tv = (g >> 1) == t && xtok < p.m;
  // kSmemX: token j's activations at xs[j * (n8 + 1) + i] for 8-element block i (the +1
  // keeps the two tokens' planes on different banks), then U * 16 zero blocks: lanes whose
  // B operand is zero read those, so full batches need no predicate (xb below).
  const int n8 = nslices * 4;
  // C::kSumX: then chunk c's sums of x for tokens 0 and 1 at sums[c] (token 1's 0 when m = 1).
  const uint4* xsl = nullptr;
  const float2* sums = nullptr;
  int xstride = 0;
  if constexpr (kSmemX) {
    uint4* xs = dyn_smem + (warps_k > 1 ? (blockDim.x >> 5) * V * 32 / 4 : 0);
    const int ntok = p.m < 2 ? static_cast<int>(p.m) : 2;
    uint4* zeros = xs + ntok * (n8 + 1);
    float* sum_out = reinterpret_cast<float*>(zeros + U * 16);
    for (int i = threadIdx.x; i < U * 16; i += blockDim.x) zeros[i] = make_uint4(0u, 0u, 0u, 0u);
    // The tokens' rows land in shared memory with every copy in flight at once (through
    // registers each 16 bytes a thread cost one L2 round trip in turn), then each block of 8
    // is permuted in place.
    for (int tok = 0; tok < ntok; ++tok) {
      const uint4* src = reinterpret_cast<const uint4*>(XRow(p, prob, tok));
      for (int j = threadIdx.x; j < n8; j += blockDim.x) CpAsync16(xs + tok * (n8 + 1) + j, src + j, true);
    }
    CpAsyncCommit();
    CpAsyncWaitAll();
    __syncthreads();
    // Whole warps iterate together (the sums' shuffles); blocks of a chunk are 4 aligned lanes.
    for (int tok = 0; tok < ntok; ++tok) {
      for (int jb = 0; jb < n8; jb += blockDim.x) {
        const int j = jb + static_cast<int>(threadIdx.x);
        const bool in = j < n8;
        uint4* at = xs + tok * (n8 + 1) + j;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (in) v = *at;
        uint32_t q[4];
        qdec::PairsOf16bitQuad(v.x, v.y, v.z, v.w, q);
        if constexpr (C::kXTwo64) {
#pragma unroll
          for (int k = 0; k < 4; ++k) q[k] = qdec::Bf16x2Mul(q[k], kX2Two64);
        }
        if (in) *at = make_uint4(q[0], q[1], q[2], q[3]);
        if constexpr (C::kSumX) {
          // Fixed order: the block's 8 values left to right, then (b0 + b1) + (b2 + b3).
          const uint32_t w[4] = {v.x, v.y, v.z, v.w};
          float s8 = 0.f;
#pragma unroll
          for (int k = 0; k < 4; ++k) s8 = (s8 + qdec::Bf16ToF32(w[k])) + qdec::Bf16ToF32(w[k] >> 16);
          s8 += __shfl_xor_sync(kFullMask, s8, 1);
          s8 += __shfl_xor_sync(kFullMask, s8, 2);
          if (in && (j & 3) == 0) {
            sum_out[2 * (j >> 2) + tok] = s8;
            if (ntok == 1) sum_out[2 * (j >> 2) + 1] = 0.f;
          }
        }
      }
    }
    __syncthreads();
    xsl = tv ? xs + (g & 1) * (n8 + 1) + t * 4 : zeros;  // this lane's token and slice
    xstride = tv ? 16 : 0;
    sums = reinterpret_cast<const float2*>(sum_out) + t;  // this lane's chunk in step 0
  }
  (void)n8;
  (void)xsl;
  (void)xstride;
  (void)sums;
  const uint16_t* xg = static_cast<const uint16_t*>(XRow(p, prob, tv ? xtok : 0)) + t * SE;

  float acc[WR][4];
#pragma unroll
  for (int wr = 0; wr < WR; ++wr)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[wr][i] = 0.f;

  const StepRange range = WarpSteps<U>(nsteps, nslices, warps_k, wk);
  const int s_begin = range.begin, s_end = range.end, full_end = range.full_end;

  auto batch = [&]<bool kFull>(int s0) {
    uint32_t raw[U][WR][2][KW];
    uint32_t sr[U][WR][2];
    bool sv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) sv[u] = kFull || (s0 + u < s_end && 4 * (s0 + u) + t < nslices);
#pragma unroll
    for (int wr = 0; wr < WR; ++wr) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t* q = wp[wr][h] + static_cast<uint32_t>(s0 * (4 * KW));
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (sv[u]) {
            LoadStream<KW>(q + u * (4 * KW), raw[u][wr][h]);
            sr[u][wr][h] = C::LoadScale(sp[wr][h], bdelta[h], static_cast<uint32_t>(4 * (s0 + u) + t));
          } else {
#pragma unroll
            for (int i = 0; i < KW; ++i) raw[u][wr][h][i] = 0u;
            sr[u][wr][h] = 0u;  // zero fragment times 2^-127 or 2^-65, or s = b = 0: 0
          }
        }
      }
    }
    if (early) PdlWait();

    // mxfp4 kSubnormal: one vote per batch for the single-FFMA scale (every u <= 192).
    bool big = false;
    if constexpr (C::kVote) {
      bool mine = true;
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int wr = 0; wr < WR; ++wr) mine = mine && C::Small(sr[u][wr][0]) && C::Small(sr[u][wr][1]);
      big = !__all_sync(kFullMask, mine);
    }

    // The batch's compute, once per scale path: the vote branches once per batch, not per
    // chunk.
    const uint4* xb = nullptr;
    if constexpr (kSmemX) xb = xsl + s0 * xstride;
    (void)xb;
    auto compute = [&]<bool kBig>() {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int xoff = (s0 + u) * (4 * SE);
        (void)xoff;
        uint32_t xq[NB][4];
#pragma unroll
        for (int w = 0; w < NB; ++w) {
          if (sv[u] && (kSmemX || tv)) {
            if constexpr (kSmemX) {
              const uint4 v = xb[u * 16 + w];  // zeros where !tv
              xq[w][0] = v.x;
              xq[w][1] = v.y;
              xq[w][2] = v.z;
              xq[w][3] = v.w;
            } else {
              const uint4 v = LoadProduced(reinterpret_cast<const uint4*>(xg + xoff + 8 * w));
              qdec::PairsOf16bitQuad(v.x, v.y, v.z, v.w, xq[w]);
              if constexpr (C::kXTwo64) {
#pragma unroll
                for (int i = 0; i < 4; ++i) xq[w][i] = qdec::Bf16x2Mul(xq[w][i], kX2Two64);
              }
            }
          } else {
            xq[w][0] = xq[w][1] = xq[w][2] = xq[w][3] = 0u;
          }
        }
        float c[WR][4];
#pragma unroll
        for (int w = 0; w < NB; ++w) {
#pragma unroll
          for (int wr = 0; wr < WR; ++wr) {
            uint32_t a0[4], a1[4];
            C::Decode(raw[u][wr][0][w], a0);
            C::Decode(raw[u][wr][1][w], a1);
            if (w == 0) {
              MmaBf16Zero(c[wr], a0[0], a1[0], a0[1], a1[1], xq[w][0], xq[w][1]);
            } else {
              MmaBf16(c[wr], a0[0], a1[0], a0[1], a1[1], xq[w][0], xq[w][1]);
            }
            MmaBf16(c[wr], a0[2], a1[2], a0[3], a1[3], xq[w][2], xq[w][3]);
          }
        }
        // c0/c1: row g, tokens 0/1; c2/c3: row g+8. One scale per row and chunk.
        float2 sx = make_float2(0.f, 0.f);
        if constexpr (C::kSumX) {
          if (sv[u]) sx = sums[4 * (s0 + u)];
        }
#pragma unroll
        for (int wr = 0; wr < WR; ++wr) {
#pragma unroll
          for (int h = 0; h < 2; ++h) C::template Apply<kBig>(&acc[wr][2 * h], &c[wr][2 * h], sr[u][wr][h], sx);
        }
      }
    };
    if (big) {
      compute.template operator()<true>();
    } else {
      compute.template operator()<false>();
    }
  };

  int s0 = s_begin;
  for (; s0 + U <= full_end; s0 += U) batch.template operator()<true>(s0);
  for (; s0 < s_end; s0 += U) batch.template operator()<false>(s0);
  if (early) PdlWait();

  if (!KSplitReduce<WR>(acc, reinterpret_cast<float*>(dyn_smem), warps_k)) return;
  // The quad's 4 chunks: a fixed butterfly (lane 0 gets (a0 + a1) + (a2 + a3)).
#pragma unroll
  for (int wr = 0; wr < WR; ++wr)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      acc[wr][i] += __shfl_xor_sync(kFullMask, acc[wr][i], 1);
      acc[wr][i] += __shfl_xor_sync(kFullMask, acc[wr][i], 2);
    }
  if (t != 0) return;
  if (paired) {
    StoreSwiGluRows<WR>(acc, p, prob, row_base / 2, wv.rows, bad);
  } else {
    StoreRowTokens<WR>(acc, p, part, prob, row_base, wv.rows, bad, 0);
  }
#else
  __trap();  // host dispatch never selects this kernel below sm_80
#endif
}

// ---- launch configuration ------------------------------------------------------------------
// Rows per warp 16*WR; U steps per batch, BPR = bytes in flight per lane and weight row:
// variant 0 = 16 rows, BPR 64 (4 steps of 16 bytes for 4-bit formats), variant 1 = 32 rows,
// BPR 32 (AutoVariant chooses). K is split among warps_k warps of a block only as far as
// needed to fill the GPU with about one wave of 16 warps per SM; blocks stay at <= 4 warps
// (several per SM, so one block's tail does not idle its SM) unless the matrix has fewer row
// tiles than SMs.
// Variants 2 and 3 are the column-split mxfp4 kernels (QgemvColKernel<ColMxfp4>, kSubnormal
// and kUnit), 32 rows and BPR 32 as variant 1, and variant 4 is variant 2 with the
// activations staged in shared memory (kSmemX); 5 and 6 are 2 and 4 with 16 rows per warp
// and BPR 64. They exist at m <= 2 only, for mxfp4 and, staged (4 and 6), for 4-bit affine
// (ColAffine4); elsewhere a forced 2..6 falls back to the automatic choice. AutoVariant picks
// 5 and 6 for mxfp4, 4 and 6 for affine; the others run only when forced
// (TEST_SetQgemvTuning: gpu_gemv_bench --sweep, RING_QGEMV_VARIANT). The column split's step
// is 4 chunks of 32 whatever the format.
struct Variant {
  int wr, bpr;
  int col;  // 0: QgemvKernel; column split: 1 subnormal operand, 2 unit, 3 = 1 + staged x
};
constexpr Variant kVariants[] = {{1, 64, 0}, {2, 32, 0}, {2, 32, 1}, {2, 32, 2},
                                 {2, 32, 3}, {1, 64, 1}, {1, 64, 3}};
constexpr int kNumVariants = sizeof(kVariants) / sizeof(kVariants[0]);

// Tuning overrides (bench sweep, tests): variant < 0 = automatic, 0..6 = forced;
// wk_cap 0 = automatic, -1 = the fill rule (ShapeFor), -2 = the fill rule's one-wave splits,
// > 0 = at most that many.
std::atomic<int> g_variant{-1};
std::atomic<int> g_wk_cap{0};

// RING_QGEMV_CLUSTER_K (read once): unset 8, "0" off, N at most N blocks a row tile.
int ClusterKCap() {
  static const int cap = [] {
    const char* v = std::getenv("RING_QGEMV_CLUSTER_K");
    if (v == nullptr) return 8;
    return std::clamp(static_cast<int>(std::strtol(v, nullptr, 10)), 0, 8);
  }();
  return cap;
}

// RING_QGEMV_AFFINE_COL (read once): "0" keeps 4-bit affine on QgemvKernel at every m (A/B
// runs, or a batch-invariant decode: one summation order at every batch size); unset or
// anything else: the column split at m <= 2.
bool AffineColumnSplit() {
  static const bool on = EnvSwitchOn("RING_QGEMV_AFFINE_COL");
  return on;
}

int PowerOfTwoAtLeast(int64_t v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}
int PowerOfTwoAtMost(int64_t v) {
  int p = 1;
  while (static_cast<int64_t>(p) * 2 <= v) p *= 2;
  return p;
}

// Words of a lane slice and elements of a slice under variant v (the column split's slice
// is one 32-element chunk, 4 words, for every format it serves).
template <class P>
constexpr int SliceWords(const Variant& v) {
  return v.col != 0 ? 4 : P::kWords;
}
template <class P>
constexpr int SliceElems(const Variant& v) {
  return v.col != 0 ? qdec::kChunk : P::kSliceElems;
}
template <class P>
constexpr int UFor(const Variant& v) {
  const int u = v.bpr / (4 * SliceWords<P>(v));
  return u < 1 ? 1 : u;
}

// The column split's format policy for P (void: none).
template <class P>
struct ColPolicy {
  template <int kCol>
  using T = void;
};
template <>
struct ColPolicy<OwnChunk<qdec::Mxfp4>> {
  template <int kCol>
  using T = ColMxfp4<kCol != 2>;
};
template <int LW, class ST>
struct ColPolicy<Affine4<LW, ST>> {
  template <int kCol>
  using T = ColAffine4<LW == 1 ? 0 : (LW == 2 ? 1 : 2), ST>;
};

template <class P, int kV>
void* KernelFor() {
  constexpr Variant v = kVariants[kV];
  if constexpr (v.col != 0) {
    using C = typename ColPolicy<P>::template T<v.col>;
    static_assert(!std::is_void_v<C>);
    static_assert(!C::kAffine || v.col == 3, "the affine column split needs staged x");
    return reinterpret_cast<void*>(&QgemvColKernel<C, v.wr, UFor<P>(v), v.col == 3>);
  } else {
    return reinterpret_cast<void*>(&QgemvKernel<P, v.wr, UFor<P>(v)>);
  }
}

absl::Status LaunchWith(void* fn, dim3 grid, int threads, size_t smem, const QmmParams& p,
                        int wk, int tiles_pb, int pdl, cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  cfg.attrs = attr;
  cfg.numAttrs = 0;
  if (pdl && PdlGemvEnabled()) {
    attr[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[cfg.numAttrs].val.programmaticStreamSerializationAllowed = 1;
    ++cfg.numAttrs;
  }
  if (p.kblocks > 1) {  // QgemvKernel's cluster K split: the grid's y extent is the cluster
    attr[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
    attr[cfg.numAttrs].val.clusterDim.x = 1;
    attr[cfg.numAttrs].val.clusterDim.y = static_cast<unsigned>(p.kblocks);
    attr[cfg.numAttrs].val.clusterDim.z = 1;
    ++cfg.numAttrs;
  }
  QmmParams pp = p;
  int a_wk = wk, a_tpb = tiles_pb, a_pdl = pdl;
  void* args[] = {&pp, &a_wk, &a_tpb, &a_pdl};
  RING_CUDA_RETURN_IF_ERROR(cudaLaunchKernelExC(&cfg, fn, args));
  return absl::OkStatus();
}

// Launch shape of variant `vi` (K split, block, grid) under the policy described above.
struct LaunchShape {
  int wr, u, wk, tiles_pb, threads;
  size_t smem;
  int64_t gx, warps;
};
template <class P>
LaunchShape ShapeFor(int vi, const QmmParams& p, int64_t problems, int sms, bool tuned = true) {
  const Variant v = kVariants[vi];
  LaunchShape sh{};
  sh.wr = v.wr;
  sh.u = UFor<P>(v);
  const int64_t want = static_cast<int64_t>(sms) * 16;  // one wave of 16 warps per SM
  const int64_t tile_rows = 16 * v.wr;
  const int64_t row_tiles = (p.w.rows + tile_rows - 1) / tile_rows;
  const int64_t tiles = row_tiles * problems;
  const int64_t nsteps = (p.w.cols / SliceElems<P>(v) + 3) / 4;
  const int forced_cap = tuned ? g_wk_cap.load(std::memory_order_relaxed) : 0;
  // Fill: the K split (any count up to 16 whose warps all get at least 90% of an even share
  // of the steps) that keeps the most warps resident per SM over the launch's waves, an SM
  // holding 16 warps (128 registers a thread); with one_wave, only splits that fit in one
  // wave (0 when none does).
  auto fill = [&](bool one_wave) {
    const int max_wk = static_cast<int>(std::min<int64_t>(16, std::max<int64_t>(1, nsteps / sh.u)));
    double best = -1.0;
    int pick = one_wave ? 0 : 1;
    for (int k = 1; k <= max_wk; ++k) {
      const int64_t per = ((nsteps + k - 1) / k + sh.u - 1) / sh.u * sh.u;
      if (10 * nsteps < 9 * k * per) continue;
      const int tpb = std::max(1, 4 / k);
      const int64_t per_sm = 16 / (tpb * k);
      const int64_t blocks = (row_tiles + tpb - 1) / tpb * problems;
      const int64_t waves = (blocks + sms * per_sm - 1) / (sms * per_sm);
      if (one_wave && waves > 1) continue;
      const double score = static_cast<double>(tiles * k) / static_cast<double>(waves * sms);
      if (score > best + 1e-9) {
        best = score;
        pick = k;
      }
    }
    return pick;
  };
  int wk = 1;
  if (forced_cap > 100) {
    wk = std::min(forced_cap - 100, 16);  // exactly that many (bench)
  } else if (forced_cap == -1 || forced_cap == -2) {
    // fill(true) is 0 when no split fits in one wave (lm_head): then no split.
    wk = std::max(1, fill(forced_cap == -2));
  } else {
    const int cap = forced_cap > 0 ? forced_cap : (tiles >= sms ? 4 : 16);
    wk = PowerOfTwoAtLeast((want + tiles - 1) / tiles);
    wk = std::min({wk, PowerOfTwoAtMost(std::min(cap, 16)),
                   PowerOfTwoAtMost(std::max<int64_t>(1, nsteps / sh.u))});
    // Launches that leave SMs short of warps (small matrices) take the fill rule's split when
    // it gives more. Not applied above 11 warps per SM: there it lost on o_proj, Qwen3-8B
    // gate/up and lm_head (session 15, run 6: uneven or deeper K splits).
    // AutoVariant (tuned = false) judges the variants by the power-of-two split alone.
    if (tuned && forced_cap == 0 && tiles * wk < sms * 11) {
      wk = std::max(wk, fill(false));
    }
    // A power-of-two split that spills past one wave takes the fullest split that fits in
    // one, where there is one (H200 sweep, session 17, run 8, us: dense gate_up 24576 x 6144
    // at M = 1 / 2 / 8 29.9 -> 27.1, 32.3 -> 28.5, 39.2 -> 32.3 (split 2 -> 1, 4 -> 2); one
    // decode token's routed gate+up 36.6 -> 34.1, runs 3 and 5). Launches with more row tiles
    // than a wave holds (lm_head, the experts' down) keep theirs.
    if (tuned && forced_cap == 0 && tiles * wk > static_cast<int64_t>(sms) * 16) {
      const int f = fill(true);
      if (f > 0) wk = f;
    }
    // One matrix on the column split whose split leaves 11-16 warps an SM (o_proj, the dense
    // down projection: 384 row tiles x 4 warps) takes the fill rule's fullest one-wave split
    // (5 warps a tile). gpu_gemv_bench --sweep, H200, session 27 run 2 / session 28 run 1,
    // mxfp4 M = 1, us, with PDL: o_proj 6144 x 16384 22.8 / 22.8 -> 19.4 / 20.0, dense down
    // 6144 x 12288 17.7 / 18.7 -> 15.1 / 16.5 (M = 2: 24.7 -> 21.4, 19.5 -> 16.9); without
    // PDL within 2% either way (o_proj 22.1 / 20.9 -> 22.4 / 21.0, dense down 18.1 / 17.8 ->
    // 18.2 / 17.4), so the sums do not depend on PDL.
    if (tuned && forced_cap == 0 && v.col != 0 && problems == 1 && tiles * wk >= sms * 11 &&
        tiles * wk < static_cast<int64_t>(sms) * 16) {
      const int f = fill(true);
      if (f > wk) wk = f;
    }
    // Several problems on long rows with staged x whose one-warp-a-tile launch runs a little
    // past a whole number of waves (a decode token's routed experts' gate and up with the
    // shared expert, GLM-5.2 on an H200: 9 x 256 row tiles = 1.09 waves) take two warps a
    // tile, so that the last partial wave is half as long. At 1-2 rows of x the launch is
    // judged by one row's problems, so that two tokens sum as each alone. H200, session 28
    // run 5 (gpu_gemv_bench --moe, us): that launch ("+shared") 45.3 -> 41.6 at one token,
    // 72.0 -> 70.5 at two; the MoE block of a token 81.6 -> 78.2. Where the launch fits its
    // waves two warps a tile lose: 8 experts without the shared one 33.7 -> 35.2 (2048 tiles,
    // one wave), 8 tokens with it 253.0 -> 280.7.
    if (tuned && forced_cap == 0 && problems > 1 && v.col == 3 && wk == 1 && nsteps >= 32 &&
        nsteps % (2 * sh.u) == 0) {
      const int64_t xrows = p.alt_from < problems ? problems - p.alt_from
                                                  : problems / std::max<int64_t>(1, p.x_pdiv);
      const int64_t judged = xrows >= 1 && xrows <= 2 ? tiles / xrows : tiles;
      const int64_t wave = static_cast<int64_t>(sms) * 16, over = judged % wave;
      if (judged > wave && over > 0 && over * 4 <= wave) wk = 2;
    }
  }
  sh.wk = wk;
  sh.tiles_pb = std::max(1, 4 / wk);
  sh.threads = sh.tiles_pb * wk * 32;
  sh.smem = wk > 1 ? static_cast<size_t>(sh.threads / 32) * tile_rows / 4 * 32 * sizeof(float) : 0;
  sh.gx = (row_tiles + sh.tiles_pb - 1) / sh.tiles_pb;
  sh.warps = tiles * wk;
  return sh;
}

// Variant choice: 32 rows per warp halves the activation loads and permutes per weight (the
// kernel is instruction-bound), so mxfp4 and the other single-chunk formats take it whenever
// it still gives at least 11 warps per SM (H200 sweep, 2026-11: q_b_proj 31.6% -> 38.6% of
// the probe, dense gate_up 43.5 -> 54.3, Qwen3 gate/up 34.5 -> 44.4, down 32.8 -> 40.6,
// lm_head 64.3 -> 69.4; o_proj, whose 32-row tiles leave 6 warps per SM, 46.8 -> 36.3).
// The affine kernel keeps 16 rows: with 32 it spills registers (lm_head 58.3% -> 40.7%).
//
// mxfp4 at m <= 2 on devices whose bf16 MMA keeps subnormal inputs
// (DeviceInfo::mma_bf16_subnormals) takes the column-split kernels (scale-free E2M1 operands)
// with 16-row tiles: variant 6 (activations staged in shared memory) for tall matrices with
// short rows, variant 5 wherever the 32-row kernel would leave too few warps. H200 sweep with
// the GPU nibble order (session 15, run 1, % of the probe at m = 1, automatic choice before
// -> now): lm_head 77.8 -> 83.0 (6), dense gate_up 58.5 -> 60.5 (6), o_proj 49.3 -> 54.9 (5),
// q_a_proj 16.8 -> 18.9 (5), kv_a_proj 5.2 -> 5.9 (5), expert gate/up 16.9 -> 18.8 (5),
// expert down 21.5 -> 21.3 (5). Where the 32-row kernel has enough warps (q_b_proj, Qwen3-8B
// gate/up, down, q/o) no column-split form won by more than noise, so variant 1 stays.
// Launches of several problems (the routed experts of a decode step) take variant 6 too
// (gpu_gemv_bench --moe, session 16, us for 1 / 2 / 8 tokens: gate+up 37.5 / 67.1 / 249.6
// -> 36.7 / 62.9 / 223.8 against the 32-row kernel, down 23.5 / 41.4 / 130.9 -> 21.4 / 35.4
// / 126.7).
//
// 4-bit affine at m <= 2 takes the column split with staged x: 32-row tiles (variant 4) on
// matrices of >= 48 Mi weights up to 65536 rows, 16-row tiles (variant 6) elsewhere; a
// single matrix of few row tiles keeps the cluster K split of variant 0 (Launch). H200 sweep
// (session 26, run 1, us at m = 1 / 2, variant 6 vs 4): Qwen3-8B down 4096 x 12288 16.5 /
// 19.0 vs 15.8 / 17.5, gate+up 24576 x 4096 15.5 / 17.3 vs 15.0 / 16.8, 6144 x 16384 28.4 /
// 43.6 (16-row tiles with 64 KB of staged x: 3 blocks an SM) vs 27.8 / 31.4; 16384 x 2048
// 10.7 / 11.6 vs 11.0 / 11.9, q/o 4096 x 4096 8.8 vs 9.9, lm_head 151936 x 4096 166.8 /
// 178.7 vs 185.6 / 194.7.
template <class P>
int AutoVariant(const QmmParams& p, int64_t problems, int sms, bool subnormals) {
  if constexpr (P::kAffine) {
    (void)subnormals;
    const bool few_tiles = problems == 1 && p.nparts <= 1 && ClusterKCap() > 1 && (p.w.rows + 15) / 16 * 4 <= sms;
    if (p.m > 2 || few_tiles || !AffineColumnSplit()) return 0;
    const bool big = p.w.rows * p.w.cols >= (int64_t{48} << 20) && p.w.rows <= 65536;
    return big ? 4 : 6;
  } else {
    const LaunchShape s1 = ShapeFor<P>(1, p, problems, sms, false);
    bool wr2 = s1.warps >= static_cast<int64_t>(sms) * 11;
    // More than two tokens: 32-row tiles also win with fewer warps when every SM gets a tile
    // and each warp has a long K range (mxfp4 o_proj 6144 x 16384 at M = 8: 30.6 -> 27.8 us),
    // not on short rows (expert down 6144 x 2048: 7.8 -> 8.6). Measured on mxfp4 only.
    if (!wr2 && p.m > 2 && std::is_same_v<P, OwnChunk<qdec::Mxfp4>>) {
      const int64_t nsteps = (p.w.cols / P::kSliceElems + 3) / 4;
      wr2 = s1.warps / s1.wk >= sms && nsteps / s1.wk >= 16;
    }
    if constexpr (std::is_same_v<P, OwnChunk<qdec::Mxfp4>>) {
      if (subnormals && p.m <= 2) {
        if (wr2 && problems == 1 && p.w.rows >= 24576 && p.w.cols <= 8192) return 6;
        // Several problems a launch (MoE experts, MLA's per-head absorbed matrices): staged
        // x on 16-row tiles (Launch falls back where x does not fit in shared memory).
        if (problems > 1) return 6;
        // One row on a tall matrix: the same sums with x staged (variant 6 gives variant 5's
        // bits, so two rows, which stay on 5, still sum as each alone). H200, session 27 run
        // 2, us: o_proj 6144 x 16384 22.1 -> 21.2, dense down 6144 x 12288 18.1 -> 17.8;
        // at m = 2 staging both rows costs more than it saves (o_proj 25.1 -> 32.7).
        if (!wr2) return p.m == 1 && p.w.rows >= 4096 ? 6 : 5;
      }
    }
    return wr2 ? 1 : 0;
  }
}

// A multi-weight launch (p.nparts > 1) is shaped as one matrix of all the parts' rows;
// each part then gets whole blocks of its own (its last block may idle a few warps).
template <class P>
absl::Status Launch(const QmmParams& p_in, int64_t problems, int overlap, cudaStream_t stream,
                    std::string* describe) {
  QmmParams p = p_in;
  if (p.nparts > 1) {
    p.w.rows = 0;
    for (int i = 0; i < p.nparts; ++i) p.w.rows += p.parts[i].rows;
  }
  absl::StatusOr<const DeviceInfo*> dev = CurrentDevice();
  if (!dev.ok()) return dev.status();
  const int sms = (*dev)->sm_count;
  const int pdl = (overlap != 0 && (*dev)->code_cc >= 90) ? overlap : 0;
  const bool subn = (*dev)->mma_bf16_subnormals;
  const int forced = g_variant.load(std::memory_order_relaxed);
  int vi = AutoVariant<P>(p, problems, sms, subn);
  if (forced >= 0 && forced < kNumVariants) vi = forced;
  constexpr bool kMx4 = std::is_same_v<P, OwnChunk<qdec::Mxfp4>>;
  // The column-split kernels exist at m <= 2: for mxfp4 (the subnormal-operand ones, col 1
  // and 3, also need an MMA that keeps subnormals) and, with staged x (col 3), for affine.
  const int col = kVariants[vi].col;
  const bool col_ok = p.m <= 2 && (kMx4 ? (col == 2 || subn) : (P::kAffine && col == 3));
  if (col != 0 && !col_ok) vi = AutoVariant<P>(p, problems, sms, subn);
  if (P::kAffine && kVariants[vi].col == 0) vi = 0;  // no 32-row affine kernel (see AutoVariant)
  // The fused SwiGLU output exists on the column split only (mxfp4, 4-bit affine); elsewhere
  // QMatmulTSwiGlu returns this FailedPrecondition with nothing launched and its caller
  // launches the plain way.
  const bool paired = p.swiglu != 0;
  auto no_fused = [] { return absl::FailedPreconditionError("no fused SwiGLU GEMV for this launch"); };
  if (paired && ((!kMx4 && !P::kAffine) || kVariants[vi].col == 0 || p.nparts != 2)) return no_fused();
  LaunchShape sh = ShapeFor<P>(vi, p, problems, sms);
  if (kVariants[vi].col == 3) {  // staged activations (QgemvColKernel kSmemX)
    // x planes and the zero blocks; affine: the chunks' sums of x (a float pair per chunk).
    size_t xbytes =
        (static_cast<size_t>(std::min<int64_t>(p.m, 2)) * (p.w.cols / 8 + 1) + sh.u * 16) * 16;
    if (P::kAffine) xbytes += static_cast<size_t>(p.w.cols / qdec::kChunk) * 2 * sizeof(float);
    if (static_cast<int64_t>(sh.smem + xbytes) > (*dev)->smem_per_block_optin) {
      vi = P::kAffine ? 0 : AutoVariant<P>(p, problems, sms, false);
      if (paired && kVariants[vi].col == 0) return no_fused();
      sh = ShapeFor<P>(vi, p, problems, sms);
    } else {
      sh.smem += xbytes;
    }
  }
  // Few row tiles on a single weight (a MoE router: GLM-5.2's 256 x 6144 gate is 16 tiles, 16
  // blocks on 132 SMs): each tile's K steps are split over a cluster of blocks as well (sm_90+,
  // ClusterKReduce), 4 warps a block, up to 8 blocks a tile while every warp keeps a batch.
  // RING_QGEMV_CLUSTER_K: 0 off, N at most N blocks a tile (A/B runs).
  const int ck = ClusterKCap();
  if (kVariants[vi].col == 0 && problems == 1 && p.nparts <= 1 && ck > 1 && (*dev)->code_cc >= 90) {
    constexpr int kWk = 4;
    const int64_t row_tiles = (p.w.rows + 16 * sh.wr - 1) / (16 * sh.wr);
    const int64_t nsteps = (p.w.cols / P::kSliceElems + 3) / 4;
    if (row_tiles * 4 <= sms) {
      int kb = PowerOfTwoAtMost(std::min<int64_t>(ck, sms / row_tiles));
      while (kb > 1 && nsteps < static_cast<int64_t>(kWk) * kb * sh.u) kb /= 2;
      if (kb > 1) {
        const size_t tile_floats = static_cast<size_t>(4 * sh.wr) * 32;
        sh.wk = kWk;
        sh.tiles_pb = 1;
        sh.threads = kWk * 32;
        sh.smem = (kWk + 1) * tile_floats * sizeof(float);  // the warps' sums, then the tile's
        sh.gx = row_tiles;
        sh.warps = row_tiles * kWk * kb;
        p.kblocks = kb;
      }
    }
  }
  if (paired) {
    p.w.rows = p_in.w.rows;  // the kernel's row count: gate's (= up's)
  } else if (p.nparts > 1) {
    const int64_t block_rows = 16 * sh.wr * static_cast<int64_t>(sh.tiles_pb);
    p.w.rows = p_in.w.rows;
    sh.gx = 0;
    for (int i = 0; i < p.nparts; ++i) {
      p.parts[i].block_begin = sh.gx;
      sh.gx += (p.parts[i].rows + block_rows - 1) / block_rows;
    }
  }
  if (sh.gx > 0x7fffffff) return absl::InvalidArgumentError("matrix too tall");
  if (describe != nullptr) {
    const int col = kVariants[vi].col;
    *describe = absl::StrFormat("gemv wr%d u%d wk%d%s blk%d grid%dx%d%s%s%s", sh.wr, sh.u, sh.wk,
                                p.kblocks > 1 ? absl::StrFormat(" cluster-k%d", p.kblocks) : "",
                                sh.threads, sh.gx, problems,
                                col == 1 ? " col-sub" : (col == 2 ? " col-unit" : (col == 3 ? (P::kAffine ? " col-aff-smx" : " col-sub-smx") : "")),
                                p.nparts > 1 ? absl::StrFormat(" parts%d%s", p.nparts, paired ? " swiglu" : "") : "",
                                pdl ? absl::StrFormat(" pdl%d", pdl) : "");
    return absl::OkStatus();
  }
  void* fn = nullptr;
  if constexpr (P::kAffine) {
    fn = vi == 4 ? KernelFor<P, 4>() : (vi == 6 ? KernelFor<P, 6>() : KernelFor<P, 0>());
  } else if constexpr (kMx4) {
    switch (vi) {
      case 1: fn = KernelFor<P, 1>(); break;
      case 2: fn = KernelFor<P, 2>(); break;
      case 3: fn = KernelFor<P, 3>(); break;
      case 4: fn = KernelFor<P, 4>(); break;
      case 5: fn = KernelFor<P, 5>(); break;
      case 6: fn = KernelFor<P, 6>(); break;
      default: fn = KernelFor<P, 0>(); break;
    }
  } else {
    fn = vi == 1 ? KernelFor<P, 1>() : KernelFor<P, 0>();
  }
  RING_CUDA_RETURN_IF_ERROR(AllowDynamicSmem(fn, sh.smem));
  return LaunchWith(fn,
                    dim3(static_cast<unsigned>(sh.gx), static_cast<unsigned>(std::max(p.kblocks, 1)),
                         static_cast<unsigned>(problems)),
                    sh.threads, sh.smem, p, sh.wk, sh.tiles_pb, pdl, stream);
}

}  // namespace

bool GemvSupports(const DeviceQuantWeight& w) {
  switch (w.spec.mode) {
    case QuantMode::kMxfp4:
    case QuantMode::kMxfp8:
      return true;
    case QuantMode::kNvfp4:
      return w.global_scale == 0.f;
    case QuantMode::kNone:
      return w.dtype == DType::kBF16;
    case QuantMode::kAffine:
      if (w.spec.bits != 4) return false;
      if (w.scale_dtype == DType::kBF16) return true;
      return w.scale_dtype == DType::kF16 && w.spec.group_size == 64;
  }
  return false;
}

absl::Status LaunchGemv(const DeviceQuantWeight& w, const QmmParams& p, int64_t problems,
                        int overlap, cudaStream_t stream, std::string* describe) {
  if (!GemvSupports(w)) return absl::InternalError("no GEMV kernel for this format");
  switch (w.spec.mode) {
    case QuantMode::kMxfp4:
      return Launch<OwnChunk<qdec::Mxfp4>>(p, problems, overlap, stream, describe);
    case QuantMode::kMxfp8:
      return Launch<OwnChunk<qdec::Mxfp8>>(p, problems, overlap, stream, describe);
    case QuantMode::kNvfp4:
      return Launch<OwnChunk<qdec::Nvfp4>>(p, problems, overlap, stream, describe);
    case QuantMode::kNone:
      return Launch<OwnChunk<qdec::DenseBf16>>(p, problems, overlap, stream, describe);
    case QuantMode::kAffine:
      if (w.scale_dtype == DType::kF16) {
        return Launch<Affine4<2, qdec::ScaleF16>>(p, problems, overlap, stream, describe);
      }
      switch (w.spec.group_size) {
        case 32: return Launch<Affine4<1, qdec::ScaleBf16>>(p, problems, overlap, stream, describe);
        case 64: return Launch<Affine4<2, qdec::ScaleBf16>>(p, problems, overlap, stream, describe);
        default: return Launch<Affine4<4, qdec::ScaleBf16>>(p, problems, overlap, stream, describe);
      }
  }
  return absl::InternalError("unreachable");
}

}  // namespace internal

void TEST_SetQgemvTuning(int variant, int wk_cap) {
  internal::g_variant.store(variant, std::memory_order_relaxed);
  internal::g_wk_cap.store(wk_cap, std::memory_order_relaxed);
}

}  // namespace ring::cuda
