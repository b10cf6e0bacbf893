// Backend's composite ops with the step's cache write (models/backend.h): HeadNormRope with
// KvRows and IndexerNormRope with k_rows must give, in the cache rows at the offset, exactly
// what the in-place op gives, leave their source rows and every other cache row alone, and
// rotate q the same way. Run on the CPU backend, whose composites are Backend's defaults (the
// CUDA backend's fused kernels are checked against these in kernels/cuda/ops_harness_test.cc).
// Also Backend::DownloadLater and Upload, on the CPU backend and on cuda:0 where there is one.
#include <algorithm>
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

// DownloadLater: the host copies are written by the next call that waits (here ArgMax, then
// EndStep), with what the device held when they were queued (the upload after them must not
// show), also across a regrowth of the CUDA backend's pinned area (a copy larger than it
// makes it wait for the queued ones first).
void CheckDownloadLater(Backend& b) {
  ASSERT_TRUE(b.BeginStep().ok());
  const std::vector<float> a = Random(1000, 21), c = Random(70000, 22), big = Random(600000, 23);
  auto da = b.AllocF(static_cast<int64_t>(a.size()));
  auto dc = b.AllocF(static_cast<int64_t>(c.size()));
  auto dbig = b.AllocF(static_cast<int64_t>(big.size()));
  ASSERT_TRUE(da.ok() && dc.ok() && dbig.ok());
  ASSERT_TRUE(b.Upload(a.data(), a.size() * 4, da->data()).ok());
  ASSERT_TRUE(b.Upload(c.data(), c.size() * 4, dc->data()).ok());
  ASSERT_TRUE(b.Upload(big.data(), big.size() * 4, dbig->data()).ok());
  std::vector<float> ha(a.size(), -1.f), hc(c.size(), -1.f), ha2(a.size(), -1.f), hbig(big.size(), -1.f);
  ASSERT_TRUE(b.DownloadLater(da->data(), a.size() * 4, ha.data()).ok());
  ASSERT_TRUE(b.DownloadLater(dc->data(), c.size() * 4, hc.data()).ok());
  const std::vector<float> zeros(a.size(), 0.f);
  ASSERT_TRUE(b.Upload(zeros.data(), zeros.size() * 4, da->data()).ok());
  int32_t best = -1;
  ASSERT_TRUE(b.ArgMax(dc->f(), 1, static_cast<int64_t>(c.size()), &best).ok());
  EXPECT_EQ(ha, a);
  EXPECT_EQ(hc, c);
  EXPECT_EQ(best, std::max_element(c.begin(), c.end()) - c.begin());
  ASSERT_TRUE(b.DownloadLater(da->data(), a.size() * 4, ha2.data()).ok());
  ASSERT_TRUE(b.DownloadLater(dbig->data(), big.size() * 4, hbig.data()).ok());
  EXPECT_EQ(ha2, zeros);  // written when the area grew
  ASSERT_TRUE(b.EndStep().ok());
  EXPECT_EQ(hbig, big);
  // Two copies that do not fit the area together: the second waits for the first.
  ASSERT_TRUE(b.BeginStep().ok());
  const size_t half = 375000, second = big.size() - half;
  std::vector<float> h1(half, -1.f), h2(half, -1.f);
  ASSERT_TRUE(b.DownloadLater(dbig->data(), half * 4, h1.data()).ok());
  ASSERT_TRUE(b.DownloadLater(dbig->f() + second, half * 4, h2.data()).ok());
  ASSERT_TRUE(b.EndStep().ok());
  EXPECT_TRUE(std::equal(h1.begin(), h1.end(), big.begin()));
  EXPECT_TRUE(std::equal(h2.begin(), h2.end(), big.begin() + second));
}

TEST(BackendDownloadLater, CpuWritesAtOnce) { CheckDownloadLater(*NewCpuBackend()); }

// Upload takes the host values at the call: the caller may reuse its buffer at once, also
// when the CUDA backend's pinned area fills within a step (7 x 200 KB here), once it has
// grown for a copy larger than it, and in steps that repeat the last one's ops (the CUDA
// backend then replays the uploads, and the small downloads after them, from graphs: other
// values each step).
void CheckUploadTakesValuesAtTheCall(Backend& b) {
  const int64_t n = 50000, chunks = 7;
  auto d = b.AllocF(n * chunks);
  const std::vector<float> big = Random(400000, 50);
  auto dbig = b.AllocF(static_cast<int64_t>(big.size()));
  ASSERT_TRUE(d.ok() && dbig.ok());
  for (uint32_t step = 0; step < 3; ++step) {
    SCOPED_TRACE(step);
    ASSERT_TRUE(b.BeginStep().ok());
    std::vector<float> host(n), want;
    for (int64_t c = 0; c < chunks; ++c) {
      host = Random(n, 40 + 10 * step + static_cast<uint32_t>(c));
      want.insert(want.end(), host.begin(), host.end());
      ASSERT_TRUE(b.Upload(host.data(), n * 4, d->f() + c * n).ok());
      std::fill(host.begin(), host.end(), -7.f);
    }
    // Small downloads (the CUDA backend's copy kernel into mapped memory), then all of it.
    std::vector<float> later(1000, -1.f), small(2000, -1.f);
    ASSERT_TRUE(b.DownloadLater(d->f() + 5, 1000 * 4, later.data()).ok());
    ASSERT_TRUE(b.Download(d->f() + 2 * n + 3, 2000 * 4, small.data()).ok());
    EXPECT_TRUE(std::equal(later.begin(), later.end(), want.begin() + 5));
    EXPECT_TRUE(std::equal(small.begin(), small.end(), want.begin() + 2 * n + 3));
    std::vector<float> got(want.size(), -1.f);
    ASSERT_TRUE(b.Download(d->data(), static_cast<int64_t>(got.size()) * 4, got.data()).ok());
    EXPECT_EQ(got, want);
    std::vector<float> hbig = big;
    ASSERT_TRUE(b.Upload(hbig.data(), static_cast<int64_t>(hbig.size()) * 4, dbig->data()).ok());
    std::fill(hbig.begin(), hbig.end(), 3.f);
    ASSERT_TRUE(b.Download(dbig->data(), static_cast<int64_t>(hbig.size()) * 4, hbig.data()).ok());
    ASSERT_TRUE(b.EndStep().ok());
    EXPECT_EQ(hbig, big);
  }
}

TEST(BackendUpload, CpuTakesValuesAtTheCall) { CheckUploadTakesValuesAtTheCall(*NewCpuBackend()); }

TEST(BackendUpload, CudaTakesValuesAtTheCall) {
  absl::StatusOr<std::shared_ptr<Backend>> b = NewCudaBackend(0);
  if (!b.ok()) GTEST_SKIP() << "no usable CUDA device: " << b.status();
  CheckUploadTakesValuesAtTheCall(**b);
}

TEST(BackendDownloadLater, CudaWritesByTheNextWait) {
  absl::StatusOr<std::shared_ptr<Backend>> b = NewCudaBackend(0);
  if (!b.ok()) GTEST_SKIP() << "no usable CUDA device: " << b.status();
  CheckDownloadLater(**b);
}

}  // namespace
}  // namespace ring::internal
