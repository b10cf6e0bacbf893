// File: kernels/cuda/qgemv.cu
//
// Quantized GEMV/GEMM kernels (API and numerics in qgemv.cuh, decoders in quant_decode.cuh):
// the host API and dispatch, the prefill GEMM, the SIMT kernels, transpose=false and the
// embedding gather. The decode GEMV (M <= 8 on the tensor cores) is in qgemv_gemv.cu.
//
// Prefill GEMM (QmmGemmKernel, M > 8, bf16 tensor-core MMA, fp32 accumulation: Hopper's
// warpgroup wgmma where the device and build have it (sm_90a, GemmCfg::kWg), else
// mma.sync m16n8k16; the loads, decoders, k order and epilogue are shared): a block
// computes a tile of kRows weight rows x kToks tokens (256 x 128, 128 x 128 or 128 x 64,
// picked per launch by LaunchGemm from the padded work per SM). K advances in stages of 128
// (4 chunks): a cp.async pipeline of 2-3 stages copies the PACKED weights and the bf16
// activations of a stage into shared memory; weights are decoded to bf16 only in registers,
// right before the mma, so a decoded weight feeds all kToks tokens of the tile. Warp w owns
// 32 weight rows (two 16-row mma tiles) and every token of the tile (wgmma: a warpgroup owns
// 128 rows as two 64-row tiles, see GemmCfg; its B operand, x, is rewritten once per stage
// into the wgmma's shared-memory layout, and each word group's decode overlaps the
// previous group's wgmmas).
// k order: inside a stage, lane (g = lane/4, t = lane%4) feeds the mma with chunk t, and for
// word group W (elements 8W..8W+7) and j in {0,2} the mma's logical k slots (2t, 2t+1 |
// 2t+8, 2t+9) carry the chunk's elements (8W+j, 8W+j+4 | 8W+j+1, 8W+j+5): the order the
// 4-bit bit tricks decode in (quant_decode.cuh Pairs). Any k order works as long as A and B
// agree, so the activations are permuted the same way, once per stage by the thread that
// copied them (permute_x), not once per use.
// Shared memory: weights [row][4 chunks][KW words] (a lane's 16-byte chunk, conflict-free
// reads); activations [token][16 units of 16 bytes], the unit index XOR-swizzled so the
// 8 lanes of a load phase hit 8 different bank groups. Tails (rows, tokens, K chunks) are
// zero-filled by the copies and get ZeroScale, so they add exact zeros.
// Grouped rows (QMatmulArgs::row_offsets, MoE prefill): one launch over all experts, each
// with its own row count known only on the device; grid.y enumerates the tiles of all
// problems in order, sized for the worst split, and a block finds its problem from the
// offsets (GroupedTile) or exits. The main loop is the same code. Automatically it is two
// launches (LaunchGroupedSplit): whole large tiles and long rests on the large tile, rests
// of at most the small tile's tokens on the small one.
// Numerics (qgemv.cuh): the mma multiplies bf16 weights (fp modes exact; affine rounded to
// bf16 as T(T(s*q)+b)) with bf16 x, accumulating in fp32.
// SIMT family (QmmSimtKernel): a warp owns 2 weight rows, lanes stride over chunks, each
// element is dequantized exactly (fp32) and FMAed with up to MB activation rows, then a
// butterfly reduction. QmmNKernel (transpose=false) and EmbedKernel use the same decoders.
#include "kernels/cuda/qgemv.cuh"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/act_round.cuh"
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/qgemv_internal.cuh"
#include "kernels/cuda/quant_decode.cuh"
#include "kernels/cuda/warp_scan.cuh"
#include "kernels/cuda/wgmma.cuh"
#include "kernels/status.h"

namespace ring::cuda {
namespace {

using namespace internal;

// ---- prefill GEMM (tensor cores) -------------------------------------------------------------
// Block tile: kRows weight rows x kToks tokens; warp w owns rows [32w, 32w+32) of the tile (two
// 16-row mma tiles) and all kToks tokens (kNT 8-token mma tiles), so each decoded weight feeds
// kToks tokens. A stage covers 128 k (4 chunks: lane t of a quad owns chunk t, see the file
// comment for the k order).
constexpr int kGemmStageK = 4 * kChunk;
// Shared-memory budget for the pipeline stages (H100/H200/B200: 227 KB per block).
constexpr int kGemmSmemBudget = 224 << 10;

// TEST_SetGemmTile: -1 = automatic, else the index of the one configuration allowed; and
// whether wgmma may be used.
std::atomic<int> g_gemm_tile{-1};
std::atomic<bool> g_gemm_wgmma{true};
std::atomic<int> g_gemm_grouped_tile{-1};

// kWg: the math runs on Hopper's warpgroup MMA (sm_90a, wgmma.cuh) instead of mma.sync:
// warpgroup q (warps 4q..4q+3) owns rows [128q, 128q + 128) of the tile as two 64-row
// wgmma tiles, warp 4q + i holding rows 16i..16i+15 of each (the A fragments the decoders
// produce, as for mma.sync); the activations are read by the wgmma from shared memory, so
// each stage's x is rewritten once into the wgmma's operand layout (kXWgWords, two
// buffers: a stage's rewrite must not overwrite what the previous stage's wgmmas read).
template <int kWarpsR, int kNT, int kMaxStages, int kMinBlocks, bool kWgmma = false>
struct GemmCfg {
  static constexpr bool kWg = kWgmma;
  static constexpr int kThreads = 32 * kWarpsR;
  static constexpr int kRows = 32 * kWarpsR;
  static constexpr int kTiles = kNT;
  static constexpr int kToks = 8 * kNT;
  static constexpr int kMinBlocksPerSm = kMinBlocks;
  static_assert(!kWg || kWarpsR % 4 == 0, "whole warpgroups");
  // Words of one stage: packed weights [kRows][4 chunks][KW], then x [kToks][128] as bf16.
  template <class F>
  static constexpr int kWStageWords = kRows * 4 * F::kWords;
  static constexpr int kXStageWords = kToks * kGemmStageK / 2;
  // kWg: x of a stage as 8 k16 steps of [kToks / 8 core matrices][2][8 tokens][16 bytes];
  // steps 16 bytes apart more than their size, so that the rewrite's stores of one token
  // spread over the banks.
  static constexpr int kXWgStepBytes = kToks * 32 + 16;
  static constexpr int kXWgWords = kWg ? 2 * 8 * kXWgStepBytes / 4 : 0;
  // As many stages as the budget holds, up to kMaxStages and at least 2 (LaunchGemm skips a
  // configuration whose shared memory exceeds the device's per-block limit).
  template <class F>
  static constexpr int kStages = std::max(
      2, std::min(kMaxStages,
                  (kGemmSmemBudget - 4 * kXWgWords) / (4 * (kWStageWords<F> + kXStageWords))));
  template <class F>
  static constexpr int kSmemBytes = 4 * (kStages<F> * (kWStageWords<F> + kXStageWords) + kXWgWords);
};
// The tile configurations LaunchGemm chooses from (index = TEST_SetGemmTile's argument):
// 0: large problems, 256 rows x 128 tokens, 8 warps, one block per SM (3 stages, 144 KB).
using GemmLarge = GemmCfg<8, 16, 3, 1>;
// 1: few row blocks (e.g. 576 rows): 128 x 128, 4 warps, two blocks per SM (2 stages).
using GemmMid = GemmCfg<4, 16, 2, 2>;
// 2: M <= 64 per problem (MoE experts, short prompts) or small grids: 128 x 64, 4 warps.
using GemmSmall = GemmCfg<4, 8, 3, 2>;
// The same three on wgmma (devices with DeviceInfo::wgmma). The accumulators of a 128 x 128
// warpgroup tile need 128 registers a thread, so the mid tile keeps one block per SM.
using GemmLargeWg = GemmCfg<8, 16, 3, 1, true>;
using GemmMidWg = GemmCfg<4, 16, 2, 1, true>;
using GemmSmallWg = GemmCfg<4, 8, 3, 2, true>;
// Blocks of ~99 KB (sm_86 / 89 / 120 / 121) hold neither the large tile's three stages (144
// KB for 4-bit weights) nor any tile of 16-bit weights: there the large tile runs in two
// stages (96 KB for 4-bit weights) in the large one's place, and where none of the three
// fits, the small tile in two (96 KB for bf16 weights), so that those devices keep a
// tensor-core GEMM.
using GemmLargeTwoStage = GemmCfg<8, 16, 2, 1>;
using GemmSmallTwoStage = GemmCfg<4, 8, 2, 2>;

// 16-byte unit u (0..15) of a token's 256-byte x row in a stage is stored at unit XSwizzle(u,
// tok). The reads (below) take unit 4t + w of tokens g and g+1 in one 8-lane phase: without
// the swizzle t = 0/2 and 1/3 and both tokens share a bank group (4-way conflict); flipping
// bit 1 for the upper half of the row and bit 0 for odd tokens spreads the 8 reads over all 8
// bank groups. Writes (8 consecutive units of one token per phase) stay conflict-free.
__device__ __forceinline__ int XSwizzle(int u, int tok) {
  return u ^ (((u >> 3) & 1) << 1) ^ (tok & 1);
}

// A 16-byte shared load kept in PTX program order with the mma around it (both are volatile
// asm), for the same reason as the barrier in the word-group loop; ptxas still hoists the
// loads of a word group ahead of its mma where registers allow.
__device__ __forceinline__ uint4 LoadSharedOrdered(const uint32_t* p) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(SmemAddr(p)));
  return v;
}

