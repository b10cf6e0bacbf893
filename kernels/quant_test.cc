// File: kernels/quant_test.cc
//
// Pure C++ tests of kernels/quant.h and the scalar conversions in kernels/dtype.h: spec and
// shape validation, encode/decode properties, the vector matmul kernels against a scalar
// double-precision reference built from the group decoders, batch (stacked) indexing, and
// the bf16/fp16/e4m3/e8m0 conversions. MLX parity itself is kernels/quant_mlx_test.cc.
#include "kernels/quant.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/quant_kernels.h"
#include "kernels/dtype.h"

namespace ring {
namespace {

// ---- dtype conversions ---------------------------------------------------------------------

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(DType, F16RoundTripsAllCodes) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const uint16_t h = static_cast<uint16_t>(c);
    const float f = F16ToFloat(h);
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) {
      ASSERT_TRUE(std::isnan(f)) << c;
      ASSERT_EQ(FloatToF16(f) & 0x7c00, 0x7c00) << c;
      ASSERT_NE(FloatToF16(f) & 0x3ff, 0) << c;
      continue;
    }
    ASSERT_EQ(FloatToF16(f), h) << "code 0x" << std::hex << c;
#if defined(__FLT16_MAX__)
    // The compiler's own half type is an independent decoder.
    _Float16 ref;
    std::memcpy(&ref, &h, 2);
    ASSERT_EQ(Bits(static_cast<float>(ref)), Bits(f)) << "code 0x" << std::hex << c;
#endif
  }
}

