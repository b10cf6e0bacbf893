// File: kernels/cuda/quant_decode.cuh
//
// Decoders for every MLX weight format (shared spec §4), usable on host and device so the
// bit tricks of the fast paths can be unit-tested on a CPU (quant_decode_test.cu).
//
// Unit of work: a CHUNK = 32 consecutive elements of one row along the quantized axis.
// Every format stores a chunk in kWords = bits-per-element 32-bit words (4-bit: 16 bytes,
// 3-bit: 12 bytes, bf16: 64 bytes), always at a word boundary because MLX requires
// cols % group == 0 and our kernels require cols % 32 == 0. A chunk lies inside one
// scale group (G >= 32) or exactly two (nvfp4, G = 16).
//
// Each format F provides:
//   kBits, kWords          bits per element, words per chunk
//   kBf16Exact             every dequantized value is exactly a bf16 (so bf16 tensor-core
//                          MMA on bf16 activations is exact up to fp32 summation order)
//   Scale                  per-chunk scale data; ZeroScale() decodes everything to 0
//   Elem(raw, e, sc)       element e (0..31) of the chunk as fp32, exactly what the CPU
//                          reference (kernels/quant.h Dequantize) returns
//   MatElem (optional)     the weight value of the CPU reference's QMatmulT where it
//                          differs from Elem (affine: fp32 scale*q + bias, unrounded)
//   Pairs(raw, W, sc, out) elements (8W+j, 8W+j+4), j = 0..3, as 4 packed bf16x2 words:
//                          the operand order of the tensor-core kernels (see qgemv.cu).
//                          Defaults to Elem + round-to-bf16; 4-bit formats have bit tricks.
//
// Arithmetic contract (kernels/quant.h): dequantized affine values are T(T(s*q) + b), each
// op rounded to the scales dtype T (two fp32 roundings for fp32 scales); fp modes: the
// product is exact in fp32 and rounded to bf16 (MLX's output dtype), except nvfp4 with a
// global scale, which stays fp32. The SIMT matmuls use MatElem (unrounded affine weights,
// as QMatmulT); the tensor-core GEMM uses bf16 weights, i.e. Elem; the decode GEMV feeds
// 4-bit affine codes as exact integers (Affine4BiasedPairs) and applies s and b in fp32.
#ifndef RINGSERVE_KERNELS_CUDA_QUANT_DECODE_CUH_
#define RINGSERVE_KERNELS_CUDA_QUANT_DECODE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/dtype.h"

#define RING_HD __host__ __device__ __forceinline__

namespace ring::cuda::qdec {

inline constexpr int kChunk = 32;

// ---- scalar conversions (device intrinsics; host twins are bit-identical) --------------
RING_HD float BitsToFloat(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
RING_HD uint32_t FloatToBits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
RING_HD float Bf16ToF32(uint32_t h) { return BitsToFloat((h & 0xffffu) << 16); }
RING_HD uint32_t F32ToBf16Bits(float f) {
#ifdef __CUDA_ARCH__
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
  return ring::FloatToBf16(f);
#endif
}
RING_HD float RoundToBf16(float f) { return Bf16ToF32(F32ToBf16Bits(f)); }
RING_HD float F16ToF32(uint32_t h) {
#ifdef __CUDA_ARCH__
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h & 0xffffu)));
#else
  return ring::F16ToFloat(static_cast<uint16_t>(h & 0xffffu));