// Loads KW consecutive words from shared memory with the widest aligned accesses.
template <int KW>
__device__ __forceinline__ void LoadSharedWords(const uint32_t* p, uint32_t (&raw)[KW]) {
  if constexpr (KW % 4 == 0) {
#pragma unroll
    for (int i = 0; i < KW / 4; ++i) {
      const uint4 v = reinterpret_cast<const uint4*>(p)[i];
      raw[4 * i] = v.x;
      raw[4 * i + 1] = v.y;
      raw[4 * i + 2] = v.z;
      raw[4 * i + 3] = v.w;
    }
  } else if constexpr (KW % 2 == 0) {
#pragma unroll
    for (int i = 0; i < KW / 2; ++i) {
      const uint2 v = reinterpret_cast<const uint2*>(p)[i];
      raw[2 * i] = v.x;
      raw[2 * i + 1] = v.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < KW; ++i) raw[i] = p[i];
  }
}

// Formats whose Pairs branches per lane between a bit-trick decoder and the general one
// (mxfp4: scales past 2^1) expose FastScale/PairsFastPath; the GEMM checks a stage's scales
// once per warp and runs a branch-free loop when all are fast. Other formats' Pairs has no
// branch.
template <class F>
constexpr bool kHasFastPath = requires(const typename F::Scale& sc) { F::FastScale(sc); };
template <class F>
__device__ __forceinline__ void FastPairs(const uint32_t* raw, int w, const typename F::Scale& sc,
                                          uint32_t out[4]) {
  if constexpr (kHasFastPath<F>) {
    F::PairsFastPath(raw, w, sc, out);
  } else {
    F::Pairs(raw, w, sc, out);
  }
}

// Grouped rows: launch tile `item` -> its problem, first token, the problem's row count
// and first row. Tiles are numbered problem by problem, ceil(rows / toks) each (or as
// QmmParams::split_* divide a problem between two launches), so empty problems take none.
// Every warp walks the offsets itself (same answer in all warps, no barrier): 2 loads and a
// warp scan per 32 problems. False past the last tile.
__device__ __forceinline__ bool GroupedTile(const QmmParams& p, int64_t item, int toks,
                                            int64_t* prob, int64_t* tok0, int64_t* rows,
                                            int64_t* first) {
  const int32_t* const off = p.row_off;
  const int lane = threadIdx.x & 31;
  int64_t before = 0;  // tiles of the problems already walked
  for (int64_t base = 0; base < p.problems; base += 32) {
    const int64_t e = base + lane;
    int lo = 0, n = 0;
    if (e < p.problems) {
      lo = __ldg(off + e);
      n = __ldg(off + e + 1) - lo;
    }
    // This problem's tiles in this launch, and the first token of its first one.
    int tiles = (n + toks - 1) / toks, tbase = 0;
    if (p.split_small > 0) {
      const int r = n % p.split_big;
      if (p.split_tail) {
        tiles = r > 0 && r <= p.split_small ? 1 : 0;
        tbase = n - r;
      } else {
        tiles = n / p.split_big + (r > p.split_small ? 1 : 0);
      }
    }
    const int inc = internal::WarpInclusiveSum(tiles);  // over the lanes
    const int total = __shfl_sync(0xffffffffu, inc, 31);
    if (item < before + total) {
      const int64_t local = item - before;
      const unsigned hit = __ballot_sync(0xffffffffu, local >= inc - tiles && local < inc);
      const int src = __ffs(hit) - 1;
      const int start = __shfl_sync(0xffffffffu, inc - tiles, src);
      *prob = base + src;
      *tok0 = __shfl_sync(0xffffffffu, tbase, src) + (local - start) * toks;
      *rows = __shfl_sync(0xffffffffu, n, src);
      *first = __shfl_sync(0xffffffffu, lo, src);
      return true;
    }
    before += total;
  }
  return false;
}