TEST(DType, FloatToF16RoundsToNearestEven) {
  EXPECT_EQ(FloatToF16(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToF16(65519.99f), 0x7bff);
  EXPECT_EQ(FloatToF16(65520.0f), 0x7c00);  // tie between max and 2^16: even -> inf
  EXPECT_EQ(FloatToF16(0x1p-24f), 0x0001);
  EXPECT_EQ(FloatToF16(0x1p-25f), 0x0000);         // tie with 0 -> even (0)
  EXPECT_EQ(FloatToF16(0x1.8p-24f), 0x0002);       // tie 1 vs 2 units -> 2
  EXPECT_EQ(FloatToF16(1.0f + 0x1p-11f), 0x3c00);  // tie -> even mantissa
  EXPECT_EQ(FloatToF16(1.0f + 0x3p-11f), 0x3c02);
  EXPECT_EQ(FloatToF16(-0.0f), 0x8000);
#if defined(__FLT16_MAX__)
  std::mt19937 rng(1);
  for (int i = 0; i < 200000; ++i) {
    // Uniform over bit patterns of finite floats in the half range and below.
    const float f = FromBits(rng() % 0x47800000u) * (rng() & 1 ? -1.0f : 1.0f);
    const _Float16 ref = static_cast<_Float16>(f);
    uint16_t r;
    std::memcpy(&r, &ref, 2);
    ASSERT_EQ(FloatToF16(f), r) << f;
  }
#endif
}

TEST(DType, Bf16RoundsTiesToEven) {
  EXPECT_EQ(FloatToBf16(FromBits(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(FloatToBf16(FromBits(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(FloatToBf16(FromBits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(FloatToBf16(FromBits(0x3f807fffu)), 0x3f80);
  EXPECT_EQ(FloatToBf16(FromBits(0x7f7fffffu)), 0x7f80);  // max float rounds to inf
  EXPECT_EQ(FloatToBf16(INFINITY), 0x7f80);
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBf16(FromBits(0x00008000u)), 0x0000);  // subnormal tie -> even
  EXPECT_EQ(FloatToBf16(FromBits(0x00018000u)), 0x0002);
  const uint16_t nan = FloatToBf16(FromBits(0x7f800001u));  // NaN with only low bits set
  EXPECT_TRUE(std::isnan(Bf16ToFloat(nan)));
  for (uint32_t c = 0; c < 65536; ++c) {
    const float f = Bf16ToFloat(static_cast<uint16_t>(c));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToBf16(f), c);
  }
}

double E4M3Formula(int c) {
  const double sign = (c & 0x80) ? -1.0 : 1.0;
  const int e = (c >> 3) & 0xf, m = c & 7;
  if (e == 0) return sign * m * std::ldexp(1.0, -9);
  return sign * (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
}

TEST(DType, E4M3AllCodes) {
  for (int c = 0; c < 256; ++c) {
    const float f = E4M3ToFloat(static_cast<uint8_t>(c));
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(f)) << c;
      continue;
    }
    EXPECT_EQ(static_cast<double>(f), E4M3Formula(c)) << c;
    EXPECT_EQ(FloatToE4M3(f), c) << c;  // round trip, including -0 (0x80)
  }
  EXPECT_EQ(E4M3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(E4M3ToFloat(0x01), 0x1p-9f);
}

TEST(DType, FloatToE4M3RoundsAndSaturatesLikeMlx) {
  // Values from mx.to_fp8 (mlx 0.32.4): ties to even, saturation at 448, NaN -> 448.
  EXPECT_EQ(FloatToE4M3(1.0625f), 0x38);   // tie 1.0 / 1.125 -> even
  EXPECT_EQ(FloatToE4M3(1.1875f), 0x3a);   // tie 1.125 / 1.25 -> even
  EXPECT_EQ(FloatToE4M3(248.0f), 0x78);    // tie 240 / 256
  EXPECT_EQ(FloatToE4M3(232.0f), 0x76);    // tie 224 / 240
  EXPECT_EQ(FloatToE4M3(0x1p-10f), 0x00);  // tie 0 / 2^-9
  EXPECT_EQ(FloatToE4M3(0x3p-11f), 0x01);
  EXPECT_EQ(FloatToE4M3(-0x1p-10f), 0x80);
  EXPECT_EQ(FloatToE4M3(0x1.ep-7f), 0x08);  // rounds up into the smallest normal
  EXPECT_EQ(FloatToE4M3(464.0f), 0x7e);
  EXPECT_EQ(FloatToE4M3(1e30f), 0x7e);
  EXPECT_EQ(FloatToE4M3(-INFINITY), 0xfe);
  EXPECT_EQ(FloatToE4M3(NAN), 0x7e);
  // Every other value: the nearest code by brute force (ties to even code).
  std::mt19937 rng(3);
  for (int i = 0; i < 100000; ++i) {
    const float f =
        std::ldexp(static_cast<float>(rng() % 1000000) / 1e6f, static_cast<int>(rng() % 24) - 14);
    int best = 0;
    for (int c = 1; c < 0x7f; ++c) {
      const double d = std::fabs(E4M3Formula(c) - f), db = std::fabs(E4M3Formula(best) - f);
      if (d < db || (d == db && (c & 1) == 0)) best = c;
    }
    ASSERT_EQ(FloatToE4M3(f), f > 448.0f ? 0x7e : best) << f;
  }
}

TEST(DType, E8M0EdgeCases) {
  EXPECT_EQ(E8M0ToFloat(0), 0x1p-127f);  // MLX's CPU backend: bf16 0x0040, a subnormal
  EXPECT_EQ(E8M0ToFloat(1), 0x1p-126f);
  EXPECT_EQ(E8M0ToFloat(127), 1.0f);
  EXPECT_EQ(E8M0ToFloat(128), 2.0f);
  EXPECT_EQ(E8M0ToFloat(254), 0x1p127f);
  EXPECT_TRUE(std::isinf(E8M0ToFloat(255)));
  for (int v = 0; v < 255; ++v) {  // every finite scale is exact in bf16
    EXPECT_EQ(RoundBf16(E8M0ToFloat(static_cast<uint8_t>(v))),
              E8M0ToFloat(static_cast<uint8_t>(v)));
  }
}

// ---- specs and validation --------------------------------------------------------------------

TEST(QuantSpec, AcceptsExactlyWhatMlxAccepts) {
  for (int bits = -1; bits <= 9; ++bits)
    for (int g : {0, 16, 32, 64, 128, 256}) {
      const bool ok = (bits >= 1 && bits <= 8 && bits != 7) && (g == 32 || g == 64 || g == 128);
      EXPECT_EQ(ValidateQuantSpec({QuantMode::kAffine, bits, g}).ok(), ok) << bits << " " << g;
    }
  EXPECT_TRUE(ValidateQuantSpec({QuantMode::kMxfp4, 4, 32}).ok());
  EXPECT_FALSE(ValidateQuantSpec({QuantMode::kMxfp4, 4, 16}).ok());
  EXPECT_FALSE(ValidateQuantSpec({QuantMode::kMxfp4, 4, 64}).ok());
  EXPECT_FALSE(ValidateQuantSpec({QuantMode::kMxfp4, 8, 32}).ok());
  EXPECT_TRUE(ValidateQuantSpec({QuantMode::kMxfp8, 8, 32}).ok());
  EXPECT_FALSE(ValidateQuantSpec({QuantMode::kMxfp8, 4, 32}).ok());
  EXPECT_FALSE(ValidateQuantSpec({QuantMode::kMxfp8, 8, 16}).ok());
  EXPECT_TRUE(ValidateQuantSpec({QuantMode::kNvfp4, 4, 16}).ok());
  EXPECT_FALSE(ValidateQuantSpec({QuantMode::kNvfp4, 4, 32}).ok());
  EXPECT_TRUE(ValidateQuantSpec({QuantMode::kNone, 0, 0}).ok());
  EXPECT_FALSE(ValidateQuantSpec({QuantMode::kNone, 16, 0}).ok());
  for (QuantMode m :
       {QuantMode::kAffine, QuantMode::kMxfp4, QuantMode::kMxfp8, QuantMode::kNvfp4}) {
    EXPECT_TRUE(ValidateQuantSpec(DefaultQuantSpec(m)).ok()) << QuantModeName(m);
    EXPECT_EQ(ParseQuantMode(QuantModeName(m)).value(), m);
  }
  EXPECT_EQ(DefaultQuantSpec(QuantMode::kAffine), (QuantSpec{QuantMode::kAffine, 4, 64}));
  EXPECT_EQ(DefaultQuantSpec(QuantMode::kMxfp4).ToString(), "mxfp4/g32/b4");
  EXPECT_EQ(QuantSpec{}.ToString(), "none");
  EXPECT_FALSE(ParseQuantMode("int4").ok());
}

// Owns the buffers of a quantized weight built by Quantize().
struct Owned {
  std::vector<uint32_t> w;
  std::vector<uint8_t> s, b;
  std::vector<float> dense_f32;
  std::vector<uint16_t> dense_16;
  QuantWeight q;
};

// batch x rows x cols random weights quantized slice by slice.
Owned MakeQuant(QuantSpec spec, DType sdt, int64_t batch, int64_t rows, int64_t cols, uint32_t seed,
                float global_scale = 0.0f) {
  Owned o;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  o.q.spec = spec;
  o.q.name = "test." + spec.ToString();
  Shape lead = batch > 1 ? Shape{batch} : Shape{};
  auto shape = [&](int64_t last) {
    Shape s = lead;
    s.push_back(rows);
    s.push_back(last);
    return s;
  };
  if (spec.mode == QuantMode::kNone) {
    const int64_t n = batch * rows * cols;
    if (sdt == DType::kF32) {
      o.dense_f32.resize(n);
      for (auto& v : o.dense_f32) v = nd(rng);
      o.q.weight = {DType::kF32, shape(cols), o.dense_f32.data()};
    } else {
      o.dense_16.resize(n);
      for (auto& v : o.dense_16)
        v = sdt == DType::kBF16 ? FloatToBf16(nd(rng)) : FloatToF16(nd(rng));
      o.q.weight = {sdt, shape(cols), o.dense_16.data()};
    }
    return o;
  }
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<float> w(rows * cols);
    for (auto& v : w) {
      v = nd(rng) + 0.01f;
      if (sdt == DType::kBF16) v = RoundBf16(v);
      if (sdt == DType::kF16) v = RoundF16(v);
    }
    auto q = Quantize(w.data(), rows, cols, spec, sdt, global_scale);
    EXPECT_TRUE(q.ok()) << q.status();
    o.w.insert(o.w.end(), q->weight.begin(), q->weight.end());
    o.s.insert(o.s.end(), q->scales.begin(), q->scales.end());
    o.b.insert(o.b.end(), q->biases.begin(), q->biases.end());
  }
  const DType st = spec.mode == QuantMode::kAffine ? sdt : DType::kU8;
  o.q.weight = {DType::kU32, shape(cols * spec.bits / 32), o.w.data()};
  o.q.scales = {st, shape(cols / spec.group_size), o.s.data()};
  if (spec.mode == QuantMode::kAffine) o.q.biases = {st, shape(cols / spec.group_size), o.b.data()};
  o.q.global_scale = global_scale;
  return o;
}

// A copy of `o.q` whose views point into o's buffers (for mutation in the tests below).
QuantWeight Clone(const Owned& o) { return o.q; }

TEST(QuantWeight, ValidatesShapesAndDtypes) {
  Owned a = MakeQuant({QuantMode::kAffine, 4, 64}, DType::kBF16, 1, 6, 256, 1);
  ASSERT_TRUE(ValidateQuantWeight(a.q).ok()) << ValidateQuantWeight(a.q);
  EXPECT_EQ(a.q.rows(), 6);
  EXPECT_EQ(a.q.cols(), 256);
  EXPECT_EQ(a.q.batch(), 1);
  auto expect_bad = [](const QuantWeight& w, const std::string& why) {
    const absl::Status st = ValidateQuantWeight(w);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << why;
    EXPECT_NE(st.message().find(w.name), std::string::npos) << st;  // names the tensor
  };
  QuantWeight w = Clone(a);
  w.weight.dtype = DType::kU8;
  expect_bad(w, "packed weight must be U32");
  w = Clone(a);
  w.weight.shape = {6 * 32};
  expect_bad(w, "1-D weight");
  w = Clone(a);
  w.scales.shape = {6, 5};
  expect_bad(w, "scales last dim");
  w = Clone(a);
  w.scales.shape = {5, 4};
  expect_bad(w, "scales rows");
  w = Clone(a);
  w.scales.dtype = DType::kU8;
  w.biases.dtype = DType::kU8;
  expect_bad(w, "affine scales must be float");
  w = Clone(a);
  w.biases = {};
  expect_bad(w, "biases missing");
  w = Clone(a);
  w.biases.dtype = DType::kF16;
  expect_bad(w, "biases dtype differs");
  w = Clone(a);
  w.biases.shape = {6, 2};
  expect_bad(w, "biases shape differs");
  w = Clone(a);
  w.global_scale = 2.0f;
  expect_bad(w, "global scale on affine");
  w = Clone(a);
  w.scales = {};
  expect_bad(w, "scales missing");
  w = Clone(a);
  w.spec.group_size = 48;
  expect_bad(w, "group size MLX rejects");
  w = Clone(a);
  w.spec.bits = 7;
  expect_bad(w, "bits MLX rejects");
  w = Clone(a);
  w.spec = {QuantMode::kAffine, 4, 128};  // 256 cols / 128 = 2 groups, scales say 4
  expect_bad(w, "group size inconsistent with scales");
  w = Clone(a);
  w.spec.bits = 3;  // 32 words * 32 / 3 is not whole
  expect_bad(w, "3-bit row of 32 words");
  w = Clone(a);
  w.weight.data = nullptr;
  expect_bad(w, "no data");

  Owned m = MakeQuant({QuantMode::kMxfp4, 4, 32}, DType::kBF16, 3, 5, 64, 2);
  ASSERT_TRUE(ValidateQuantWeight(m.q).ok()) << ValidateQuantWeight(m.q);
  EXPECT_EQ(m.q.batch(), 3);
  w = Clone(m);
  w.biases = w.scales;
  expect_bad(w, "mxfp4 has no biases");
  w = Clone(m);
  w.scales.dtype = DType::kBF16;
  expect_bad(w, "mxfp4 scales must be U8");
  w = Clone(m);
  w.scales.shape = {2, 5, 2};
  expect_bad(w, "batch dims differ");
  w = Clone(m);
  w.global_scale = 1.0f;
  expect_bad(w, "global scale on mxfp4");

  Owned n = MakeQuant({QuantMode::kNvfp4, 4, 16}, DType::kF32, 1, 4, 64, 3, 2.5f);
  EXPECT_TRUE(ValidateQuantWeight(n.q).ok());
  w = Clone(n);
  w.global_scale = INFINITY;
  expect_bad(w, "non-finite global scale");

  Owned d = MakeQuant({QuantMode::kNone, 0, 0}, DType::kBF16, 1, 4, 40, 4);
  EXPECT_TRUE(ValidateQuantWeight(d.q).ok());
  EXPECT_EQ(d.q.cols(), 40);
  w = Clone(d);
  w.weight.dtype = DType::kU32;
  expect_bad(w, "unquantized U32");
  w = Clone(d);
  w.scales = {DType::kBF16, {4, 1}, d.dense_16.data()};
  expect_bad(w, "unquantized with scales");
}

TEST(Quantize, RejectsBadArguments) {
  std::vector<float> w(64, 0.5f);
  EXPECT_FALSE(Quantize(w.data(), 1, 64, {QuantMode::kAffine, 7, 64}, DType::kF32).ok());
  EXPECT_FALSE(Quantize(w.data(), 2, 32, {QuantMode::kAffine, 4, 64}, DType::kF32).ok());
  EXPECT_FALSE(Quantize(w.data(), 1, 64, {QuantMode::kAffine, 4, 64}, DType::kU32).ok());
  EXPECT_FALSE(Quantize(w.data(), 1, 64, {QuantMode::kNone, 0, 0}, DType::kF32).ok());
  EXPECT_FALSE(Quantize(w.data(), 1, 64, {QuantMode::kMxfp4, 4, 32}, DType::kF32, 2.0f).ok());
  EXPECT_TRUE(Quantize(w.data(), 1, 64, {QuantMode::kMxfp4, 4, 32}, DType::kU8).ok());
}

TEST(Quantize, PacksCodesLsbFirst) {
  // Affine 4-bit, one group of 32 with values -15..0 twice: |min| > |max|, so MLX anchors
  // the bias at min: scale 1, bias -15, q = value + 15. (With |max| >= |min| it anchors at
  // max with a negative scale.)
  std::vector<float> w(32);
  for (int i = 0; i < 32; ++i) w[i] = static_cast<float>(i % 16) - 15.0f;
  auto q = Quantize(w.data(), 1, 32, {QuantMode::kAffine, 4, 32}, DType::kF32);
  ASSERT_TRUE(q.ok());
  ASSERT_EQ(q->weight.size(), 4u);
  EXPECT_EQ(q->weight[0], 0x76543210u);
  EXPECT_EQ(q->weight[1], 0xfedcba98u);
  float s, b;
  std::memcpy(&s, q->scales.data(), 4);
  std::memcpy(&b, q->biases.data(), 4);
  EXPECT_EQ(s, 1.0f);
  EXPECT_EQ(b, -15.0f);
  for (int i = 0; i < 32; ++i) w[i] = static_cast<float>(i % 16);  // anchored at max
  q = Quantize(w.data(), 1, 32, {QuantMode::kAffine, 4, 32}, DType::kF32);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->weight[0], 0x89abcdefu);  // q = 15 - value
  std::memcpy(&s, q->scales.data(), 4);
  std::memcpy(&b, q->biases.data(), 4);
  EXPECT_EQ(s, -1.0f);
  EXPECT_EQ(b, 15.0f);
  // 3-bit: one continuous bit stream; value v2 straddles bytes 0 and 1.
  std::vector<float> w3(32);
  for (int i = 0; i < 32; ++i) w3[i] = static_cast<float>(i % 8) - 7.0f;
  auto q3 = Quantize(w3.data(), 1, 32, {QuantMode::kAffine, 3, 32}, DType::kF32);
  ASSERT_TRUE(q3.ok());
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(q3->weight.data());
  for (int i = 0; i < 32; ++i) {
    uint32_t v = 0;
    for (int k = 0; k < 3; ++k) v |= ((bytes[(3 * i + k) / 8] >> ((3 * i + k) % 8)) & 1u) << k;
    EXPECT_EQ(v, static_cast<uint32_t>(i % 8)) << i;
  }
  // mxfp4: element 2i in the low nibble; 1.0 is code 2, -6 code 15, scale 2^0 -> 127.
  std::vector<float> wf(32, 0.0f);
  wf[0] = 1.0f;
  wf[1] = -6.0f;
  auto qf = Quantize(wf.data(), 1, 32, {QuantMode::kMxfp4, 4, 32}, DType::kF32);
  ASSERT_TRUE(qf.ok());
  EXPECT_EQ(qf->weight[0] & 0xffu, 0xf2u);
  EXPECT_EQ(qf->scales[0], 127);
}

struct FormatCase {
  QuantSpec spec;
  DType sdt;
};
std::vector<FormatCase> AllFormats() {
  std::vector<FormatCase> out;
  for (int bits : {1, 2, 3, 4, 5, 6, 8})
    for (int g : {32, 64, 128})
      for (DType t : {DType::kF32, DType::kBF16, DType::kF16})
        out.push_back({{QuantMode::kAffine, bits, g}, t});
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    out.push_back({{QuantMode::kMxfp4, 4, 32}, t});
    out.push_back({{QuantMode::kMxfp8, 8, 32}, t});
    out.push_back({{QuantMode::kNvfp4, 4, 16}, t});
  }
  return out;
}

TEST(Quantize, RoundTripErrorIsAtMostOneStep) {
  for (const FormatCase& f : AllFormats()) {
    if (f.spec.mode == QuantMode::kAffine && f.sdt != DType::kF32)
      continue;  // step bound needs exact scales
    SCOPED_TRACE(f.spec.ToString() + " " + DTypeName(f.sdt));
    const int64_t rows = 7, cols = 384;
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> w(rows * cols);
    for (auto& v : w)
      v = f.sdt == DType::kF32 ? nd(rng)
                               : (f.sdt == DType::kBF16 ? RoundBf16(nd(rng)) : RoundF16(nd(rng)));
    auto q = Quantize(w.data(), rows, cols, f.spec, f.sdt);
    ASSERT_TRUE(q.ok());
    QuantWeight qw;
    qw.spec = f.spec;
    qw.weight = {DType::kU32, {rows, cols * f.spec.bits / 32}, q->weight.data()};
    qw.scales = {q->scale_dtype, {rows, cols / f.spec.group_size}, q->scales.data()};
    if (f.spec.mode == QuantMode::kAffine)
      qw.biases = {q->scale_dtype, qw.scales.shape, q->biases.data()};
    ASSERT_TRUE(ValidateQuantWeight(qw).ok());
    const std::vector<float> d = Dequantize(qw);
    const int gs = f.spec.group_size;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < cols / gs; ++g) {
        float lo = INFINITY, hi = -INFINITY, amax = 0.0f;
        for (int j = 0; j < gs; ++j) {
          const float v = w[r * cols + g * gs + j];
          lo = std::min(lo, v);
          hi = std::max(hi, v);
          amax = std::max(amax, std::fabs(v));
        }
        double step;  // the worst-case reconstruction error of the format
        switch (f.spec.mode) {
          case QuantMode::kAffine:
            step = (hi - lo) / ((1 << f.spec.bits) - 1) * (f.spec.bits == 1 ? 0.5 : 1.0) * 1.001;
            break;
          case QuantMode::kMxfp4:  // spacing <= 2 * 2^e, 2^e < amax / 3
            step = amax / 3.0;
            break;
          case QuantMode::kNvfp4:  // spacing <= 2 * s, s ~ amax / 6 (+1/16 from e4m3)
            step = amax / 6.0 * 1.07 + 1e-30;
            break;
          default:  // mxfp8: relative 2^-4, plus subnormals of e4m3 below 2^-6 * 2^e
            step = amax / 16.0;
            break;
        }
        for (int j = 0; j < gs; ++j) {
          const int64_t i = r * cols + g * gs + j;
          ASSERT_LE(std::fabs(static_cast<double>(d[i]) - w[i]), step + 1e-6 * amax)
              << "row " << r << " group " << g << " elem " << j << " w " << w[i] << " deq " << d[i];
        }
      }
  }
}

TEST(Quantize, FpModesAreIdempotentOnTheirOwnOutput) {
  for (QuantSpec spec : {QuantSpec{QuantMode::kMxfp4, 4, 32}, QuantSpec{QuantMode::kMxfp8, 8, 32},
                         QuantSpec{QuantMode::kNvfp4, 4, 16}}) {
    SCOPED_TRACE(spec.ToString());
    Owned o = MakeQuant(spec, DType::kBF16, 1, 9, 256, 5);
    const std::vector<float> d1 = Dequantize(o.q);  // bf16 values
    auto q2 = Quantize(d1.data(), 9, 256, spec, DType::kBF16);
    ASSERT_TRUE(q2.ok());
    QuantWeight w2 = o.q;
    w2.weight.data = q2->weight.data();
    w2.scales.data = q2->scales.data();
    const std::vector<float> d2 = Dequantize(w2);
    for (size_t i = 0; i < d1.size(); ++i) ASSERT_EQ(Bits(d1[i]), Bits(d2[i])) << i;
  }
}

// ---- matmuls against a scalar double-precision reference ----------------------------------------

// W_b as the matmul uses it (affine: scale * q + bias, unrounded), in double, and the
// magnitude |scale * q| + |bias| of each element for the error scale of a dot product.
struct RefWeights {
  std::vector<double> w, mag;
};
RefWeights ReferenceWeights(const QuantWeight& w, int64_t b) {
  const cpu::QSlice s = cpu::MakeQSlice(w, b);
  RefWeights out{std::vector<double>(s.rows * s.cols), std::vector<double>(s.rows * s.cols)};
  if (w.spec.mode == QuantMode::kNone) {
    std::vector<float> f(s.rows * s.cols);
    DequantizeRows(w, b, 0, s.rows, f.data());
    for (size_t i = 0; i < f.size(); ++i) {
      out.w[i] = f[i];
      out.mag[i] = std::fabs(f[i]);
    }
    return out;
  }
  // Scales straight from the bytes with the dtype.h conversions (not LoadRowScales, which
  // is under test); codes from the scalar decoder that Dequantize (MLX-verified) uses.
  const int gs = w.spec.group_size;
  const int64_t sbase = b * s.rows * s.groups;
  std::vector<float> code(gs);
  for (int64_t r = 0; r < s.rows; ++r) {
    for (int64_t g = 0; g < s.groups; ++g) {
      const int64_t gi = sbase + r * s.groups + g;
      double scale = 0.0, bias = 0.0;
      const uint8_t byte = w.scales.dtype == DType::kU8 ? w.scales.as<uint8_t>()[gi] : 0;
      switch (w.spec.mode) {
        case QuantMode::kAffine:
          scale = w.scales.at(gi);
          bias = w.biases.at(gi);
          break;
        case QuantMode::kMxfp4:
        case QuantMode::kMxfp8:
          scale = E8M0ToFloat(byte);
          break;
        case QuantMode::kNvfp4:
          scale = E4M3ToFloat(byte);
          if (w.global_scale != 0.0f)
            scale = static_cast<float>(scale) * (w.global_scale / 2688.0f);
          break;
        case QuantMode::kNone:
          break;
      }
      cpu::DecodeGroup(s, r, g, code.data());
      for (int j = 0; j < gs; ++j) {
        const double sq = scale * code[j];
        out.w[r * s.cols + g * gs + j] = sq + bias;
        out.mag[r * s.cols + g * gs + j] = std::fabs(sq) + std::fabs(bias);
      }
    }
  }
  return out;
}

void CheckMatmuls(const QuantWeight& w, int64_t m, uint32_t seed, float x_scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, x_scale);
  const int64_t R = w.rows(), C = w.cols();
  for (int64_t b = 0; b < w.batch(); ++b) {
    const RefWeights ref_w = ReferenceWeights(w, b);
    const std::vector<double>& W = ref_w.w;
    const std::vector<double>& A = ref_w.mag;
    // transpose=true: y[m, R] = x[m, C] W^T
    std::vector<float> x(m * C), y(m * R, NAN);
    for (auto& v : x) v = nd(rng);
    QMatmulT(x.data(), m, w, b, y.data());
    for (int64_t i = 0; i < m; ++i)
      for (int64_t r = 0; r < R; ++r) {
        double ref = 0, den = 0;
        for (int64_t k = 0; k < C; ++k) {
          ref += x[i * C + k] * W[r * C + k];
          den += std::fabs(x[i * C + k]) * A[r * C + k];
        }
        ASSERT_NEAR(y[i * R + r], ref, 1e-5 * den)
            << "T b=" << b << " m=" << i << " r=" << r;
      }
    // transpose=false: y[m, C] = x[m, R] W
    std::vector<float> xn(m * R), yn(m * C, NAN);
    for (auto& v : xn) v = nd(rng);
    QMatmulN(xn.data(), m, w, b, yn.data());
    for (int64_t i = 0; i < m; ++i)
      for (int64_t c = 0; c < C; ++c) {
        double ref = 0, den = 0;
        for (int64_t r = 0; r < R; ++r) {
          ref += xn[i * R + r] * W[r * C + c];
          den += std::fabs(xn[i * R + r]) * A[r * C + c];
        }
        ASSERT_NEAR(yn[i * C + c], ref, 1e-5 * den)
            << "N b=" << b << " m=" << i << " c=" << c;
      }
  }
}

// Runs fn once per matmul kernel set this build and CPU support (scalar decoders, AVX2,
// AVX-512), forcing it through the test hook, and restores the default afterwards.
template <typename Fn>
void ForEachQuantIsa(Fn fn) {
  const cpu::QuantIsa saved = cpu::ActiveQuantIsa();
  const struct {
    cpu::QuantIsa isa;
    const char* name;
  } isas[] = {{cpu::QuantIsa::kScalar, "scalar"},
              {cpu::QuantIsa::kAvx2, "avx2"},
              {cpu::QuantIsa::kAvx512, "avx512"}};
  for (const auto& [isa, name] : isas) {
    if (!cpu::TEST_SetQuantIsa(isa)) {
      std::printf("  (%s kernels not supported here: skipped)\n", name);
      continue;
    }
    SCOPED_TRACE(std::string("quant ISA ") + name);
    fn();
    if (::testing::Test::HasFatalFailure()) break;
  }
  EXPECT_TRUE(cpu::TEST_SetQuantIsa(saved));
}

TEST(QMatmul, MatchesReferenceForEveryFormat) {
  ForEachQuantIsa([] {
    uint32_t seed = 100;
    for (const FormatCase& f : AllFormats()) {
      SCOPED_TRACE(f.spec.ToString() + " " + DTypeName(f.sdt));
      // cols: whole vector chunks plus a tail of groups (chunks are 32 bytes of codes).
      const int64_t cols = f.spec.group_size * (f.spec.group_size == 16 ? 13 : 9);
      Owned o = MakeQuant(f.spec, f.sdt, 1, 11, cols, seed++);
      ASSERT_TRUE(ValidateQuantWeight(o.q).ok());
      for (int64_t m : {1, 2, 3, 4, 5, 8, 9}) CheckMatmuls(o.q, m, seed++);
    }
  });
}

TEST(QMatmul, FourBitShapesAroundTheWideChunk) {
  // The AVX-512 kernel takes 128 codes (64 bytes) per chunk and leaves whole groups of a
  // row's tail to the scalar decoder: rows shorter than a chunk, exact multiples, chunks
  // plus a tail, one row and a row-block remainder, every 4-bit mode and group size.
  ForEachQuantIsa([] {
    uint32_t seed = 500;
    std::vector<FormatCase> cases;
    for (int g : {32, 64, 128})
      for (DType t : {DType::kF32, DType::kBF16, DType::kF16})
        cases.push_back({{QuantMode::kAffine, 4, g}, t});
    for (DType t : {DType::kBF16, DType::kF32}) {
      cases.push_back({{QuantMode::kMxfp4, 4, 32}, t});
      cases.push_back({{QuantMode::kNvfp4, 4, 16}, t});
    }
    for (const FormatCase& f : cases) {
      const int gs = f.spec.group_size;
      for (int64_t cols : {int64_t{gs}, int64_t{256}, 3 * 128 + int64_t{gs}, 5 * 128 + 3 * int64_t{gs}}) {
        if (cols % gs != 0) continue;
        for (int64_t rows : {1, 17}) {
          SCOPED_TRACE(f.spec.ToString() + " " + DTypeName(f.sdt) + " " + std::to_string(rows) +
                       "x" + std::to_string(cols));
          Owned o = MakeQuant(f.spec, f.sdt, 1, rows, cols, seed++);
          ASSERT_TRUE(ValidateQuantWeight(o.q).ok());
          for (int64_t m : {1, 2, 3, 4, 6}) CheckMatmuls(o.q, m, seed++);
        }
      }
    }
    // nvfp4 with a global scale (per-group scales are then not powers of two times E4M3).
    Owned n = MakeQuant({QuantMode::kNvfp4, 4, 16}, DType::kBF16, 1, 9, 3 * 128 + 16, 7, 3.7f);
    CheckMatmuls(n.q, 1, 8);
    CheckMatmuls(n.q, 5, 9);
  });
}

TEST(QMatmul, IsaHookOnlyAcceptsWhatRuns) {
  const cpu::QuantIsa saved = cpu::ActiveQuantIsa();
  EXPECT_TRUE(cpu::TEST_SetQuantIsa(cpu::QuantIsa::kScalar));
  EXPECT_EQ(cpu::ActiveQuantIsa(), cpu::QuantIsa::kScalar);
#if defined(__AVX2__)
  EXPECT_TRUE(cpu::TEST_SetQuantIsa(cpu::QuantIsa::kAvx2));
  EXPECT_EQ(cpu::ActiveQuantIsa(), cpu::QuantIsa::kAvx2);
#endif
  const bool avx512 = cpu::TEST_SetQuantIsa(cpu::QuantIsa::kAvx512);
#if defined(__x86_64__) && defined(__AVX2__)
  EXPECT_EQ(avx512, __builtin_cpu_supports("avx512f") != 0);
#else
  EXPECT_FALSE(avx512);
#endif
  EXPECT_TRUE(cpu::TEST_SetQuantIsa(saved));
}

TEST(QMatmul, LongRowsUseSeveralKTilesAndRowBlocks) {
  // The kernels walk K in tiles of ~24 KiB of x (K > 2048) and rows in blocks of 8; long
  // rows and 19 rows (two full blocks and a remainder) cover tile and block edges.
  ForEachQuantIsa([] {
    uint32_t seed = 300;
    for (QuantSpec spec :
         {QuantSpec{QuantMode::kAffine, 4, 64}, QuantSpec{QuantMode::kMxfp4, 4, 32},
          QuantSpec{QuantMode::kNvfp4, 4, 16}, QuantSpec{QuantMode::kMxfp8, 8, 32},
          QuantSpec{QuantMode::kAffine, 8, 128}, QuantSpec{QuantMode::kAffine, 2, 32}}) {
      SCOPED_TRACE(spec.ToString());
      Owned o = MakeQuant(spec, DType::kBF16, 1, 19, 128 * 37, seed++);
      for (int64_t m : {1, 2, 5, 8}) CheckMatmuls(o.q, m, seed++);
    }
    // One row of x is tiled too once its permuted copy exceeds 32 KiB (here 36.5 KiB: a
    // full tile and a partial one for every chunk width).
    for (QuantSpec spec : {QuantSpec{QuantMode::kAffine, 4, 64}, QuantSpec{QuantMode::kMxfp4, 4, 32},
                           QuantSpec{QuantMode::kMxfp8, 8, 32}}) {
      SCOPED_TRACE(spec.ToString() + " long row");
      Owned o = MakeQuant(spec, DType::kBF16, 1, 11, 128 * 73, seed++);
      CheckMatmuls(o.q, 1, seed++);
    }
  });
}

// A row of x gives bit-identical outputs alone and among m rows (continuous batching must
// not change a sequence's numbers): same K tiling and the same accumulator chains for any m.
TEST(QMatmul, ARowAloneEqualsTheSameRowInABatch) {
  ForEachQuantIsa([] {
    uint32_t seed = 900;
    for (QuantSpec spec :
         {QuantSpec{QuantMode::kAffine, 4, 64}, QuantSpec{QuantMode::kMxfp4, 4, 32},
          QuantSpec{QuantMode::kNvfp4, 4, 16}, QuantSpec{QuantMode::kMxfp8, 8, 32},
          QuantSpec{QuantMode::kAffine, 8, 64}, QuantSpec{QuantMode::kAffine, 2, 32},
          QuantSpec{QuantMode::kNone, 0, 0}}) {
      for (int64_t cols : {int64_t{1024}, int64_t{128 * 37}}) {
        SCOPED_TRACE(spec.ToString() + " cols " + std::to_string(cols));
        Owned o = MakeQuant(spec, DType::kBF16, 1, 19, cols, seed++);
        std::mt19937 rng(seed++);
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (int64_t m : {2, 3, 4, 5, 8}) {
          std::vector<float> x(m * cols), y(m * 19), one(19);
          for (auto& v : x) v = nd(rng);
          QMatmulT(x.data(), m, o.q, 0, y.data());
          for (int64_t i = 0; i < m; ++i) {
            QMatmulT(x.data() + i * cols, 1, o.q, 0, one.data());
            for (int r = 0; r < 19; ++r)
              ASSERT_EQ(y[i * 19 + r], one[r]) << "m=" << m << " row " << i << " out " << r;
          }
        }
      }
    }
  });
}

// Scale bytes rewritten to cover every E8M0 value but inf (0: MLX's 2^-127) and every
// E4M3 value, negative and subnormal ones included; one NaN E4M3 scale poisons its row.
void CheckEveryScaleByte() {
  for (QuantSpec spec : {QuantSpec{QuantMode::kMxfp4, 4, 32}, QuantSpec{QuantMode::kMxfp8, 8, 32},
                         QuantSpec{QuantMode::kNvfp4, 4, 16}}) {
    for (float gscale : {0.0f, 3.7f}) {
      if (gscale != 0.0f && spec.mode != QuantMode::kNvfp4) continue;
      SCOPED_TRACE(spec.ToString() + (gscale != 0.0f ? " global" : ""));
      Owned o = MakeQuant(spec, DType::kF32, 1, 17, 1024, 41, gscale);
      if (spec.mode == QuantMode::kNvfp4) {  // all codes but NaN; max 448, no overflow
        for (size_t i = 0; i < o.s.size(); ++i)
          o.s[i] = static_cast<uint8_t>(i % 255 == 127 ? 0 : i % 255);
        CheckMatmuls(o.q, 1, 42);
        CheckMatmuls(o.q, 3, 43);
      } else {  // E8M0 0..190 with |x| ~ 1, then 64..254 with |x| ~ 2^-60 (fp32 range)
        for (size_t i = 0; i < o.s.size(); ++i) o.s[i] = static_cast<uint8_t>(i % 191);
        const size_t groups = o.s.size() / 17;  // row 0 all 2^-127, row 1 mixes 0 and 1
        for (size_t g = 0; g < groups; ++g) {
          o.s[g] = 0;
          o.s[groups + g] = static_cast<uint8_t>(g % 2);
        }
        CheckMatmuls(o.q, 1, 42);
        CheckMatmuls(o.q, 3, 43);
        for (size_t i = 0; i < o.s.size(); ++i) o.s[i] = static_cast<uint8_t>(64 + i % 191);
        CheckMatmuls(o.q, 1, 44, 0x1p-60f);
        CheckMatmuls(o.q, 3, 45, 0x1p-60f);
      }
      if (spec.mode != QuantMode::kNvfp4) continue;
      o.s[5 * (1024 / 16) + 7] = 0x7f;  // NaN scale in row 5
      std::vector<float> x(1024, 1.0f), y(17);
      QMatmulT(x.data(), 1, o.q, 0, y.data());
      for (int r = 0; r < 17; ++r) EXPECT_EQ(std::isnan(y[r]), r == 5) << r;
    }
  }
}

TEST(QMatmul, EveryScaleByteDecodes) {
  ForEachQuantIsa([] { CheckEveryScaleByte(); });
}

TEST(QMatmul, NvFp4GlobalScaleAndUnquantized) {
  Owned n = MakeQuant({QuantMode::kNvfp4, 4, 16}, DType::kBF16, 1, 13, 256, 7, 3.7f);
  EXPECT_EQ(DequantizeDType(n.q), DType::kF32);
  CheckMatmuls(n.q, 3, 8);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(t));
    Owned d = MakeQuant({QuantMode::kNone, 0, 0}, t, 2, 9, 75, 9);
    ASSERT_TRUE(ValidateQuantWeight(d.q).ok());
    EXPECT_EQ(DequantizeDType(d.q), t);
    CheckMatmuls(d.q, 1, 10);
    CheckMatmuls(d.q, 6, 11);
  }
}

