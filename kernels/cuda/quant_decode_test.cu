// Host-side tests of the decoders in quant_decode.cuh: the scalar conversions against the
// CPU reference's (kernels/dtype.h) and MLX's tables, and every tensor-core fast path
// (bit tricks on packed words) against the plain per-element decode, over all codes.
// Compiled by nvcc but runs on the CPU, so it runs in CI without a GPU. The same
// comparison is repeated on the device by the GPU harness (TEST_CountFastDecodeMismatches).
#include "kernels/cuda/quant_decode.cuh"

#include <cmath>
#include <cstdint>
#include <random>

#include "gtest/gtest.h"
#include "kernels/dtype.h"

namespace ring::cuda::qdec {
namespace {

bool SameFloat(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || FloatToBits(a) == FloatToBits(b);
}

TEST(QuantDecode, Fp4MatchesMlxTable) {
  const float kLut[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  for (uint32_t n = 0; n < 16; ++n) {
    EXPECT_TRUE(SameFloat(Fp4ToF32(n), kLut[n])) << "code " << n << " -> " << Fp4ToF32(n);
  }
}

TEST(QuantDecode, E4M3AndE8M0MatchCpuReference) {
  for (uint32_t v = 0; v < 256; ++v) {
    EXPECT_TRUE(SameFloat(E4M3ToF32(v), ring::E4M3ToFloat(static_cast<uint8_t>(v)))) << v;
    EXPECT_TRUE(SameFloat(E8M0ToF32(v), ring::E8M0ToFloat(static_cast<uint8_t>(v)))) << v;
  }
}

TEST(QuantDecode, HalfConversionsMatchCpuReference) {
  std::mt19937 rng(7);
  for (uint32_t h = 0; h < 65536; ++h) {
    EXPECT_TRUE(SameFloat(F16ToF32(h), ring::F16ToFloat(static_cast<uint16_t>(h)))) << h;
  }
  std::normal_distribution<float> nd(0.f, 10.f);
  for (int i = 0; i < 10000; ++i) {
    const float f = nd(rng);
    EXPECT_EQ(F32ToBf16Bits(f), ring::FloatToBf16(f));
  }
}

// Element e of a chunk, read from its bytes the way MLX's CPU extract_bits does (byte-wise,
// LSB first), as an independent check of ExtractCode for the odd widths.
uint32_t CodeFromBytes(const uint32_t* raw, int bits, int e) {
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(raw);
  uint32_t q = 0;
  for (int b = 0; b < bits; ++b) {
    const int bit = e * bits + b;
    q |= static_cast<uint32_t>((bytes[bit / 8] >> (bit % 8)) & 1) << b;
  }
  return q;
}

template <int kBits>
void CheckExtract(std::mt19937& rng) {
  uint32_t raw[kBits];
  for (int trial = 0; trial < 200; ++trial) {
    for (auto& w : raw) w = rng();
    for (int e = 0; e < kChunk; ++e) {
      ASSERT_EQ(ExtractCode<kBits>(raw, e), CodeFromBytes(raw, kBits, e)) << kBits << "-bit e=" << e;
    }
  }
}

TEST(QuantDecode, ExtractCodeAllWidths) {
  std::mt19937 rng(1);
  CheckExtract<2>(rng);
  CheckExtract<3>(rng);
  CheckExtract<4>(rng);
  CheckExtract<5>(rng);
  CheckExtract<6>(rng);
  CheckExtract<8>(rng);
  // MLX 3-bit example from the spec: v2 = bits 6..7 of byte 0 + bit 0 of byte 1.
  uint32_t raw3[3] = {0x000001c0u, 0u, 0u};
  EXPECT_EQ(ExtractCode<3>(raw3, 2), 7u);
}

// Pair order: element (8W+j, 8W+j+4) in the low/high half.
template <class F>
void CheckPairsAgainstElem(const uint32_t* raw, const typename F::Scale& sc, const char* what) {
  for (int w = 0; w < 4; ++w) {
    uint32_t fast[4], ref[4];
    F::Pairs(raw, w, sc, fast);
    for (int j = 0; j < 4; ++j) {
      ref[j] = F32ToBf16Bits(F::Elem(raw, 8 * w + j, sc)) |
               (F32ToBf16Bits(F::Elem(raw, 8 * w + j + 4, sc)) << 16);
      ASSERT_EQ(fast[j], ref[j]) << what << " w=" << w << " j=" << j << std::hex << " raw=" << raw[w];
    }
  }
}

TEST(QuantDecode, Mxfp4FastPairsEqualExactDecode) {
  std::mt19937 rng(2);
  uint32_t raw[4];
  for (uint32_t u = 0; u < 256; ++u) {
    const Mxfp4::Scale sc = Mxfp4::MakeScale(u);
    EXPECT_EQ(sc.fast, u <= 128);
    // Every nibble value at every position, plus random words.
    for (uint32_t n = 0; n < 16; ++n) {
      for (auto& w : raw) w = Mxfp4::Repack(n * 0x11111111u);
      CheckPairsAgainstElem<Mxfp4>(raw, sc, "mxfp4 splat");
    }
    for (int trial = 0; trial < 20; ++trial) {
      for (auto& w : raw) w = rng();
      CheckPairsAgainstElem<Mxfp4>(raw, sc, "mxfp4 random");
    }
  }
}

// The GPU nibble order: a permutation of each word's bits, and the decode of a repacked
// word is MLX's decode of the original (kernels/quant.h: fp4 value times 2^(u-127), rounded
// to bf16), for every code at every position and every scale.
TEST(QuantDecode, Mxfp4GpuOrderDecodesAsMlxOrder) {
  bool seen[32] = {};
  for (int i = 0; i < 32; ++i) {
    const int b = Mxfp4::GpuBit(i);
    ASSERT_TRUE(b >= 0 && b < 32 && !seen[b]) << "bit " << i << " -> " << b;
    seen[b] = true;
  }
  std::mt19937 rng(9);
  for (int trial = 0; trial < 20000; ++trial) {
    const uint32_t v = rng();
    ASSERT_EQ(Mxfp4::Unpack(Mxfp4::Repack(v)), v) << std::hex << v;
    ASSERT_EQ(Mxfp4::Repack(Mxfp4::Unpack(v)), v) << std::hex << v;
  }
  uint32_t mlx[4], gpu[4];
  for (uint32_t u = 0; u < 256; ++u) {
    const Mxfp4::Scale sc = Mxfp4::MakeScale(u);
    for (int trial = 0; trial < 24; ++trial) {
      for (int w = 0; w < 4; ++w) {
        mlx[w] = trial < 16 ? (trial * 0x11111111u) ^ (w * 0x01234567u) : static_cast<uint32_t>(rng());
        gpu[w] = Mxfp4::Repack(mlx[w]);
      }
      for (int e = 0; e < 32; ++e) {
        const float want = RoundToBf16(Fp4ToF32(ExtractCode<4>(mlx, e)) * E8M0ToF32(u));
        ASSERT_TRUE(SameFloat(Mxfp4::Elem(gpu, e, sc), want)) << "u=" << u << " e=" << e << std::hex << " mlx=" << mlx[e / 8];
      }
    }
  }
}

// The prefill GEMM's branch-free split: PairsFastPath must equal Pairs (hence the exact
// decode) for every scale FastScale accepts, and FastScale must accept exactly the scales
// Pairs decodes with the bit trick.
TEST(QuantDecode, Mxfp4FastPathEqualsPairsWhereFast) {
  std::mt19937 rng(3);
  uint32_t raw[4];
  for (uint32_t u = 0; u < 256; ++u) {
    const Mxfp4::Scale sc = Mxfp4::MakeScale(u);
    ASSERT_EQ(Mxfp4::FastScale(sc), u <= 128) << u;
    if (!Mxfp4::FastScale(sc)) continue;
    for (int trial = 0; trial < 36; ++trial) {
      for (auto& w : raw) w = trial < 16 ? trial * 0x11111111u : rng();
      for (int w = 0; w < 4; ++w) {
        uint32_t fast[4], ref[4];
        Mxfp4::PairsFastPath(raw, w, sc, fast);
        Mxfp4::Pairs(raw, w, sc, ref);
        for (int j = 0; j < 4; ++j) ASSERT_EQ(fast[j], ref[j]) << "u=" << u << " w=" << w;
      }
    }
  }
  EXPECT_TRUE(Mxfp4::FastScale(Mxfp4::ZeroScale()));
}

TEST(QuantDecode, Affine4Bf16FastPairsEqualExactDecode) {
  using F = Affine<4, ScaleBf16>;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  uint32_t raw[4];
  for (int trial = 0; trial < 5000; ++trial) {
    // Scales and biases as a quantizer writes them: bf16 values of assorted magnitudes.
    const float s = RoundToBf16(std::ldexp(std::fabs(nd(rng)) + 0.01f, (trial % 40) - 30));
    const float b = RoundToBf16(-8.f * s * (1.f + 0.1f * nd(rng)) * ((trial & 1) ? 1.f : -1.f));
    for (auto& w : raw) w = rng();
    CheckPairsAgainstElem<F>(raw, F::MakeScale(s, b), "affine4");
  }
}

// The exact affine GEMV's operand: bf16 (128 + q) in the shared pair order.
TEST(QuantDecode, Affine4BiasedPairsAreExactCodes) {
  std::mt19937 rng(6);
  for (int trial = 0; trial < 20000; ++trial) {
    const uint32_t v = trial < 16 ? trial * 0x11111111u : static_cast<uint32_t>(rng());
    uint32_t out[4];
    Affine4BiasedPairs(v, out);
    for (int j = 0; j < 4; ++j) {
      const float lo = Bf16ToF32(out[j]), hi = Bf16ToF32(out[j] >> 16);
      EXPECT_EQ(lo, 128.f + static_cast<float>((v >> (4 * j)) & 15u)) << std::hex << v << " j " << j;
      EXPECT_EQ(hi, 128.f + static_cast<float>((v >> (4 * j + 16)) & 15u)) << std::hex << v << " j " << j;
    }
  }
}

// The column-split GEMV's scale-free operands (qgemv_gemv.cu QgemvMx4ColKernel), in the
// shared pair order (of the MLX word v, held repacked): PairsTiny is E2M1 * 2^-126 exactly (+-0.5 a bf16 subnormal, zero
// kept), PairsUnit the E2M1 value itself.
TEST(QuantDecode, Mxfp4ScaleFreePairsAreExact) {
  std::mt19937 rng(8);
  for (int trial = 0; trial < 20000; ++trial) {
    const uint32_t v = trial < 16 ? trial * 0x11111111u : static_cast<uint32_t>(rng());
    uint32_t tiny[4], unit[4];
    Mxfp4::PairsTiny(Mxfp4::Repack(v), tiny);
    Mxfp4::PairsUnit(Mxfp4::Repack(v), unit);
    for (int j = 0; j < 4; ++j) {
      for (int half = 0; half < 2; ++half) {
        const float want = Fp4ToF32((v >> (4 * j + 16 * half)) & 15u);
        const float t = Bf16ToF32(tiny[j] >> (16 * half));
        const float u = Bf16ToF32(unit[j] >> (16 * half));
        EXPECT_TRUE(SameFloat(t, want * 0x1p-126f)) << std::hex << v << " j " << j << " half " << half;
        EXPECT_TRUE(SameFloat(u, want)) << std::hex << v << " j " << j << " half " << half;
      }
    }
  }
}

TEST(QuantDecode, DenseBf16PairsAreAPermutation) {
  std::mt19937 rng(4);
  uint32_t raw[16];
  for (auto& w : raw) w = rng() & 0x7f7f7f7fu;  // finite values
  CheckPairsAgainstElem<DenseBf16>(raw, DenseBf16::Scale{}, "dense bf16");
  // Activations use the same permutation: words (x0,x1),(x2,x3),(x4,x5),(x6,x7).
  uint32_t out[4];
  PairsOf16bitQuad(0x00010000u, 0x00030002u, 0x00050004u, 0x00070006u, out);
  EXPECT_EQ(out[0], 0x00040000u);
  EXPECT_EQ(out[1], 0x00050001u);
  EXPECT_EQ(out[2], 0x00060002u);
  EXPECT_EQ(out[3], 0x00070003u);
}

TEST(QuantDecode, GenericPairsExactForBf16Formats) {
  std::mt19937 rng(5);
  uint32_t raw8[8];
  for (auto& w : raw8) w = rng();
  for (uint32_t u = 100; u < 140; ++u) {
    CheckPairsAgainstElem<Mxfp8>(raw8, Mxfp8::MakeScale(u), "mxfp8");
  }
  uint32_t raw4[4];
  for (auto& w : raw4) w = rng();
  CheckPairsAgainstElem<Nvfp4>(raw4, Nvfp4::MakeScale(0x3a38u, 0.f), "nvfp4");
  uint32_t raw3[3];
  for (auto& w : raw3) w = rng();
  CheckPairsAgainstElem<Affine<3, ScaleBf16>>(raw3, Affine<3, ScaleBf16>::MakeScale(0.0625f, -0.25f),
                                              "affine3");
}

TEST(QuantDecode, AffineValueRoundsInScaleDtype) {
  // bf16: T(T(s*q) + b). s*q = 3 * 1.0078125 = 3.0234375 -> bf16 3.03125 (ties to even),
  // + b (0.00390625) = 3.03515625 -> bf16 3.03125.
  using F = Affine<4, ScaleBf16>;
  uint32_t raw[4] = {3u, 0u, 0u, 0u};
  const float v = F::Elem(raw, 0, F::MakeScale(1.0078125f, 0.00390625f));
  EXPECT_EQ(v, 3.03125f);
  // fp32 scales: one fma.
  using G = Affine<4, ScaleF32>;
  EXPECT_EQ(G::Elem(raw, 0, G::MakeScale(0.1f, 0.2f)), std::fma(0.1f, 3.f, 0.2f));
}

}  // namespace
}  // namespace ring::cuda::qdec