// y[p][tok, row] for a kRows x kToks tile of one problem (file comment).
template <class F, class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocksPerSm) QmmGemmKernel(QmmParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using Loader = ScaleLoader<F>;
  constexpr int KW = F::kWords;
  constexpr int kRows = Cfg::kRows, kToks = Cfg::kToks, kNT = Cfg::kTiles;
  constexpr int kStages = Cfg::template kStages<F>;
  constexpr int kWStage = Cfg::template kWStageWords<F>;
  constexpr int kXStage = Cfg::kXStageWords;
  constexpr bool kWg = Cfg::kWg;
  extern __shared__ uint4 gemm_smem[];
  uint32_t* const ws = reinterpret_cast<uint32_t*>(gemm_smem);
  uint32_t* const xs = ws + kStages * kWStage;
  uint8_t* const xwg = reinterpret_cast<uint8_t*>(xs + kStages * kXStage);  // kWg only

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  // This block's problem, its first token and its token count; grouped rows also give the
  // problem's first row (`first`) and exit blocks past the last tile. The epilogue takes
  // them again (from blockIdx and p, or from shared memory when grouped) so that none is
  // held in a register across the k loop, where the accumulators need every register.
  __shared__ int64_t tile_s[4];
  int64_t prob = blockIdx.z, tok0 = static_cast<int64_t>(blockIdx.y) * kToks, m = p.m, first = 0;
  if (p.row_off != nullptr) {
    if (!GroupedTile(p, blockIdx.y, kToks, &prob, &tok0, &m, &first)) return;
    if (tid == 0) {
      tile_s[0] = prob;
      tile_s[1] = tok0;
      tile_s[2] = m;
      tile_s[3] = first;
    }
  }
  int64_t b = 0;
  const bool bad = !ProblemBatch(p, prob, &b);
  if (bad) b = 0;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int64_t nchunks = p.w.cols / kChunk;
  const int nks = static_cast<int>((nchunks + 3) / 4);

  // Issues the copies of k-step ks into stage slot `slot`; rows past the matrix, tokens past
  // m and chunks past K are zero-filled (with ZeroScale below, they contribute exact zeros).
  // Thread tid always copies the same 16-byte column u of rows r0 + j * step, so the source
  // of row j is one pointer plus a fixed stride: a few instructions per copy.
  constexpr int kXTokStep = Cfg::kThreads / 16;
  constexpr int kXPerThread = kToks / kXTokStep;
  static_assert(kToks % kXTokStep == 0);
  const int xu = tid & 15, xtk = tid >> 4;
  const uint16_t* const xsrc0 = static_cast<const uint16_t*>(XRow(p, prob, first)) +
                                (tok0 + xtk) * p.ldx + 8 * xu;
  const int64_t xstride = kXTokStep * p.ldx;
  const int64_t xtoks_left = m - tok0 - xtk;  // tokens j * kXTokStep < xtoks_left exist
  // Word offset of this thread's first x unit in a stage (the swizzle depends on the token's
  // parity, which kXTokStep (even) keeps).
  const int xoff = xtk * (kGemmStageK / 2) + 4 * XSwizzle(xu, xtk);
  static_assert(kXTokStep % 2 == 0);
  auto load_stage = [&](int slot, int ks) {
    const int64_t c0 = 4 * static_cast<int64_t>(ks);  // first chunk of the stage
    uint32_t* wdst = ws + slot * kWStage;
    if constexpr (KW % 4 == 0 && Cfg::kThreads % KW == 0) {
      constexpr int kUnitsPerRow = KW;  // 4 chunks x KW words / 4 words per unit
      constexpr int kRowStep = Cfg::kThreads / kUnitsPerRow;
      const int u = tid % kUnitsPerRow, r0 = tid / kUnitsPerRow;
      const bool chunk_ok = !bad && c0 + (u * 4) / KW < nchunks;
      const int64_t rows_left = p.w.rows - row0 - r0;  // rows j * kRowStep < rows_left exist
      const int64_t step = kRowStep * p.w.row_words;
      const uint32_t* src = RowPtr(p.w, b, row0 + r0) + c0 * KW + 4 * u;
      uint32_t* dst = wdst + r0 * 4 * KW + 4 * u;
      // Not unrolled: unrolled, the compiler keeps each copy's address and row check live
      // across the k loop, where the accumulators need the registers. Pointers step by a
      // fixed stride so an iteration is a handful of instructions.
#pragma unroll 1
      for (int j = 0; j < kRows / kRowStep; ++j) {
        const bool ok = chunk_ok && j * kRowStep < rows_left;
        CpAsync16(dst, ok ? src : p.w.w, ok);
        src += step;
        dst += kRowStep * 4 * KW;
      }
    } else {
#pragma unroll 1
      for (int i = tid; i < kRows * 4 * KW; i += Cfg::kThreads) {
        const int r = i / (4 * KW), wd = i % (4 * KW);
        const int64_t row = row0 + r;
        const int64_t chunk = c0 + wd / KW;
        const bool ok = !bad && row < p.w.rows && chunk < nchunks;
        const uint32_t* src = ok ? RowPtr(p.w, b, row) + c0 * KW + wd : p.w.w;
        CpAsync4(wdst + r * 4 * KW + wd, src, ok);
      }
    }
    uint32_t* xdst = xs + slot * kXStage + xoff;
    const bool xchunk_ok = c0 + (xu >> 2) < nchunks;
    const uint16_t* xsrc = xsrc0 + ks * kGemmStageK;
#pragma unroll 1
    for (int j = 0; j < kXPerThread; ++j) {
      const bool ok = xchunk_ok && j * kXTokStep < xtoks_left;
      CpAsync16(xdst, ok ? xsrc : static_cast<const uint16_t*>(p.x), ok);
      xsrc += xstride;
      xdst += kXTokStep * (kGemmStageK / 2);
    }
  };
  // Rewrites this thread's x units of a landed stage in the decoders' pair order
  // (PairsOf16bitQuad): once here instead of once per use by every warp of the block.
  // A thread's own cp.async writes are visible to it after its wait_group; the barrier that
  // follows publishes the result.
  // kWg: the pairs go to the wgmma's B layout instead (buffer `buf`): the unit of chunk c,
  // word group W gives the k16 steps 2W (pairs 0, 1) and 2W + 1 (pairs 2, 3), each pair in
  // word c of its core-matrix row (k 2c, 2c + 1 | 2c + 8, 2c + 9, as the A fragments).
  auto permute_x = [&](int slot, int buf) {
    uint32_t* xdst = xs + slot * kXStage + xoff;
#pragma unroll
    for (int j = 0; j < kXPerThread; ++j) {
      uint4* q = reinterpret_cast<uint4*>(xdst + j * kXTokStep * (kGemmStageK / 2));
      const uint4 v = *q;
      uint32_t o[4];
      qdec::PairsOf16bitQuad(v.x, v.y, v.z, v.w, o);
      if constexpr (kWg) {
        const int tok = xtk + j * kXTokStep, c = xu >> 2, wg = xu & 3;
        uint8_t* base = xwg + (buf * 8 + 2 * wg) * Cfg::kXWgStepBytes + (tok >> 3) * 256 +
                        (tok & 7) * 16 + 4 * c;
        *reinterpret_cast<uint32_t*>(base) = o[0];
        *reinterpret_cast<uint32_t*>(base + 128) = o[1];
        *reinterpret_cast<uint32_t*>(base + Cfg::kXWgStepBytes) = o[2];
        *reinterpret_cast<uint32_t*>(base + Cfg::kXWgStepBytes + 128) = o[3];
      } else {
        *q = make_uint4(o[0], o[1], o[2], o[3]);
      }
    }
    if constexpr (kWg) FenceProxyAsync();
  };

  // This lane's weight rows: tile rt, half h -> row warp_row + kRtRows*rt + g + 8*h of the
  // block (mma.sync: warp w owns 32 consecutive rows; kWg: see GemmCfg).
  constexpr int kRtRows = kWg ? 64 : 16;
  const int warp_row = kWg ? 128 * (warp >> 2) + 16 * (warp & 3) : 32 * warp;
  int64_t srow[2][2];
  bool rv[2][2];
#pragma unroll
  for (int rt = 0; rt < 2; ++rt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = row0 + warp_row + kRtRows * rt + g + 8 * h;
      rv[rt][h] = !bad && row < p.w.rows;
      srow[rt][h] = ScaleRow(p.w, b, rv[rt][h] ? row : 0);
    }
  }
  typename Loader::Raw sraw[2][2];
  auto fetch_scales = [&](int ks) {
    const int64_t chunk = 4 * static_cast<int64_t>(ks) + t;
    const int64_t c = chunk < nchunks ? chunk : 0;
#pragma unroll
    for (int rt = 0; rt < 2; ++rt)
#pragma unroll
      for (int h = 0; h < 2; ++h) sraw[rt][h] = Loader::Fetch(p.w, srow[rt][h], c);
  };

  float acc[2][kNT][4];