TEST(QMatmul, StackedSlicesAreIndependent) {
  // Batch slice b of a stacked weight must equal the same matrix quantized alone.
  for (QuantSpec spec :
       {QuantSpec{QuantMode::kAffine, 4, 64}, QuantSpec{QuantMode::kMxfp4, 4, 32},
        QuantSpec{QuantMode::kAffine, 3, 32}, QuantSpec{QuantMode::kMxfp8, 8, 32}}) {
    SCOPED_TRACE(spec.ToString());
    Owned stack = MakeQuant(spec, DType::kBF16, 4, 6, 128, 21);
    EXPECT_EQ(stack.q.batch(), 4);
    const std::vector<float> all = Dequantize(stack.q);
    CheckMatmuls(stack.q, 2, 22);
    for (int64_t b = 0; b < 4; ++b) {
      std::vector<float> rows(3 * 128);
      DequantizeRows(stack.q, b, 2, 5, rows.data());  // rows [2, 5) of slice b
      for (size_t i = 0; i < rows.size(); ++i) {
        ASSERT_EQ(Bits(rows[i]), Bits(all[b * 6 * 128 + 2 * 128 + i])) << b << " " << i;
      }
      // Distinct slices really differ (the index is used).
      if (b > 0) {
        EXPECT_NE(all[b * 6 * 128], all[(b - 1) * 6 * 128]);
      }
    }
  }
}

TEST(QMatmul, ZeroRowsAndEmptyBatches) {
  Owned o = MakeQuant({QuantMode::kAffine, 4, 64}, DType::kBF16, 1, 5, 64, 31);
  std::vector<float> y(5, 1.0f);
  QMatmulT(nullptr, 0, o.q, 0, y.data());  // m = 0: nothing written
  for (float v : y) EXPECT_EQ(v, 1.0f);
  // All-zero x gives exact zeros (no stray bias or post-scale terms).
  std::vector<float> x(64, 0.0f);
  QMatmulT(x.data(), 1, o.q, 0, y.data());
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace ring
