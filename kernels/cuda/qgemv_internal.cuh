// File: kernels/cuda/qgemv_internal.cuh
//
// Internals shared by the quantized matmul translation units (qgemv.cu: host API, SIMT,
// transpose=false, embedding, prefill GEMM; qgemv_gemv.cu: the decode GEMV): the kernels'
// parameter block and small device helpers. Not a public header.
#ifndef RINGSERVE_KERNELS_CUDA_QGEMV_INTERNAL_CUH_
#define RINGSERVE_KERNELS_CUDA_QGEMV_INTERNAL_CUH_

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/qgemv.cuh"
#include "kernels/cuda/quant_decode.cuh"

namespace ring::cuda::internal {

using qdec::kChunk;

// Device view of a weight (POD, passed by value).
struct WeightView {
  const uint32_t* w;
  const void* scales;
  const void* biases;
  int64_t batch, rows, cols;
  int64_t row_words;   // words per logical row
  int64_t scale_cols;  // scale entries per row
  int group_shift;     // affine: log2(group / 32)
  float gs_factor;     // nvfp4: global_scale / (448 * 6), 0 when absent
};

// One weight of a multi-weight decode GEMV launch (QMatmulTMany): the pointers and rows
// that differ from QmmParams::w (format, cols and scale layout are shared), its output, and
// the first block of grid x that works on it.
struct GemvPart {
  const uint32_t* w;
  const void* scales;
  const void* biases;
  int64_t rows;
  float* y;
  int64_t ldy;
  int64_t block_begin;
};
inline constexpr int kMaxGemvParts = 4;

// A part's weight for the trailing problems of an expert launch (QMatmulArgs::alt): a
// batch-1 matrix laid out as one expert slice.
struct GemvAlt {
  const uint32_t* w;
  const void* scales;
  const void* biases;
};

struct QmmParams {
  WeightView w;
  const void* x;
  int x_bf16;
  int64_t ldx, m;
  float* y;
  int64_t ldy;
  const int32_t* ids;
  int64_t batch_begin;
  int64_t x_pstride, x_pdiv, y_pstride;
  int round_bf16;
  uint16_t* y_bf16;  // QMatmulArgs::y_bf16 (decode GEMV, one part)
  // Grouped rows (QMatmulArgs::row_offsets); null otherwise. `problems` is their count.
  const int32_t* row_off;
  const int32_t* y_rows;
  int64_t problems;
  // Grouped rows split into two launches (LaunchGemm): 0 = one launch, every tile of every
  // problem. Else a problem's rows n = q * split_big + r go to a launch of split_big-token
  // tiles (the q full tiles, and the rest when r > split_small) and, when 0 < r <=
  // split_small, to a launch of split_small-token tiles (split_tail = 1) that holds its rest
  // only, so that a short rest does not pay for a wide tile.
  int split_big, split_small, split_tail;
  // Decode GEMV only: nparts > 1 weights on the same x (parts[0] repeats w, y and ldy).
  int nparts;
  GemvPart parts[kMaxGemvParts];
  // Problems >= alt_from take part i's weight from alt[i] and read x row
  // alt_x_row0 + (p - alt_from) (QMatmulArgs::alt_problems); INT64_MAX: none.
  int64_t alt_from, alt_x_row0;
  GemvAlt alt[kMaxGemvParts];
  // Decode GEMV (QgemvKernel, sm_90+): a cluster of this many blocks along y splits each row
  // tile's K steps further, reduced through distributed shared memory in rank order; 0 or 1:
  // none (the grid's y extent is then 1).
  int kblocks;
  // Fused SwiGLU output (QMatmulTSwiGlu; the column-split kernel only): 0 off, else
  // 1 + the cpu::ActDType of its roundings. parts[0] is gate and parts[1] up (nparts = 2,
  // same rows): every 16-row tile holds 8 rows of gate in its first half and the same 8 rows
  // of up in its second, grid x covers the two as one matrix of twice the rows, and y (ldy =
  // the rows of one) gets SwiGLU(gate x, up x) per row, after the outputs' bf16 rounding.
  int swiglu;
};

// ---- device helpers --------------------------------------------------------------------
// Per-chunk scale data of a format, in two steps so a kernel can issue the global loads a
// stage ahead and build the decoder's Scale only when it needs it: Fetch (the raw bytes of
// the chunk's scale/bias) and Make (F::Scale from them); Load does both.
template <class F>
struct ScaleLoader;

template <int kBits, class ST>
struct ScaleLoader<qdec::Affine<kBits, ST>> {
  using F = qdec::Affine<kBits, ST>;
  using S = typename ST::Storage;
  struct Raw {
    S s, b;
  };
  __device__ static Raw Fetch(const WeightView& v, int64_t srow, int64_t chunk) {
    const int64_t i = srow + (chunk >> v.group_shift);
    return {__ldg(static_cast<const S*>(v.scales) + i), __ldg(static_cast<const S*>(v.biases) + i)};
  }
  __device__ static typename F::Scale Make(const WeightView&, Raw r) {
    return F::MakeScale(ST::Load(r.s), ST::Load(r.b));
  }
  __device__ static typename F::Scale Load(const WeightView& v, int64_t srow, int64_t chunk) {
    return Make(v, Fetch(v, srow, chunk));
  }
};
// E8M0 formats: one scale byte per chunk.
template <class F>
struct E8M0ScaleLoader {
  using Raw = uint8_t;
  __device__ static Raw Fetch(const WeightView& v, int64_t srow, int64_t chunk) {
    return __ldg(static_cast<const uint8_t*>(v.scales) + srow + chunk);
  }
  __device__ static typename F::Scale Make(const WeightView&, Raw r) { return F::MakeScale(r); }
  __device__ static typename F::Scale Load(const WeightView& v, int64_t srow, int64_t chunk) {
    return Make(v, Fetch(v, srow, chunk));
  }
};
template <>
struct ScaleLoader<qdec::Mxfp4> : E8M0ScaleLoader<qdec::Mxfp4> {};
template <>
struct ScaleLoader<qdec::Mxfp8> : E8M0ScaleLoader<qdec::Mxfp8> {};
template <>
struct ScaleLoader<qdec::Nvfp4> {
  using Raw = uint16_t;
  // Two 16-element groups per chunk: scale bytes 2c and 2c+1 (2-byte aligned).
  __device__ static Raw Fetch(const WeightView& v, int64_t srow, int64_t chunk) {
    return __ldg(reinterpret_cast<const uint16_t*>(static_cast<const uint8_t*>(v.scales) + srow +
                                                   2 * chunk));
  }
  __device__ static qdec::Nvfp4::Scale Make(const WeightView& v, Raw r) {
    return qdec::Nvfp4::MakeScale(r, v.gs_factor);
  }
  __device__ static qdec::Nvfp4::Scale Load(const WeightView& v, int64_t srow, int64_t chunk) {
    return Make(v, Fetch(v, srow, chunk));
  }
};
template <class F>
struct DenseScaleLoader {
  struct Raw {};
  __device__ static Raw Fetch(const WeightView&, int64_t, int64_t) { return {}; }
  __device__ static typename F::Scale Make(const WeightView&, Raw) { return {}; }
  __device__ static typename F::Scale Load(const WeightView&, int64_t, int64_t) { return {}; }
};
template <>
struct ScaleLoader<qdec::DenseBf16> : DenseScaleLoader<qdec::DenseBf16> {};
template <>
struct ScaleLoader<qdec::DenseF16> : DenseScaleLoader<qdec::DenseF16> {};
template <>
struct ScaleLoader<qdec::DenseF32> : DenseScaleLoader<qdec::DenseF32> {};

// One chunk of one row: kWords words at p (aligned to the chunk size up to 16 bytes).
// kStream marks weights that are read once (GEMV): evict-first keeps L2 for activations.
template <int kWords, bool kStream>
__device__ __forceinline__ void LoadRaw(const uint32_t* p, uint32_t (&raw)[kWords]) {
  if constexpr (kWords % 4 == 0) {
#pragma unroll
    for (int i = 0; i < kWords / 4; ++i) {
      const uint4* q = reinterpret_cast<const uint4*>(p) + i;
      const uint4 v = kStream ? __ldcs(q) : __ldg(q);
      raw[4 * i] = v.x;
      raw[4 * i + 1] = v.y;
      raw[4 * i + 2] = v.z;
      raw[4 * i + 3] = v.w;
    }
  } else if constexpr (kWords % 2 == 0) {
#pragma unroll
    for (int i = 0; i < kWords / 2; ++i) {
      const uint2* q = reinterpret_cast<const uint2*>(p) + i;
      const uint2 v = kStream ? __ldcs(q) : __ldg(q);
      raw[2 * i] = v.x;
      raw[2 * i + 1] = v.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kWords; ++i) raw[i] = kStream ? __ldcs(p + i) : __ldg(p + i);
  }
}

// Slice of weight row `row` of batch b, and the start of its scale row.
__device__ __forceinline__ const uint32_t* RowPtr(const WeightView& v, int64_t b, int64_t row) {
  return v.w + (b * v.rows + row) * v.row_words;
}
__device__ __forceinline__ int64_t ScaleRow(const WeightView& v, int64_t b, int64_t row) {
  return (b * v.rows + row) * v.scale_cols;
}

// Which batch slice problem p uses; false when an expert id is out of range.
__device__ __forceinline__ bool ProblemBatch(const QmmParams& p, int64_t prob, int64_t* b) {
  const int64_t v = p.ids != nullptr ? static_cast<int64_t>(LoadProduced(p.ids + prob))
                                     : (p.w.batch == 1 ? 0 : p.batch_begin + prob);
  *b = v;
  return v >= 0 && v < p.w.batch;
}

__device__ __forceinline__ float FinishOutput(float v, bool bad, int round_bf16) {
  if (bad) return __int_as_float(0x7fc00000);
  return round_bf16 ? qdec::RoundToBf16(v) : v;
}

// Eight activations x[k..k+8) of one row as fp32.
__device__ __forceinline__ void LoadX8(const void* row, int x_bf16, int64_t k, float out[8]) {
  if (x_bf16) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(row) + k));
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = qdec::Bf16ToF32(w[i]);
      out[2 * i + 1] = qdec::Bf16ToF32(w[i] >> 16);
    }
  } else {
    const float4* q = reinterpret_cast<const float4*>(static_cast<const float*>(row) + k);
    const float4 a = __ldg(q), b = __ldg(q + 1);
    out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
    out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
  }
}
__device__ __forceinline__ float LoadX1(const void* row, int x_bf16, int64_t k) {
  return x_bf16 ? qdec::Bf16ToF32(__ldg(static_cast<const uint16_t*>(row) + k))
                : __ldg(static_cast<const float*>(row) + k);
}
__device__ __forceinline__ const void* XRow(const QmmParams& p, int64_t prob, int64_t tok) {
  const int64_t r = prob >= p.alt_from ? p.alt_x_row0 + (prob - p.alt_from) : prob / p.x_pdiv;
  const int64_t off = r * p.x_pstride + tok * p.ldx;
  return p.x_bf16 ? static_cast<const void*>(static_cast<const uint16_t*>(p.x) + off)
                  : static_cast<const void*>(static_cast<const float*>(p.x) + off);
}

