#include "kernels/cpu/ops.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"

namespace ring::cpu {
namespace {

std::vector<float> Random(int64_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

TEST(RmsNorm, MatchesFormulaAndRoundsLikeMlx) {
  const int64_t rows = 3, dim = 64;
  auto x = Random(rows * dim, 1);
  std::vector<uint16_t> w(dim);
  for (int64_t i = 0; i < dim; ++i) w[i] = FloatToBf16(1.f + 0.01f * i);
  TensorView wv{DType::kBF16, {dim}, w.data()};
  std::vector<float> out(rows * dim);
  RmsNorm(x.data(), rows, dim, wv, 1e-5f, ActDType::kBF16, out.data());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
    for (int64_t i = 0; i < dim; ++i) {
      const float y = RoundBf16(static_cast<float>(x[r * dim + i] * inv));
      EXPECT_EQ(out[r * dim + i], RoundBf16(y * Bf16ToFloat(w[i]))) << r << "," << i;
    }
  }
}

TEST(Rope, TraditionalAndHalfSplitRotatePairsByPosition) {
  const int64_t T = 5, H = 2, D = 8, dims = 8;
  std::vector<float> inv{1.f, 0.5f, 0.25f, 0.125f};
  for (bool trad : {true, false}) {
    auto x = Random(T * H * D, 2);
    auto y = x;
    Rope(y.data(), T, H, D, H * D, dims, trad, inv, /*offset=*/3, ActDType::kF32);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < dims / 2; ++i) {
          const int64_t a = trad ? 2 * i : i, b = trad ? 2 * i + 1 : i + dims / 2;
          const float* xi = x.data() + (t * H + h) * D;
          const float* yi = y.data() + (t * H + h) * D;
          const float th = (3 + t) * inv[i];
          EXPECT_NEAR(yi[a], xi[a] * std::cos(th) - xi[b] * std::sin(th), 1e-5);
          EXPECT_NEAR(yi[b], xi[a] * std::sin(th) + xi[b] * std::cos(th), 1e-5);
        }
  }
}

TEST(Rope, OnlyFirstDimsRotate) {
  std::vector<float> x = Random(16, 3), y = x;
  Rope(y.data(), 1, 1, 16, 16, 4, false, {1.f, 0.5f}, 7, ActDType::kF32);
  for (int i = 4; i < 16; ++i) EXPECT_EQ(x[i], y[i]);
  EXPECT_NE(x[0], y[0]);
}

TEST(Attention, MatchesNaiveCausalGqa) {
  const int64_t L = 4, S = 6, hq = 4, hkv = 2, dk = 8, dv = 5, off = S - L;
  auto q = Random(L * hq * dk, 4), k = Random(S * hkv * dk, 5), v = Random(S * hkv * dv, 6);
  std::vector<float> out(L * hq * dv);
  AttentionArgs a{q.data(), hq * dk, k.data(), hkv * dk, v.data(), hkv * dv, L, S, hq, hkv,
                  dk, dv, 0.3f, nullptr, off};
  Attention(a, ActDType::kF32, out.data());
  for (int64_t i = 0; i < L; ++i)
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t kh = h / (hq / hkv);
      std::vector<double> s;
      double mx = -1e300;
      for (int64_t j = 0; j <= off + i; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < dk; ++d) dot += 0.3 * q[(i * hq + h) * dk + d] * k[(j * hkv + kh) * dk + d];
        s.push_back(dot);
        mx = std::max(mx, dot);
      }
      double sum = 0;
      for (auto& e : s) sum += (e = std::exp(e - mx));
      for (int64_t d = 0; d < dv; ++d) {
        double o = 0;
        for (size_t j = 0; j < s.size(); ++j) o += s[j] / sum * v[(j * hkv + kh) * dv + d];
        EXPECT_NEAR(out[(i * hq + h) * dv + d], o, 1e-5);
      }
    }
}

TEST(Attention, AdditiveMaskOfBf16LowestHidesKeys) {
  const int64_t S = 3;
  std::vector<float> q{1, 0}, k{1, 0, 0, 1, 1, 1}, v{1, 2, 3};
  std::vector<float> mask{0.f, -3.3895313892515355e38f, 0.f};
  std::vector<float> out(1);
  AttentionArgs a{q.data(), 2, k.data(), 2, v.data(), 1, 1, S, 1, 1, 2, 1, 1.f, mask.data(), -1};
  Attention(a, ActDType::kF32, out.data());
  EXPECT_NEAR(out[0], 0.5 * 1 + 0.5 * 3, 1e-6);  // keys 0 and 2 tie, key 1 hidden
}

TEST(TopK, PicksLargestWithLowIndexOnTies) {
  std::vector<float> x{0.f, 5.f, 3.f, 5.f, -INFINITY, 3.f};
  EXPECT_EQ(TopKIndices(x.data(), 6, 3), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(TopKIndices(x.data(), 6, 10).size(), 6u);
  EXPECT_EQ(ArgMax(x.data(), 6), 1);
}

TEST(SwiGlu, RoundsEachStep) {
  std::vector<float> g{-2.f, 0.f, 1.5f}, u{3.f, 1.f, -0.7f}, out(3);
  SwiGlu(g.data(), u.data(), 3, ActDType::kF32, out.data());
  for (int i = 0; i < 3; ++i)
    EXPECT_NEAR(out[i], g[i] / (1 + std::exp(-g[i])) * u[i], 1e-6);
}

}  // namespace
}  // namespace ring::cpu