#pragma unroll
  for (int rt = 0; rt < 2; ++rt)
#pragma unroll
    for (int n = 0; n < kNT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[rt][n][i] = 0.f;
  // A fragments of a word group, two sets: kWg's wgmmas read them asynchronously.
  uint32_t abuf[2][2][2][4] = {};

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nks) load_stage(s, s);
    CpAsyncCommit();
  }
  fetch_scales(0);

  for (int ks = 0; ks < nks; ++ks) {
    CpAsyncWait<kStages - 2>();
    permute_x(ks % kStages, ks & 1);
    typename F::Scale sc[2][2];
    const bool chunk_ok = 4 * static_cast<int64_t>(ks) + t < nchunks;
    bool fast = true;
#pragma unroll
    for (int rt = 0; rt < 2; ++rt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        sc[rt][h] = rv[rt][h] && chunk_ok ? Loader::Make(p.w, sraw[rt][h]) : F::ZeroScale();
        if constexpr (kHasFastPath<F>) fast = fast && F::FastScale(sc[rt][h]);
      }
    // Stage ks visible to all; everyone is done with the slot refilled next. A wgmma needs
    // its whole warpgroup on the same instruction, so there the fast-path choice is the
    // block's (one barrier either way).
    if constexpr (kWg) {
      // The last wgmma group of stage ks - 1 ran during the rewrite above; it must be done
      // in every thread before anyone rewrites its x buffer (stage ks + 1).
      WgmmaWait<0>();
      fast = __syncthreads_and(fast);
    } else {
      __syncthreads();
      fast = __all_sync(0xffffffffu, fast);
    }
    if (ks + kStages - 1 < nks) load_stage((ks + kStages - 1) % kStages, ks + kStages - 1);
    CpAsyncCommit();
    if (ks + 1 < nks) fetch_scales(ks + 1);  // in flight during this stage's math

    const int slot = ks % kStages;
    const uint32_t* wst = ws + slot * kWStage + (warp_row + g) * 4 * KW + t * KW;
    const uint32_t* xst = xs + slot * kXStage + g * (kGemmStageK / 2);
    const uint8_t* xwst = xwg + (ks & 1) * 8 * Cfg::kXWgStepBytes;
    // One stage's math. kFast: every lane's scales take the format's branch-free decoder,
    // so the loop body is one basic block the compiler can software-pipeline.
    auto stage_math = [&](auto fast_tag) {
      constexpr bool kFast = decltype(fast_tag)::value;
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        // Keeps each word group's shared loads and decodes after the previous group's mma
        // in the PTX, to bound the registers in flight (ptxas still schedules the SASS).
        asm volatile("" ::: "memory");
        uint32_t (&a)[2][2][4] = abuf[w & 1];
#pragma unroll
        for (int rt = 0; rt < 2; ++rt) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t* src = wst + (kRtRows * rt + 8 * h) * 4 * KW;
            uint32_t raw[KW];
            if constexpr (KW == 4) {
              // 4-bit formats read only word w for the pairs of word group w.
#pragma unroll
              for (int i = 0; i < 4; ++i) raw[i] = i == w ? src[w] : 0u;
            } else {
              LoadSharedWords<KW>(src, raw);
            }
            if constexpr (kFast) {
              FastPairs<F>(raw, w, sc[rt][h], a[rt][h]);
            } else {
              F::Pairs(raw, w, sc[rt][h], a[rt][h]);
            }
          }
        }
        // The general decoders may branch per lane (mxfp4's rare slow scales);
        // mma.sync.aligned needs the whole warp converged.
        if constexpr (!kFast) __syncwarp();
        if constexpr (kWg) {
          // Two k16 steps (pairs 0-1 and 2-3 of the word group) x two 64-row tiles. The
          // group is waited for one word group later, so this word group's decode runs
          // while the previous one's wgmmas do; abuf alternates so that no A register is
          // rewritten before the wgmma reading it is done.
          WgmmaFence();
#pragma unroll
          for (int jj = 0; jj < 2; ++jj) {
            const uint64_t desc = WgmmaDesc(xwst + (2 * w + jj) * Cfg::kXWgStepBytes, 128, 256);
#pragma unroll
            for (int rt = 0; rt < 2; ++rt) {
              const uint32_t ar[4] = {a[rt][0][2 * jj], a[rt][1][2 * jj], a[rt][0][2 * jj + 1],
                                      a[rt][1][2 * jj + 1]};
              WgmmaBf16RS<kToks>(reinterpret_cast<float(&)[kToks / 2]>(acc[rt]), ar, desc);
            }
          }
          WgmmaCommit();
          WgmmaWait<1>();
#pragma unroll
          for (int rt = 0; rt < 2; ++rt)
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
              for (int i = 0; i < 4; ++i) WgmmaFenceOperand(abuf[(w + 1) & 1][rt][h][i]);
          continue;
        }
        const int xunit = XSwizzle(4 * t + w, g);
