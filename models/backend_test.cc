// Backend's composite ops with the step's cache write (models/backend.h): HeadNormRope with
// KvRows and IndexerNormRope with k_rows must give, in the cache rows at the offset, exactly
// what the in-place op gives, leave their source rows and every other cache row alone, and
// rotate q the same way. Run on the CPU backend, whose composites are Backend's defaults (the
// CUDA backend's fused kernels are checked against these in kernels/cuda/ops_harness_test.cc).
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "models/backend.h"

namespace ring::internal {
namespace {

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

RopeTable Table(int64_t dims) {
  RopeTable r;
  r.dims = dims;
  for (int64_t i = 0; i < dims / 2; ++i) {
    r.inv_freq.push_back(static_cast<float>(std::pow(1e6, -2.0 * i / dims)));
  }
  return r;
}

TEST(BackendCacheWrite, HeadNormRopeWritesTheCacheRowsAsInPlace) {
  std::shared_ptr<Backend> b = NewCpuBackend();
  const int64_t T = 3, H = 4, KV = 2, d = 64, offset = 5, rows = offset + T + 2, kw = KV * d;
  const RopeTable r = Table(d);
  ASSERT_TRUE(b->AddRope(r).ok());
  const std::vector<float> qn = Random(d, 1), kn = Random(d, 2);
  const TensorView q_norm{DType::kF32, {d}, qn.data()}, k_norm{DType::kF32, {d}, kn.data()};
  for (ActDType t : {ActDType::kF32, ActDType::kBF16}) {
    const std::vector<float> q0 = Random(T * H * d, 3), k0 = Random(T * kw, 4), v0 = Random(T * kw, 5);
    const std::vector<float> kc0 = Random(rows * kw, 6), vc0 = Random(rows * kw, 7);
    // In place.
    std::vector<float> qi = q0, ki = k0;
    ASSERT_TRUE(b->HeadNormRope(r, qi.data(), H, q_norm, ki.data(), KV, k_norm, T, d, 1e-6f, offset, t,
                                nullptr)
                    .ok());
    // Into the cache rows at the offset.
    std::vector<float> q = q0, k = k0, kc = kc0, vc = vc0;
    const Backend::KvRows kv{v0.data(), kc.data() + offset * kw, vc.data() + offset * kw};
    ASSERT_TRUE(
        b->HeadNormRope(r, q.data(), H, q_norm, k.data(), KV, k_norm, T, d, 1e-6f, offset, t, &kv).ok());
    EXPECT_EQ(q, qi);
    EXPECT_EQ(k, k0) << "the source rows were written";
    std::vector<float> want_k = kc0, want_v = vc0;
    std::copy(ki.begin(), ki.end(), want_k.begin() + offset * kw);
    std::copy(v0.begin(), v0.end(), want_v.begin() + offset * kw);
    EXPECT_EQ(kc, want_k);
    EXPECT_EQ(vc, want_v);
  }
}

TEST(BackendCacheWrite, IndexerNormRopeWritesTheKeyRowsAsInPlace) {
  std::shared_ptr<Backend> b = NewCpuBackend();
  const int64_t T = 2, H = 4, d = 128, offset = 9, rows = offset + T + 3;
  const RopeTable r = Table(64);
  ASSERT_TRUE(b->AddRope(r).ok());
  const std::vector<float> nw = Random(d, 11), nb = Random(d, 12);
  const TensorView norm_w{DType::kF32, {d}, nw.data()}, norm_b{DType::kF32, {d}, nb.data()};
  for (ActDType t : {ActDType::kF32, ActDType::kBF16}) {
    const std::vector<float> q0 = Random(T * H * d, 13), k0 = Random(T * d, 14), w0 = Random(T * H, 15);
    const std::vector<float> kc0 = Random(rows * d, 16);
    std::vector<float> qi = q0, ki = k0, wi = w0;
    ASSERT_TRUE(b->IndexerNormRope(r, qi.data(), T, H, d, ki.data(), norm_w, norm_b, 1e-5f, offset,
                                   wi.data(), T * H, 0.01f, t, nullptr)
                    .ok());
    std::vector<float> q = q0, k = k0, w = w0, kc = kc0;
    ASSERT_TRUE(b->IndexerNormRope(r, q.data(), T, H, d, k.data(), norm_w, norm_b, 1e-5f, offset,
                                   w.data(), T * H, 0.01f, t, kc.data() + offset * d)
                    .ok());
    EXPECT_EQ(q, qi);
    EXPECT_EQ(w, wi);
    EXPECT_EQ(k, k0) << "the source rows were written";
    std::vector<float> want = kc0;
    std::copy(ki.begin(), ki.end(), want.begin() + offset * d);
    EXPECT_EQ(kc, want);
  }
}

}  // namespace
}  // namespace ring::internal