__device__ __forceinline__ void MmaBf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// c = A * B with zero accumulators (c is written, not read): a fresh partial sum.
__device__ __forceinline__ void MmaBf16Zero(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                            uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%10,%10,%10,%10};\n"
      : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.f));
#endif
}

// ---- decode GEMV (qgemv_gemv.cu) -------------------------------------------------------------
// arr[i] by static indices only, so that a parameter array stays in the constant bank.
template <class T>
__device__ __forceinline__ T StaticPick(const T (&arr)[kMaxGemvParts], int i) {
  T s = arr[0];
#pragma unroll
  for (int j = 1; j < kMaxGemvParts; ++j) {
    if (i == j) s = arr[j];
  }
  return s;
}
// The part of a multi-weight launch that block `bx` of grid x works on: sets *w's pointers
// and rows to it and makes *bx relative to its first block; returns its index.
__device__ __forceinline__ int SelectGemvPart(const QmmParams& p, WeightView* w, int64_t* bx) {
  int part = 0;
#pragma unroll
  for (int i = 1; i < kMaxGemvParts; ++i) {
    if (i < p.nparts && *bx >= p.parts[i].block_begin) part = i;
  }
  const GemvPart s = StaticPick(p.parts, part);
  w->w = s.w;
  w->scales = s.scales;
  w->biases = s.biases;
  w->rows = s.rows;
  *bx -= s.block_begin;
  return part;
}
// Problem `prob`'s weight for part `part`: the expert slice *b of *w (ProblemBatch), or for
// the trailing alt problems the part's alt weight (slice 0). False on a bad expert id.
__device__ __forceinline__ bool ProblemWeight(const QmmParams& p, int part, int64_t prob,
                                              WeightView* w, int64_t* b) {
  if (prob < p.alt_from) return ProblemBatch(p, prob, b);
  const GemvAlt s = StaticPick(p.alt, part);
  w->w = s.w;
  w->scales = s.scales;
  w->biases = s.biases;
  *b = 0;
  return true;
}
// Output and row stride of part `part` (p.y / p.ldy for a single-weight launch).
__device__ __forceinline__ void GemvPartOutput(const QmmParams& p, int part, float** y,
                                               int64_t* ldy) {
  *y = p.y;
  *ldy = p.ldy;
#pragma unroll
  for (int i = 1; i < kMaxGemvParts; ++i) {
    if (part == i) {
      *y = p.parts[i].y;
      *ldy = p.parts[i].ldy;
    }
  }
}

// Whether the tensor-core GEMV (M <= 8, bf16 x) has a kernel for this weight's format: mxfp4,
// nvfp4 without a global scale, mxfp8, bf16 matrices (values exact in bf16), and 4-bit affine
// with bf16 scales (groups 32/64/128) or fp16 scales (group 64), computed exactly.
bool GemvSupports(const DeviceQuantWeight& w);
// Launches it (p.m <= 8, bf16 x; `overlap` as QMatmulArgs::overlap, already checked against the
// device). `describe`, when non-null, receives the launch configuration instead of launching.
absl::Status LaunchGemv(const DeviceQuantWeight& w, const QmmParams& p, int64_t problems,
                        int overlap, cudaStream_t stream, std::string* describe = nullptr);

}  // namespace ring::cuda::internal

#endif  // RINGSERVE_KERNELS_CUDA_QGEMV_INTERNAL_CUH_