#pragma unroll
        for (int n = 0; n < kNT; ++n) {
          // Already in pair order (permute_x): the B operands of the word group's two mma.
          const uint4 xq = LoadSharedOrdered(xst + n * 8 * (kGemmStageK / 2) + 4 * xunit);
#pragma unroll
          for (int rt = 0; rt < 2; ++rt) {
            MmaBf16(acc[rt][n], a[rt][0][0], a[rt][1][0], a[rt][0][1], a[rt][1][1], xq.x, xq.y);
            MmaBf16(acc[rt][n], a[rt][0][2], a[rt][1][2], a[rt][0][3], a[rt][1][3], xq.z, xq.w);
          }
        }
      }
    };
    if constexpr (kHasFastPath<F>) {
      if (fast) {
        stage_math(std::true_type{});
      } else {
        stage_math(std::false_type{});
      }
    } else {
      stage_math(std::true_type{});
    }
  }
  CpAsyncWait<0>();
  if constexpr (kWg) {
    WgmmaWait<0>();
#pragma unroll
    for (int rt = 0; rt < 2; ++rt)
#pragma unroll
      for (int n = 0; n < kNT; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) WgmmaFenceOperand(acc[rt][n][i]);
  }

  // Published to all threads by the k loop's barriers (nks >= 1).
  if (p.row_off != nullptr) {
    prob = tile_s[0];
    tok0 = tile_s[1];
    m = tile_s[2];
    first = tile_s[3];
  } else {
    prob = blockIdx.z;
    tok0 = static_cast<int64_t>(blockIdx.y) * kToks;
    m = p.m;
    first = 0;
  }
  // One store loop per addressing mode (y_rows: scattered rows), each straight-line.
  auto store = [&](auto scatter_tag) {
    constexpr bool kScatter = decltype(scatter_tag)::value;
    float* ybase = p.y + prob * p.y_pstride + first * p.ldy;
#pragma unroll
    for (int rt = 0; rt < 2; ++rt) {
#pragma unroll
      for (int n = 0; n < kNT; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int64_t row = row0 + warp_row + kRtRows * rt + g + (i >= 2 ? 8 : 0);
          const int64_t tok = tok0 + 8 * n + 2 * t + (i & 1);
          if (row < p.w.rows && tok < m) {
            float* yrow = kScatter ? p.y + __ldg(p.y_rows + first + tok) * p.ldy
                                   : ybase + tok * p.ldy;
            yrow[row] = FinishOutput(acc[rt][n][i], bad, p.round_bf16);
          }
        }
      }
    }
  };
  if (p.y_rows != nullptr) {
    store(std::true_type{});
  } else {
    store(std::false_type{});
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

// Transposed bf16 copy of weight slices [b0, b0 + gridDim.z) for QMatmulN's GEMM path:
// out[s][col][row] = W_{b0+s}[row, col] as the GEMM's decoders give it (Elem: the
// dequantized value, a bf16 for every format that takes this path). Thread (lane, warp) decodes chunk blockIdx.y * 8 + warp of row
// blockIdx.x * 32 + lane, so each store of a warp writes 32 consecutive rows of one column.
constexpr int kTransposeWarps = 8;

template <class F>
__global__ void __launch_bounds__(kTransposeWarps * 32)
    DecodeTransposedKernel(WeightView v, int64_t b0, uint16_t* out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 32 + lane;
  const int64_t chunk = static_cast<int64_t>(blockIdx.y) * kTransposeWarps + warp;
  if (row >= v.rows || chunk >= v.cols / kChunk) return;
  const int64_t b = b0 + blockIdx.z;
  uint32_t raw[F::kWords];
  LoadRaw<F::kWords, false>(RowPtr(v, b, row) + chunk * F::kWords, raw);
  const typename F::Scale sc = ScaleLoader<F>::Load(v, ScaleRow(v, b, row), chunk);
  uint16_t* o = out + (static_cast<int64_t>(blockIdx.z) * v.cols + chunk * kChunk) * v.rows + row;
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    float val[8];
    DecodeWord<F, false>(raw, w, sc, val);
#pragma unroll
    for (int e = 0; e < 8; ++e) o[(8 * w + e) * v.rows] = qdec::F32ToBf16Bits(val[e]);
  }
}