#endif
}
RING_HD float RoundToF16(float f) {
#ifdef __CUDA_ARCH__
  return __half2float(__float2half_rn(f));
#else
  return ring::RoundF16(f);
#endif
}
RING_HD float Fma(float a, float b, float c) {
#ifdef __CUDA_ARCH__
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// E2M1 code -> fp32. The 3 magnitude bits land in the fp32 exponent/mantissa so the
// pattern reads value * 2^-126 for normals and the subnormal 0.5 alike; one exact multiply
// restores the scale. Sign bit 3 -> bit 31.
RING_HD float Fp4ToF32(uint32_t nib) {
  return BitsToFloat(((nib & 7u) << 22) | ((nib & 8u) << 28)) * 0x1p126f;
}
// E4M3 ("fn") -> fp32, same trick with factor 2^120; 0x7f/0xff are NaN.
RING_HD float E4M3ToF32(uint32_t v) {
  v &= 0xffu;
  if ((v & 0x7fu) == 0x7fu) return BitsToFloat(0x7fc00000u);
  return BitsToFloat(((v & 0x7fu) << 20) | ((v & 0x80u) << 24)) * 0x1p120f;
}
// E8M0 -> fp32: 2^(v-127); v == 0 is 2^-127 (fp32 subnormal), v == 255 is +inf (as the
// CPU reference, kernels/dtype.h E8M0ToFloat).
RING_HD float E8M0ToF32(uint32_t v) {
  v &= 0xffu;
  return BitsToFloat(v == 0 ? 0x00400000u : v << 23);
}

// ---- packed bf16x2 arithmetic --------------------------------------------------------
// fma.rn.bf16x2 (sm_80+) handles subnormals and rounds once; the host twin is exact for
// the operand ranges the decoders use (products of <= 8-bit significands).
RING_HD uint32_t Bf16x2Fma(uint32_t a, uint32_t b, uint32_t c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#else
  const float lo = Fma(Bf16ToF32(a), Bf16ToF32(b), Bf16ToF32(c));
  const float hi = Fma(Bf16ToF32(a >> 16), Bf16ToF32(b >> 16), Bf16ToF32(c >> 16));
  return F32ToBf16Bits(lo) | (F32ToBf16Bits(hi) << 16);
#endif
}
inline constexpr uint32_t kBf16x2NegZero = 0x80008000u;
inline constexpr uint32_t kBf16x2One = 0x3f803f80u;
RING_HD uint32_t Bf16x2Mul(uint32_t a, uint32_t b) { return Bf16x2Fma(a, b, kBf16x2NegZero); }
RING_HD uint32_t Bf16x2Add(uint32_t a, uint32_t b) { return Bf16x2Fma(a, kBf16x2One, b); }
RING_HD uint32_t PackBf16x2(float lo, float hi) {
#ifdef __CUDA_ARCH__
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &h, 4);
  return u;
#else
  return F32ToBf16Bits(lo) | (F32ToBf16Bits(hi) << 16);
#endif
}
RING_HD uint32_t Bf16x2Splat(uint32_t h) { return (h & 0xffffu) | (h << 16); }
// Byte permute (PRMT): bytes of {a, b} picked by the selector nibbles.
RING_HD uint32_t BytePerm(uint32_t a, uint32_t b, uint32_t sel) {
#ifdef __CUDA_ARCH__
  return __byte_perm(a, b, sel);
#else
  const uint64_t v = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<uint32_t>((v >> (8 * ((sel >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
#endif
}
// Rotate right by d (1..31): one funnel shift on the device.
RING_HD uint32_t RotR(uint32_t v, int d) {
#ifdef __CUDA_ARCH__
  return __funnelshift_r(v, v, d);
#else
  return (v >> d) | (v << (32 - d));
#endif
}
// Elements (8W+j, 8W+j+4) of four consecutive words holding two 16-bit elements each
// (bf16 activations or a bf16 weight chunk): the shared pair order.
RING_HD void PairsOf16bitQuad(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3, uint32_t out[4]) {
  out[0] = BytePerm(w0, w2, 0x5410);
  out[1] = BytePerm(w0, w2, 0x7632);
  out[2] = BytePerm(w1, w3, 0x5410);
  out[3] = BytePerm(w1, w3, 0x7632);
}

// Bits [e*bits, e*bits+bits) of the chunk's little-endian bit stream (MLX packs 2/4/8 bits
// per word LSB-first and 3/5/6 bits as one LSB-first stream over the bytes: the same
// thing). With e a compile-time constant after unrolling this folds to a shift and mask.
template <int kBits>
RING_HD uint32_t ExtractCode(const uint32_t* raw, int e) {
  const int off = e * kBits;
  const int wi = off >> 5, sh = off & 31;
  uint32_t q = raw[wi] >> sh;
  if (sh + kBits > 32) q |= raw[wi + 1] << (32 - sh);
  return q & ((1u << kBits) - 1u);
}

// The weight value a matmul uses: F::MatElem where the format defines one (affine),
// else the dequantized value (identical for fp modes and plain matrices).
template <class F>
RING_HD float MatElem(const uint32_t* raw, int e, const typename F::Scale& sc) {
  if constexpr (requires { F::MatElem(raw, e, sc); }) {
    return F::MatElem(raw, e, sc);
  } else {
    return F::Elem(raw, e, sc);
  }
}

template <class F>
RING_HD void GenericPairs(const uint32_t* raw, int w, const typename F::Scale& sc, uint32_t out[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) out[j] = PackBf16x2(F::Elem(raw, 8 * w + j, sc), F::Elem(raw, 8 * w + j + 4, sc));
}

// ---- scale dtypes of affine weights -----------------------------------------------------
struct ScaleBf16 {
  using Storage = uint16_t;
  static constexpr bool kIsBf16 = true;
  RING_HD static float Load(uint32_t bits) { return Bf16ToF32(bits); }
  RING_HD static float Affine(float q, float s, float b) { return RoundToBf16(RoundToBf16(s * q) + b); }
};
struct ScaleF16 {
  using Storage = uint16_t;
  static constexpr bool kIsBf16 = false;
  RING_HD static float Load(uint32_t bits) { return F16ToF32(bits); }
  RING_HD static float Affine(float q, float s, float b) { return RoundToF16(RoundToF16(s * q) + b); }
};
struct ScaleF32 {
  using Storage = float;
  static constexpr bool kIsBf16 = false;
  RING_HD static float Load(float v) { return v; }
  // Two fp32 roundings, never an FMA (kernels/quant.cc); the product goes through double
  // on the host so no contraction can fuse it (exact: 24-bit scale times 8-bit code).
  RING_HD static float Affine(float q, float s, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(__fmul_rn(s, q), b);
#else
    const float p = static_cast<float>(static_cast<double>(s) * q);
    return p + b;
#endif
  }
};

// ---- formats ------------------------------------------------------------------------------
template <int kBitsT, class ST>
struct Affine {
  static constexpr int kBits = kBitsT;
  static constexpr int kWords = kBitsT;
  static constexpr bool kBf16Exact = ST::kIsBf16;
  using ScaleType = ST;
  struct Scale {
    float s, b;
    uint32_t s2, c2, b2;  // bf16x2 splats of s, -128*s, b (fast 4-bit path, bf16 scales)
  };
  RING_HD static Scale ZeroScale() { return Scale{0.f, 0.f, 0u, 0u, 0u}; }
  RING_HD static Scale MakeScale(float s, float b) {
    Scale sc{s, b, 0u, 0u, 0u};
    if constexpr (ST::kIsBf16) {
      sc.s2 = Bf16x2Splat(F32ToBf16Bits(s));
      sc.c2 = Bf16x2Splat(F32ToBf16Bits(-128.f * s));  // exact: power-of-two multiple
      sc.b2 = Bf16x2Splat(F32ToBf16Bits(b));
    }
    return sc;
  }
  RING_HD static float Elem(const uint32_t* raw, int e, const Scale& sc) {
    return ST::Affine(static_cast<float>(ExtractCode<kBits>(raw, e)), sc.s, sc.b);
  }
  // The matmul's weight (kernels/quant.h QMatmulT): scale * q + bias in fp32, not rounded
  // to the scales dtype (MLX's quantized_matmul on fp32 activations).
  RING_HD static float MatElem(const uint32_t* raw, int e, const Scale& sc) {
    return Fma(sc.s, static_cast<float>(ExtractCode<kBits>(raw, e)), sc.b);
  }
  RING_HD static void Pairs(const uint32_t* raw, int w, const Scale& sc, uint32_t out[4]) {
    if constexpr (kBits == 4 && ST::kIsBf16) {
      // 0x4300 | q is the bf16 of 128 + q; fma(128+q, s, -128 s) = bf16(q*s) rounded once
      // from the exact product, then + b rounded once: the two roundings of T arithmetic.
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t t = ((raw[w] >> (4 * j)) & 0x000f000fu) | 0x43004300u;
        out[j] = Bf16x2Add(Bf16x2Fma(t, sc.s2, sc.c2), sc.b2);
      }
    } else {
      GenericPairs<Affine>(raw, w, sc, out);
    }
  }
};

struct Mxfp4 {
  static constexpr int kBits = 4;
  static constexpr int kWords = 4;
  static constexpr bool kBf16Exact = true;
  struct Scale {
    float s;      // 2^(u-127)
    uint32_t f2;  // bf16x2 splat of 2^(u-1) (valid when fast)
    bool fast;    // u <= 128: the factor is a normal bf16
  };
  RING_HD static Scale ZeroScale() { return Scale{0.f, 0u, true}; }
  RING_HD static Scale MakeScale(uint32_t u) {
    u &= 0xffu;
    const uint32_t k = u + 126u;  // bf16 exponent field of 2^(u-1); u = 0 gives 2^-1 as well
    return Scale{E8M0ToF32(u), (k << 7) | (k << 23), u <= 128u};
  }
  // bf16x2 splat of 2^(u-1), the fast path's multiplier (valid for u <= 128).
  RING_HD static uint32_t FastFactor(uint32_t u) { return (u + 126u) * 0x00800080u; }

  // ---- GPU nibble order ----
  // MLX packs element j of a word (8 per word) in bits 4j..4j+3 as s e1 e0 m (m lowest).
  // On the device every mxfp4 word is held permuted (Repack, applied in place by
  // UploadQuantWeight), so that the tensor-core operand of the element pair (j, j+4),
  // j = 0..3 (the shared pair order), falls out of the word in few instructions. That
  // operand is the bf16x2 pattern E2M1 * 2^-126: sign at bit 15 (31 for element j+4), e1 e0 m
  // at bits 8..6 (24..22), everything else zero; the subnormal 0.5 is 0x0040 and zero stays
  // zero. With S = 0x81c081c0 (the bits of that pattern):
  //   pair 0: v & S            pair 1: rotr(v, 3) & S      pair 2: rotr(v, 6) & S
  //   pair 3: ((v & 0x001b001b) * 0x1084) & S
  // Pair 3 makes three copies of its 8 bits shifted by 2, 7 and 12 in one multiply (the
  // copies occupy disjoint bits, so no carry crosses), and the mask keeps one source bit for
  // each target. 8 instructions per 8 weights, against 13 for the same patterns from the
  // MLX order (isolate two nibbles, one multiply making the magnitude and sign copies, mask;
  // no rotation tiling of the 32 bits by S exists, hence the multiply for the last pair).
  // The patterns are bit-identical to those the MLX order gave, so every result is unchanged.
  // GpuBit(i): the bit of the GPU word that holds bit i of the MLX word.
  RING_HD static constexpr int GpuBit(int i) {
    const int j = i >> 2, b = i & 3, k = j & 3;
    const int pos = (b == 3 ? 15 : 6 + b) + 16 * (j >> 2);  // its place in pair k's pattern
    if (k == 0) return pos;
    if (k == 1) return (pos + 3) & 31;
    if (k == 2) return (pos + 6) & 31;
    return pos - (b == 0 ? 2 : (b == 3 ? 12 : 7));  // k = 3: the copy shifted by 2, 7 or 12
  }
  RING_HD static uint32_t Repack(uint32_t mlx) {
    uint32_t v = 0;
#pragma unroll
    for (int i = 0; i < 32; ++i) v |= ((mlx >> i) & 1u) << GpuBit(i);
    return v;
  }
  RING_HD static uint32_t Unpack(uint32_t gpu) {
    uint32_t v = 0;
#pragma unroll
    for (int i = 0; i < 32; ++i) v |= ((gpu >> GpuBit(i)) & 1u) << i;
    return v;
  }
  static constexpr uint32_t kPairMask = 0x81c081c0u;
  // Pair k (0..3) of a GPU-order word, as the E2M1 * 2^-126 bf16x2 pattern.
  RING_HD static uint32_t PairTiny(uint32_t v, int k) {
    switch (k) {
      case 0: return v & kPairMask;
      case 1: return RotR(v, 3) & kPairMask;
      case 2: return RotR(v, 6) & kPairMask;
      default: return ((v & 0x001b001bu) * 0x1084u) & kPairMask;
    }
  }
  RING_HD static float Elem(const uint32_t* raw, int e, const Scale& sc) {
    const uint32_t pair = PairTiny(raw[e >> 3], e & 3);
    const float v = Bf16ToF32(pair >> (e & 4 ? 16 : 0)) * 0x1p126f;  // the E2M1 value, exact
    return RoundToBf16(v * sc.s);
  }
  // Pairs of one GPU-order word v, given f2 = FastFactor(u): the patterns times 2^(u-1),
  // which applies both the 2^126 correction and the group scale, exactly. 12 instructions
  // per 8 weights.
  RING_HD static void PairsFast(uint32_t v, uint32_t f2, uint32_t out[4]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) out[k] = Bf16x2Mul(PairTiny(v, k), f2);
  }
  // Scale-free pairs for the column-split GEMV (qgemv_gemv.cu), which applies the group scale
  // in fp32 on the mma accumulators: the patterns themselves; the caller scales the
  // activations by 2^64 so that the products are normal fp32 numbers again. PairsUnit
  // multiplies by the constant 2^126 instead and returns the E2M1 values themselves (exact;
  // no subnormal operand reaches the mma).
  RING_HD static void PairsTiny(uint32_t v, uint32_t out[4]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) out[k] = PairTiny(v, k);
  }
  static constexpr uint32_t kBf16x2Two126 = 0x7e807e80u;  // bf16x2 (2^126, 2^126)
  RING_HD static void PairsUnit(uint32_t v, uint32_t out[4]) {
    PairsFast(v, kBf16x2Two126, out);
  }
  RING_HD static void Pairs(const uint32_t* raw, int w, const Scale& sc, uint32_t out[4]) {
    if (!sc.fast) return GenericPairs<Mxfp4>(raw, w, sc, out);
    PairsFast(raw[w], sc.f2, out);
  }
  // Branch-free split of Pairs for callers that check FastScale once for many chunks (the
  // prefill GEMM): PairsFastPath equals Pairs whenever FastScale(sc).
  RING_HD static bool FastScale(const Scale& sc) { return sc.fast; }
  RING_HD static void PairsFastPath(const uint32_t* raw, int w, const Scale& sc, uint32_t out[4]) {
    PairsFast(raw[w], sc.f2, out);
  }
};

// 4-bit affine codes of one packed word as bf16 pairs (128 + q_j, 128 + q_{j+4}), j = 0..3,
// in the shared pair order: exact, scale-free. The exact affine GEMV multiplies these with x
// and applies s and b per group in fp32: s * sum x (128 + q) + (b - 128 s) * sum x.
// e = even nibbles (q0 q2 q4 q6, one per byte), o = odd ones; a byte permute with 0x43 bytes
// makes each bf16 0x43qq = 128 + q. 7 instructions per 8 weights.
RING_HD void Affine4BiasedPairs(uint32_t v, uint32_t out[4]) {
  constexpr uint32_t k43 = 0x43434343u;
  const uint32_t e = v & 0x0f0f0f0fu;
  const uint32_t o = (v >> 4) & 0x0f0f0f0fu;
  out[0] = BytePerm(e, k43, 0x4240);
  out[1] = BytePerm(o, k43, 0x4240);
  out[2] = BytePerm(e, k43, 0x4341);
  out[3] = BytePerm(o, k43, 0x4341);
}

struct Nvfp4 {
  static constexpr int kBits = 4;
  static constexpr int kWords = 4;
  static constexpr bool kBf16Exact = true;
  // kBf16Exact holds without a global scale only; the host excludes nvfp4 with a global
  // scale from the tensor-core path at run time.
  struct Scale {
    float s0, s1;  // e4m3(scale) [* fp32(global / 2688)] of elements 0..15 and 16..31
    bool global;   // with a global scale the values stay fp32 (mx.dequantize returns fp32)
  };
  RING_HD static Scale ZeroScale() { return Scale{0.f, 0.f, false}; }
  // gs_factor = fp32(global_scale / 2688), or 0 when the weight has no global scale.
  RING_HD static Scale MakeScale(uint32_t two_bytes, float gs_factor) {
    const float a = E4M3ToF32(two_bytes), b = E4M3ToF32(two_bytes >> 8);
    if (gs_factor == 0.f) return Scale{a, b, false};
    return Scale{a * gs_factor, b * gs_factor, true};
  }
  RING_HD static float Elem(const uint32_t* raw, int e, const Scale& sc) {
    const float v = Fp4ToF32(ExtractCode<4>(raw, e)) * (e < 16 ? sc.s0 : sc.s1);
    return sc.global ? v : RoundToBf16(v);
  }
  RING_HD static void Pairs(const uint32_t* raw, int w, const Scale& sc, uint32_t out[4]) {
    GenericPairs<Nvfp4>(raw, w, sc, out);
  }
};

struct Mxfp8 {
  static constexpr int kBits = 8;
  static constexpr int kWords = 8;
  static constexpr bool kBf16Exact = true;
  struct Scale {
    float s;
  };
  RING_HD static Scale ZeroScale() { return Scale{0.f}; }
  RING_HD static Scale MakeScale(uint32_t u) { return Scale{E8M0ToF32(u)}; }
  RING_HD static float Elem(const uint32_t* raw, int e, const Scale& sc) {
    return RoundToBf16(E4M3ToF32(ExtractCode<8>(raw, e)) * sc.s);
  }
  RING_HD static void Pairs(const uint32_t* raw, int w, const Scale& sc, uint32_t out[4]) {
    GenericPairs<Mxfp8>(raw, w, sc, out);
  }
};

// Unquantized matrices: a chunk is 32 plain elements.
struct DenseBf16 {
  static constexpr int kBits = 16;
  static constexpr int kWords = 16;
  static constexpr bool kBf16Exact = true;
  struct Scale {};
  RING_HD static Scale ZeroScale() { return Scale{}; }
  RING_HD static float Elem(const uint32_t* raw, int e, const Scale&) {
    return Bf16ToF32(raw[e >> 1] >> (16 * (e & 1)));
  }
  RING_HD static void Pairs(const uint32_t* raw, int w, const Scale&, uint32_t out[4]) {
    PairsOf16bitQuad(raw[4 * w], raw[4 * w + 1], raw[4 * w + 2], raw[4 * w + 3], out);
  }
};
struct DenseF16 {
  static constexpr int kBits = 16;
  static constexpr int kWords = 16;
  static constexpr bool kBf16Exact = false;
  struct Scale {};
  RING_HD static Scale ZeroScale() { return Scale{}; }
  RING_HD static float Elem(const uint32_t* raw, int e, const Scale&) {
    return F16ToF32(raw[e >> 1] >> (16 * (e & 1)));
  }
  RING_HD static void Pairs(const uint32_t* raw, int w, const Scale& sc, uint32_t out[4]) {
    GenericPairs<DenseF16>(raw, w, sc, out);
  }
};
struct DenseF32 {
  static constexpr int kBits = 32;
  static constexpr int kWords = 32;
  static constexpr bool kBf16Exact = false;
  struct Scale {};
  RING_HD static Scale ZeroScale() { return Scale{}; }
  RING_HD static float Elem(const uint32_t* raw, int e, const Scale&) { return BitsToFloat(raw[e]); }
  RING_HD static void Pairs(const uint32_t* raw, int w, const Scale& sc, uint32_t out[4]) {
    GenericPairs<DenseF32>(raw, w, sc, out);
  }
};

}  // namespace ring::cuda::qdec

#endif  // RINGSERVE_KERNELS_CUDA_QUANT_DECODE_CUH_