// ---- embedding rows ---------------------------------------------------------------------------
template <class F>
__global__ void EmbedKernel(WeightView v, const int32_t* ids, void* out, int out_bf16, cpu::ActDType round) {
  PdlBegin();
  constexpr int KW = F::kWords;
  const int64_t unit = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t chunk = unit >> 2;
  const int w = static_cast<int>(unit & 3);
  if (chunk >= v.cols / kChunk) return;
  const int64_t tok = blockIdx.y;
  const int64_t id = LoadProduced(ids + tok);
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
#pragma unroll
  for (int e = 0; e < 8; ++e) val[e] = DevRoundAct(val[e], round);
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

// ---- mxfp4 words into the GPU nibble order (UploadQuantWeight) ------------------------------
__global__ void RepackMxfp4Kernel(uint32_t* w, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    w[i] = qdec::Mxfp4::Repack(w[i]);
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

// The alt weight of one part (QMatmulArgs::alt): one slice of `w`'s layout.
absl::Status SetAlt(const DeviceQuantWeight& w, const DeviceQuantWeight* alt, GemvAlt* out) {
  if (alt == nullptr || !SameSliceLayout(w, *alt)) {
    return absl::InvalidArgumentError(
        "alt weight: needs a batch-1 matrix with the format, scales and shape of one slice");
  }
  const WeightView v = MakeView(*alt);
  *out = GemvAlt{v.w, v.scales, v.biases};
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
  p.y_bf16 = a.y_bf16;
  if (a.y_bf16 != nullptr && !a.round_bf16) {
    return absl::InvalidArgumentError("y_bf16 needs round_bf16");
  }
  p.row_off = a.row_offsets;
  p.y_rows = a.y_rows;
  p.problems = a.problems;
  p.alt_from = std::numeric_limits<int64_t>::max();
  if (a.alt_problems != 0) {
    if (a.alt_problems < 0 || a.alt_problems > a.problems || a.row_offsets != nullptr ||
        a.alt_x_row0 < 0) {
      return absl::InvalidArgumentError(
          "alt problems: 0 < alt_problems <= problems, no grouped rows, alt_x_row0 >= 0");
    }
    p.alt_from = a.problems - a.alt_problems;
    p.alt_x_row0 = a.alt_x_row0;
    RING_RETURN_IF_ERROR(SetAlt(w, a.alt[0], &p.alt[0]));
  }
  if (a.row_offsets != nullptr) {
    if (a.expert_ids != nullptr || a.batch_begin != 0 || (w.batch == 1 && a.problems != 1) ||
        (w.batch > 1 && a.problems > w.batch) || a.m > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(
          "grouped rows: problem p uses slice p (no expert ids, batch_begin 0, problems <= "
          "batch) and m < 2^31");
    }
    p.x_pstride = 0;  // rows are addressed through row_offsets
    p.y_pstride = 0;
  } else if (a.y_rows != nullptr) {
    return absl::InvalidArgumentError("y_rows needs row_offsets");
  }
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
  if (a.path == QmmPath::kSimt && a.row_offsets == nullptr) return Family::kSimt;
  absl::StatusOr<const DeviceInfo*> dev = CurrentDevice();
  if (!dev.ok()) return dev.status();
  const bool hw = UseTensorCoreMatmul(**dev);
  const bool bf16_x = a.x_dtype == DType::kBF16;
  const bool grouped = a.row_offsets != nullptr;
  const bool gemv = hw && bf16_x && a.m <= 8 && !grouped && GemvSupports(w);
  const bool gemm = hw && bf16_x && bf16_exact;
  if (grouped) {
    if (gemm && a.path != QmmPath::kSimt) return Family::kTcGemm;
    return absl::InvalidArgumentError(
        "grouped rows need the prefill GEMM: bf16 x, sm_80+ code and a format with exact "
        "bf16 values");
  }
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

// One GEMM configuration's launch for these arguments, or its cost estimate (`cost`, in
// padded tile elements per SM; 0 when the configuration does not fit the device).
template <class F, class Cfg>
absl::Status GemmWith(const QmmParams& p, int64_t problems, const DeviceInfo& dev,
                      cudaStream_t stream, std::string* describe, double* cost) {
  constexpr int kSmem = Cfg::template kSmemBytes<F>;
  const int64_t row_blocks = (p.w.rows + Cfg::kRows - 1) / Cfg::kRows;
  int64_t tok_blocks = (p.m + Cfg::kToks - 1) / Cfg::kToks;
  int64_t expected_tok_blocks = tok_blocks * problems;
  if (p.row_off != nullptr) {
    // Grouped rows: the tiles of all problems share grid.y, sized for the worst split (each
    // non-empty problem adds at most one partial tile); blocks past the last tile exit at
    // once. Expected: half a partial tile per non-empty problem.
    const int64_t nonempty = std::min(problems, p.m);
    expected_tok_blocks = tok_blocks + (nonempty + 1) / 2;
    tok_blocks = p.split_tail ? nonempty : tok_blocks + nonempty;
    problems = 1;
  }
  if (cost != nullptr) {
    *cost = 0;
    if (kSmem > dev.smem_per_block_optin || tok_blocks > 65535) return absl::OkStatus();
    // Blocks are spread over the SMs; each SM's share of padded tile work bounds the time.
    const int64_t blocks = row_blocks * expected_tok_blocks;
    const int64_t per_sm = (blocks + dev.sm_count - 1) / dev.sm_count;
    *cost = static_cast<double>(per_sm) * Cfg::kRows * Cfg::kToks;
    return absl::OkStatus();
  }
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(tok_blocks),
                  static_cast<unsigned>(problems));
  if (describe != nullptr) {
    *describe = absl::StrFormat("gemm %dx%d s%d blk%d smem%d grid%dx%dx%d%s", Cfg::kRows,
                                Cfg::kToks, Cfg::template kStages<F>, Cfg::kThreads, kSmem,
                                grid.x, grid.y, grid.z, Cfg::kWg ? " wgmma" : "");
    return absl::OkStatus();
  }
  auto kernel = QmmGemmKernel<F, Cfg>;
  // Per launch rather than once: the attribute is per device, and it costs ~1 us against
  // GEMMs of hundreds of us.
  RING_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  kernel<<<grid, Cfg::kThreads, kSmem, stream>>>(p);
  RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

// Grouped rows in two launches (QmmParams::split_*): every problem's whole Large tiles and
// rests of more than Small::kToks rows on the Large tile, the shorter rests on the Small
// one. An expert's tile costs about the same whether it holds few tokens or many (each
// weight is decoded once per tile), so a 2048-token GLM-5.2 prompt, ~64 uneven slots per
// expert, ran fastest on the large tile (H200, 2026-12-01) except for the experts' short rests,
// which paid a whole 128-token tile for at most 64 tokens. False when a tile does not fit.
template <class F, class Large, class Small>
absl::StatusOr<bool> LaunchGroupedSplit(const QmmParams& p, const DeviceInfo& dev,
                                        cudaStream_t stream, std::string* describe) {
  static_assert(Large::kToks > Small::kToks);
  QmmParams bulk = p;
  bulk.split_big = Large::kToks;
  bulk.split_small = Small::kToks;
  bulk.split_tail = 0;
  QmmParams tail = bulk;
  tail.split_tail = 1;
  double cost[2];
  RING_RETURN_IF_ERROR((GemmWith<F, Large>(bulk, p.problems, dev, stream, nullptr, &cost[0])));
  RING_RETURN_IF_ERROR((GemmWith<F, Small>(tail, p.problems, dev, stream, nullptr, &cost[1])));
  if (cost[0] <= 0 || cost[1] <= 0) return false;
  std::string d0, d1;
  RING_RETURN_IF_ERROR((GemmWith<F, Large>(bulk, p.problems, dev, stream,
                                           describe != nullptr ? &d0 : nullptr, nullptr)));
  RING_RETURN_IF_ERROR((GemmWith<F, Small>(tail, p.problems, dev, stream,
                                           describe != nullptr ? &d1 : nullptr, nullptr)));
  if (describe != nullptr) *describe = absl::StrCat(d0, " + rests ", d1);
  return true;
}

// One of the three tile configurations of a family (mma.sync or wgmma), see LaunchGemm;
// grouped rows split between the large and the small one unless a tile is forced.
template <class F, class Large, class Mid, class Small>
absl::StatusOr<bool> LaunchGemmFrom(const QmmParams& p, int64_t problems, const DeviceInfo& dev,
                                    cudaStream_t stream, std::string* describe) {
  const int grouped = g_gemm_grouped_tile.load(std::memory_order_relaxed);
  int forced = g_gemm_tile.load(std::memory_order_relaxed);
  if (p.row_off != nullptr) {
    if (grouped == 3 || (grouped < 0 && forced < 0)) {
      RING_ASSIGN_OR_RETURN(const bool launched,
                            (LaunchGroupedSplit<F, Large, Small>(p, dev, stream, describe)));
      if (launched) return true;
    }
    if (grouped >= 0 && grouped < 3) forced = grouped;
  }
  double cost[3];
  RING_RETURN_IF_ERROR((GemmWith<F, Large>(p, problems, dev, stream, nullptr, &cost[0])));
  RING_RETURN_IF_ERROR((GemmWith<F, Mid>(p, problems, dev, stream, nullptr, &cost[1])));
  RING_RETURN_IF_ERROR((GemmWith<F, Small>(p, problems, dev, stream, nullptr, &cost[2])));
  // Relative speed per unit of tile work: the small tile decodes each weight for half as
  // many tokens; the mid one shares each weight tile between half as many warps. Grouped
  // rows on wgmma (MoE experts, when forced to one tile): a 2048-token GLM-5.2 prefill (64
  // slots per expert on average, unevenly) ran its experts 0.5 ms faster on the large tile
  // than on the small one (H200, 2026-12-01), which the padded-work estimate alone ranks the
  // other way.
  const double kEfficiency[3] = {1.0, 0.95, p.row_off != nullptr && Large::kWg ? 0.7 : 0.8};
  int best = -1;
  for (int i = 0; i < 3; ++i) {
    if (cost[i] <= 0 || (forced >= 0 && forced != i)) continue;
    if (best < 0 || cost[i] / kEfficiency[i] < cost[best] / kEfficiency[best]) best = i;
  }
  switch (best) {
    case 0: RING_RETURN_IF_ERROR((GemmWith<F, Large>(p, problems, dev, stream, describe, nullptr))); break;
    case 1: RING_RETURN_IF_ERROR((GemmWith<F, Mid>(p, problems, dev, stream, describe, nullptr))); break;
    case 2: RING_RETURN_IF_ERROR((GemmWith<F, Small>(p, problems, dev, stream, describe, nullptr))); break;
    default: return false;
  }
  return true;
}

// Picks the GEMM configuration with the least padded work per SM (ties and near-ties go to
// the larger tiles, which decode each weight for more tokens and reuse shared memory more)
// and launches it, on wgmma where the device and this build have it, for formats of at most
// 8 bits: 16-bit weights fill a stage's shared memory twice as fast, and with the wgmma's
// operand buffers their tiles drop to one block per SM (the GLM-5.2 slice's expanded MLA
// keys, bf16 K = 512: 1.19 ms on wgmma against 0.80 ms on mma.sync for a 2048-token
// prefill, H200, 2026-12-01). False when no tile fits the device's shared memory (the
// caller then runs the SIMT kernel).
template <class F>
absl::StatusOr<bool> LaunchGemm(const QmmParams& p, int64_t problems, cudaStream_t stream,
                                std::string* describe) {
  RING_ASSIGN_OR_RETURN(const DeviceInfo* dev, CurrentDevice());
  if (F::kWords <= 8 && dev->wgmma && g_gemm_wgmma.load(std::memory_order_relaxed)) {
    RING_ASSIGN_OR_RETURN(const bool launched,
                          (LaunchGemmFrom<F, GemmLargeWg, GemmMidWg, GemmSmallWg>(
                              p, problems, *dev, stream, describe)));
    if (launched) return true;
  }
  const bool large_fits = GemmLarge::kSmemBytes<F> <= dev->smem_per_block_optin;
  RING_ASSIGN_OR_RETURN(
      const bool launched,
      large_fits ? (LaunchGemmFrom<F, GemmLarge, GemmMid, GemmSmall>(p, problems, *dev, stream, describe))
                 : (LaunchGemmFrom<F, GemmLargeTwoStage, GemmMid, GemmSmall>(p, problems, *dev, stream, describe)));
  if (launched) return true;
  const int grouped = g_gemm_grouped_tile.load(std::memory_order_relaxed);
  const int forced = p.row_off != nullptr && grouped >= 0 && grouped < 3 ? grouped
                                                                         : g_gemm_tile.load(std::memory_order_relaxed);
  if (forced >= 0 && forced != 2) return false;
  double cost = 0;
  RING_RETURN_IF_ERROR((GemmWith<F, GemmSmallTwoStage>(p, problems, *dev, stream, nullptr, &cost)));
  if (cost <= 0) return false;
  RING_RETURN_IF_ERROR((GemmWith<F, GemmSmallTwoStage>(p, problems, *dev, stream, describe, nullptr)));
  return true;
}

template <class F>
absl::Status LaunchT(const DeviceQuantWeight& w, const QmmParams& p, const QMatmulArgs& a,
                     Family fam, cudaStream_t stream, std::string* describe) {
  const int64_t rows = p.w.rows;
  const int64_t problems = a.problems;
  if (fam == Family::kTcGemv) return LaunchGemv(w, p, problems, a.overlap, stream, describe);
  if (a.alt_problems != 0 || a.y_bf16 != nullptr) {
    return absl::InvalidArgumentError("alt problems and y_bf16 need the decode GEMV (m <= 8, bf16 x)");
  }
  if (fam == Family::kTcGemm) {
    if constexpr (F::kBf16Exact) {
      RING_ASSIGN_OR_RETURN(const bool launched, LaunchGemm<F>(p, problems, stream, describe));
      if (launched) return absl::OkStatus();
      if (p.row_off != nullptr) {
        return absl::UnimplementedError("grouped rows: no GEMM tile fits this device");
      }
      // No tile configuration fits this device's shared memory (less than the two-stage
      // small tile's 96 KB for 16-bit weights): the exact SIMT kernel below.
    } else {
      return absl::InternalError("tensor-core path picked for a non-bf16 format");
    }
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
  if (v.spec.mode == QuantMode::kMxfp4) {
    // Into the GPU nibble order, in place. The legacy stream orders it after the copy.
    const int64_t words = static_cast<int64_t>(w.weight.nbytes() / 4);
    const int64_t blocks = std::min<int64_t>((words + 255) / 256, 4096);
    RepackMxfp4Kernel<<<static_cast<unsigned>(blocks), 256>>>(o.weight.as<uint32_t>(), words);
    RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    RING_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(nullptr));
  }
  return o;
}

bool SameSliceLayout(const DeviceQuantWeight& stacked, const DeviceQuantWeight& single) {
  return single.batch == 1 && single.rows == stacked.rows && single.cols == stacked.cols &&
         single.spec.mode == stacked.spec.mode && single.spec.bits == stacked.spec.bits &&
         single.spec.group_size == stacked.spec.group_size && single.dtype == stacked.dtype &&
         single.scale_dtype == stacked.scale_dtype &&
         single.global_scale == stacked.global_scale &&
         (single.scales == nullptr) == (stacked.scales == nullptr) &&
         (single.biases == nullptr) == (stacked.biases == nullptr);
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

namespace {

// Whether weights a and b can share one decode-GEMV launch: the kernel instantiation and
// everything in WeightView but the pointers and rows must agree.
bool SameGemvLayout(const DeviceQuantWeight& a, const DeviceQuantWeight& b) {
  return a.spec.mode == b.spec.mode && a.spec.bits == b.spec.bits &&
         a.spec.group_size == b.spec.group_size && a.dtype == b.dtype &&
         a.scale_dtype == b.scale_dtype && a.cols == b.cols && a.batch == b.batch &&
         a.global_scale == b.global_scale;
}

// ws[i0, i0 + n) in one launch if they share the decode GEMV; false (nothing launched) if not.
absl::StatusOr<bool> LaunchGemvParts(absl::Span<const DeviceQuantWeight* const> ws,
                                     absl::Span<float* const> ys, const QMatmulArgs& a,
                                     cudaStream_t stream, std::string* describe) {
  const DeviceQuantWeight& w0 = *ws[0];
  for (const DeviceQuantWeight* w : ws) {
    if (!SameGemvLayout(w0, *w)) return false;
  }
  if (a.row_offsets != nullptr) return false;
  if (a.y_bf16 != nullptr) return absl::InvalidArgumentError("y_bf16: one weight a launch");
  bool launched = false;
  RING_RETURN_IF_ERROR(WithFormat(w0, [&](auto fmt) -> absl::Status {
    using F = decltype(fmt);
    RING_ASSIGN_OR_RETURN(const Family fam, PickFamily(Bf16Exact(F::kBf16Exact, w0), w0, a));
    if (fam != Family::kTcGemv) return absl::OkStatus();
    QMatmulArgs a0 = a;
    a0.y = ys[0];
    a0.ldy = 0;
    RING_ASSIGN_OR_RETURN(QmmParams p, MakeParams(w0, a0, w0.cols, w0.rows));
    p.nparts = static_cast<int>(ws.size());
    for (size_t i = 0; i < ws.size(); ++i) {
      if (ys[i] == nullptr) return absl::InvalidArgumentError("y is null");
      const WeightView v = MakeView(*ws[i]);
      p.parts[i] = GemvPart{v.w, v.scales, v.biases, v.rows, ys[i], v.rows, 0};
      if (a.alt_problems != 0) RING_RETURN_IF_ERROR(SetAlt(*ws[i], a.alt[i], &p.alt[i]));
    }
    launched = true;
    return LaunchGemv(w0, p, a.problems, a.overlap, stream, describe);
  }));
  return launched;
}

// QMatmulTSwiGlu's launch (or, with `describe`, its line).
absl::Status LaunchGemvSwiGlu(const DeviceQuantWeight& gate, const DeviceQuantWeight& up, const QMatmulArgs& a,
                              cudaStream_t stream, std::string* describe) {
  auto refuse = [](const char* why) {
    return absl::FailedPreconditionError(absl::StrCat("no fused SwiGLU GEMV: ", why));
  };
  if (!SameGemvLayout(gate, up) || gate.rows != up.rows) return refuse("gate and up differ");
  const bool affine4 = gate.spec.mode == QuantMode::kAffine && gate.spec.bits == 4;
  if (gate.spec.mode != QuantMode::kMxfp4 && !affine4) return refuse("mxfp4 and 4-bit affine only");
  if (!a.round_bf16) return refuse("it needs round_bf16");
  if (a.row_offsets != nullptr) return refuse("grouped rows");
  return WithFormat(gate, [&](auto fmt) -> absl::Status {
    using F = decltype(fmt);
    RING_ASSIGN_OR_RETURN(const Family fam, PickFamily(Bf16Exact(F::kBf16Exact, gate), gate, a));
    if (fam != Family::kTcGemv) return refuse("not a decode GEMV");
    RING_ASSIGN_OR_RETURN(QmmParams p, MakeParams(gate, a, gate.cols, gate.rows));
    p.nparts = 2;
    for (int i = 0; i < 2; ++i) {
      const DeviceQuantWeight& w = i == 0 ? gate : up;
      const WeightView v = MakeView(w);
      p.parts[i] = GemvPart{v.w, v.scales, v.biases, v.rows, p.y, p.ldy, 0};
      if (a.alt_problems != 0) RING_RETURN_IF_ERROR(SetAlt(w, a.alt[i], &p.alt[i]));
    }
    p.swiglu = 1 + static_cast<int>(cpu::ActDType::kBF16);
    return LaunchGemv(gate, p, a.problems, a.overlap, stream, describe);
  });
}

}  // namespace

bool FusedSwiGluEnabled() {
  static const bool on = EnvSwitchOn("RING_FUSED_SWIGLU");
  return on;
}

absl::Status QMatmulTSwiGlu(const DeviceQuantWeight& gate, const DeviceQuantWeight& up, const QMatmulArgs& a,
                            cudaStream_t stream) {
  return LaunchGemvSwiGlu(gate, up, a, stream, nullptr);
}

absl::StatusOr<std::string> DescribeQmmSwiGlu(const DeviceQuantWeight& gate, const DeviceQuantWeight& up,
                                              const QMatmulArgs& a) {
  alignas(16) static float dummy[4] = {};
  QMatmulArgs probe = a;
  if (probe.x == nullptr) probe.x = dummy;
  if (probe.y == nullptr) probe.y = dummy;
  std::string out;
  RING_RETURN_IF_ERROR(LaunchGemvSwiGlu(gate, up, probe, nullptr, &out));
  return out;
}

absl::Status QMatmulTMany(absl::Span<const DeviceQuantWeight* const> ws,
                          absl::Span<float* const> ys, const QMatmulArgs& a,
                          cudaStream_t stream) {
  if (ws.empty() || ws.size() != ys.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("QMatmulTMany: %d weights, %d outputs", ws.size(), ys.size()));
  }
  if (a.alt_problems != 0 && ws.size() > static_cast<size_t>(kMaxGemvParts)) {
    return absl::InvalidArgumentError("alt problems: at most 4 weights a launch");
  }
  for (size_t i0 = 0; i0 < ws.size(); i0 += kMaxGemvParts) {
    const size_t n = std::min<size_t>(kMaxGemvParts, ws.size() - i0);
    if (n > 1) {
      RING_ASSIGN_OR_RETURN(const bool launched,
                            LaunchGemvParts(ws.subspan(i0, n), ys.subspan(i0, n), a, stream, nullptr));
      if (launched) continue;
    }
    for (size_t i = i0; i < i0 + n; ++i) {
      QMatmulArgs ai = a;
      ai.y = ys[i];
      ai.ldy = 0;
      ai.alt[0] = a.alt[i];
      RING_RETURN_IF_ERROR(QMatmulT(*ws[i], ai, stream));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> DescribeQmmMany(absl::Span<const DeviceQuantWeight* const> ws,
                                            const QMatmulArgs& a) {
  if (ws.empty() || ws.size() > static_cast<size_t>(kMaxGemvParts)) {
    return absl::InvalidArgumentError("DescribeQmmMany: 1..4 weights");
  }
  alignas(16) static float dummy[4] = {};
  std::vector<float*> ys(ws.size(), dummy);
  QMatmulArgs probe = a;
  if (probe.x == nullptr) probe.x = dummy;
  std::string out;
  if (ws.size() > 1) {
    RING_ASSIGN_OR_RETURN(const bool launched, LaunchGemvParts(ws, ys, probe, nullptr, &out));
    if (launched) return out;
  }
  return absl::StrCat("separate: ", ws.size(), " launches");
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
    if (a.row_offsets != nullptr) {
      return absl::InvalidArgumentError("grouped rows: QMatmulT only");
    }
    RING_ASSIGN_OR_RETURN(const QmmParams p, MakeParams(w, a, w.rows, w.cols));
    if constexpr (F::kBf16Exact) {
      RING_ASSIGN_OR_RETURN(const Family fam, PickFamily(Bf16Exact(true, w), w, a));
      // The GEMM path (qgemv.cuh): a prefill-sized M over a plain slice range, contraction
      // length a multiple of the GEMM's chunk. The decode-sized M stays on SIMT, which reads
      // the packed weight once instead of writing and reading a bf16 copy.
      // This is the one place a dequantized copy of weights exists, and only for the call:
      // the GEMM's decoders run along the packed axis and this contraction runs across it.
      // The copy is a stream-ordered temporary of the slices in use (12.6 MB for a GLM-5.2
      // layer's key expansion, freed when the call's work is done), and it took that
      // prefill step from 32 ms (SIMT) to 1 ms over 4 layers at 2048 tokens.
      if (fam == Family::kTcGemm && a.expert_ids == nullptr && w.rows % kChunk == 0) {
        const int64_t b0 = w.batch == 1 ? 0 : a.batch_begin;
        const int64_t nb = w.batch == 1 ? 1 : a.problems;
        RING_ASSIGN_OR_RETURN(StreamBuffer wt,
                              StreamBuffer::Allocate(nb * w.rows * w.cols * 2, stream));
        const dim3 grid(static_cast<unsigned>((w.rows + 31) / 32),
                        static_cast<unsigned>((w.cols / kChunk + kTransposeWarps - 1) /
                                              kTransposeWarps),
                        static_cast<unsigned>(nb));
        DecodeTransposedKernel<F><<<grid, kTransposeWarps * 32, 0, stream>>>(MakeView(w), b0,
                                                                              wt.as<uint16_t>());
        RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        DeviceQuantWeight t;
        t.spec = QuantSpec{QuantMode::kNone, 0, 0};
        t.dtype = DType::kBF16;
        t.weight = wt.data();
        t.batch = nb;
        t.rows = w.cols;
        t.cols = w.rows;
        QMatmulArgs ta = a;
        ta.batch_begin = 0;
        ta.path = QmmPath::kTensorCore;
        return QMatmulT(t, ta, stream);
      }
    }
    if (a.path == QmmPath::kTensorCore) {
      return absl::InvalidArgumentError(
          "transpose=false: the tensor-core path needs M > 8, bf16 x, no expert ids and a "
          "format with exact bf16 values");
    }
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
                       DType out_dtype, cudaStream_t stream, cpu::ActDType round) {
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
    RING_LAUNCH_PDL((EmbedKernel<F>), grid, threads, 0, stream, MakeView(w), ids, out,
                    out_dtype == DType::kBF16, round);
    return absl::OkStatus();
  });
}

void TEST_SetGroupedGemmTile(int tile) {
  g_gemm_grouped_tile.store(tile, std::memory_order_relaxed);
}

void TEST_SetGemmTile(int tile, bool wgmma) {
  g_gemm_tile.store(tile, std::memory_order_relaxed);
  g_gemm_wgmma.store(wgmma, std::memory_order_relaxed);
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
