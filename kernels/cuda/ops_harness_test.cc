// GPU op harness in the spirit of llama.cpp's test-backend-ops: every CUDA op, on every
// weight format and a set of shapes, against the CPU reference (kernels/quant.h,
// kernels/cpu/ops.h), with a written NMSE tolerance per op. Prints one table row per case:
//   op | shape | mode | NMSE | tolerance | PASS/FAIL
// Skips (GTEST_SKIP) when no CUDA device is visible, so CI without a GPU passes cleanly.
// RING_GPU_FULL=1 adds the real GLM-5.2 and Qwen3-8B shapes (0.5 GB lm_head included).
//
// Tolerances (NMSE = sum (gpu - ref)^2 / sum ref^2). Matmul cases also check the worst
// output feature: max over weight rows r of sum_tok (gpu - ref)^2 / (sum ref^2 / rows),
// which must stay under kWorstRowFactor * tol. NMSE alone is diluted by the matrix size (one
// wrong group of 64 in a 4096 x 4096 matrix is NMSE ~4e-6); per feature it is ~G/K ~1e-2.
//   kTolMatmul 1e-5: every path but one computes the reference's function up to fp32
//     summation order: the SIMT kernels use the reference's fp32 weights; the decode GEMV
//     feeds the tensor cores exact bf16 values (fp modes, bf16 weights) or exact integer
//     codes with the affine scale and bias applied per group in fp32. Measured NMSE
//     <= 1.4e-11, worst feature <= 6.4e-11 (H200, 2026-11, full run). x is never rounded
//     (the tensor cores only take bf16 x).
//   kTolMatmulAffineGemm 1e-4, for affine weights on the prefill GEMM (M > 8) only: it
//     rounds each weight to bf16 as T(T(s*q) + b) (mx.dequantize / MLX's CUDA kernels)
//     while the reference keeps fp32 s*q + b. Each rounding is <= 2^-9 relative to s*q or
//     to the sum, and s*q and b largely cancel (b ~ -8 s), so the weight error relative to
//     the weight is larger than 2^-9: measured NMSE 0.95e-5 .. 2.6e-5, worst feature
//     <= 4.6e-5 (H200, 2026-11, every affine GEMM case of this file and the Qwen3-8B
//     shapes; <= 8.9e-5 with the M = 9 cases of PrefillGemmTileEdges, H200, 2026-11-30):
//     ~4x headroom, while any wrong group scale is >= 1e-2 (see below).
//   kTolExpertsAffineGemm 4e-4, for affine experts forced onto the grouped GEMM only: the
//     expert chains three such GEMMs (gate, up, down) through SwiGLU, so the weight roundings
//     add up: measured NMSE 8.2e-5 .. 9.7e-5, worst feature <= 1.7e-4 (H200, 2026-11-30,
//     every case of MoeExpertsGrouped / GroupedExpertsModelShapes), against 1e-4 for one
//     GEMM; 4e-4 keeps the ~4x headroom. Exact formats on the grouped path stay at
//     kTolMatmul (measured <= 4.6e-8).
//   A wrong nibble, scale, row or k-permutation gives NMSE >= 1e-3 on the small shapes and
//   a worst-feature ratio >= 1e-2 on any shape: HarnessCatchesWrongGroupScale checks that a
//   single wrong group scale fails every matmul path.
//   kTolEwF32 1e-9: fp32 norms/rope/swiglu differ only by summation order and the last ulp
//     of expf/sinf/cosf (relative ~3e-7, NMSE ~1e-13).
//   kTolEwBf16 1e-6: those same fp32 differences occasionally move a value across a bf16
//     rounding boundary (probability ~1e-7/2^-8 per element, each flip ~2^-16 relative
//     squared); a missing or extra rounding step gives NMSE ~1e-5.
//   kTolExact 0: Add and the embedding gather are bit-exact by construction; so are the
//     integer results (top-k sets, routed expert ids, argmax), compared element for element.
//   Model ops (attention, MLA, indexer, MoE): fp32 mode 1e-9 (kTolEwF32: summation order,
//     online vs two-pass softmax, expf ulps; ~1e-13 expected); bf16 mode kTolAttnBf16 1e-6
//     for attention / experts / combine (as kTolEwBf16: rare flips of a bf16 rounding); the
//     MLA core chains five rounded intermediates (pe scores, expanded K/V or latent q) where
//     one flipped pe score moves a softmax weight by |s| * 2^-8, so it gets kMlaFactor x 1e-6;
//     a missing rounding step or a wrong mask is >= 1e-4. Sparse prefill rows that run
//     absorbed (MlaAttentionAbsorbsRows) are held to that against the CPU's decode form of
//     each row, and to kTolMlaForms against the expanded form. Router weights are fp32 sigmoid /
//     normalisation (1e-12: ulps of expf); the Qwen3 softmax scores are rounded (1e-6 in bf16).
//     The indexer test feeds values whose dot products are exact in fp32, so its top-k must
//     be identical, not close.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "kernels/cpu/model_ops.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/indexer.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/qgemv.cuh"
#include "kernels/cuda/sampling.cuh"
#include "kernels/dtype.h"
#include "kernels/quant.h"
#include "kernels/status.h"

namespace ring::cuda {
namespace {

constexpr double kTolMatmul = 1e-5;
constexpr double kTolMatmulAffineGemm = 1e-4;
constexpr double kTolExpertsAffineGemm = 4e-4;
constexpr double kWorstRowFactor = 10;
constexpr double kTolEwF32 = 1e-9;
constexpr double kTolEwBf16 = 1e-6;
constexpr double kTolExact = 0.0;
constexpr double kTolAttnBf16 = 1e-6;
constexpr double kMlaFactor = 10;
constexpr double kTolRouteWeights = 1e-12;

bool FullRun() {
  const char* v = std::getenv("RING_GPU_FULL");
  return v != nullptr && std::string(v) == "1";
}

// ---- the table -------------------------------------------------------------------------
struct Row {
  std::string op, shape, mode;
  double nmse, tol;
  bool pass;
  double worst = -1;  // worst-feature ratio, < 0 when not applicable
};
std::vector<Row>& Table() {
  static auto* t = new std::vector<Row>();
  return *t;
}
void PrintRow(const Row& r) {
  const std::string worst = r.worst < 0 ? "" : absl::StrFormat("%.2e", r.worst);
  std::printf("| %-22s | %-26s | %-34s | %10.3e | %9s | %8.1e | %s |\n", r.op.c_str(),
              r.shape.c_str(), r.mode.c_str(), r.nmse, worst.c_str(), r.tol,
              r.pass ? "PASS" : "FAIL");
  std::fflush(stdout);
}

class TableEnvironment : public ::testing::Environment {
 public:
  void TearDown() override {
    if (Table().empty()) return;
    int fails = 0;
    std::printf("\n| %-22s | %-26s | %-34s | %10s | %9s | %8s | %s |\n", "op", "shape", "mode",
                "NMSE", "worst row", "tol", "result");
    for (const Row& r : Table()) {
      PrintRow(r);
      fails += !r.pass;
    }
    std::printf("%zu cases, %d failed\n", Table().size(), fails);
  }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new TableEnvironment);

// RING_QGEMV_VARIANT=N runs every case with decode-GEMV variant N, RING_QGEMV_WK_CAP=C with
// K-split setting C (TEST_SetQgemvTuning), to check a variant or launch shape before making it
// the default.
class QgemvVariantEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* v = std::getenv("RING_QGEMV_VARIANT");
    const char* c = std::getenv("RING_QGEMV_WK_CAP");
    if (v != nullptr || c != nullptr) {
      std::printf("decode GEMV variant %s, K-split setting %s\n", v ? v : "auto", c ? c : "auto");
      TEST_SetQgemvTuning(v ? std::atoi(v) : -1, c ? std::atoi(c) : 0);
    }
  }
};
const auto* const kVariantEnv = ::testing::AddGlobalTestEnvironment(new QgemvVariantEnvironment);

double Nmse(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(got[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  if (den == 0) return num == 0 ? 0 : INFINITY;
  return std::isnan(num) ? INFINITY : num / den;
}

// Worst output feature: outputs are [..., row_len] (weight rows innermost); feature j
// collects elements i with i % row_len == j. Ratio of its squared error to the mean
// feature energy.
double WorstRow(const std::vector<float>& got, const std::vector<float>& ref, int64_t row_len) {
  std::vector<double> err(row_len, 0.0);
  double den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(got[i]) - ref[i];
    err[i % row_len] += std::isnan(d) ? INFINITY : d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  const double mean = den / row_len;
  double worst = 0;
  for (double e : err) worst = std::max(worst, e);
  if (mean == 0) return worst == 0 ? 0 : INFINITY;
  return worst / mean;
}

// Computes the case's metrics and whether it passes (does not record it).
Row Judge(const std::string& op, const std::string& shape, const std::string& mode,
          const std::vector<float>& got, const std::vector<float>& ref, double tol,
          int64_t row_len) {
  Row r{op, shape, mode, INFINITY, tol, false};
  if (got.size() != ref.size()) return r;
  r.nmse = Nmse(got, ref);
  r.pass = r.nmse <= tol;
  if (row_len > 0) {
    r.worst = WorstRow(got, ref, row_len);
    r.pass = r.pass && r.worst <= kWorstRowFactor * tol;
  }
  return r;
}

// row_len: length of the innermost output dimension for matmuls (0: no per-feature check).
void Report(const std::string& op, const std::string& shape, const std::string& mode,
            const std::vector<float>& got, const std::vector<float>& ref, double tol,
            int64_t row_len = 0) {
  ASSERT_EQ(got.size(), ref.size());
  const Row r = Judge(op, shape, mode, got, ref, tol, row_len);
  PrintRow(r);
  Table().push_back(r);
  EXPECT_TRUE(r.pass) << op << " " << shape << " " << mode << ": NMSE " << r.nmse
                      << ", worst feature " << r.worst << ", tol " << tol;
}

// ---- fixtures ------------------------------------------------------------------------------
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<int> n = DeviceCount();
    if (!n.ok() || *n == 0) {
      GTEST_SKIP() << "no CUDA device: " << (n.ok() ? "none visible" : n.status().ToString());
    }
    absl::StatusOr<const DeviceInfo*> dev = CurrentDevice();
    ASSERT_TRUE(dev.ok()) << dev.status();
    dev_ = *dev;
  }
  const DeviceInfo* dev_ = nullptr;
};

std::vector<float> RandomFloats(size_t n, uint32_t seed, float sigma = 1.f, bool bf16 = true) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, sigma);
  std::vector<float> v(n);
  for (auto& f : v) f = bf16 ? RoundBf16(nd(rng)) : nd(rng);
  return v;
}

std::vector<uint16_t> ToBf16Bits(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = FloatToBf16(v[i]);
  return o;
}
std::vector<float> FromBf16Bits(const std::vector<uint16_t>& v) {
  std::vector<float> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = Bf16ToFloat(v[i]);
  return o;
}

// A host weight (what a checkpoint holds) plus its device copy.
struct TestWeight {
  QuantSpec spec;
  DType scale_dtype = DType::kU8;
  DType dense_dtype = DType::kF32;
  int64_t batch = 1, rows = 0, cols = 0;
  std::vector<uint8_t> wbytes, sbytes, bbytes;
  QuantWeight host;
  OwnedDeviceWeight dev;

  std::string Mode() const {
    if (spec.mode == QuantMode::kNone) return absl::StrCat("none/", DTypeName(dense_dtype));
    std::string m = spec.ToString();
    if (spec.mode == QuantMode::kAffine) m += absl::StrCat("/", DTypeName(scale_dtype));
    if (host.global_scale > 0) m += "/gs";
    return m;
  }
  std::string Shape() const {
    return batch > 1 ? absl::StrFormat("%dx%dx%d", batch, rows, cols)
                     : absl::StrFormat("%dx%d", rows, cols);
  }
};

std::unique_ptr<TestWeight> MakeWeight(QuantSpec spec, DType scale_or_dense, int64_t batch,
                                       int64_t rows, int64_t cols, uint32_t seed,
                                       float global_scale = 0.f) {
  auto t = std::make_unique<TestWeight>();
  t->spec = spec;
  t->batch = batch;
  t->rows = rows;
  t->cols = cols;
  const bool dense = spec.mode == QuantMode::kNone;
  if (dense) t->dense_dtype = scale_or_dense;
  t->scale_dtype = dense ? DType::kU8 : scale_or_dense;
  // Generated and quantized in parts of up to 2048 rows on all cores (the 0.5 GB lm_head
  // would take minutes on one); a part's data depends only on (seed, b, part).
  constexpr int64_t kPartRows = 2048;
  const int64_t nparts = (rows + kPartRows - 1) / kPartRows;
  struct Part {
    std::vector<uint8_t> w, s, b;
    absl::Status status;
  };
  std::vector<Part> parts(batch * nparts);
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t i = next++; i < batch * nparts; i = next++) {
      const int64_t b = i / nparts, k = i % nparts;
      const int64_t r0 = k * kPartRows, r1 = std::min(rows, r0 + kPartRows);
      // Weight-like magnitudes, rounded to the model dtype (bf16).
      const std::vector<float> w =
          RandomFloats((r1 - r0) * cols, seed + 17 * b + 1000003 * static_cast<uint32_t>(k), 0.05f);
      Part& part = parts[i];
      if (dense) {
        for (float f : w) {
          if (t->dense_dtype == DType::kF32) {
            const size_t o = part.w.size();
            part.w.resize(o + 4);
            std::memcpy(&part.w[o], &f, 4);
          } else {
            const uint16_t hb = t->dense_dtype == DType::kBF16 ? FloatToBf16(f) : FloatToF16(f);
            part.w.push_back(hb & 0xff);
            part.w.push_back(hb >> 8);
          }
        }
        continue;
      }
      absl::StatusOr<QuantizedBuffers> q =
          Quantize(w.data(), r1 - r0, cols, spec, t->scale_dtype, global_scale);
      if (!q.ok()) {
        part.status = q.status();
        continue;
      }
      const uint8_t* wb = reinterpret_cast<const uint8_t*>(q->weight.data());
      part.w.assign(wb, wb + q->weight.size() * 4);
      part.s = std::move(q->scales);
      part.b = std::move(q->biases);
    }
  };
  std::vector<std::thread> pool;
  const int64_t nthreads = std::min<int64_t>(batch * nparts, std::max(1u, std::thread::hardware_concurrency()));
  for (int64_t i = 0; i < nthreads; ++i) pool.emplace_back(work);
  for (std::thread& th : pool) th.join();
  for (Part& part : parts) {
    EXPECT_TRUE(part.status.ok()) << part.status;
    if (!part.status.ok()) return nullptr;
    t->wbytes.insert(t->wbytes.end(), part.w.begin(), part.w.end());
    t->sbytes.insert(t->sbytes.end(), part.s.begin(), part.s.end());
    t->bbytes.insert(t->bbytes.end(), part.b.begin(), part.b.end());
  }
  QuantWeight& h = t->host;
  h.spec = spec;
  h.name = "test";
  h.global_scale = global_scale;
  Shape lead = batch > 1 ? Shape{batch} : Shape{};
  auto with = [&](std::initializer_list<int64_t> tail) {
    Shape s = lead;
    s.insert(s.end(), tail);
    return s;
  };
  if (dense) {
    h.weight = TensorView{t->dense_dtype, with({rows, cols}), t->wbytes.data()};
  } else {
    h.weight = TensorView{DType::kU32, with({rows, cols * spec.bits / 32}), t->wbytes.data()};
    h.scales = TensorView{t->scale_dtype, with({rows, cols / spec.group_size}), t->sbytes.data()};
    if (spec.mode == QuantMode::kAffine) {
      h.biases = TensorView{t->scale_dtype, with({rows, cols / spec.group_size}), t->bbytes.data()};
    }
  }
  absl::StatusOr<OwnedDeviceWeight> d = UploadQuantWeight(h);
  EXPECT_TRUE(d.ok()) << d.status();
  if (!d.ok()) return nullptr;
  t->dev = *std::move(d);
  return t;
}

// Every format the kernels support, with the scale/element dtype.
struct FormatCase {
  QuantSpec spec;
  DType dtype;
  float global_scale = 0.f;
};
std::vector<FormatCase> AllFormats() {
  std::vector<FormatCase> f;
  f.push_back({{QuantMode::kMxfp4, 4, 32}, DType::kU8});
  f.push_back({{QuantMode::kNvfp4, 4, 16}, DType::kU8});
  f.push_back({{QuantMode::kNvfp4, 4, 16}, DType::kU8, 448.f * 6.f * 0.37f});
  f.push_back({{QuantMode::kMxfp8, 8, 32}, DType::kU8});
  for (DType sd : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (int bits : {2, 3, 4, 5, 6, 8}) {
      for (int g : {32, 64, 128}) f.push_back({{QuantMode::kAffine, bits, g}, sd});
    }
  }
  for (DType d : {DType::kBF16, DType::kF16, DType::kF32}) f.push_back({{QuantMode::kNone, 0, 0}, d});
  return f;
}

// y = x @ W_b^T on the GPU; x given as fp32 values (already bf16-representable when
// x_dtype is BF16).
std::vector<float> GpuMatmulT(const TestWeight& w, const std::vector<float>& x, int64_t m,
                              DType x_dtype, QmmPath path, QMatmulArgs extra = {},
                              int64_t out_rows = -1) {
  const int64_t ny = out_rows >= 0 ? out_rows : m * w.rows;
  absl::StatusOr<DeviceBuffer> dx =
      x_dtype == DType::kBF16 ? DeviceBuffer::FromVector(ToBf16Bits(x)) : DeviceBuffer::FromVector(x);
  EXPECT_TRUE(dx.ok()) << dx.status();
  absl::StatusOr<DeviceBuffer> dy = DeviceBuffer::Allocate(ny * sizeof(float));
  EXPECT_TRUE(dy.ok()) << dy.status();
  if (!dx.ok() || !dy.ok()) return {};
  QMatmulArgs a = extra;
  a.x = dx->data();
  a.x_dtype = x_dtype;
  a.m = m;
  a.y = dy->as<float>();
  a.path = path;
  absl::Status s = QMatmulT(w.dev.view, a, nullptr);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  absl::StatusOr<std::vector<float>> y = dy->ToVector<float>(ny);
  EXPECT_TRUE(y.ok()) << y.status();
  return y.ok() ? *y : std::vector<float>();
}

// Rows [r0, r1) of batch slice b of a host weight, as a 2-D weight of its own.
QuantWeight SliceRows(const QuantWeight& w, int64_t rows, int64_t b, int64_t r0, int64_t r1) {
  QuantWeight s = w;
  auto cut = [&](TensorView& v) {
    if (!v.present()) return;
    const int64_t inner = v.shape.back();
    const int64_t esize = DTypeSize(v.dtype);
    v.data = static_cast<const uint8_t*>(v.data) + ((b * rows + r0) * inner) * esize;
    v.shape = Shape{r1 - r0, inner};
  };
  cut(s.weight);
  cut(s.scales);
  cut(s.biases);
  return s;
}

// The CPU reference, split over weight rows on all cores (the full-size shapes would take
// minutes single-threaded).
std::vector<float> CpuMatmulT(const TestWeight& w, const std::vector<float>& x, int64_t m,
                              int64_t b = 0) {
  std::vector<float> y(m * w.rows);
  const int64_t parts =
      std::min<int64_t>(std::max(1u, std::thread::hardware_concurrency()), (w.rows + 63) / 64);
  if (parts <= 1 || m * w.rows * w.cols < (int64_t{1} << 22)) {
    ring::QMatmulT(x.data(), m, w.host, b, y.data());
    return y;
  }
  std::vector<std::thread> pool;
  const int64_t step = (w.rows + parts - 1) / parts;
  for (int64_t r0 = 0; r0 < w.rows; r0 += step) {
    const int64_t r1 = std::min(w.rows, r0 + step);
    pool.emplace_back([&, r0, r1] {
      const QuantWeight part = SliceRows(w.host, w.rows, b, r0, r1);
      std::vector<float> yp(m * (r1 - r0));
      ring::QMatmulT(x.data(), m, part, 0, yp.data());
      for (int64_t t = 0; t < m; ++t) {
        std::copy(yp.begin() + t * (r1 - r0), yp.begin() + (t + 1) * (r1 - r0),
                  y.begin() + t * w.rows + r0);
      }
    });
  }
  for (std::thread& th : pool) th.join();
  return y;
}

// The kernel QMatmulT runs for these arguments: "gemv", "gemm" or "simt".
std::string KernelOf(const TestWeight& w, QMatmulArgs a) {
  absl::StatusOr<std::string> d = DescribeQmm(w.dev.view, a);
  EXPECT_TRUE(d.ok()) << d.status();
  if (!d.ok()) return "?";
  return d->substr(0, d->find(' '));
}

// Tolerance of a matmul case (see the file comment).
double MatmulTol(const TestWeight& w, const std::string& kernel) {
  return kernel == "gemm" && w.spec.mode == QuantMode::kAffine ? kTolMatmulAffineGemm : kTolMatmul;
}

// ---- tests -------------------------------------------------------------------------------
TEST_F(GpuTest, DeviceReport) {
  std::printf("%s\n%s\n", dev_->ToString().c_str(), MlaKernelForms(*dev_).c_str());
  EXPECT_GT(dev_->sm_count, 0);
  EXPECT_GT(dev_->mem_total, 0);
  EXPECT_FALSE(CompiledArchs().empty());
  // The loaded code must be one of the archs compiled in (or JIT from the newest PTX).
  EXPECT_GT(dev_->code_cc, 0);
}

TEST_F(GpuTest, FastDecodersMatchExactDecodeOnDevice) {
  for (const FormatCase& f : AllFormats()) {
    auto w = MakeWeight(f.spec, f.dtype, 1, 64, 1024, 11, f.global_scale);
    ASSERT_NE(w, nullptr);
    absl::StatusOr<int64_t> bad = TEST_CountFastDecodeMismatches(w->dev.view);
    ASSERT_TRUE(bad.ok()) << bad.status();
    EXPECT_EQ(*bad, 0) << w->Mode();
  }
}

// Every format x {fp32, bf16 x} x {1, 5, 8, 37 rows}, auto path and forced SIMT, on two
// shapes: 72 x 320 (a row tail: 4.5 tiles of 16, and a k tail: 2.5 slices of 128; groups
// of 128 use 384) and 72 x 2944 (23 slices of 128: K split over several warps and several
// load batches per warp in the decode GEMV).
TEST_F(GpuTest, MatmulAllFormats) {
  const int64_t rows = 72;
  uint32_t seed = 100;
  for (const FormatCase& f : AllFormats()) {
    const int64_t g = f.spec.mode == QuantMode::kNone ? 32 : f.spec.group_size;
    for (const int64_t cols : {int64_t{320 % g == 0 ? 320 : 384}, int64_t{2944}}) {
      auto w = MakeWeight(f.spec, f.dtype, 1, rows, cols, ++seed, f.global_scale);
      ASSERT_NE(w, nullptr);
      for (int64_t m : {1, 5, 8, 37}) {
        for (DType xd : {DType::kF32, DType::kBF16}) {
          const std::vector<float> x = RandomFloats(m * cols, seed * 7 + m, 1.f, xd == DType::kBF16);
          const std::vector<float> ref = CpuMatmulT(*w, x, m);
          QMatmulArgs probe;
          probe.x_dtype = xd;
          probe.m = m;
          absl::StatusOr<QmmPath> auto_used = ResolveQmmPath(w->dev.view, probe);
          ASSERT_TRUE(auto_used.ok()) << auto_used.status();
          for (QmmPath path : {QmmPath::kAuto, QmmPath::kSimt}) {
            // Forced SIMT is a separate case only where auto picked the tensor cores.
            if (path == QmmPath::kSimt && *auto_used == QmmPath::kSimt) continue;
            probe.path = path;
            const std::string kernel = KernelOf(*w, probe);
            const std::vector<float> got = GpuMatmulT(*w, x, m, xd, path);
            Report(absl::StrFormat("qmm_t[%s] x=%s", kernel, DTypeName(xd)),
                   absl::StrFormat("M%d %s", m, w->Shape()), w->Mode(), got, ref,
                   MatmulTol(*w, kernel), rows);
          }
        }
      }
    }
  }
}

// Continuous batching (Stage::ForwardBatch) runs the decode steps of several sequences as one
// GEMV of M rows, so what a sequence gets should not depend on what it was batched with: the
// decode GEMV's row j must be the M = 1 result of activation row j. It is, bit for bit,
// between any M whose launches take the same kernel family. The exception, measured here:
// mxfp4 at M <= 2 takes the column-split kernel (QgemvMx4ColKernel, faster at batch 1),
// which sums each 32-element chunk apart and scales it on the accumulators, where M >= 3
// folds the scales into the weights and accumulates in the mma: the same products, summed
// in another grouping (measured on the H200: ~40% of the outputs differ, by <= 2.3e-5
// relative). Those rows must match M = 8 within an NMSE of 1e-10 and one another bit for bit.
TEST_F(GpuTest, DecodeGemvRowDoesNotDependOnM) {
  uint32_t seed = 4100;
  int col_split = 0;
  for (const FormatCase& f : AllFormats()) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1024, 2048}, {4096, 4096}}) {
      auto w = MakeWeight(f.spec, f.dtype, 1, rows, cols, ++seed, f.global_scale);
      ASSERT_NE(w, nullptr);
      const std::vector<float> x = RandomFloats(8 * cols, seed * 7);
      QMatmulArgs probe;
      probe.x_dtype = DType::kBF16;
      probe.m = 8;
      if (KernelOf(*w, probe) != "gemv") continue;
      const std::vector<float> y8 = GpuMatmulT(*w, x, 8, DType::kBF16, QmmPath::kAuto);
      ASSERT_EQ(y8.size(), static_cast<size_t>(8 * rows));
      std::vector<float> y1;
      for (int64_t m : {1, 2, 3, 4}) {
        probe.m = m;
        const absl::StatusOr<std::string> desc = DescribeQmm(w->dev.view, probe);
        ASSERT_TRUE(desc.ok()) << desc.status();
        const std::vector<float> ym =
            GpuMatmulT(*w, std::vector<float>(x.begin(), x.begin() + m * cols), m, DType::kBF16, QmmPath::kAuto);
        ASSERT_EQ(ym.size(), static_cast<size_t>(m * rows));
        const std::string what = absl::StrCat(w->Mode(), " ", w->Shape(), ": M", m, " (", *desc, ") against M8");
        const std::vector<float> y8_rows(y8.begin(), y8.begin() + m * rows);
        if (desc->find(" col-") == std::string::npos) {
          EXPECT_EQ(0, std::memcmp(ym.data(), y8_rows.data(), ym.size() * 4)) << what;
          continue;
        }
        ++col_split;
        double err = 0, ref = 0;
        for (size_t i = 0; i < ym.size(); ++i) {
          err += (static_cast<double>(ym[i]) - y8_rows[i]) * (static_cast<double>(ym[i]) - y8_rows[i]);
          ref += static_cast<double>(y8_rows[i]) * y8_rows[i];
        }
        EXPECT_LE(err / ref, 1e-10) << what;
        if (m == 1) y1 = ym;
        if (m == 2 && !y1.empty()) {
          EXPECT_EQ(0, std::memcmp(ym.data(), y1.data(), y1.size() * 4)) << what << ": row 0 differs from M1's";
        }
      }
    }
  }
  // The column split is where the exception lives: it must have been exercised.
  if (dev_->mma_bf16_subnormals) {
    EXPECT_GT(col_split, 0);
  }
}

// Several weights on one x in one decode-GEMV launch (QMatmulTMany): q/k/v-like row counts
// with row tails (200, 72, 40, 16 rows), every format, m = 1, 2, 5, 8; each output against
// its own weight's reference, so a block working on the wrong part, or writing another
// part's rows, fails. 5 weights run as 4 + 1; weights of different widths as separate
// launches; m = 9 (no decode GEMV) as one QMatmulT each.
// Programmatic dependent launch (kernels/cuda/launch.cuh): a decode GEMV launched with
// overlap right behind a kernel that lets it start early and only then writes x must still
// read the new x. Each round fills x with NaN bits, then a slow copy (TEST_SlowCopy: starts
// its dependents at once, spins, then writes x) and the GEMV; its output must equal, bit for
// bit, the same GEMV on x launched plainly. (The GEMV once read x with non-coherent loads
// that the compiler issued before its dependency wait: it returned NaN here.)
TEST_F(GpuTest, PdlGemvWaitsForItsProducer) {
  if (dev_->code_cc < 90) GTEST_SKIP() << "programmatic dependent launch needs sm_90";
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const std::unique_ptr<CUstream_st, cudaError_t (*)(cudaStream_t)> owned(stream,
                                                                           cudaStreamDestroy);
  uint32_t seed = 2100;
  int gemv_cases = 0;
  int restore = -1, cap = 0;
  if (const char* v = std::getenv("RING_QGEMV_VARIANT")) restore = std::atoi(v);
  if (const char* c = std::getenv("RING_QGEMV_WK_CAP")) cap = std::atoi(c);
  // The automatic choice for every format, then the staged-x column splits forced (variants
  // 4 and 6: x goes to shared memory after the wait) for mxfp4 and 4-bit affine.
  for (const int variant : {-1, 4, 6}) {
    for (const FormatCase& f : AllFormats()) {
      const bool col_format = f.spec.mode == QuantMode::kMxfp4 ||
                              (f.spec.mode == QuantMode::kAffine && f.spec.bits == 4 && f.dtype != DType::kF32);
      if (variant >= 0 && !col_format) continue;
      TEST_SetQgemvTuning(variant, cap);
      const int64_t cols = 2048, rows = 1024;
      auto w = MakeWeight(f.spec, f.dtype, 1, rows, cols, ++seed, f.global_scale);
      ASSERT_NE(w, nullptr);
      for (int64_t m : {1, 2, 8}) {
        const std::vector<uint16_t> xb = ToBf16Bits(RandomFloats(m * cols, seed * 3 + m));
        absl::StatusOr<DeviceBuffer> src = DeviceBuffer::FromVector(xb);
        absl::StatusOr<DeviceBuffer> x = DeviceBuffer::Allocate(xb.size() * 2);
        absl::StatusOr<DeviceBuffer> want = DeviceBuffer::Allocate(m * rows * sizeof(float));
        absl::StatusOr<DeviceBuffer> got = DeviceBuffer::Allocate(m * rows * sizeof(float));
        ASSERT_TRUE(src.ok() && x.ok() && want.ok() && got.ok());
        QMatmulArgs a;
        a.x = src->data();
        a.x_dtype = DType::kBF16;
        a.m = m;
        a.y = want->as<float>();
        if (KernelOf(*w, a) != "gemv") continue;  // the overlap is the decode GEMV's
        ++gemv_cases;
        ASSERT_TRUE(QMatmulT(w->dev.view, a, stream).ok());
        for (int overlap : {1, 2}) {
          for (int round = 0; round < 3; ++round) {
            ASSERT_EQ(cudaMemsetAsync(x->data(), 0xff, xb.size() * 2, stream), cudaSuccess);
            ASSERT_TRUE(
                TEST_SlowCopy(src->data(), x->data(), static_cast<int64_t>(xb.size() / 2), 200000, stream)
                    .ok());
            QMatmulArgs b = a;
            b.x = x->data();
            b.y = got->as<float>();
            b.overlap = overlap;
            ASSERT_TRUE(QMatmulT(w->dev.view, b, stream).ok());
            ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
            absl::StatusOr<std::vector<float>> g = got->ToVector<float>(m * rows);
            absl::StatusOr<std::vector<float>> r = want->ToVector<float>(m * rows);
            ASSERT_TRUE(g.ok() && r.ok());
            EXPECT_EQ(0, std::memcmp(g->data(), r->data(), g->size() * sizeof(float)))
                << w->Mode() << " M" << m << " variant " << variant << " overlap " << overlap << " round "
                << round;
          }
        }
      }
    }
  }
  TEST_SetQgemvTuning(restore, cap);
  EXPECT_GT(gemv_cases, 0) << "no format took the decode GEMV: nothing was tested";
}

// CopyBytes into device memory and into mapped pinned host memory, at aligned and unaligned
// addresses and lengths, behind a slow producer of its source (TEST_SlowCopy lets its
// dependents start at once and writes only after spinning): every byte must be the new one.
TEST_F(GpuTest, CopyBytesWaitsForItsProducerAndReachesMappedHost) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const std::unique_ptr<CUstream_st, cudaError_t (*)(cudaStream_t)> owned(stream, cudaStreamDestroy);
  constexpr int64_t kMax = 70016;
  void* host = nullptr;
  ASSERT_EQ(cudaHostAlloc(&host, kMax + 16, cudaHostAllocMapped), cudaSuccess);
  const std::unique_ptr<void, cudaError_t (*)(void*)> host_owned(host, cudaFreeHost);
  void* host_dev = nullptr;
  ASSERT_EQ(cudaHostGetDevicePointer(&host_dev, host, 0), cudaSuccess);
  std::mt19937 rng(77);
  std::vector<uint32_t> words((kMax + 16) / 4);
  for (uint32_t& w : words) w = rng();
  absl::StatusOr<DeviceBuffer> fresh = DeviceBuffer::FromVector(words);
  absl::StatusOr<DeviceBuffer> src = DeviceBuffer::Allocate(words.size() * 4);
  absl::StatusOr<DeviceBuffer> dst = DeviceBuffer::Allocate(words.size() * 4);
  ASSERT_TRUE(fresh.ok() && src.ok() && dst.ok());
  const auto* want = reinterpret_cast<const unsigned char*>(words.data());
  for (int64_t bytes : {int64_t{16}, int64_t{4096}, int64_t{4100}, kMax}) {
    for (int64_t shift : {0, 1}) {
      for (bool to_host : {false, true}) {
        ASSERT_EQ(cudaMemsetAsync(src->data(), 0, words.size() * 4, stream), cudaSuccess);
        ASSERT_TRUE(TEST_SlowCopy(fresh->data(), src->data(), static_cast<int64_t>(words.size()), 100000,
                                  stream)
                        .ok());
        char* out = static_cast<char*>(to_host ? host_dev : dst->data()) + shift;
        ASSERT_TRUE(CopyBytes(static_cast<const char*>(src->data()) + shift, out, bytes, stream).ok());
        std::vector<unsigned char> got(bytes);
        if (to_host) {
          ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
          std::memcpy(got.data(), static_cast<char*>(host) + shift, bytes);
        } else {
          ASSERT_EQ(cudaMemcpyAsync(got.data(), out, bytes, cudaMemcpyDeviceToHost, stream), cudaSuccess);
          ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        }
        EXPECT_EQ(0, std::memcmp(got.data(), want + shift, bytes))
            << bytes << " bytes at +" << shift << (to_host ? " to mapped host memory" : " on the device");
      }
    }
  }
}

TEST_F(GpuTest, MatmulManySharedX) {
  uint32_t seed = 1500;
  for (const FormatCase& f : AllFormats()) {
    const int64_t g = f.spec.mode == QuantMode::kNone ? 32 : f.spec.group_size;
    const int64_t cols = 2944 % g == 0 ? 2944 : 3072;
    std::vector<std::unique_ptr<TestWeight>> ws;
    for (int64_t rows : {200, 72, 40, 16, 24}) {
      ws.push_back(MakeWeight(f.spec, f.dtype, 1, rows, cols, ++seed, f.global_scale));
      ASSERT_NE(ws.back(), nullptr);
    }
    for (size_t n : {size_t{3}, size_t{5}}) {
      std::vector<const DeviceQuantWeight*> dw;
      for (size_t i = 0; i < n; ++i) dw.push_back(&ws[i]->dev.view);
      for (int64_t m : {1, 2, 5, 8, 9}) {
        const std::vector<float> x = RandomFloats(m * cols, seed * 7 + m);
        absl::StatusOr<DeviceBuffer> dx = DeviceBuffer::FromVector(ToBf16Bits(x));
        ASSERT_TRUE(dx.ok()) << dx.status();
        std::vector<DeviceBuffer> dy;
        std::vector<float*> ys;
        for (size_t i = 0; i < n; ++i) {
          absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(m * ws[i]->rows * sizeof(float));
          ASSERT_TRUE(b.ok()) << b.status();
          dy.push_back(*std::move(b));
          ys.push_back(dy.back().as<float>());
        }
        QMatmulArgs a;
        a.x = dx->data();
        a.x_dtype = DType::kBF16;
        a.m = m;
        const size_t first = std::min<size_t>(n, 4);
        absl::StatusOr<std::string> desc =
            DescribeQmmMany(absl::MakeConstSpan(dw).subspan(0, first), a);
        ASSERT_TRUE(desc.ok()) << desc.status();
        QMatmulArgs one = a;
        one.y = ys[0];
        const bool gemv = KernelOf(*ws[0], one) == "gemv";
        EXPECT_EQ(desc->find(absl::StrFormat("parts%d", first)) != std::string::npos, gemv) << *desc;
        absl::Status st = QMatmulTMany(dw, ys, a, nullptr);
        ASSERT_TRUE(st.ok()) << st;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        for (size_t i = 0; i < n; ++i) {
          absl::StatusOr<std::vector<float>> got = dy[i].ToVector<float>(m * ws[i]->rows);
          ASSERT_TRUE(got.ok()) << got.status();
          QMatmulArgs pi = a;
          pi.y = ys[i];
          const std::string kernel = KernelOf(*ws[i], pi);
          Report(absl::StrFormat("qmm_many[%s] part %d/%d", gemv ? "gemv" : kernel, i + 1, n),
                 absl::StrFormat("M%d %s", m, ws[i]->Shape()), ws[i]->Mode(), *got,
                 CpuMatmulT(*ws[i], x, m), MatmulTol(*ws[i], kernel), ws[i]->rows);
        }
      }
    }
  }
  // Different widths never share a launch.
  const QuantSpec mx{QuantMode::kMxfp4, 4, 32};
  auto a1 = MakeWeight(mx, DType::kU8, 1, 64, 256, 1601);
  auto a2 = MakeWeight(mx, DType::kU8, 1, 64, 512, 1602);
  ASSERT_TRUE(a1 && a2);
  const DeviceQuantWeight* pair[] = {&a1->dev.view, &a2->dev.view};
  QMatmulArgs a;
  a.x_dtype = DType::kBF16;
  a.m = 1;
  absl::StatusOr<std::string> desc = DescribeQmmMany(pair, a);
  ASSERT_TRUE(desc.ok()) << desc.status();
  EXPECT_EQ(*desc, "separate: 2 launches");
}

// The device probe behind the automatic variant-4 choice: Hopper's bf16 MMA keeps subnormal
// inputs (checked on the H200); on other GPUs the probe decides and the harness below checks
// whichever kernels it lets run.
TEST_F(GpuTest, MmaSubnormalProbe) {
  if (dev_->cc == 90) {
    EXPECT_TRUE(dev_->mma_bf16_subnormals) << dev_->ToString();
  }
  if (dev_->cc < 80) {
    EXPECT_FALSE(dev_->mma_bf16_subnormals) << dev_->ToString();
  }
}

// The column-split mxfp4 decode GEMV (TEST_SetQgemvTuning variants 2, 3 and 4,
// qgemv_gemv.cu QgemvMx4ColKernel: group scale applied in fp32 on the mma accumulators;
// variants 2 and 4 feed the mma bf16-subnormal-encoded E2M1 values against x * 2^64, 4
// with x staged in shared memory). Forced here so that the default run checks it: row and
// K tails (72 x 320), K split over warps and batches (72 x 2944), a lm_head-like width
// (264 x 6144), 40 x 12352 (K tail; variant 4 at m = 2 needs more than 48 KB of shared
// memory), m = 1 and 2 (m = 3 must fall back to another kernel), bf16 x; then scales that
// leave the fast path (u > 192: the two-multiply batches) or are tiny (u = 7, 1, 0), and one
// doubled group scale that must fail.
TEST_F(GpuTest, Mxfp4ColumnSplitGemvVariants) {
  const QuantSpec spec{QuantMode::kMxfp4, 4, 32};
  struct Dims {
    int64_t rows, cols;
  };
  int restore = -1, cap = 0;
  if (const char* v = std::getenv("RING_QGEMV_VARIANT")) restore = std::atoi(v);
  if (const char* c = std::getenv("RING_QGEMV_WK_CAP")) cap = std::atoi(c);
  for (int variant : {2, 3, 4, 5, 6}) {
    TEST_SetQgemvTuning(variant, cap);
    uint32_t seed = 700 + 10 * variant;
    for (const Dims d : {Dims{72, 320}, Dims{72, 2944}, Dims{264, 6144}, Dims{40, 12352}}) {
      auto w = MakeWeight(spec, DType::kU8, 1, d.rows, d.cols, ++seed);
      ASSERT_NE(w, nullptr);
      // Scale edits (host copy = the reference's, then re-uploaded): none; 16 huge scales
      // (u = 193, 200, 230: weights up to 6 * 2^103, outputs still finite); 16 tiny ones
      // (u = 7, 1, 0).
      for (int edit = 0; edit < 3; ++edit) {
        if (edit > 0) {
          std::mt19937 rng(seed * 31 + edit);
          const uint8_t vals[2][3] = {{200, 230, 193}, {7, 1, 0}};
          for (int i = 0; i < 16; ++i) {
            w->sbytes[rng() % w->sbytes.size()] = vals[edit - 1][i % 3];
          }
          ASSERT_EQ(cudaMemcpy(const_cast<void*>(w->dev.view.scales), w->sbytes.data(),
                               w->sbytes.size(), cudaMemcpyHostToDevice),
                    cudaSuccess);
        }
        for (int64_t m : {1, 2, 3}) {
          {  // bf16 x only: fp32 x never reaches the decode GEMV
            const DType xd = DType::kBF16;
            const std::vector<float> x = RandomFloats(m * d.cols, seed * 7 + m + 100 * edit);
            const std::vector<float> ref = CpuMatmulT(*w, x, m);
            QMatmulArgs probe;
            probe.x_dtype = xd;
            probe.m = m;
            absl::StatusOr<std::string> desc = DescribeQmm(w->dev.view, probe);
            ASSERT_TRUE(desc.ok()) << desc.status();
            const bool col = desc->find(" col-") != std::string::npos;
            if (KernelOf(*w, probe) == "gemv") {
              EXPECT_EQ(col, m <= 2 && (variant == 3 || dev_->mma_bf16_subnormals)) << *desc;
            }
            const std::vector<float> got = GpuMatmulT(*w, x, m, xd, QmmPath::kAuto);
            Report(absl::StrFormat("qmm_t[%s] x=%s v%d%s", KernelOf(*w, probe), DTypeName(xd),
                                   variant, col ? " col" : ""),
                   absl::StrFormat("M%d %s%s", m, w->Shape(),
                                   edit == 1 ? " huge-s" : (edit == 2 ? " tiny-s" : "")),
                   w->Mode(), got, ref, kTolMatmul, d.rows);
          }
        }
      }
    }
    // One doubled group scale (device copy only) must fail the case.
    auto w = MakeWeight(spec, DType::kU8, 1, 72, 384, 990 + variant);
    ASSERT_NE(w, nullptr);
    const std::vector<float> x = RandomFloats(384, 991 + variant);
    const std::vector<float> ref = CpuMatmulT(*w, x, 1);
    std::vector<uint8_t> scales = w->sbytes;
    scales[37 * (384 / 32) + 2] = static_cast<uint8_t>(scales[37 * (384 / 32) + 2] + 1);
    ASSERT_EQ(cudaMemcpy(const_cast<void*>(w->dev.view.scales), scales.data(), scales.size(),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    const std::vector<float> got = GpuMatmulT(*w, x, 1, DType::kBF16, QmmPath::kAuto);
    EXPECT_GT(Nmse(got, ref), kTolMatmul) << "variant " << variant << ": a wrong group scale went unnoticed";
  }
  // The automatic choice: a tall matrix with short rows takes variant 4 at m <= 2 where the
  // MMA keeps subnormals (24576 x 544: a K tail; 24576 x 8192: the widest row it takes).
  TEST_SetQgemvTuning(-1, cap);
  for (const Dims d : {Dims{24576, 544}, Dims{24576, 8192}}) {
    auto w = MakeWeight(spec, DType::kU8, 1, d.rows, d.cols, 1200 + static_cast<uint32_t>(d.cols));
    ASSERT_NE(w, nullptr);
    for (int64_t m : {1, 2, 3}) {
      const std::vector<float> x = RandomFloats(m * d.cols, 1300 + static_cast<uint32_t>(m));
      QMatmulArgs probe;
      probe.x_dtype = DType::kBF16;
      probe.m = m;
      absl::StatusOr<std::string> desc = DescribeQmm(w->dev.view, probe);
      ASSERT_TRUE(desc.ok()) << desc.status();
      const bool smx = desc->find(" col-sub-smx") != std::string::npos;
      EXPECT_EQ(smx, m <= 2 && dev_->mma_bf16_subnormals) << *desc;
      Report(absl::StrFormat("qmm_t[%s] x=BF16 auto%s", KernelOf(*w, probe), smx ? " col" : ""),
             absl::StrFormat("M%d %s", m, w->Shape()), w->Mode(),
             GpuMatmulT(*w, x, m, DType::kBF16, QmmPath::kAuto), CpuMatmulT(*w, x, m), kTolMatmul, d.rows);
    }
  }
  TEST_SetQgemvTuning(restore, cap);
}

// The column-split mxfp4 kernels with x from global memory (variant 5) and staged in shared
// memory (variant 6) sum alike: the same bits at m = 1 and 2 (row and K tails, a K split,
// huge scales). AutoVariant relies on it to stage x for one row but not for two on tall
// matrices: a two-row batch still gets each row's bits alone (checked on such a matrix).
TEST_F(GpuTest, Mxfp4StagedColumnSplitMatchesUnstaged) {
  if (!dev_->mma_bf16_subnormals) GTEST_SKIP() << "no subnormal-operand column split on this device";
  const QuantSpec spec{QuantMode::kMxfp4, 4, 32};
  int restore = -1, cap = 0;
  if (const char* v = std::getenv("RING_QGEMV_VARIANT")) restore = std::atoi(v);
  if (const char* c = std::getenv("RING_QGEMV_WK_CAP")) cap = std::atoi(c);
  uint32_t seed = 7300;
  struct Dims {
    int64_t rows, cols;
  };
  for (const Dims d : {Dims{72, 320}, Dims{72, 2944}, Dims{264, 6144}, Dims{40, 12352}}) {
    auto w = MakeWeight(spec, DType::kU8, 1, d.rows, d.cols, ++seed);
    ASSERT_NE(w, nullptr);
    for (int i = 0; i < 8; ++i) w->sbytes[(seed * 13 + 97 * i) % w->sbytes.size()] = 200;  // huge scales
    ASSERT_EQ(cudaMemcpy(const_cast<void*>(w->dev.view.scales), w->sbytes.data(), w->sbytes.size(),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    for (int64_t m : {1, 2}) {
      const std::vector<float> x = RandomFloats(m * d.cols, seed * 3 + m);
      TEST_SetQgemvTuning(5, cap);
      const std::vector<float> plain = GpuMatmulT(*w, x, m, DType::kBF16, QmmPath::kAuto);
      TEST_SetQgemvTuning(6, cap);
      const std::vector<float> staged = GpuMatmulT(*w, x, m, DType::kBF16, QmmPath::kAuto);
      ASSERT_EQ(plain.size(), staged.size());
      EXPECT_EQ(0, std::memcmp(plain.data(), staged.data(), plain.size() * 4))
          << w->Shape() << " M" << m << ": staged x sums differently";
    }
  }
  TEST_SetQgemvTuning(-1, cap);
  auto w = MakeWeight(spec, DType::kU8, 1, 6144, 2048, ++seed);
  ASSERT_NE(w, nullptr);
  const std::vector<float> x = RandomFloats(2 * 2048, seed);
  const std::vector<float> both = GpuMatmulT(*w, x, 2, DType::kBF16, QmmPath::kAuto);
  for (int64_t r : {0, 1}) {
    const std::vector<float> xr(x.begin() + r * 2048, x.begin() + (r + 1) * 2048);
    const std::vector<float> alone = GpuMatmulT(*w, xr, 1, DType::kBF16, QmmPath::kAuto);
    ASSERT_EQ(alone.size(), size_t{6144});
    EXPECT_EQ(0, std::memcmp(alone.data(), both.data() + r * 6144, alone.size() * 4))
        << "row " << r << " of a two-row batch differs from the row alone";
  }
  TEST_SetQgemvTuning(restore, cap);
}

// The column-split 4-bit affine decode GEMV (qgemv_gemv.cu ColAffine4: s and b applied per
// 32-element chunk on the mma accumulators, the chunks' sums of x staged in shared memory),
// forced (variants 4: 32 rows a warp, 6: 16 rows) on a row tail (72 x 384), a K tail of
// half a step (72 x 2880, 40 x 12352: 90 and 386 chunks), several batches and a K split
// (72 x 2944), a wide row (264 x 6144) and a long one (40 x 12288),
// groups 32 / 64 / 128 with bf16 scales and 64 with fp16 ones, m = 1, 2 (column split) and
// 3 (another kernel), against the CPU; each row of a two-row batch equals the row alone bit
// for bit; then one wrong bias that must fail.
TEST_F(GpuTest, AffineColumnSplitGemvVariants) {
  struct Dims {
    int64_t rows, cols;
  };
  int restore = -1, cap = 0;
  if (const char* v = std::getenv("RING_QGEMV_VARIANT")) restore = std::atoi(v);
  if (const char* c = std::getenv("RING_QGEMV_WK_CAP")) cap = std::atoi(c);
  const FormatCase formats[] = {{{QuantMode::kAffine, 4, 32}, DType::kBF16},
                                {{QuantMode::kAffine, 4, 64}, DType::kBF16},
                                {{QuantMode::kAffine, 4, 128}, DType::kBF16},
                                {{QuantMode::kAffine, 4, 64}, DType::kF16}};
  int col_cases = 0;
  for (int variant : {4, 6}) {
    TEST_SetQgemvTuning(variant, cap);
    uint32_t seed = 5100 + 100 * variant;
    for (const FormatCase& f : formats) {
      for (const Dims d : {Dims{72, 384}, Dims{72, 2880}, Dims{72, 2944}, Dims{264, 6144}, Dims{40, 12288},
                           Dims{40, 12352}}) {
        if (d.cols % f.spec.group_size != 0) continue;
        auto w = MakeWeight(f.spec, f.dtype, 1, d.rows, d.cols, ++seed);
        ASSERT_NE(w, nullptr);
        for (int64_t m : {1, 2, 3}) {
          const std::vector<float> x = RandomFloats(m * d.cols, seed * 5 + m);
          QMatmulArgs probe;
          probe.x_dtype = DType::kBF16;
          probe.m = m;
          const absl::StatusOr<std::string> desc = DescribeQmm(w->dev.view, probe);
          ASSERT_TRUE(desc.ok()) << desc.status();
          const bool col = desc->find(" col-aff-smx") != std::string::npos;
          if (KernelOf(*w, probe) == "gemv") {
            EXPECT_EQ(col, m <= 2) << *desc;
          }
          col_cases += col;
          const std::vector<float> got = GpuMatmulT(*w, x, m, DType::kBF16, QmmPath::kAuto);
          Report(absl::StrFormat("qmm_t[%s] x=BF16 v%d%s", KernelOf(*w, probe), variant, col ? " col" : ""),
                 absl::StrFormat("M%d %s", m, w->Shape()), w->Mode(), got, CpuMatmulT(*w, x, m), kTolMatmul,
                 d.rows);
          // Two rows sum as each does alone (the batch-invariant decode of 1-2 sequences).
          if (col && m == 2) {
            for (int64_t r : {0, 1}) {
              const std::vector<float> xr(x.begin() + r * d.cols, x.begin() + (r + 1) * d.cols);
              const std::vector<float> alone = GpuMatmulT(*w, xr, 1, DType::kBF16, QmmPath::kAuto);
              ASSERT_EQ(alone.size(), static_cast<size_t>(d.rows));
              EXPECT_EQ(0, std::memcmp(alone.data(), got.data() + r * d.rows, alone.size() * 4))
                  << "v" << variant << " " << w->Mode() << " " << w->Shape() << " row " << r
                  << ": batched differs from alone";
            }
          }
        }
      }
    }
    // One bias moved by 1 (device copy only) must fail.
    auto w = MakeWeight(formats[1].spec, formats[1].dtype, 1, 72, 384, 1990 + variant);
    ASSERT_NE(w, nullptr);
    const std::vector<float> x = RandomFloats(384, 1991 + variant);
    const std::vector<float> ref = CpuMatmulT(*w, x, 1);
    std::vector<uint8_t> biases = w->bbytes;
    const size_t at = 2 * (37 * (384 / 64) + 2);  // row 37, group 2 (bf16 bytes)
    uint16_t b16 = 0;
    std::memcpy(&b16, biases.data() + at, 2);
    b16 = static_cast<uint16_t>(FloatToBf16(Bf16ToFloat(b16) + 1.f));
    std::memcpy(biases.data() + at, &b16, 2);
    ASSERT_EQ(cudaMemcpy(const_cast<void*>(w->dev.view.biases), biases.data(), biases.size(),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    const std::vector<float> got = GpuMatmulT(*w, x, 1, DType::kBF16, QmmPath::kAuto);
    EXPECT_GT(Nmse(got, ref), kTolMatmul) << "variant " << variant << ": a wrong group bias went unnoticed";
  }
  TEST_SetQgemvTuning(restore, cap);
  EXPECT_GT(col_cases, 0);
}

// Decode GEMVs of few row tiles split each tile's K over a cluster of blocks (sm_90+,
// qgemv_gemv.cu ClusterKReduce): a MoE router (GLM-5.2's 256 x 6144 bf16 gate, Qwen3-MoE's
// 128 x 2048), a small affine and an mxfp8 matrix, m = 1, 2, 8, against the CPU; the path is
// the cluster one where the device has clusters (each shape has K steps enough for at least
// two blocks a tile), and two runs give the same bits.
TEST_F(GpuTest, FewTileGemvClusterK) {
  struct C {
    FormatCase f;
    int64_t rows, cols;
  };
  uint32_t seed = 1900;
  for (const C& c : {C{{{QuantMode::kNone, 0, 0}, DType::kBF16}, 256, 6144},
                     C{{{QuantMode::kNone, 0, 0}, DType::kBF16}, 128, 2048},
                     C{{{QuantMode::kAffine, 4, 64}, DType::kBF16}, 200, 4096},
                     C{{{QuantMode::kMxfp8, 8, 32}, DType::kU8}, 64, 4096}}) {
    auto w = MakeWeight(c.f.spec, c.f.dtype, 1, c.rows, c.cols, ++seed);
    ASSERT_NE(w, nullptr);
    for (int64_t m : {1, 2, 8}) {
      const std::vector<float> x = RandomFloats(m * c.cols, ++seed);
      QMatmulArgs probe;
      probe.x_dtype = DType::kBF16;
      probe.m = m;
      absl::StatusOr<std::string> desc = DescribeQmm(w->dev.view, probe);
      ASSERT_TRUE(desc.ok()) << desc.status();
      const bool gemv = KernelOf(*w, probe) == "gemv";
      const bool cluster = desc->find("cluster-k") != std::string::npos;
      if (gemv && dev_->code_cc >= 90 && desc->find(" col-") == std::string::npos) {
        EXPECT_TRUE(cluster) << *desc;
      }
      const std::vector<float> got = GpuMatmulT(*w, x, m, DType::kBF16, QmmPath::kAuto);
      const std::vector<float> again = GpuMatmulT(*w, x, m, DType::kBF16, QmmPath::kAuto);
      EXPECT_EQ(0, std::memcmp(got.data(), again.data(), got.size() * 4)) << *desc << ": runs differ";
      Report(absl::StrFormat("qmm_t[%s]%s", KernelOf(*w, probe), cluster ? " cluster-k" : ""),
             absl::StrFormat("M%d %s", m, w->Shape()), w->Mode(), got, CpuMatmulT(*w, x, m),
             kTolMatmul, c.rows);
    }
  }
}

// The harness must fail a kernel that gets one group's scale wrong: for each matmul kernel
// (decode GEMV, prefill GEMM, SIMT) and a few formats, doubling a single group scale in the
// device copy (the reference keeps the right one) must exceed the case's tolerance.
TEST_F(GpuTest, HarnessCatchesWrongGroupScale) {
  const int64_t rows = 72, cols = 384, bad_row = 37, bad_group = 2;
  struct Case {
    FormatCase f;
    int64_t m;
    DType xd;
    QmmPath path;
  };
  const FormatCase mx{{QuantMode::kMxfp4, 4, 32}, DType::kU8};
  const FormatCase a4{{QuantMode::kAffine, 4, 64}, DType::kBF16};
  const FormatCase a3{{QuantMode::kAffine, 3, 32}, DType::kBF16};
  for (const Case& c : {Case{mx, 1, DType::kBF16, QmmPath::kAuto}, Case{mx, 8, DType::kBF16, QmmPath::kAuto},
                        Case{mx, 37, DType::kBF16, QmmPath::kAuto}, Case{mx, 5, DType::kF32, QmmPath::kAuto},
                        Case{a4, 1, DType::kBF16, QmmPath::kAuto}, Case{a4, 8, DType::kBF16, QmmPath::kAuto},
                        Case{a4, 37, DType::kBF16, QmmPath::kAuto}, Case{a4, 5, DType::kF32, QmmPath::kAuto},
                        Case{a3, 1, DType::kBF16, QmmPath::kAuto}, Case{a3, 37, DType::kBF16, QmmPath::kAuto}}) {
    auto w = MakeWeight(c.f.spec, c.f.dtype, 1, rows, cols, 900 + c.m);
    ASSERT_NE(w, nullptr);
    const std::vector<float> x = RandomFloats(c.m * cols, 901 + c.m, 1.f, c.xd == DType::kBF16);
    const std::vector<float> ref = CpuMatmulT(*w, x, c.m);
    QMatmulArgs probe;
    probe.x_dtype = c.xd;
    probe.m = c.m;
    probe.path = c.path;
    const std::string kernel = KernelOf(*w, probe);
    const double tol = MatmulTol(*w, kernel);
    const std::string op = absl::StrFormat("qmm_t[%s] x=%s", kernel, DTypeName(c.xd));
    const std::string shape = absl::StrFormat("M%d %s", c.m, w->Shape());
    // Sanity: the intact weight passes.
    Report(op, shape, w->Mode(), GpuMatmulT(*w, x, c.m, c.xd, c.path), ref, tol, rows);
    // Double the scale of group bad_group of row bad_row (E8M0: +1; bf16: exponent + 1).
    const int64_t groups = cols / c.f.spec.group_size;
    const int64_t gi = bad_row * groups + bad_group;
    std::vector<uint8_t> scales = w->sbytes;
    if (c.f.spec.mode == QuantMode::kAffine) {
      uint16_t v;
      std::memcpy(&v, &scales[2 * gi], 2);
      v = static_cast<uint16_t>(v + 0x0080);
      std::memcpy(&scales[2 * gi], &v, 2);
    } else {
      scales[gi] = static_cast<uint8_t>(scales[gi] + 1);
    }
    ASSERT_EQ(cudaMemcpy(const_cast<void*>(w->dev.view.scales), scales.data(), scales.size(),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    const std::vector<float> got = GpuMatmulT(*w, x, c.m, c.xd, c.path);
    const Row r = Judge("neg: " + op, shape, w->Mode() + " 1 group x2", got, ref, tol, rows);
    // Recorded as PASS when the harness rejects the corrupted weight.
    Row shown = r;
    shown.pass = !r.pass;
    PrintRow(shown);
    Table().push_back(shown);
    EXPECT_FALSE(r.pass) << "a wrong group scale went unnoticed: " << op << " " << shape << " "
                         << w->Mode() << " NMSE " << r.nmse << " worst " << r.worst;
  }
}

// The prefill GEMM's tile edges, for each of its tile configurations (TEST_SetGemmTile) and
// the automatic choice: rows not a multiple of any tile (200, 576 = 4.5 x 128, 2.25 x 256),
// K tails (544 = 4 stages of 128 + one chunk, 576 for groups of 64; 160 = 1 stage + 1
// chunk), M not a multiple of
// the token tile (9, 65, 130), and stacked experts with ids (repeats and one bad id).
TEST_F(GpuTest, PrefillGemmTileEdges) {
  struct Fmt {
    FormatCase f;
    bool all_shapes;  // else only the first shape (the generic decoders)
  };
  const Fmt fmts[] = {{{{QuantMode::kMxfp4, 4, 32}, DType::kU8}, true},
                      {{{QuantMode::kAffine, 4, 64}, DType::kBF16}, true},
                      {{{QuantMode::kNvfp4, 4, 16}, DType::kU8}, false},
                      {{{QuantMode::kMxfp8, 8, 32}, DType::kU8}, false},
                      {{{QuantMode::kAffine, 3, 32}, DType::kBF16}, false},
                      {{{QuantMode::kAffine, 6, 128}, DType::kBF16}, false},
                      {{{QuantMode::kNone, 0, 0}, DType::kBF16}, false}};
  struct Sh {
    int64_t rows, cols;
  };
  const Sh shapes[] = {{200, 544}, {576, 160}, {64, 1024}};
  uint32_t seed = 700;
  // Every tile on each MMA family the device has: wgmma (sm_90a builds on Hopper) and
  // mma.sync.
  std::vector<std::pair<int, bool>> configs;
  for (bool wg : {true, false}) {
    if (wg && !dev_->wgmma) continue;
    for (int tile : {-1, 0, 1, 2}) configs.push_back({tile, wg});
  }
  for (const auto& [tile, wg] : configs) {
    TEST_SetGemmTile(tile, wg);
    for (const Fmt& fm : fmts) {
      for (const Sh& sh : shapes) {
        if (!fm.all_shapes && sh.rows != shapes[0].rows) continue;
        const int64_t g = fm.f.spec.mode == QuantMode::kNone ? 32 : fm.f.spec.group_size;
        const int64_t cols = sh.cols % g == 0 ? sh.cols : (sh.cols / g + 1) * g;
        auto w = MakeWeight(fm.f.spec, fm.f.dtype, 1, sh.rows, cols, ++seed);
        ASSERT_NE(w, nullptr);
        for (int64_t m : {9, 65, 130}) {
          const std::vector<float> x = RandomFloats(m * cols, seed * 3 + m);
          QMatmulArgs probe;
          probe.x_dtype = DType::kBF16;
          probe.m = m;
          const std::string kernel = KernelOf(*w, probe);
          EXPECT_EQ(kernel, "gemm") << w->Mode();
          absl::StatusOr<std::string> desc = DescribeQmm(w->dev.view, probe);
          ASSERT_TRUE(desc.ok()) << desc.status();
          // 4-bit formats take wgmma where allowed; 16-bit weights never do (LaunchGemm);
          // 8-bit ones may have no wgmma tile that fits a forced choice (then mma.sync runs).
          if (!wg || (fm.f.spec.mode != QuantMode::kNone && fm.f.spec.bits <= 4)) {
            EXPECT_EQ(absl::StrContains(*desc, " wgmma"), wg) << *desc;
          } else if (fm.f.spec.mode == QuantMode::kNone) {
            EXPECT_FALSE(absl::StrContains(*desc, " wgmma")) << *desc;
          }
          Report(absl::StrFormat("qmm_t[%s%s] tile%d", kernel, wg ? " wgmma" : "", tile),
                 absl::StrFormat("M%d %s", m, w->Shape()), w->Mode(),
                 GpuMatmulT(*w, x, m, DType::kBF16, QmmPath::kAuto), CpuMatmulT(*w, x, m),
                 MatmulTol(*w, kernel), w->rows);
        }
      }
    }
    // Stacked experts: 5 problems of M = 70 over 6 experts (ids repeat), then one bad id
    // that must poison only its own problem.
    for (const Fmt& fm : {fmts[0], fmts[1]}) {
      const int64_t experts = 6, rows = 200, cols = 576, m = 70;
      auto w = MakeWeight(fm.f.spec, fm.f.dtype, experts, rows, cols, ++seed);
      ASSERT_NE(w, nullptr);
      const std::vector<int32_t> ids = {4, 0, 5, 4, 2};
      const int64_t probs = static_cast<int64_t>(ids.size());
      const std::vector<float> x = RandomFloats(probs * m * cols, seed * 5);
      std::vector<float> ref;
      for (int64_t p = 0; p < probs; ++p) {
        std::vector<float> xp(x.begin() + p * m * cols, x.begin() + (p + 1) * m * cols);
        std::vector<float> yp = CpuMatmulT(*w, xp, m, ids[p]);
        ref.insert(ref.end(), yp.begin(), yp.end());
      }
      absl::StatusOr<DeviceBuffer> dids = DeviceBuffer::FromVector(ids);
      ASSERT_TRUE(dids.ok());
      QMatmulArgs a;
      a.problems = probs;
      a.expert_ids = dids->as<int32_t>();
      a.x_problem_stride = m * cols;
      a.y_problem_stride = m * rows;
      const std::vector<float> got =
          GpuMatmulT(*w, x, m, DType::kBF16, QmmPath::kAuto, a, probs * m * rows);
      a.m = m;
      a.x_dtype = DType::kBF16;
      const std::string kernel = KernelOf(*w, a);
      EXPECT_EQ(kernel, "gemm") << w->Mode();
      Report(absl::StrFormat("qmm_t[%s%s] tile%d experts", kernel, wg ? " wgmma" : "", tile),
             absl::StrFormat("5 x M%d of %s", m, w->Shape()), w->Mode(), got, ref,
             MatmulTol(*w, kernel), rows);
      const std::vector<int32_t> bad_ids = {1, 6};
      absl::StatusOr<DeviceBuffer> dbad = DeviceBuffer::FromVector(bad_ids);
      ASSERT_TRUE(dbad.ok());
      a.problems = 2;
      a.expert_ids = dbad->as<int32_t>();
      const std::vector<float> got_bad =
          GpuMatmulT(*w, x, m, DType::kBF16, QmmPath::kAuto, a, 2 * m * rows);
      ASSERT_EQ(got_bad.size(), static_cast<size_t>(2 * m * rows));
      const std::vector<float> ref1 = CpuMatmulT(*w, std::vector<float>(x.begin(), x.begin() + m * cols), m, 1);
      EXPECT_LE(Nmse(std::vector<float>(got_bad.begin(), got_bad.begin() + m * rows), ref1),
                MatmulTol(*w, kernel));
      EXPECT_TRUE(std::all_of(got_bad.begin() + m * rows, got_bad.end(),
                              [](float v) { return std::isnan(v); }));
    }
  }
  TEST_SetGemmTile(-1);
}

// Output rounding mirrors cpu::RoundAct.
TEST_F(GpuTest, MatmulRoundsOutputToBf16) {
  auto w = MakeWeight({QuantMode::kMxfp4, 4, 32}, DType::kU8, 1, 64, 256, 5);
  ASSERT_NE(w, nullptr);
  const std::vector<float> x = RandomFloats(2 * 256, 6);
  std::vector<float> ref = CpuMatmulT(*w, x, 2);
  cpu::RoundActInPlace(ref.data(), ref.size(), cpu::ActDType::kBF16);
  QMatmulArgs a;
  a.round_bf16 = true;
  const std::vector<float> got = GpuMatmulT(*w, x, 2, DType::kBF16, QmmPath::kAuto, a);
  a.m = 2;
  a.x_dtype = DType::kBF16;
  Report(absl::StrFormat("qmm_t[%s] round_bf16", KernelOf(*w, a)), "M2 64x256", w->Mode(), got,
         ref, kTolMatmul, 64);
}

// Stacked weights: problem p uses slice p; then the MoE gather with expert ids, shared x per
// token (x_problem_div = k) and per-slot x, including an invalid id that must give NaN.
TEST_F(GpuTest, StackedAndGather) {
  const int64_t experts = 6, rows = 96, cols = 256, k = 3, tokens = 2;
  for (FormatCase f : {FormatCase{{QuantMode::kMxfp4, 4, 32}, DType::kU8},
                       FormatCase{{QuantMode::kAffine, 4, 64}, DType::kBF16},
                       FormatCase{{QuantMode::kAffine, 3, 32}, DType::kF16}}) {
    auto w = MakeWeight(f.spec, f.dtype, experts, rows, cols, 31);
    ASSERT_NE(w, nullptr);
    for (DType xd : {DType::kBF16, DType::kF32}) {
      // Batched: 4 problems, slices 2..5, each with its own 3 rows of x.
      {
        const int64_t m = 3, probs = 4, begin = 2;
        const std::vector<float> x = RandomFloats(probs * m * cols, 41, 1.f, xd == DType::kBF16);
        std::vector<float> ref;
        for (int64_t p = 0; p < probs; ++p) {
          std::vector<float> xp(x.begin() + p * m * cols, x.begin() + (p + 1) * m * cols);
          std::vector<float> yp = CpuMatmulT(*w, xp, m, begin + p);
          ref.insert(ref.end(), yp.begin(), yp.end());
        }
        QMatmulArgs a;
        a.problems = probs;
        a.batch_begin = begin;
        a.x_problem_stride = m * cols;
        a.y_problem_stride = m * rows;
        const std::vector<float> got = GpuMatmulT(*w, x, m, xd, QmmPath::kAuto, a, probs * m * rows);
        a.m = m;
        a.x_dtype = xd;
        const std::string kernel = KernelOf(*w, a);
        Report(absl::StrFormat("qmm_t[%s] batched x=%s", kernel, DTypeName(xd)),
               "4 problems M3 " + w->Shape(), w->Mode(), got, ref, MatmulTol(*w, kernel), rows);
      }
      // Gather: tokens x k expert choices, x shared by a token's slots.
      {
        const std::vector<int32_t> ids = {4, 0, 5, 1, 4, 2};
        const std::vector<float> x = RandomFloats(tokens * cols, 43, 1.f, xd == DType::kBF16);
        std::vector<float> ref;
        for (int64_t p = 0; p < tokens * k; ++p) {
          std::vector<float> xp(x.begin() + (p / k) * cols, x.begin() + (p / k + 1) * cols);
          std::vector<float> yp = CpuMatmulT(*w, xp, 1, ids[p]);
          ref.insert(ref.end(), yp.begin(), yp.end());
        }
        absl::StatusOr<DeviceBuffer> dids = DeviceBuffer::FromVector(ids);
        ASSERT_TRUE(dids.ok());
        QMatmulArgs a;
        a.problems = tokens * k;
        a.expert_ids = dids->as<int32_t>();
        a.x_problem_stride = cols;
        a.x_problem_div = k;
        a.y_problem_stride = rows;
        const std::vector<float> got = GpuMatmulT(*w, x, 1, xd, QmmPath::kAuto, a, tokens * k * rows);
        a.x_dtype = xd;
        const std::string kernel = KernelOf(*w, a);
        Report(absl::StrFormat("qmm_t[%s] gather x=%s", kernel, DTypeName(xd)),
               "2 tok x 3 of 6 " + w->Shape(), w->Mode(), got, ref, MatmulTol(*w, kernel), rows);
      }
    }
    // An out-of-range id poisons only its own problem.
    const std::vector<int32_t> ids = {1, 9};
    absl::StatusOr<DeviceBuffer> dids = DeviceBuffer::FromVector(ids);
    ASSERT_TRUE(dids.ok());
    QMatmulArgs a;
    a.problems = 2;
    a.expert_ids = dids->as<int32_t>();
    a.y_problem_stride = rows;
    const std::vector<float> x = RandomFloats(cols, 47);
    const std::vector<float> got = GpuMatmulT(*w, x, 1, DType::kBF16, QmmPath::kAuto, a, 2 * rows);
    ASSERT_EQ(got.size(), static_cast<size_t>(2 * rows));
    EXPECT_FALSE(std::isnan(got[0]));
    EXPECT_TRUE(std::isnan(got[rows]));
    EXPECT_TRUE(std::isnan(got[2 * rows - 1]));
  }
}

// transpose=false (MultiLinear embed_q): y[m, cols] = x[m, rows] @ W_b.
// M > 8 with bf16 x runs the prefill GEMM on a transposed bf16 copy of the slices (formats
// with exact bf16 values; affine with bf16 scales rounded as on any GEMM); the rest SIMT.
TEST_F(GpuTest, MatmulTransposeFalse) {
  const int64_t heads = 3, rows = 512, cols = 192;
  std::vector<int64_t> ms = {1, 7, 40};
  if (FullRun()) ms.push_back(300);
  for (const FormatCase& f : {FormatCase{{QuantMode::kMxfp4, 4, 32}, DType::kU8},
                              FormatCase{{QuantMode::kAffine, 4, 64}, DType::kBF16},
                              FormatCase{{QuantMode::kAffine, 6, 32}, DType::kF32},
                              FormatCase{{QuantMode::kNvfp4, 4, 16}, DType::kU8},
                              FormatCase{{QuantMode::kNone, 0, 0}, DType::kBF16}}) {
    auto w = MakeWeight(f.spec, f.dtype, heads, rows, cols, 53);
    ASSERT_NE(w, nullptr);
    for (int64_t m : ms) {
      for (DType xd : {DType::kF32, DType::kBF16}) {
        const std::vector<float> x = RandomFloats(heads * m * rows, 59 + m, 1.f, xd == DType::kBF16);
        std::vector<float> ref(heads * m * cols);
        for (int64_t h = 0; h < heads; ++h) {
          ring::QMatmulN(x.data() + h * m * rows, m, w->host, h, ref.data() + h * m * cols);
        }
        absl::StatusOr<DeviceBuffer> dx = xd == DType::kBF16 ? DeviceBuffer::FromVector(ToBf16Bits(x))
                                                             : DeviceBuffer::FromVector(x);
        absl::StatusOr<DeviceBuffer> dy = DeviceBuffer::Allocate(ref.size() * sizeof(float));
        ASSERT_TRUE(dx.ok() && dy.ok());
        QMatmulArgs a;
        a.x = dx->data();
        a.x_dtype = xd;
        a.m = m;
        a.y = dy->as<float>();
        a.problems = heads;
        a.x_problem_stride = m * rows;
        a.y_problem_stride = m * cols;
        absl::Status s = QMatmulN(w->dev.view, a, nullptr);
        ASSERT_TRUE(s.ok()) << s;
        absl::StatusOr<std::vector<float>> got = dy->ToVector<float>(ref.size());
        ASSERT_TRUE(got.ok()) << got.status();
        const bool gemm = xd == DType::kBF16 && m > 8 &&
                          !(f.spec.mode == QuantMode::kAffine && f.dtype != DType::kBF16);
        const bool affine_gemm = gemm && f.spec.mode == QuantMode::kAffine;
        Report(absl::StrFormat("qmm_n[%s] x=%s", gemm ? "gemm" : "simt", DTypeName(xd)),
               absl::StrFormat("M%d %s", m, w->Shape()), w->Mode(), *got, ref,
               affine_gemm ? kTolMatmulAffineGemm : kTolMatmul, cols);
      }
    }
  }
}

TEST_F(GpuTest, EmbeddingRowsAllFormats) {
  const int64_t vocab = 50, hidden = 256;
  const std::vector<int32_t> ids = {3, 49, 0, 3, 17};
  for (const FormatCase& f : AllFormats()) {
    auto w = MakeWeight(f.spec, f.dtype, 1, vocab, hidden, 61, f.global_scale);
    ASSERT_NE(w, nullptr);
    std::vector<float> ref(ids.size() * hidden);
    for (size_t t = 0; t < ids.size(); ++t) DequantizeRows(w->host, 0, ids[t], ids[t] + 1, &ref[t * hidden]);
    absl::StatusOr<DeviceBuffer> dids = DeviceBuffer::FromVector(ids);
    absl::StatusOr<DeviceBuffer> dout = DeviceBuffer::Allocate(ref.size() * sizeof(float));
    ASSERT_TRUE(dids.ok() && dout.ok());
    ASSERT_TRUE(EmbedRows(w->dev.view, dids->as<int32_t>(), ids.size(), dout->data(), DType::kF32, nullptr).ok());
    absl::StatusOr<std::vector<float>> got = dout->ToVector<float>(ref.size());
    ASSERT_TRUE(got.ok());
    Report("embed_rows f32", absl::StrFormat("5 of %dx%d", vocab, hidden), w->Mode(), *got, ref, kTolExact);
    // With the activation rounding in the same launch: the CPU engine's embedding rows
    // (dequantised, then cpu::RoundAct), exactly.
    for (cpu::ActDType rt : {cpu::ActDType::kBF16, cpu::ActDType::kF16}) {
      std::vector<float> rounded = ref;
      for (float& v : rounded) v = cpu::RoundAct(v, rt);
      ASSERT_TRUE(EmbedRows(w->dev.view, dids->as<int32_t>(), ids.size(), dout->data(), DType::kF32, nullptr, rt).ok());
      got = dout->ToVector<float>(ref.size());
      ASSERT_TRUE(got.ok());
      Report(rt == cpu::ActDType::kBF16 ? "embed_rows f32 round bf16" : "embed_rows f32 round f16",
             absl::StrFormat("5 of %dx%d", vocab, hidden), w->Mode(), *got, rounded, kTolExact);
    }
  }
  // Out-of-range id -> NaN row.
  auto w = MakeWeight({QuantMode::kMxfp4, 4, 32}, DType::kU8, 1, vocab, hidden, 62);
  const std::vector<int32_t> bad = {vocab};
  absl::StatusOr<DeviceBuffer> dids = DeviceBuffer::FromVector(bad);
  absl::StatusOr<DeviceBuffer> dout = DeviceBuffer::Allocate(hidden * 2);
  ASSERT_TRUE(dids.ok() && dout.ok());
  ASSERT_TRUE(EmbedRows(w->dev.view, dids->as<int32_t>(), 1, dout->data(), DType::kBF16, nullptr).ok());
  absl::StatusOr<std::vector<uint16_t>> got = dout->ToVector<uint16_t>(hidden);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(std::isnan(Bf16ToFloat((*got)[0])));
}

// ---- elementwise ---------------------------------------------------------------------------
struct DevVec {
  DeviceBuffer buf;
  DType dtype;
  DevArray in() const { return DevArray{buf.data(), dtype}; }
  DevMutArray out() { return DevMutArray{buf.data(), dtype}; }
};
DevVec Upload(const std::vector<float>& v, DType t) {
  absl::StatusOr<DeviceBuffer> b =
      t == DType::kBF16 ? DeviceBuffer::FromVector(ToBf16Bits(v)) : DeviceBuffer::FromVector(v);
  EXPECT_TRUE(b.ok()) << b.status();
  return DevVec{b.ok() ? *std::move(b) : DeviceBuffer(), t};
}
std::vector<float> Download(const DevVec& d, size_t n) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if (d.dtype == DType::kBF16) {
    absl::StatusOr<std::vector<uint16_t>> h = d.buf.ToVector<uint16_t>(n);
    EXPECT_TRUE(h.ok());
    return h.ok() ? FromBf16Bits(*h) : std::vector<float>();
  }
  absl::StatusOr<std::vector<float>> h = d.buf.ToVector<float>(n);
  EXPECT_TRUE(h.ok());
  return h.ok() ? *h : std::vector<float>();
}
const char* ActName(cpu::ActDType t) { return t == cpu::ActDType::kBF16 ? "bf16" : "f32"; }
double EwTol(cpu::ActDType t) { return t == cpu::ActDType::kBF16 ? kTolEwBf16 : kTolEwF32; }

// (rounding, storage) combinations: fp32 math with fp32 storage, bf16 rounding stored as
// fp32 (the CPU engine's convention) and bf16 rounding stored as bf16.
struct EwMode {
  cpu::ActDType round;
  DType storage;
};
const EwMode kEwModes[] = {{cpu::ActDType::kF32, DType::kF32},
                           {cpu::ActDType::kBF16, DType::kF32},
                           {cpu::ActDType::kBF16, DType::kBF16}};

TEST_F(GpuTest, RmsNormAndLayerNorm) {
  struct S { int64_t rows, dim; };
  // Decode rows (1 row), the register path's edge (8 per thread of 1024 at 8192) and past it.
  for (S s : {S{4, 6144}, S{3, 2048}, S{64 * 2, 128}, S{2, 512}, S{5, 100}, S{1, 6144},
              S{1, 33}, S{1, 8192}, S{2, 9000}}) {
    for (EwMode md : kEwModes) {
      const bool bf = md.round == cpu::ActDType::kBF16;
      const std::vector<float> x = RandomFloats(s.rows * s.dim, 71, 3.f, bf);
      const std::vector<float> w = RandomFloats(s.dim, 72, 1.f, true);
      const std::vector<float> bias = RandomFloats(s.dim, 73, 0.1f, true);
      const std::vector<uint16_t> wb = ToBf16Bits(w), bb = ToBf16Bits(bias);
      const TensorView wv{DType::kBF16, {s.dim}, wb.data()}, bv{DType::kBF16, {s.dim}, bb.data()};
      DevVec dx = Upload(x, md.storage), dw = Upload(w, DType::kBF16), db = Upload(bias, DType::kBF16);
      DevVec dout = Upload(std::vector<float>(x.size()), md.storage);
      const std::string shape = absl::StrFormat("%dx%d", s.rows, s.dim);
      const std::string mode = absl::StrFormat("round %s, store %s", ActName(md.round), DTypeName(md.storage));

      std::vector<float> ref(x.size());
      cpu::RmsNorm(x.data(), s.rows, s.dim, wv, 1e-5f, md.round, ref.data());
      ASSERT_TRUE(RmsNorm(dx.in(), s.rows, s.dim, dw.in(), 1e-5f, md.round, dout.out(), nullptr).ok());
      Report("rms_norm", shape, mode, Download(dout, x.size()), ref, EwTol(md.round));

      cpu::RmsNorm(x.data(), s.rows, s.dim, TensorView{}, 1e-6f, md.round, ref.data());
      ASSERT_TRUE(RmsNorm(dx.in(), s.rows, s.dim, DevArray{}, 1e-6f, md.round, dout.out(), nullptr).ok());
      Report("rms_norm no weight", shape, mode, Download(dout, x.size()), ref, EwTol(md.round));

      cpu::LayerNorm(x.data(), s.rows, s.dim, wv, bv, 1e-5f, md.round, ref.data());
      ASSERT_TRUE(LayerNorm(dx.in(), s.rows, s.dim, dw.in(), db.in(), 1e-5f, md.round, dout.out(), nullptr).ok());
      Report("layer_norm", shape, mode, Download(dout, x.size()), ref, EwTol(md.round));

      // Residual add + norm in one launch, the sum written over x (in place, as the layer
      // program does) and the bf16 side output: equal to cpu::Add then cpu::RmsNorm.
      const std::vector<float> r = RandomFloats(s.rows * s.dim, 74, 3.f, bf);
      std::vector<float> sum_ref(x.size());
      cpu::Add(x.data(), r.data(), x.size(), md.round, sum_ref.data());
      cpu::RmsNorm(sum_ref.data(), s.rows, s.dim, wv, 1e-5f, md.round, ref.data());
      DevVec dh = Upload(x, md.storage), dr = Upload(r, md.storage);
      absl::StatusOr<DeviceBuffer> dbits = DeviceBuffer::Allocate(x.size() * 2);
      ASSERT_TRUE(dbits.ok());
      ASSERT_TRUE(AddRmsNorm(dh.in(), dr.in(), s.rows, s.dim, dw.in(), 1e-5f, md.round, dh.out(),
                             dout.out(), nullptr, dbits->as<uint16_t>())
                      .ok());
      Report("add_rms_norm sum", shape, mode, Download(dh, x.size()), sum_ref, EwTol(md.round));
      Report("add_rms_norm", shape, mode, Download(dout, x.size()), ref, EwTol(md.round));
      if (md.round == cpu::ActDType::kBF16) {
        absl::StatusOr<std::vector<uint16_t>> bits = dbits->ToVector<uint16_t>(x.size());
        ASSERT_TRUE(bits.ok());
        std::vector<float> got(x.size());
        for (size_t i = 0; i < got.size(); ++i) got[i] = Bf16ToFloat((*bits)[i]);
        Report("add_rms_norm bf16 bits", shape, mode, got, ref, EwTol(md.round));
      }
    }
  }
}

TEST_F(GpuTest, Rope) {
  struct S {
    int64_t tokens, heads, head_dim, dims;
    bool traditional;
    int64_t offset;
    double base;
  };
  // GLM MLA q_pe (64 rotated of 64, interleaved), indexer (64 of 128), Qwen3 half-split.
  for (S s : {S{3, 64, 64, 64, true, 0, 8e6}, S{2, 32, 128, 64, true, 70000, 8e6},
              S{5, 32, 128, 128, false, 17, 1e6}, S{1, 8, 128, 128, false, 1000000, 1e6}}) {
    std::vector<float> inv(s.dims / 2);
    for (int64_t i = 0; i < s.dims / 2; ++i) {
      inv[i] = static_cast<float>(std::pow(s.base, -2.0 * i / s.dims));
    }
    absl::StatusOr<DeviceBuffer> dinv = DeviceBuffer::FromVector(inv);
    ASSERT_TRUE(dinv.ok());
    const int64_t stride = s.heads * s.head_dim + 16;  // rows with padding, as in a fused qkv
    for (EwMode md : kEwModes) {
      const bool bf = md.round == cpu::ActDType::kBF16;
      std::vector<float> x = RandomFloats(s.tokens * stride, 81, 2.f, bf);
      DevVec dx = Upload(x, md.storage);
      cpu::Rope(x.data(), s.tokens, s.heads, s.head_dim, stride, s.dims, s.traditional, inv, s.offset,
                md.round);
      ASSERT_TRUE(Rope(dx.out(), s.tokens, s.heads, s.head_dim, stride, s.dims, s.traditional,
                       dinv->as<float>(), s.offset, md.round, nullptr)
                      .ok());
      Report(s.traditional ? "rope traditional" : "rope half-split",
             absl::StrFormat("%dx%dx%d d%d @%d", s.tokens, s.heads, s.head_dim, s.dims, s.offset),
             absl::StrFormat("round %s, store %s", ActName(md.round), DTypeName(md.storage)),
             Download(dx, x.size()), x, EwTol(md.round));
    }
  }
}

// Qwen3's fused q/k head norms + RoPE: bit for bit the RmsNorm, (ScaleRound,) Rope kernels it
// replaces, and within the elementwise tolerance of the CPU reference.
TEST_F(GpuTest, HeadNormRope) {
  struct S {
    int64_t T, H, KV, d, offset;
    float pre;
  };
  for (S s : {S{1, 16, 8, 128, 150, 1.f}, S{7, 4, 2, 128, 3, 1.f}, S{3, 8, 2, 64, 40, 1.25f}}) {
    std::vector<float> inv(s.d / 2);
    for (int64_t i = 0; i < s.d / 2; ++i) {
      inv[i] = static_cast<float>(std::pow(1e6, -2.0 * i / s.d));
    }
    absl::StatusOr<DeviceBuffer> dinv = DeviceBuffer::FromVector(inv);
    ASSERT_TRUE(dinv.ok());
    for (cpu::ActDType t : {cpu::ActDType::kF32, cpu::ActDType::kBF16}) {
      const bool bf = t == cpu::ActDType::kBF16;
      const float eps = 1e-6f;
      const std::vector<float> q = RandomFloats(s.T * s.H * s.d, 301, 3.f, bf);
      const std::vector<float> k = RandomFloats(s.T * s.KV * s.d, 302, 3.f, bf);
      const std::vector<float> qw = RandomFloats(s.d, 303, 1.f, true);
      const std::vector<float> kw = RandomFloats(s.d, 304, 1.f, true);
      DevVec dqw = Upload(qw, DType::kF32), dkw = Upload(kw, DType::kF32);
      // CPU reference.
      auto reference = [&](std::vector<float> x, int64_t heads, const std::vector<float>& w) {
        const TensorView wv{DType::kF32, {s.d}, w.data()};
        cpu::RmsNorm(x.data(), s.T * heads, s.d, wv, eps, t, x.data());
        if (s.pre != 1.f) {
          for (float& v : x) v = cpu::RoundAct(v * s.pre, t);
        }
        cpu::Rope(x.data(), s.T, heads, s.d, heads * s.d, s.d, false, inv, s.offset, t);
        return x;
      };
      // The unfused kernels.
      auto unfused = [&](const std::vector<float>& x, int64_t heads, const DevVec& w) {
        DevVec dx = Upload(x, DType::kF32);
        EXPECT_TRUE(RmsNorm(dx.in(), s.T * heads, s.d, w.in(), eps, t, dx.out(), nullptr).ok());
        if (s.pre != 1.f) {
          EXPECT_TRUE(
              ScaleRound(dx.out(), s.T, heads, s.d, heads * s.d, s.d, s.pre, t, nullptr).ok());
        }
        EXPECT_TRUE(Rope(dx.out(), s.T, heads, s.d, heads * s.d, s.d, false, dinv->as<float>(),
                         s.offset, t, nullptr)
                        .ok());
        return Download(dx, x.size());
      };
      DevVec fq = Upload(q, DType::kF32), fk = Upload(k, DType::kF32);
      ASSERT_TRUE(HeadNormRope(fq.buf.as<float>(), s.H, dqw.buf.as<float>(), fk.buf.as<float>(),
                               s.KV, dkw.buf.as<float>(), s.T, s.d, eps, s.pre,
                               dinv->as<float>(), s.offset, t, nullptr)
                      .ok());
      const std::vector<float> gq = Download(fq, q.size()), gk = Download(fk, k.size());
      const std::vector<float> uq = unfused(q, s.H, dqw), uk = unfused(k, s.KV, dkw);
      EXPECT_EQ(0, std::memcmp(gq.data(), uq.data(), gq.size() * 4)) << "q differs from unfused";
      EXPECT_EQ(0, std::memcmp(gk.data(), uk.data(), gk.size() * 4)) << "k differs from unfused";
      const std::string shape = absl::StrFormat("T%d h%d/%d d%d @%d pre %g", s.T, s.H, s.KV,
                                                s.d, s.offset, s.pre);
      Report("head_norm_rope q", shape, ActName(t), gq, reference(q, s.H, qw), EwTol(t));
      Report("head_norm_rope k", shape, ActName(t), gk, reference(k, s.KV, kw), EwTol(t));

      // With the step's cache write, the position read on the device (and from the host):
      // q as in place, k's result in cache rows offset.. of k_cache, v copied to v_cache,
      // k itself and every other cache row untouched.
      const int64_t kvw = s.KV * s.d, rows = s.offset + s.T + 2;
      const std::vector<float> v = RandomFloats(s.T * kvw, 305, 3.f, bf);
      const std::vector<float> kc0 = RandomFloats(rows * kvw, 306, 1.f, bf);
      const std::vector<float> vc0 = RandomFloats(rows * kvw, 307, 1.f, bf);
      const std::vector<int32_t> pos = {static_cast<int32_t>(s.offset)};
      absl::StatusOr<DeviceBuffer> dpos = DeviceBuffer::FromVector(pos);
      ASSERT_TRUE(dpos.ok());
      for (bool on_device : {true, false}) {
        DevVec cq = Upload(q, DType::kF32), ck = Upload(k, DType::kF32), cv = Upload(v, DType::kF32);
        DevVec kc = Upload(kc0, DType::kF32), vc = Upload(vc0, DType::kF32);
        ASSERT_TRUE(HeadNormRope(cq.buf.as<float>(), s.H, dqw.buf.as<float>(), ck.buf.as<float>(),
                                 s.KV, dkw.buf.as<float>(), s.T, s.d, eps, s.pre,
                                 dinv->as<float>(), on_device ? 0 : s.offset, t, nullptr,
                                 on_device ? dpos->as<int32_t>() : nullptr, kc.buf.as<float>(),
                                 cv.buf.as<float>(), vc.buf.as<float>())
                        .ok());
        const std::string how = on_device ? "position on the device" : "position from the host";
        const std::vector<float> cq_out = Download(cq, q.size());
        EXPECT_EQ(0, std::memcmp(cq_out.data(), gq.data(), gq.size() * 4)) << "q, " << how;
        EXPECT_EQ(Download(ck, k.size()), k) << "k was written, " << how;
        std::vector<float> want_k = kc0, want_v = vc0;
        std::copy(gk.begin(), gk.end(), want_k.begin() + s.offset * kvw);
        std::copy(v.begin(), v.end(), want_v.begin() + s.offset * kvw);
        const std::vector<float> got_k = Download(kc, kc0.size()), got_v = Download(vc, vc0.size());
        EXPECT_EQ(0, std::memcmp(got_k.data(), want_k.data(), want_k.size() * 4)) << "k cache, " << how;
        EXPECT_EQ(0, std::memcmp(got_v.data(), want_v.data(), want_v.size() * 4)) << "v cache, " << how;
      }
    }
  }
}

// MLA's cache-row copies, latent norm and both RoPEs in one kernel: bit for bit the copies,
// RmsNorm, (ScaleRound,) Rope kernels it replaces, and within the elementwise tolerance of
// the CPU reference. GLM-5.2's dims (kvl 512, rope 64, 64 heads of 192) and odd ones.
TEST_F(GpuTest, MlaKvRope) {
  struct S {
    int64_t T, H, kvl, rope, qd, offset;
    float pre;
    bool traditional;
  };
  for (S s : {S{1, 64, 512, 64, 192, 2047, 1.f, true}, S{5, 16, 512, 64, 192, 3, 1.f, true},
              S{3, 4, 96, 16, 48, 40, 1.25f, true}, S{2, 3, 2000, 32, 40, 9, 1.f, false}}) {
    std::vector<float> inv(s.rope / 2);
    for (int64_t i = 0; i < s.rope / 2; ++i) inv[i] = static_cast<float>(std::pow(1e4, -2.0 * i / s.rope));
    absl::StatusOr<DeviceBuffer> dinv = DeviceBuffer::FromVector(inv);
    ASSERT_TRUE(dinv.ok());
    const int64_t ld = s.kvl + s.rope;
    for (cpu::ActDType t : {cpu::ActDType::kF32, cpu::ActDType::kBF16}) {
      const bool bf = t == cpu::ActDType::kBF16;
      const float eps = 1e-6f;
      const std::vector<float> ckv = RandomFloats(s.T * ld, 311, 3.f, bf);
      const std::vector<float> q = RandomFloats(s.T * s.H * s.qd, 312, 3.f, bf);
      const std::vector<float> w = RandomFloats(s.kvl, 313, 1.f, true);
      DevVec dw = Upload(w, DType::kF32), dckv = Upload(ckv, DType::kF32);
      // CPU reference.
      std::vector<float> rl(s.T * s.kvl), rk(s.T * s.rope), rq = q;
      for (int64_t r = 0; r < s.T; ++r) {
        std::copy_n(ckv.begin() + r * ld, s.kvl, rl.begin() + r * s.kvl);
        std::copy_n(ckv.begin() + r * ld + s.kvl, s.rope, rk.begin() + r * s.rope);
      }
      const TensorView wv{DType::kF32, {s.kvl}, w.data()};
      cpu::RmsNorm(rl.data(), s.T, s.kvl, wv, eps, t, rl.data());
      auto pre = [&](float* x, int64_t heads, int64_t head_dim) {
        if (s.pre == 1.f) return;
        for (int64_t r = 0; r < s.T * heads; ++r) {
          for (int64_t d = 0; d < s.rope; ++d) x[r * head_dim + d] = cpu::RoundAct(x[r * head_dim + d] * s.pre, t);
        }
      };
      float* rq_pe = rq.data() + (s.qd - s.rope);
      pre(rq_pe, s.H, s.qd);
      pre(rk.data(), 1, s.rope);
      cpu::Rope(rq_pe, s.T, s.H, s.qd, s.H * s.qd, s.rope, s.traditional, inv, s.offset, t);
      cpu::Rope(rk.data(), s.T, 1, s.rope, s.rope, s.rope, s.traditional, inv, s.offset, t);
      // The unfused kernels.
      DevVec ul = Upload(std::vector<float>(s.T * s.kvl), DType::kF32);
      DevVec uk = Upload(std::vector<float>(s.T * s.rope), DType::kF32);
      DevVec uq = Upload(q, DType::kF32);
      ASSERT_EQ(cudaMemcpy2D(ul.buf.as<float>(), s.kvl * 4, dckv.buf.as<float>(), ld * 4, s.kvl * 4, s.T,
                             cudaMemcpyDeviceToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy2D(uk.buf.as<float>(), s.rope * 4, dckv.buf.as<float>() + s.kvl, ld * 4, s.rope * 4,
                             s.T, cudaMemcpyDeviceToDevice), cudaSuccess);
      ASSERT_TRUE(RmsNorm(ul.in(), s.T, s.kvl, dw.in(), eps, t, ul.out(), nullptr).ok());
      const DevMutArray uq_pe{uq.buf.as<float>() + (s.qd - s.rope), DType::kF32};
      if (s.pre != 1.f) {
        ASSERT_TRUE(ScaleRound(uq_pe, s.T, s.H, s.qd, s.H * s.qd, s.rope, s.pre, t, nullptr).ok());
        ASSERT_TRUE(ScaleRound(uk.out(), s.T, 1, s.rope, s.rope, s.rope, s.pre, t, nullptr).ok());
      }
      ASSERT_TRUE(Rope(uq_pe, s.T, s.H, s.qd, s.H * s.qd, s.rope, s.traditional, dinv->as<float>(), s.offset,
                       t, nullptr).ok());
      ASSERT_TRUE(Rope(uk.out(), s.T, 1, s.rope, s.rope, s.rope, s.traditional, dinv->as<float>(), s.offset,
                       t, nullptr).ok());
      // Fused.
      DevVec fl = Upload(std::vector<float>(s.T * s.kvl), DType::kF32);
      DevVec fk = Upload(std::vector<float>(s.T * s.rope), DType::kF32);
      DevVec fq = Upload(q, DType::kF32);
      ASSERT_TRUE(MlaKvRope(dckv.buf.as<float>(), s.T, s.kvl, s.rope, dw.in(), eps, fl.buf.as<float>(),
                            fk.buf.as<float>(), fq.buf.as<float>(), s.H, s.qd, s.pre, s.traditional,
                            dinv->as<float>(), s.offset, t, nullptr)
                      .ok());
      const std::vector<float> gl = Download(fl, rl.size()), gk = Download(fk, rk.size()), gq = Download(fq, q.size());
      const std::vector<float> ol = Download(ul, rl.size()), ok = Download(uk, rk.size()), oq = Download(uq, q.size());
      EXPECT_EQ(0, std::memcmp(gl.data(), ol.data(), gl.size() * 4)) << "latent differs from unfused";
      EXPECT_EQ(0, std::memcmp(gk.data(), ok.data(), gk.size() * 4)) << "k_pe differs from unfused";
      EXPECT_EQ(0, std::memcmp(gq.data(), oq.data(), gq.size() * 4)) << "q differs from unfused";
      const std::string shape = absl::StrFormat("T%d kvl%d rope%d q %dx%d @%d pre %g%s", s.T, s.kvl, s.rope, s.H,
                                                s.qd, s.offset, s.pre, s.traditional ? "" : " half-split");
      Report("mla_kv_rope latent", shape, ActName(t), gl, rl, EwTol(t));
      Report("mla_kv_rope k_pe", shape, ActName(t), gk, rk, EwTol(t));
      Report("mla_kv_rope q", shape, ActName(t), gq, rq, EwTol(t));

      // The position on the device: latent and k_pe given by the caches' row 0, rows offset..
      // written bit for bit as above, every other row untouched.
      const int64_t rows = s.offset + s.T + 2;
      const std::vector<float> lc0 = RandomFloats(rows * s.kvl, 314, 1.f, bf);
      const std::vector<float> kc0 = RandomFloats(rows * s.rope, 315, 1.f, bf);
      const std::vector<int32_t> pos = {static_cast<int32_t>(s.offset)};
      absl::StatusOr<DeviceBuffer> dpos = DeviceBuffer::FromVector(pos);
      ASSERT_TRUE(dpos.ok());
      DevVec lc = Upload(lc0, DType::kF32), kc = Upload(kc0, DType::kF32), pq = Upload(q, DType::kF32);
      ASSERT_TRUE(MlaKvRope(dckv.buf.as<float>(), s.T, s.kvl, s.rope, dw.in(), eps, lc.buf.as<float>(),
                            kc.buf.as<float>(), pq.buf.as<float>(), s.H, s.qd, s.pre, s.traditional,
                            dinv->as<float>(), 0, t, nullptr, dpos->as<int32_t>())
                      .ok());
      std::vector<float> want_l = lc0, want_k = kc0;
      std::copy(gl.begin(), gl.end(), want_l.begin() + s.offset * s.kvl);
      std::copy(gk.begin(), gk.end(), want_k.begin() + s.offset * s.rope);
      const std::vector<float> got_l = Download(lc, lc0.size()), got_k = Download(kc, kc0.size());
      const std::vector<float> got_q = Download(pq, q.size());
      EXPECT_EQ(0, std::memcmp(got_l.data(), want_l.data(), want_l.size() * 4)) << "latent cache, " << shape;
      EXPECT_EQ(0, std::memcmp(got_k.data(), want_k.data(), want_k.size() * 4)) << "k_pe cache, " << shape;
      EXPECT_EQ(0, std::memcmp(got_q.data(), gq.data(), gq.size() * 4)) << "q, position on the device, " << shape;
    }
  }
}

// The DSA indexer's key LayerNorm, both RoPEs and the weights' scale in one kernel: bit for bit
// the LayerNorm, (ScaleRound,) Rope and ScaleRound kernels it replaces, and within the
// elementwise tolerance of the CPU reference. GLM-5.2's dims (32 heads of 128, rope 64
// interleaved) and odd ones.
TEST_F(GpuTest, IndexerNormRope) {
  struct S {
    int64_t T, H, d, dims, offset;
    float pre;
    bool traditional, scale_w;
  };
  for (S s : {S{1, 32, 128, 64, 2100, 1.f, true, true}, S{1, 32, 128, 64, 5, 1.f, true, false},
              S{6, 8, 128, 64, 40, 1.25f, true, true}, S{3, 4, 96, 32, 9, 1.f, false, true},
              S{2, 2, 1100, 64, 3, 1.f, true, true}}) {
    std::vector<float> inv(s.dims / 2);
    for (int64_t i = 0; i < s.dims / 2; ++i) inv[i] = static_cast<float>(std::pow(1e4, -2.0 * i / s.dims));
    absl::StatusOr<DeviceBuffer> dinv = DeviceBuffer::FromVector(inv);
    ASSERT_TRUE(dinv.ok());
    const int64_t nw = s.T * s.H;
    const float wscale = 0.0078125f * 1.3f;
    for (cpu::ActDType t : {cpu::ActDType::kF32, cpu::ActDType::kBF16}) {
      const bool bf = t == cpu::ActDType::kBF16;
      const float eps = 1e-5f;
      const std::vector<float> q = RandomFloats(s.T * s.H * s.d, 321, 3.f, bf);
      const std::vector<float> k = RandomFloats(s.T * s.d, 322, 3.f, bf);
      const std::vector<float> w = RandomFloats(nw, 323, 2.f, bf);
      const std::vector<float> gw = RandomFloats(s.d, 324, 1.f, true), gb = RandomFloats(s.d, 325, 0.5f, true);
      DevVec dgw = Upload(gw, DType::kF32), dgb = Upload(gb, DType::kF32);
      // CPU reference.
      std::vector<float> rq = q, rk = k, rw = w;
      const TensorView wv{DType::kF32, {s.d}, gw.data()}, bv{DType::kF32, {s.d}, gb.data()};
      cpu::LayerNorm(rk.data(), s.T, s.d, wv, bv, eps, t, rk.data());
      auto pre = [&](std::vector<float>& x, int64_t heads) {
        if (s.pre == 1.f) return;
        for (int64_t r = 0; r < s.T * heads; ++r) {
          for (int64_t c = 0; c < s.dims; ++c) x[r * s.d + c] = cpu::RoundAct(x[r * s.d + c] * s.pre, t);
        }
      };
      pre(rq, s.H);
      pre(rk, 1);
      cpu::Rope(rq.data(), s.T, s.H, s.d, s.H * s.d, s.dims, s.traditional, inv, s.offset, t);
      cpu::Rope(rk.data(), s.T, 1, s.d, s.d, s.dims, s.traditional, inv, s.offset, t);
      if (s.scale_w) {
        for (float& v : rw) v = cpu::RoundAct(v * wscale, t);
      }
      // The unfused kernels.
      DevVec uq = Upload(q, DType::kF32), uk = Upload(k, DType::kF32), uw = Upload(w, DType::kF32);
      ASSERT_TRUE(LayerNorm(uk.in(), s.T, s.d, dgw.in(), dgb.in(), eps, t, uk.out(), nullptr).ok());
      if (s.pre != 1.f) {
        ASSERT_TRUE(ScaleRound(uq.out(), s.T, s.H, s.d, s.H * s.d, s.dims, s.pre, t, nullptr).ok());
        ASSERT_TRUE(ScaleRound(uk.out(), s.T, 1, s.d, s.d, s.dims, s.pre, t, nullptr).ok());
      }
      ASSERT_TRUE(Rope(uq.out(), s.T, s.H, s.d, s.H * s.d, s.dims, s.traditional, dinv->as<float>(), s.offset, t,
                       nullptr).ok());
      ASSERT_TRUE(Rope(uk.out(), s.T, 1, s.d, s.d, s.dims, s.traditional, dinv->as<float>(), s.offset, t,
                       nullptr).ok());
      if (s.scale_w) {
        ASSERT_TRUE(ScaleRound(uw.out(), nw, wscale, t, nullptr).ok());
      }
      // Fused.
      DevVec fq = Upload(q, DType::kF32), fk = Upload(k, DType::kF32), fw = Upload(w, DType::kF32);
      ASSERT_TRUE(IndexerNormRope(fq.buf.as<float>(), s.T, s.H, s.d, fk.buf.as<float>(), dgw.in(), dgb.in(), eps,
                                  s.dims, s.pre, s.traditional, dinv->as<float>(), s.offset,
                                  s.scale_w ? fw.buf.as<float>() : nullptr, s.scale_w ? nw : 0, wscale, t, nullptr)
                      .ok());
      const std::vector<float> gq = Download(fq, q.size()), gk = Download(fk, k.size()), gwo = Download(fw, w.size());
      const std::vector<float> oq = Download(uq, q.size()), ok = Download(uk, k.size()), ow = Download(uw, w.size());
      EXPECT_EQ(0, std::memcmp(gq.data(), oq.data(), gq.size() * 4)) << "q differs from unfused";
      EXPECT_EQ(0, std::memcmp(gk.data(), ok.data(), gk.size() * 4)) << "k differs from unfused";
      EXPECT_EQ(0, std::memcmp(gwo.data(), ow.data(), gwo.size() * 4)) << "w differs from unfused";
      const std::string shape = absl::StrFormat("T%d q %dx%d rope %d @%d pre %g%s%s", s.T, s.H, s.d, s.dims,
                                                s.offset, s.pre, s.traditional ? "" : " half-split",
                                                s.scale_w ? " +w" : "");
      Report("indexer_norm_rope q", shape, ActName(t), gq, rq, EwTol(t));
      Report("indexer_norm_rope k", shape, ActName(t), gk, rk, EwTol(t));
      Report("indexer_norm_rope w", shape, ActName(t), gwo, rw, kTolExact);

      // Into the key cache (rows offset.. of a cache given by its row 0), the position on the
      // device and from the host: the same bits, k only read, every other row untouched.
      const int64_t rows = s.offset + s.T + 2;
      const std::vector<float> kc0 = RandomFloats(rows * s.d, 326, 1.f, bf);
      const std::vector<int32_t> pos = {static_cast<int32_t>(s.offset)};
      absl::StatusOr<DeviceBuffer> dpos = DeviceBuffer::FromVector(pos);
      ASSERT_TRUE(dpos.ok());
      std::vector<float> want = kc0;
      std::copy(gk.begin(), gk.end(), want.begin() + s.offset * s.d);
      for (bool on_device : {true, false}) {
        DevVec cq = Upload(q, DType::kF32), ck = Upload(k, DType::kF32), cw = Upload(w, DType::kF32);
        DevVec kc = Upload(kc0, DType::kF32);
        ASSERT_TRUE(IndexerNormRope(cq.buf.as<float>(), s.T, s.H, s.d, ck.buf.as<float>(), dgw.in(), dgb.in(),
                                    eps, s.dims, s.pre, s.traditional, dinv->as<float>(),
                                    on_device ? 0 : s.offset, s.scale_w ? cw.buf.as<float>() : nullptr,
                                    s.scale_w ? nw : 0, wscale, t, nullptr,
                                    on_device ? dpos->as<int32_t>() : nullptr, kc.buf.as<float>())
                        .ok());
        const std::string how = shape + (on_device ? ", position on the device" : ", position from the host");
        const std::vector<float> got = Download(kc, kc0.size()), got_q = Download(cq, q.size());
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4)) << "key cache, " << how;
        EXPECT_EQ(0, std::memcmp(got_q.data(), gq.data(), gq.size() * 4)) << "q, " << how;
        EXPECT_EQ(Download(ck, k.size()), k) << "k was written, " << how;
        const std::vector<float> got_w = Download(cw, w.size());
        EXPECT_EQ(0, std::memcmp(got_w.data(), gwo.data(), gwo.size() * 4)) << "w, " << how;
      }
    }
  }
}

TEST_F(GpuTest, SwiGluAndAdd) {
  for (int64_t n : {int64_t{12288}, int64_t{2048 * 8}, int64_t{777}}) {
    for (EwMode md : kEwModes) {
      const bool bf = md.round == cpu::ActDType::kBF16;
      const std::vector<float> a = RandomFloats(n, 91, 4.f, bf), b = RandomFloats(n, 92, 2.f, bf);
      DevVec da = Upload(a, md.storage), db = Upload(b, md.storage);
      DevVec dout = Upload(std::vector<float>(n), md.storage);
      const std::string mode = absl::StrFormat("round %s, store %s", ActName(md.round), DTypeName(md.storage));
      std::vector<float> ref(n);
      cpu::SwiGlu(a.data(), b.data(), n, md.round, ref.data());
      ASSERT_TRUE(SwiGlu(da.in(), db.in(), n, md.round, dout.out(), nullptr).ok());
      Report("swiglu", absl::StrCat(n), mode, Download(dout, n), ref, EwTol(md.round));
      cpu::Add(a.data(), b.data(), n, md.round, ref.data());
      ASSERT_TRUE(Add(da.in(), db.in(), n, md.round, dout.out(), nullptr).ok());
      Report("add", absl::StrCat(n), mode, Download(dout, n), ref, kTolExact);
    }
  }
}

// ---- model ops: attention, MLA, DSA indexer, MoE, argmax ------------------------------------
// Each case runs the CUDA op and its CPU reference (kernels/cpu/ops.h, model_ops.h) on the
// same inputs (fp32 buffers holding bf16 values in bf16 mode).
std::vector<float> Dl(const float* p, size_t n) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), p, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}
std::vector<int32_t> DlI(const int32_t* p, size_t n) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<int32_t> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), p, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}
DeviceBuffer UpF(const std::vector<float>& v) {
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::FromVector(v);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? *std::move(b) : DeviceBuffer();
}
DeviceBuffer UpI(const std::vector<int32_t>& v) {
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::FromVector(v);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? *std::move(b) : DeviceBuffer();
}
DeviceBuffer Zeros(size_t floats) {
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(std::max<size_t>(floats, 1) * 4);
  EXPECT_TRUE(b.ok()) << b.status();
  if (b.ok()) {
    EXPECT_TRUE(b->Zero().ok());
  }
  return b.ok() ? *std::move(b) : DeviceBuffer();
}
// `launch` (work queued on `stream`) captured into an executable CUDA graph, as the backend
// replays decode steps; null (and a test failure) when capture or instantiation fails.
cudaGraphExec_t CaptureGraph(cudaStream_t stream, const std::function<absl::Status()>& launch) {
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const absl::Status st = launch();
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  EXPECT_TRUE(st.ok()) << st;
  cudaGraphExec_t exec = nullptr;
  if (graph != nullptr) {
    EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    cudaGraphDestroy(graph);
  }
  if (!st.ok() && exec != nullptr) {
    cudaGraphExecDestroy(exec);
    exec = nullptr;
  }
  return exec;
}
// Launches `exec` on `stream` and waits for it.
void ReplayGraph(cudaGraphExec_t exec, cudaStream_t stream) {
  ASSERT_NE(exec, nullptr) << "no graph to replay";
  EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
}
// Exact comparison of integer results, reported as a table row (NMSE of the mismatch count).
void ReportExact(const std::string& op, const std::string& shape, const std::string& mode,
                 const std::vector<int32_t>& got, const std::vector<int32_t>& ref) {
  ASSERT_EQ(got.size(), ref.size());
  int64_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) bad += got[i] != ref[i];
  Row r{op, shape, mode, static_cast<double>(bad), kTolExact, bad == 0};
  PrintRow(r);
  Table().push_back(r);
  EXPECT_EQ(bad, 0) << op << " " << shape << " " << mode << ": " << bad << " of " << ref.size()
                    << " indices differ";
}
double AttnTol(cpu::ActDType t) { return t == cpu::ActDType::kBF16 ? kTolAttnBf16 : kTolEwF32; }
const cpu::ActDType kActs[] = {cpu::ActDType::kF32, cpu::ActDType::kBF16};

TEST_F(GpuTest, AttentionGqa) {
  struct S {
    int64_t L, S, hq, hkv, d, causal;
    bool mask;
  };
  // Qwen3 prefill (causal, chunk after a cached prefix), decode, GQA 4:1 / 2:1 / MHA, an
  // additive mask, and a 512-wide head (GLM's absorbed MLA width).
  for (S s : {S{7, 7, 4, 2, 32, 0, false}, S{5, 25, 8, 2, 128, 20, false},
              S{1, 40, 8, 2, 128, -1, false}, S{6, 30, 4, 4, 64, -1, true},
              S{1, 300, 16, 1, 512, -1, true}, S{3, 70, 32, 8, 128, 67, false},
              // Decode on the batched-key kernel (dk = dv in {64, 128, 256}): Qwen3-0.6B-like
              // heads over keys that are no multiple of a warp's batch, a masked 1000-key
              // row (split over blocks on a large GPU, see AttentionGqaSplitKeys), fewer
              // keys than warps, a single key, d = 256 (its smaller batch).
              S{1, 301, 16, 8, 128, 300, false}, S{1, 1000, 32, 8, 128, -1, true},
              S{1, 5, 2, 1, 64, -1, false}, S{1, 1, 4, 2, 128, 0, false},
              S{2, 9, 4, 2, 256, 7, false}, S{1, 200, 8, 2, 256, -1, true},
              // L >= 16: the tiled prefill kernel (ragged query tiles and key chunks, head
              // widths up to its 256, causal after a prefix, mask).
              S{37, 37, 4, 2, 128, 0, false}, S{40, 100, 4, 4, 64, 60, true},
              S{20, 20, 3, 1, 256, 0, false}, S{16, 50, 2, 2, 192, -1, true},
              // Longer prompts: many query tiles (a ragged last one), a prefix, a mask, an
              // unaligned head width on the scalar-load variant.
              S{130, 130, 4, 2, 128, 0, false}, S{140, 300, 4, 4, 64, 160, true},
              S{130, 150, 2, 1, 30, 20, false}, S{128, 128, 2, 2, 256, 0, false}}) {
    // Masked keys at bf16's lowest and, the second time, at -inf (a warp's first key
    // included: its weight must be 0, not NaN).
    for (int inf = 0; inf < (s.mask ? 2 : 1); ++inf)
    for (cpu::ActDType t : kActs) {
      const bool bf = t == cpu::ActDType::kBF16;
      const std::vector<float> q = RandomFloats(s.L * s.hq * s.d, 1001, 1.f, bf);
      const std::vector<float> k = RandomFloats(s.S * s.hkv * s.d, 1002, 1.f, bf);
      const std::vector<float> v = RandomFloats(s.S * s.hkv * s.d, 1003, 1.f, bf);
      std::vector<float> mask;
      if (s.mask) {
        mask = RandomFloats(s.hq * s.L * s.S, 1004, 2.f, bf);
        for (size_t i = 0; i < mask.size(); i += 3) {
          mask[i] = inf ? -std::numeric_limits<float>::infinity() : -3.3895313892515355e38f;
        }
      }
      const float scale = 1.f / std::sqrt(static_cast<float>(s.d));
      cpu::AttentionArgs a{q.data(), s.hq * s.d, k.data(), s.hkv * s.d, v.data(), s.hkv * s.d,
                           s.L, s.S, s.hq, s.hkv, s.d, s.d, scale,
                           s.mask ? mask.data() : nullptr, s.causal};
      std::vector<float> ref(s.L * s.hq * s.d);
      cpu::Attention(a, t, ref.data());
      DeviceBuffer dq = UpF(q), dk = UpF(k), dv = UpF(v), dm = UpF(s.mask ? mask : std::vector<float>{0.f});
      DeviceBuffer dout = Zeros(ref.size());
      cpu::AttentionArgs g = a;
      g.q = dq.as<float>();
      g.k = dk.as<float>();
      g.v = dv.as<float>();
      g.add_mask = s.mask ? dm.as<float>() : nullptr;
      ASSERT_TRUE(Attention(g, t, dout.as<float>(), nullptr).ok());
      Report(s.mask ? (inf ? "attention +mask-inf" : "attention +mask") : "attention",
             absl::StrFormat("L%d S%d h%d/%d d%d c%d", s.L, s.S, s.hq, s.hkv, s.d, s.causal),
             ActName(t), Dl(dout.as<float>(), ref.size()), ref, AttnTol(t));
    }
  }
}

// The split rule of long decode rows (a pure function of shapes and SM count, no GPU): rows
// under 512 keys and grids with more than one block per SM keep the single pass; otherwise
// at most two blocks per SM in all, in splits of at least 256 keys, multiples of 128, at
// most 256 of them, that cover the keys the longest row sees with no empty trailing split.
TEST(AttentionVecKeySplitTest, SplitRule) {
  auto plan = [](int64_t L, int64_t S, int64_t hq, int64_t causal, int sm_count) {
    AttentionParams p;
    p.L = L;
    p.S = S;
    p.hq = hq;
    p.hkv = 1;
    p.causal_offset = causal;
    return AttentionVecKeySplit(p, sm_count);
  };
  // Qwen3-0.6B decode on 132 SMs: 16 heads x 16 splits of 256 keys = 256 blocks <= 264.
  AttentionKeySplit a = plan(1, 4096, 16, 4095, 132);
  EXPECT_EQ(a.splits, 16);
  EXPECT_EQ(a.keys_per_split, 256);
  // 8191 keys: 16 splits of 512, the last of 511 keys.
  a = plan(1, 8191, 16, -1, 132);
  EXPECT_EQ(a.splits, 16);
  EXPECT_EQ(a.keys_per_split, 512);
  // Short rows, and a causal chunk whose longest row sees 301 keys of 100000.
  for (const AttentionKeySplit& one :
       {plan(1, 301, 16, 300, 132), plan(1, 511, 16, -1, 132), plan(1, 100000, 16, 300, 132),
        plan(1, 100000, 264, -1, 132), plan(2, 100000, 132, -1, 132),
        plan(1, 100000, 133, -1, 132)}) {
    EXPECT_EQ(one.splits, 1);
  }
  EXPECT_EQ(plan(1, 511, 16, -1, 132).keys_per_split, 511);
  // One head over 2^20 keys: capped at 256 splits (the combine's limit) of 4096 keys.
  a = plan(1, 1 << 20, 1, -1, 132);
  EXPECT_EQ(a.splits, 256);
  EXPECT_EQ(a.keys_per_split, 4096);
  // Sweep: every split plan covers the visible keys exactly (last split non-empty).
  for (int sm : {20, 48, 132, 170}) {
    for (int64_t hq : {1, 2, 8, 16, 32}) {
      for (int64_t L : {1, 2, 3}) {
        for (int64_t S : {512, 513, 1000, 4096, 4097, 8191, 65537, 1 << 20}) {
          for (int64_t causal : {int64_t{-1}, S - L, S / 2}) {
            const AttentionKeySplit sp = plan(L, S, hq, causal, sm);
            if (sp.splits == 1) continue;
            const int64_t keys = causal >= 0 ? std::min(S, causal + L) : S;
            EXPECT_LE(L * hq * sp.splits, 2 * sm);
            EXPECT_LE(sp.splits, 256);
            EXPECT_GE(sp.keys_per_split, 256);
            EXPECT_EQ(sp.keys_per_split % 128, 0);
            EXPECT_GE(sp.splits * sp.keys_per_split, keys);
            EXPECT_LT((sp.splits - 1) * sp.keys_per_split, keys)
                << "L" << L << " S" << S << " hq" << hq << " causal " << causal << " sm " << sm;
          }
        }
      }
    }
  }
}

// Long GQA decode rows on the batched-key kernel, whose keys are split over blocks
// (AttentionVecKeySplit) and merged by SplitCombineKernel; every case must take the split
// path. mask: 0 none; 1 random values with every third key at bf16's lowest; 2 random values
// with keys [512, 4096) of every row and all keys of head 1 at the lowest (whole splits
// masked, and a row with nothing but masked keys, which the reference averages uniformly).
struct SplitCase {
  int64_t L, S, hq, hkv, d, causal;
  int mask;
};
struct SplitRun {
  std::vector<float> ref, out;
  std::vector<uint16_t> out_bf16;
  int64_t splits = 0;
};
SplitRun RunSplitAttention(const SplitCase& s, cpu::ActDType t, const DeviceInfo& dev,
                           cudaStream_t stream = nullptr) {
  SplitRun r;
  const bool bf = t == cpu::ActDType::kBF16;
  const std::vector<float> q = RandomFloats(s.L * s.hq * s.d, 2001, 1.f, bf);
  const std::vector<float> k = RandomFloats(s.S * s.hkv * s.d, 2002, 1.f, bf);
  const std::vector<float> v = RandomFloats(s.S * s.hkv * s.d, 2003, 1.f, bf);
  std::vector<float> mask;
  constexpr float kLowest = -3.3895313892515355e38f;
  if (s.mask != 0) {
    mask = RandomFloats(s.hq * s.L * s.S, 2004, 2.f, bf);
    for (int64_t h = 0; h < s.hq; ++h) {
      for (int64_t i = 0; i < s.L; ++i) {
        float* row = mask.data() + (h * s.L + i) * s.S;
        for (int64_t j = 0; j < s.S; ++j) {
          const bool low = s.mask == 1 ? j % 3 == 0 : (h == 1 || (j >= 512 && j < 4096));
          if (low) row[j] = kLowest;
        }
      }
    }
  }
  const float scale = 1.f / std::sqrt(static_cast<float>(s.d));
  cpu::AttentionArgs a{q.data(), s.hq * s.d, k.data(), s.hkv * s.d, v.data(), s.hkv * s.d,
                       s.L, s.S, s.hq, s.hkv, s.d, s.d, scale,
                       s.mask != 0 ? mask.data() : nullptr, s.causal};
  r.ref.resize(s.L * s.hq * s.d);
  cpu::Attention(a, t, r.ref.data());
  AttentionParams shape;
  shape.L = s.L;
  shape.S = s.S;
  shape.hq = s.hq;
  shape.hkv = s.hkv;
  shape.causal_offset = s.causal;
  r.splits = AttentionVecKeySplit(shape, dev.sm_count).splits;
  DeviceBuffer dq = UpF(q), dk = UpF(k), dv = UpF(v);
  DeviceBuffer dm = UpF(s.mask != 0 ? mask : std::vector<float>{0.f});
  DeviceBuffer dout = Zeros(r.ref.size()), dbf = Zeros((r.ref.size() + 1) / 2);
  cpu::AttentionArgs g = a;
  g.q = dq.as<float>();
  g.k = dk.as<float>();
  g.v = dv.as<float>();
  g.add_mask = s.mask != 0 ? dm.as<float>() : nullptr;
  if (stream == nullptr) {
    const absl::Status st = Attention(g, t, dout.as<float>(), nullptr, dbf.as<uint16_t>());
    EXPECT_TRUE(st.ok()) << st;
  } else {
    // Captured into a CUDA graph as the backend does, and the graph launched twice. The
    // stream does not wait for the legacy stream's zeroing of the outputs: synchronize.
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaGraphExec_t exec = CaptureGraph(
        stream, [&] { return Attention(g, t, dout.as<float>(), stream, dbf.as<uint16_t>()); });
    if (exec != nullptr) {
      ReplayGraph(exec, stream);
      ReplayGraph(exec, stream);
      cudaGraphExecDestroy(exec);
    }
  }
  r.out = Dl(dout.as<float>(), r.ref.size());
  absl::StatusOr<std::vector<uint16_t>> bits = dbf.ToVector<uint16_t>(r.ref.size());
  EXPECT_TRUE(bits.ok()) << bits.status();
  if (bits.ok()) r.out_bf16 = *std::move(bits);
  return r;
}
std::string SplitShape(const SplitCase& s, int64_t splits) {
  return absl::StrFormat("L%d S%d h%d/%d d%d c%d x%d", s.L, s.S, s.hq, s.hkv, s.d, s.causal,
                         splits);
}
// The bf16 copy holds exactly the bits of the fp32 output (a table row: mismatch count).
void ReportBf16Copy(const std::string& shape, cpu::ActDType t, const SplitRun& r) {
  std::vector<int32_t> got(r.out_bf16.begin(), r.out_bf16.end()), want(r.out.size());
  got.resize(r.out.size());
  for (size_t i = 0; i < r.out.size(); ++i) want[i] = FloatToBf16(r.out[i]);
  ReportExact("attn split bf16 copy", shape, ActName(t), got, want);
}

// y_bf16: the decode GEMV's side copy is the bf16 encoding of every output it writes (a
// next matmul's input), for single problems and for stacked problems with a row stride;
// refused without round_bf16 and on the kernels that have no side copy.
TEST_F(GpuTest, MatmulWritesBf16SideCopy) {
  uint32_t seed = 950;
  for (const FormatCase& f : {FormatCase{{QuantMode::kMxfp4, 4, 32}, DType::kU8},
                              FormatCase{{QuantMode::kAffine, 4, 64}, DType::kBF16}}) {
    for (int64_t m : {1, 2, 5}) {
      for (int64_t problems : {1, 3}) {
        auto w = MakeWeight(f.spec, f.dtype, problems, 96, 256, ++seed);
        ASSERT_NE(w, nullptr);
        const std::vector<float> x = RandomFloats(problems * m * 256, ++seed, 1.f, true);
        const int64_t ystride = m * 96 + 32;  // a gap between problems stays untouched
        absl::StatusOr<DeviceBuffer> dx = DeviceBuffer::FromVector(ToBf16Bits(x));
        absl::StatusOr<DeviceBuffer> db =
            DeviceBuffer::FromVector(std::vector<uint16_t>(problems * ystride, 0xabcd));
        ASSERT_TRUE(dx.ok() && db.ok());
        DeviceBuffer dy = Zeros(problems * ystride);
        QMatmulArgs a;
        a.x = dx->data();
        a.x_dtype = DType::kBF16;
        a.m = m;
        a.y = dy.as<float>();
        a.problems = problems;
        a.x_problem_stride = m * 256;
        a.y_problem_stride = ystride;
        a.round_bf16 = true;
        a.y_bf16 = db->as<uint16_t>();
        const absl::Status st = QMatmulT(w->dev.view, a, nullptr);
        ASSERT_TRUE(st.ok()) << st;
        const std::vector<float> y = Dl(dy.as<float>(), problems * ystride);
        const absl::StatusOr<std::vector<uint16_t>> b = db->ToVector<uint16_t>(problems * ystride);
        ASSERT_TRUE(b.ok()) << b.status();
        int64_t wrong = 0;
        for (int64_t i = 0; i < problems * ystride; ++i) {
          const bool in = i % ystride < m * 96;
          const uint16_t want = in ? static_cast<uint16_t>(std::bit_cast<uint32_t>(y[i]) >> 16) : 0xabcd;
          wrong += (*b)[i] != want;
        }
        EXPECT_EQ(wrong, 0) << w->Mode() << " m" << m << " problems " << problems << " "
                            << KernelOf(*w, a);
      }
    }
  }
  auto w = MakeWeight({QuantMode::kMxfp4, 4, 32}, DType::kU8, 1, 64, 256, 5);
  DeviceBuffer dx = Zeros(16 * 256), dy = Zeros(16 * 64), db = Zeros(16 * 64);
  QMatmulArgs a;
  a.x = dx.data();
  a.x_dtype = DType::kBF16;
  a.y = dy.as<float>();
  a.y_bf16 = reinterpret_cast<uint16_t*>(db.data());
  EXPECT_EQ(QMatmulT(w->dev.view, a, nullptr).code(), absl::StatusCode::kInvalidArgument);  // no rounding
  a.round_bf16 = true;
  a.m = 16;  // the prefill GEMM: no side copy
  EXPECT_EQ(QMatmulT(w->dev.view, a, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

// The bf16 copies the elementwise ops write for the GEMMs after them: SwiGlu's out_bf16 and
// ToBf16, on the 16-byte path (n % 4 == 0, aligned) and the scalar one (n odd, or the input
// one float past an aligned address); every copy must be exactly the fp32 value's bf16 bits.
TEST_F(GpuTest, Bf16CopiesOfElementwiseOutputs) {
  for (int64_t n : {int64_t{2048 * 12}, int64_t{4099}}) {
    for (int64_t skew : {int64_t{0}, int64_t{1}}) {
      const std::vector<float> a = RandomFloats(n + 1, 93, 4.f, false);
      const std::vector<float> b = RandomFloats(n + 1, 94, 2.f, false);
      DeviceBuffer da = UpF(a), db = UpF(b), dout = Zeros(n + 1);
      absl::StatusOr<DeviceBuffer> dbf = DeviceBuffer::Allocate((n + 1) * 2);
      ASSERT_TRUE(dbf.ok()) << dbf.status();
      const std::string shape = absl::StrFormat("%d%s", n, skew ? " +1 float" : "");
      // SwiGlu: fp32 output and its bf16 bits (skew shifts all three arrays).
      ASSERT_TRUE(SwiGlu(DevArray{da.as<float>() + skew, DType::kF32},
                         DevArray{db.as<float>() + skew, DType::kF32}, n, cpu::ActDType::kF32,
                         DevMutArray{dout.as<float>() + skew, DType::kF32}, nullptr,
                         dbf->as<uint16_t>() + skew)
                      .ok());
      std::vector<float> ref(n);
      cpu::SwiGlu(a.data() + skew, b.data() + skew, n, cpu::ActDType::kF32, ref.data());
      const std::vector<float> out = Dl(dout.as<float>(), n + 1);
      Report("swiglu (bf16 copy run)", shape, "fp32",
             std::vector<float>(out.begin() + skew, out.begin() + skew + n), ref, EwTol(cpu::ActDType::kF32));
      absl::StatusOr<std::vector<uint16_t>> bits = dbf->ToVector<uint16_t>(n + 1);
      ASSERT_TRUE(bits.ok()) << bits.status();
      std::vector<int32_t> got(n), want(n);
      for (int64_t i = 0; i < n; ++i) {
        got[i] = (*bits)[i + skew];
        want[i] = FloatToBf16(out[i + skew]);
      }
      ReportExact("swiglu bf16 copy", shape, "fp32", got, want);
      // ToBf16 of the gate input.
      ASSERT_TRUE(ToBf16(da.as<float>() + skew, n, dbf->as<uint16_t>() + skew, nullptr).ok());
      bits = dbf->ToVector<uint16_t>(n + 1);
      ASSERT_TRUE(bits.ok()) << bits.status();
      for (int64_t i = 0; i < n; ++i) {
        got[i] = (*bits)[i + skew];
        want[i] = FloatToBf16(a[i + skew]);
      }
      ReportExact("to_bf16", shape, "fp32", got, want);
    }
  }
}

TEST_F(GpuTest, AttentionGqaSplitKeys) {
  // Qwen3-0.6B-like decode (16 / 8 heads, d 128) over 4096 keys (causal offset S - 1) and
  // 8191 (a ragged last split); d = 64 and d = 256 over ~5000 keys; a causal offset far
  // below S (keys past it unseen, splits over the visible ones only); two query rows; the
  // two masks, on one and two rows.
  using C = SplitCase;
  for (C s : {C{1, 4096, 16, 8, 128, 4095, 0}, C{1, 8191, 16, 8, 128, -1, 0},
              C{1, 5000, 16, 8, 64, -1, 0}, C{1, 4999, 8, 2, 256, 4998, 0},
              C{1, 6000, 16, 8, 128, 3000, 0}, C{2, 4096, 16, 8, 128, 4094, 0},
              C{1, 6000, 16, 8, 128, -1, 1}, C{1, 6000, 16, 8, 128, -1, 2},
              C{2, 5000, 8, 4, 64, 4998, 2}}) {
    for (cpu::ActDType t : kActs) {
      const SplitRun r = RunSplitAttention(s, t, *dev_);
      EXPECT_GT(r.splits, 1) << SplitShape(s, r.splits) << " took the single pass";
      const std::string shape = SplitShape(s, r.splits);
      Report(s.mask != 0 ? absl::StrFormat("attention split +mask%d", s.mask) : "attention split",
             shape, ActName(t), r.out, r.ref, AttnTol(t));
      ReportBf16Copy(shape, t, r);
    }
  }
}

// Two query rows in standard decode order (causal offset S - 2: row 0 sees S - 1 keys) with
// S chosen so the last split holds key S - 1 alone: row 0's last split sees no key and must
// contribute nothing (no NaN from an empty partial).
TEST_F(GpuTest, AttentionGqaSplitKeysEmptySplit) {
  SplitCase s{2, 0, 16, 8, 128, 0, 0};
  for (int64_t S = 4097; S <= 16384 && s.S == 0; ++S) {
    AttentionParams p;
    p.L = s.L;
    p.S = S;
    p.hq = s.hq;
    p.causal_offset = S - 2;
    const AttentionKeySplit sp = AttentionVecKeySplit(p, dev_->sm_count);
    if (sp.splits > 1 && (sp.splits - 1) * sp.keys_per_split == S - 1) s.S = S;
  }
  ASSERT_GT(s.S, 0) << "no key count in [4097, 16384] gives a one-key last split on "
                    << dev_->sm_count << " SMs";
  s.causal = s.S - 2;
  for (cpu::ActDType t : kActs) {
    const SplitRun r = RunSplitAttention(s, t, *dev_);
    Report("attention split empty", SplitShape(s, r.splits), ActName(t), r.out, r.ref,
           AttnTol(t));
  }
}

// The split path repeats bit for bit: the same inputs twice, and once more captured into a
// CUDA graph (stream-ordered scratch inside the capture, the graph launched twice).
TEST_F(GpuTest, AttentionGqaSplitKeysDeterministic) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (SplitCase s : {SplitCase{1, 8191, 16, 8, 128, 8190, 0},
                      SplitCase{2, 6000, 16, 8, 128, -1, 2}}) {
    for (cpu::ActDType t : kActs) {
      const SplitRun a = RunSplitAttention(s, t, *dev_);
      const SplitRun b = RunSplitAttention(s, t, *dev_);
      const SplitRun c = RunSplitAttention(s, t, *dev_, stream);
      EXPECT_GT(a.splits, 1);
      ASSERT_EQ(a.out.size(), b.out.size());
      ASSERT_EQ(a.out.size(), c.out.size());
      int64_t diff_b = 0, diff_c = 0;
      for (size_t i = 0; i < a.out.size(); ++i) {
        diff_b += std::memcmp(&a.out[i], &b.out[i], sizeof(float)) != 0;
        diff_c += std::memcmp(&a.out[i], &c.out[i], sizeof(float)) != 0;
      }
      EXPECT_EQ(diff_b, 0) << SplitShape(s, a.splits) << " " << ActName(t)
                           << ": a second run differs";
      EXPECT_EQ(diff_c, 0) << SplitShape(s, a.splits) << " " << ActName(t)
                           << ": the graph-captured run differs";
      EXPECT_EQ(a.out_bf16, c.out_bf16);
      Report("attention split graph", SplitShape(s, c.splits), ActName(t), c.out, c.ref,
             AttnTol(t));
    }
  }
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// Decode with the key count on the device (AttentionParams::pos_at, what a decode step
// replayed from a CUDA graph runs): a = cpu::AttentionArgs of one row over S keys, S in the
// call only the upper bound fixing the grid. Against the CPU reference at several counts
// under one bound (single pass and split), and one graph captured at the first count and
// replayed at the others equal bit for bit to direct launches with the same bound.
TEST_F(GpuTest, AttentionGqaDevicePos) {
  struct C {
    int64_t bound, hq, hkv, d;
    std::vector<int64_t> counts;
  };
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (const C& c : {C{256, 16, 8, 128, {1, 100, 256}}, C{4096, 16, 8, 128, {300, 2049, 4096}},
                     C{8192, 8, 2, 64, {5000, 8192, 4097}}, C{2048, 8, 4, 256, {1500, 17}}}) {
    AttentionParams shape;
    shape.L = 1;
    shape.S = c.bound;
    shape.hq = c.hq;
    const int64_t splits = AttentionVecKeySplit(shape, dev_->sm_count).splits;
    for (cpu::ActDType t : kActs) {
      const bool bf = t == cpu::ActDType::kBF16;
      const std::vector<float> q = RandomFloats(c.hq * c.d, 2101, 1.f, bf);
      const std::vector<float> k = RandomFloats(c.bound * c.hkv * c.d, 2102, 1.f, bf);
      const std::vector<float> v = RandomFloats(c.bound * c.hkv * c.d, 2103, 1.f, bf);
      DeviceBuffer dq = UpF(q), dk = UpF(k), dv = UpF(v), dpos = Zeros(1);
      DeviceBuffer direct = Zeros(c.hq * c.d), replay = Zeros(c.hq * c.d);
      cpu::AttentionArgs a{q.data(), c.hq * c.d, k.data(), c.hkv * c.d, v.data(), c.hkv * c.d,
                           1, c.bound, c.hq, c.hkv, c.d, c.d,
                           1.f / std::sqrt(static_cast<float>(c.d)), nullptr, -1};
      cpu::AttentionArgs g = a;
      g.q = dq.as<float>();
      g.k = dk.as<float>();
      g.v = dv.as<float>();
      auto set_count = [&](int64_t n) {
        const int32_t pos = static_cast<int32_t>(n - 1);
        EXPECT_EQ(cudaMemcpy(dpos.data(), &pos, 4, cudaMemcpyHostToDevice), cudaSuccess);
      };
      cudaGraphExec_t exec = nullptr;
      for (int64_t n : c.counts) {
        set_count(n);
        const std::string shape_s =
            absl::StrFormat("keys %d of %d h%d/%d d%d x%d", n, c.bound, c.hq, c.hkv, c.d, splits);
        const absl::Status st = Attention(g, t, direct.as<float>(), nullptr, nullptr,
                                          dpos.as<int32_t>());
        ASSERT_TRUE(st.ok()) << st;
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        cpu::AttentionArgs r = a;
        r.S = n;
        std::vector<float> ref(c.hq * c.d);
        cpu::Attention(r, t, ref.data());
        const std::vector<float> got = Dl(direct.as<float>(), ref.size());
        Report("attention device pos", shape_s, ActName(t), got, ref, AttnTol(t));
        if (exec == nullptr) {
          exec = CaptureGraph(stream, [&] {
            return Attention(g, t, replay.as<float>(), stream, nullptr, dpos.as<int32_t>());
          });
        }
        ReplayGraph(exec, stream);
        const std::vector<float> rep = Dl(replay.as<float>(), ref.size());
        EXPECT_EQ(0, std::memcmp(rep.data(), got.data(), got.size() * 4))
            << shape_s << " " << ActName(t) << ": the graph replayed at this count differs";
      }
      if (exec != nullptr) cudaGraphExecDestroy(exec);
    }
  }
  // Refused where the kernel cannot take it: a mask, two rows.
  DeviceBuffer one = Zeros(16 * 128 * 4);
  cpu::AttentionArgs bad{one.as<float>(), 128, one.as<float>(), 128, one.as<float>(), 128,
                         2, 16, 1, 1, 128, 128, 1.f, nullptr, 14};
  EXPECT_EQ(Attention(bad, cpu::ActDType::kF32, one.as<float>(), nullptr, nullptr,
                      one.as<int32_t>()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// MLA core in its four regimes: dense / sparse x expanded (prefill chunk after a cached
// prefix) / absorbed (decode), for mxfp4 and affine embed_q/unembed_out.
// Small dims (expanded and absorbed forms; decode at chunk edges, 32 and 33 keys, and over
// 9000 keys: more than 256 chunks, so two per split and 141 partials to combine), then
// GLM-5.2's latent/rope/head dims with 10 heads (not a multiple of the decode kernel's 8
// heads per block) in decode: sparse over 2048 of 2100 keys, and dense over 5000 keys
// (several 32-key chunks per split); and with GLM-5.2's 64 heads: sparse 2048 of 2100, dense
// at short context (17 and 48 keys: one or two splits, partial chunks) and over 4096 keys.
// cpu::MlaAttention of each row of a prefill chunk as its own decode step (T = 1 at offset + i
// over offset + i + 1 keys: the row's top-k, or all of them when they are at most K): what
// the GPU computes where MlaAttentionAbsorbsRows says so.
std::vector<float> CpuMlaRowsAbsorbed(const cpu::MlaAttentionArgs& a, const QuantWeight& embed_q,
                                      const QuantWeight& unembed_out, cpu::ActDType t) {
  const int64_t qd = a.nope + a.rope;
  std::vector<float> out(a.T * a.H * a.vd);
  for (int64_t i = 0; i < a.T; ++i) {
    cpu::MlaAttentionArgs r = a;
    r.q = a.q + i * a.H * qd;
    r.T = 1;
    r.offset = a.offset + i;
    r.S = r.offset + 1;
    const bool selected = a.topk != nullptr && r.S > a.K;
    r.topk = selected ? a.topk + i * a.K : nullptr;
    r.K = selected ? a.K : 0;
    cpu::MlaAttention(r, embed_q, unembed_out, t, out.data() + i * a.H * a.vd);
  }
  return out;
}

// The reference's two MLA forms round different intermediates (expanded K/V vs q_lat); sparse
// prefill rows computed absorbed stay within this of the expanded form on the harness's
// shapes (measured in docs/correctness.md), far under the whole-model bound of 1e-3.
constexpr double kTolMlaForms = 1e-4;

TEST_F(GpuTest, MlaAttention) {
  struct Dims {
    int64_t H, nope, rope, vd, kvl;
  };
  struct S {
    int64_t T, offset, K;
  };
  uint32_t seed = 1100;
  for (const Dims& dims :
       {Dims{4, 64, 32, 64, 128}, Dims{10, 192, 64, 256, 512}, Dims{64, 192, 64, 256, 512},
        Dims{4, 128, 64, 128, 512}}) {
  const int64_t H = dims.H, nope = dims.nope, rope = dims.rope, vd = dims.vd, kvl = dims.kvl;
  const bool glm = kvl == 512;
  for (const FormatCase& f : {FormatCase{{QuantMode::kMxfp4, 4, 32}, DType::kU8},
                              FormatCase{{QuantMode::kAffine, 4, 64}, DType::kBF16}}) {
    auto embed_q = MakeWeight(f.spec, f.dtype, H, kvl, nope, ++seed);
    auto unembed = MakeWeight(f.spec, f.dtype, H, vd, kvl, ++seed);
    ASSERT_TRUE(embed_q && unembed);
    const std::vector<S> cases =
        H == 64 ? std::vector<S>{S{1, 2099, 2048}, S{1, 16, 0}, S{1, 47, 0}, S{1, 4095, 0},
                                 // a prefill chunk of GLM-5.2's rows, sparse at K = 2048 (bf16:
                                 // absorbed rows), the first rows with at most K keys
                                 S{40, 2100, 2048}, S{40, 2030, 2048}}
        // GLM-5.2's and DeepSeek's dims: prefills take the tensor-core kernel with the rope
        // scores inside it (bf16), dense and sparse, from a cache offset and over several tiles.
        : glm   ? std::vector<S>{S{1, 2099, 2048}, S{1, 4999, 0}, S{24, 150, 0}, S{24, 150, 64},
                                 S{130, 20, 0}, S{70, 100, 96},
                                 // sparse rows with at most K keys (all selected), and a
                                 // chunk of M <= 8 rows (the unembedding's GEMV)
                                 S{130, 20, 96}, S{3, 300, 128}}
                : std::vector<S>{S{6, 4, 0}, S{6, 14, 8}, S{1, 11, 0}, S{1, 23, 8}, S{9, 0, 0},
                                 S{1, 149, 0}, S{1, 299, 200}, S{20, 13, 0}, S{40, 30, 32},
                                 S{1, 31, 0}, S{1, 32, 0}, S{1, 63, 40}, S{1, 8999, 0},
                                 // prefill over several key and row blocks of the pe scores,
                                 // and a longer prompt
                                 S{24, 150, 0}, S{24, 150, 64}, S{130, 20, 0}, S{130, 20, 64}};
    for (S s : cases) {
      for (cpu::ActDType t : kActs) {
        const bool bf = t == cpu::ActDType::kBF16;
        const int64_t T = s.T, Sn = s.offset + s.T, K = s.K;
        const std::vector<float> q = RandomFloats(T * H * (nope + rope), ++seed, 1.f, bf);
        // Latent rows are RMS-normed in the model (unit scale); k_pe after RoPE.
        const std::vector<float> lat = RandomFloats(Sn * kvl, ++seed, 1.f, bf);
        const std::vector<float> kpe = RandomFloats(Sn * rope, ++seed, 1.f, bf);
        std::vector<int32_t> topk;
        if (K > 0) {
          std::mt19937 rng(seed);
          std::uniform_real_distribution<float> u(0.f, 1.f);
          for (int64_t i = 0; i < T; ++i) {
            std::vector<float> sc(Sn);
            for (int64_t j = 0; j < Sn; ++j) sc[j] = (T > 1 && j > s.offset + i) ? -INFINITY : u(rng);
            const std::vector<int32_t> sel = cpu::TopKIndices(sc.data(), Sn, K);
            topk.insert(topk.end(), sel.begin(), sel.end());
          }
        }
        cpu::MlaAttentionArgs a;
        a.q = q.data();
        a.latent = lat.data();
        a.k_pe = kpe.data();
        a.topk = K > 0 ? topk.data() : nullptr;
        a.T = T;
        a.S = Sn;
        a.offset = s.offset;
        a.K = K;
        a.H = H;
        a.nope = nope;
        a.rope = rope;
        a.vd = vd;
        a.kvl = kvl;
        a.scale = 1.f / std::sqrt(static_cast<float>(nope + rope));
        DeviceBuffer dq = UpF(q), dl = UpF(lat), dp = UpF(kpe);
        DeviceBuffer dt = UpI(K > 0 ? topk : std::vector<int32_t>{0});
        cpu::MlaAttentionArgs g = a;
        g.q = dq.as<float>();
        g.latent = dl.as<float>();
        g.k_pe = dp.as<float>();
        g.topk = K > 0 ? dt.as<int32_t>() : nullptr;
        const bool rows_absorbed = MlaAttentionAbsorbsRows(g, t);
        // Where the GPU runs the rows absorbed, its reference is the CPU's decode form of each
        // row; the expanded form (the reference's prefill) is checked against kTolMlaForms on
        // the shapes where the CPU computes it quickly.
        std::vector<float> ref(T * H * vd), expanded;
        if (!rows_absorbed || Sn <= 1200) {
          expanded.resize(ref.size());
          cpu::MlaAttention(a, embed_q->host, unembed->host, t, expanded.data());
        }
        ref = rows_absorbed ? CpuMlaRowsAbsorbed(a, embed_q->host, unembed->host, t) : expanded;
        DeviceBuffer dout = Zeros(ref.size());
        absl::Status st = MlaAttention(g, embed_q->dev.view, unembed->dev.view, t, dout.as<float>(), nullptr);
        ASSERT_TRUE(st.ok()) << st;
        if (t == cpu::ActDType::kBF16) {  // o_proj's bf16 input as a side copy: the same numbers
          DeviceBuffer dout2 = Zeros(ref.size()), dbits = Zeros((ref.size() + 1) / 2);
          st = MlaAttention(g, embed_q->dev.view, unembed->dev.view, t, dout2.as<float>(), nullptr,
                            reinterpret_cast<uint16_t*>(dbits.data()));
          ASSERT_TRUE(st.ok()) << st;
          const std::vector<float> o2 = Dl(dout2.as<float>(), ref.size());
          const absl::StatusOr<std::vector<uint16_t>> bits = dbits.ToVector<uint16_t>(ref.size());
          ASSERT_TRUE(bits.ok()) << bits.status();
          int64_t wrong = 0;
          for (size_t i = 0; i < o2.size(); ++i) {
            wrong += (*bits)[i] != static_cast<uint16_t>(std::bit_cast<uint32_t>(o2[i]) >> 16);
          }
          EXPECT_EQ(wrong, 0) << "T" << T << " K" << K;
          EXPECT_EQ(std::memcmp(o2.data(), Dl(dout.as<float>(), ref.size()).data(), o2.size() * 4), 0);
        }
        const std::string shape = absl::StrFormat("T%d @%d K%d h%d", T, s.offset, K, H);
        const std::string mode = absl::StrCat(embed_q->Mode(), " ", ActName(t));
        Report(absl::StrFormat("mla %s %s", T > 1 && !rows_absorbed ? "expanded" : "absorbed",
                               K > 0 ? "sparse" : "dense"),
               shape, mode, Dl(dout.as<float>(), ref.size()), ref, AttnTol(t) * kMlaFactor);
        if (rows_absorbed && !expanded.empty()) {
          Report("mla absorbed rows vs expanded", shape, mode, Dl(dout.as<float>(), ref.size()),
                 expanded, kTolMlaForms);
        }
      }
    }
  }
  }
}

// Absorbed decode with the key count on the device (what a graph-replayed step runs), at
// GLM-5.2's dims: dense and sparse rows at several counts under one bound against the CPU,
// and a graph captured at the first count and replayed at the others equal to direct launches.
TEST_F(GpuTest, MlaAttentionDevicePos) {
  const int64_t H = 64, nope = 192, rope = 64, vd = 256, kvl = 512;
  uint32_t seed = 1700;
  auto embed_q = MakeWeight({QuantMode::kMxfp4, 4, 32}, DType::kU8, H, kvl, nope, ++seed);
  auto unembed = MakeWeight({QuantMode::kMxfp4, 4, 32}, DType::kU8, H, vd, kvl, ++seed);
  ASSERT_TRUE(embed_q && unembed);
  struct S {
    int64_t bound, K;
    std::vector<int64_t> counts;
  };
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (const S& s : {S{2048, 0, {300, 2048, 17}}, S{4096, 2048, {2101, 4096, 3000}}}) {
    for (cpu::ActDType t : kActs) {
      const bool bf = t == cpu::ActDType::kBF16;
      const std::vector<float> q = RandomFloats(H * (nope + rope), ++seed, 1.f, bf);
      const std::vector<float> lat = RandomFloats(s.bound * kvl, ++seed, 1.f, bf);
      const std::vector<float> kpe = RandomFloats(s.bound * rope, ++seed, 1.f, bf);
      DeviceBuffer dq = UpF(q), dl = UpF(lat), dp = UpF(kpe), dpos = Zeros(1);
      DeviceBuffer dt = Zeros(std::max<int64_t>(s.K, 1));
      DeviceBuffer direct = Zeros(H * vd), replay = Zeros(H * vd);
      cpu::MlaAttentionArgs a;
      a.q = q.data();
      a.latent = lat.data();
      a.k_pe = kpe.data();
      a.T = 1;
      a.K = s.K;
      a.H = H;
      a.nope = nope;
      a.rope = rope;
      a.vd = vd;
      a.kvl = kvl;
      a.scale = 1.f / std::sqrt(static_cast<float>(nope + rope));
      cpu::MlaAttentionArgs g = a;
      g.q = dq.as<float>();
      g.latent = dl.as<float>();
      g.k_pe = dp.as<float>();
      g.topk = s.K > 0 ? dt.as<int32_t>() : nullptr;
      g.S = s.bound;
      g.offset = s.bound - 1;
      ASSERT_TRUE(MlaAttentionTakesDevicePos(g));
      // The replay runs on the caller's scratch, the direct launches on their own
      // allocations: the same bits either way.
      const int64_t scratch_bytes = MlaAttentionScratchBytes(g, t);
      ASSERT_GT(scratch_bytes, 0);
      DeviceBuffer scratch = Zeros((scratch_bytes + 3) / 4);
      cudaGraphExec_t exec = nullptr;
      for (int64_t n : s.counts) {
        const int32_t pos = static_cast<int32_t>(n - 1);
        ASSERT_EQ(cudaMemcpy(dpos.data(), &pos, 4, cudaMemcpyHostToDevice), cudaSuccess);
        std::vector<int32_t> topk;
        if (s.K > 0) {
          std::mt19937 rng(seed + n);
          std::uniform_real_distribution<float> u(0.f, 1.f);
          std::vector<float> sc(n);
          for (float& v : sc) v = u(rng);
          topk = cpu::TopKIndices(sc.data(), n, s.K);
          ASSERT_EQ(cudaMemcpy(dt.data(), topk.data(), topk.size() * 4, cudaMemcpyHostToDevice),
                    cudaSuccess);
        }
        cpu::MlaAttentionArgs r = a;
        r.S = n;
        r.offset = n - 1;
        r.topk = s.K > 0 ? topk.data() : nullptr;
        std::vector<float> ref(H * vd);
        cpu::MlaAttention(r, embed_q->host, unembed->host, t, ref.data());
        const absl::Status st = MlaAttention(g, embed_q->dev.view, unembed->dev.view, t,
                                             direct.as<float>(), nullptr, nullptr, dpos.as<int32_t>());
        ASSERT_TRUE(st.ok()) << st;
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::string shape = absl::StrFormat("keys %d of %d K%d h%d", n, s.bound, s.K, H);
        const std::vector<float> got = Dl(direct.as<float>(), ref.size());
        Report(absl::StrFormat("mla absorbed %s device pos", s.K > 0 ? "sparse" : "dense"), shape,
               absl::StrCat(embed_q->Mode(), " ", ActName(t)), got, ref, AttnTol(t) * kMlaFactor);
        if (exec == nullptr) {
          exec = CaptureGraph(stream, [&] {
            return MlaAttention(g, embed_q->dev.view, unembed->dev.view, t, replay.as<float>(),
                                stream, nullptr, dpos.as<int32_t>(), scratch.data());
          });
        }
        ReplayGraph(exec, stream);
        const std::vector<float> rep = Dl(replay.as<float>(), ref.size());
        EXPECT_EQ(0, std::memcmp(rep.data(), got.data(), got.size() * 4))
            << shape << " " << ActName(t) << ": the graph replayed at this count differs";
      }
      if (exec != nullptr) cudaGraphExecDestroy(exec);
    }
  }
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// Top-k selection: random values with many ties (few levels), +-0, -inf tails; must be the
// exact set cpu::TopKIndices returns.
TEST_F(GpuTest, TopKRows) {
  struct S {
    int64_t rows, n, k, levels;
  };
  // Decode rows (2049..2112 of k 2048), long rows, and one past the shared-memory cache
  // (70000 keys; ~56k fit on an H200). Rows of 4096 keys or more, up to 16 of them, take
  // a cluster a row (TopKRowsClusterKernel; sm_90+): k = n, k = 1, ties across the
  // blocks' slices (2 levels), a length off the cluster size; 17 rows keep the one-block
  // kernel on long rows, cached and not, and a row whose cache is under 48 KB but not with
  // the kernel's static arrays (AllowDynamicSmem; it failed to launch).
  for (S s : {S{3, 100, 10, 0}, S{4, 5000, 2048, 0}, S{2, 3000, 64, 7}, S{5, 257, 256, 3},
              S{1, 70000, 2048, 50}, S{2, 16, 16, 0}, S{1, 2049, 2048, 0}, S{1, 2112, 2048, 5},
              S{1, 40000, 2048, 0}, S{1, 100000, 2048, 0},
              S{2, 8192, 2048, 9}, S{2, 8193, 4000, 0}, S{1, 4096, 4096, 0}, S{1, 9001, 1, 0},
              S{1, 30003, 2048, 2}, S{16, 16384, 2048, 0}, S{17, 5000, 2048, 0},
              S{17, 70000, 2048, 50}, S{17, 11800, 2048, 0}}) {
    std::mt19937 rng(1200 + s.n);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> x(s.rows * s.n);
    for (float& v : x) {
      v = s.levels > 0 ? static_cast<float>(static_cast<int>(nd(rng) * s.levels / 3)) : RoundBf16(nd(rng));
      if (v == 0.f && (rng() & 1)) v = -0.f;
    }
    for (int64_t i = 0; i < s.n; i += 5) x[i] = -INFINITY;  // masked keys in row 0
    std::vector<int32_t> ref;
    for (int64_t r = 0; r < s.rows; ++r) {
      const std::vector<int32_t> sel = cpu::TopKIndices(x.data() + r * s.n, s.n, s.k);
      ref.insert(ref.end(), sel.begin(), sel.end());
    }
    DeviceBuffer dx = UpF(x);
    absl::StatusOr<DeviceBuffer> dout = DeviceBuffer::Allocate(ref.size() * 4);
    ASSERT_TRUE(dout.ok());
    ASSERT_TRUE(TopKRows(dx.as<float>(), s.rows, s.n, s.k, dout->as<int32_t>(), nullptr).ok());
    ReportExact("topk rows", absl::StrFormat("%dx%d k%d", s.rows, s.n, s.k),
                s.levels > 0 ? absl::StrFormat("%d levels (ties)", s.levels) : "bf16 values",
                DlI(dout->as<int32_t>(), ref.size()), ref);
  }
}

// The DSA indexer: q and k take values n/4 with |n| <= 8 so every dot product is exact in
// fp32 whatever the summation order; the selected sets must then be identical.
TEST_F(GpuTest, IndexerTopK) {
  struct S {
    int64_t T, offset, heads, dim, K;
  };
  // 64 heads (DeepSeek-V3.2's indexer) and 40; dim 320: past the prefill score kernel's key
  // registers (kKeyRegs), so the keys are read from memory per head. Decode rows (T = 1,
  // IndexerScoresDecodeKernel): GLM-5.2's 32 x 128 over 2064 keys, a partial last block of
  // keys, and 40 x 320 (its shared memory past 48 KB). Prefill rows with bf16 activations and
  // 16 / 32 / 64 heads of 128 dims (IndexerScoresMmaKernel): several blocks with a partial
  // last one, rows that see fewer than K keys (offset 0), key tiles past a block's causal
  // limit, a key count off the 64-key tile.
  for (S s : {S{1, 299, 4, 32, 64}, S{5, 60, 8, 64, 16}, S{7, 0, 4, 32, 4},
              S{2, 4999, 32, 128, 2048}, S{3, 2045, 32, 128, 2048}, S{1, 3000, 64, 128, 2048},
              S{2, 300, 40, 320, 64}, S{1, 2063, 32, 128, 2048}, S{1, 700, 40, 320, 64},
              S{37, 100, 64, 128, 64}, S{130, 0, 32, 128, 32}, S{9, 500, 16, 128, 128},
              S{301, 2000, 32, 128, 2048}}) {
    for (cpu::ActDType t : kActs) {
      const int64_t Sn = s.offset + s.T;
      std::mt19937 rng(1300 + Sn);
      std::uniform_int_distribution<int> u(-8, 8);
      std::vector<float> q(s.T * s.heads * s.dim), k(Sn * s.dim);
      for (float& v : q) v = u(rng) / 4.f;
      for (float& v : k) v = u(rng) / 4.f;
      const std::vector<float> w = RandomFloats(s.T * s.heads, 1301, 0.1f, true);
      cpu::IndexerArgs a;
      a.q = q.data();
      a.keys = k.data();
      a.w = w.data();
      a.T = s.T;
      a.S = Sn;
      a.offset = s.offset;
      a.heads = s.heads;
      a.dim = s.dim;
      a.K = s.K;
      std::vector<int32_t> ref(s.T * s.K);
      cpu::IndexerTopK(a, t, ref.data());
      DeviceBuffer dq = UpF(q), dk = UpF(k), dw = UpF(w);
      absl::StatusOr<DeviceBuffer> dout = DeviceBuffer::Allocate(ref.size() * 4);
      ASSERT_TRUE(dout.ok());
      cpu::IndexerArgs g = a;
      g.q = dq.as<float>();
      g.keys = dk.as<float>();
      g.w = dw.as<float>();
      absl::Status st = IndexerTopK(g, t, dout->as<int32_t>(), nullptr);
      ASSERT_TRUE(st.ok()) << st;
      ReportExact("indexer topk", absl::StrFormat("T%d S%d h%d d%d K%d", s.T, Sn, s.heads, s.dim, s.K),
                  ActName(t), DlI(dout->as<int32_t>(), ref.size()), ref);
    }
  }
}

// The decode row with the key count on the device (what a graph-replayed step runs): ids
// exactly the CPU's at several counts under one bound, and a graph captured at the first
// count and replayed at the others equal to them.
TEST_F(GpuTest, IndexerTopKDevicePos) {
  struct S {
    int64_t bound, heads, dim, K;
    std::vector<int64_t> counts;
  };
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (const S& s : {S{4096, 32, 128, 2048, {2049, 2101, 4096, 3001}},
                     S{1024, 40, 320, 64, {700, 65, 1024}},
                     S{32768, 32, 128, 2048, {16385, 32768, 20001}}}) {
    for (cpu::ActDType t : kActs) {
      std::mt19937 rng(1310 + s.bound);
      std::uniform_int_distribution<int> u(-8, 8);
      std::vector<float> q(s.heads * s.dim), k(s.bound * s.dim);
      for (float& v : q) v = u(rng) / 4.f;
      for (float& v : k) v = u(rng) / 4.f;
      const std::vector<float> w = RandomFloats(s.heads, 1311, 0.1f, true);
      DeviceBuffer dq = UpF(q), dk = UpF(k), dw = UpF(w), dpos = Zeros(1);
      DeviceBuffer direct = Zeros(s.K), replay = Zeros(s.K);
      cpu::IndexerArgs a;
      a.q = q.data();
      a.keys = k.data();
      a.w = w.data();
      a.T = 1;
      a.heads = s.heads;
      a.dim = s.dim;
      a.K = s.K;
      cpu::IndexerArgs g = a;
      g.q = dq.as<float>();
      g.keys = dk.as<float>();
      g.w = dw.as<float>();
      g.S = s.bound;
      g.offset = s.bound - 1;
      ASSERT_TRUE(IndexerTakesDevicePos(g));
      // The replay's scores in the caller's scratch, the direct launches' in their own.
      DeviceBuffer scratch = Zeros(IndexerTopKScratchBytes(g) / 4);
      cudaGraphExec_t exec = nullptr;
      for (int64_t n : s.counts) {
        const int32_t pos = static_cast<int32_t>(n - 1);
        ASSERT_EQ(cudaMemcpy(dpos.data(), &pos, 4, cudaMemcpyHostToDevice), cudaSuccess);
        cpu::IndexerArgs r = a;
        r.S = n;
        r.offset = n - 1;
        std::vector<int32_t> ref(s.K);
        cpu::IndexerTopK(r, t, ref.data());
        const absl::Status st = IndexerTopK(g, t, direct.as<int32_t>(), nullptr, dpos.as<int32_t>());
        ASSERT_TRUE(st.ok()) << st;
        const std::string shape =
            absl::StrFormat("keys %d of %d h%d d%d K%d", n, s.bound, s.heads, s.dim, s.K);
        const std::vector<int32_t> got = DlI(direct.as<int32_t>(), ref.size());
        ReportExact("indexer topk device pos", shape, ActName(t), got, ref);
        if (exec == nullptr) {
          exec = CaptureGraph(stream, [&] {
            return IndexerTopK(g, t, replay.as<int32_t>(), stream, dpos.as<int32_t>(),
                               scratch.data());
          });
        }
        ReplayGraph(exec, stream);
        EXPECT_EQ(DlI(replay.as<int32_t>(), ref.size()), got) << shape << ": the graph replay differs";
      }
      if (exec != nullptr) cudaGraphExecDestroy(exec);
    }
  }
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// A decode row's indexer and MLA in one call (IndexedMlaDecode: MLA's query projection on a
// side stream beside the indexer) against IndexerTopK then MlaAttention on one stream: the
// same ids and the same output bits (fp32 and its bf16 copy), eagerly and replayed from a
// graph captured at the first key count, with the side stream also delayed by 2 ms
// (TEST_SetSideStreamDelayNs), so that an attention not joined to the side stream would read
// the previous row's q_lat. Each count gets new queries. Refused where it does not apply.
TEST_F(GpuTest, IndexedMlaDecodeSideStream) {
  const int64_t nope = 192, rope = 64, vd = 256, kvl = 512, ih = 32, id = 128, K = 2048, bound = 4096;
  uint32_t seed = 1750;
  cudaStream_t st = nullptr;
  SideStream side;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&side.stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&side.fork, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&side.join, cudaEventDisableTiming), cudaSuccess);
  for (const int64_t H : {int64_t{64}, int64_t{10}}) {
    auto embed_q = MakeWeight({QuantMode::kMxfp4, 4, 32}, DType::kU8, H, kvl, nope, ++seed);
    auto unembed = MakeWeight({QuantMode::kMxfp4, 4, 32}, DType::kU8, H, vd, kvl, ++seed);
    ASSERT_TRUE(embed_q && unembed);
    for (cpu::ActDType t : kActs) {
      const bool bf = t == cpu::ActDType::kBF16;
      const std::vector<float> lat = RandomFloats(bound * kvl, ++seed, 1.f, bf);
      const std::vector<float> kpe = RandomFloats(bound * rope, ++seed, 1.f, bf);
      const std::vector<float> keys = RandomFloats(bound * id, ++seed, 1.f, bf);
      const std::vector<float> w = RandomFloats(ih, ++seed, 0.1f, true);
      DeviceBuffer dq = Zeros(H * (nope + rope)), dix_q = Zeros(ih * id), dl = UpF(lat), dp = UpF(kpe),
                   dk = UpF(keys), dw = UpF(w), dpos = Zeros(1);
      DeviceBuffer want_ids = Zeros(K), got_ids = Zeros(K), want = Zeros(H * vd), got = Zeros(H * vd);
      DeviceBuffer want_b = Zeros(H * vd / 2), got_b = Zeros(H * vd / 2);
      cpu::IndexerArgs ix;
      ix.q = dix_q.as<float>();
      ix.keys = dk.as<float>();
      ix.w = dw.as<float>();
      ix.T = 1;
      ix.S = bound;
      ix.offset = bound - 1;
      ix.heads = ih;
      ix.dim = id;
      ix.K = K;
      cpu::MlaAttentionArgs a;
      a.latent = dl.as<float>();
      a.k_pe = dp.as<float>();
      a.T = 1;
      a.S = bound;
      a.offset = bound - 1;
      a.K = K;
      a.H = H;
      a.nope = nope;
      a.rope = rope;
      a.vd = vd;
      a.kvl = kvl;
      a.scale = 1.f / std::sqrt(static_cast<float>(nope + rope));
      a.q = dq.as<float>();
      cpu::MlaAttentionArgs ref_a = a, got_a = a;
      ref_a.topk = want_ids.as<int32_t>();
      got_a.topk = got_ids.as<int32_t>();
      ASSERT_TRUE(IndexedMlaDecodeApplies(got_a));
      DeviceBuffer ix_scratch = Zeros(IndexerTopKScratchBytes(ix) / 4);
      DeviceBuffer scratch = Zeros((MlaAttentionScratchBytes(got_a, t) + 3) / 4);
      uint16_t* const gb = bf ? got_b.as<uint16_t>() : nullptr;
      auto joint = [&] {
        return IndexedMlaDecode(ix, got_ids.as<int32_t>(), ix_scratch.data(), got_a, embed_q->dev.view,
                                unembed->dev.view, t, got.as<float>(), st, gb, dpos.as<int32_t>(),
                                scratch.data(), side);
      };
      cudaGraphExec_t exec = nullptr;
      for (const int64_t n : {int64_t{2101}, int64_t{4096}, int64_t{3000}}) {
        // 0: eager; 1: eager, side delayed; 2: replayed from a graph captured with the delay.
        for (int run = 0; run < 3; ++run) {
          // New queries for this row, then the reference: the two ops on one stream.
          const std::vector<float> q = RandomFloats(H * (nope + rope), ++seed, 1.f, bf);
          const std::vector<float> iq = RandomFloats(ih * id, ++seed, 1.f, bf);
          const int32_t pos = static_cast<int32_t>(n - 1);
          ASSERT_EQ(cudaMemcpy(dq.data(), q.data(), q.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
          ASSERT_EQ(cudaMemcpy(dix_q.data(), iq.data(), iq.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
          ASSERT_EQ(cudaMemcpy(dpos.data(), &pos, 4, cudaMemcpyHostToDevice), cudaSuccess);
          ASSERT_TRUE(IndexerTopK(ix, t, want_ids.as<int32_t>(), st, dpos.as<int32_t>()).ok());
          ASSERT_TRUE(MlaAttention(ref_a, embed_q->dev.view, unembed->dev.view, t, want.as<float>(), st,
                                   bf ? want_b.as<uint16_t>() : nullptr, dpos.as<int32_t>())
                          .ok());
          ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
          TEST_SetSideStreamDelayNs(run > 0 ? 2000000 : 0);
          if (run < 2) {
            ASSERT_TRUE(joint().ok());
          } else {
            if (exec == nullptr) exec = CaptureGraph(st, joint);
            ASSERT_NE(exec, nullptr);
            ReplayGraph(exec, st);
          }
          ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
          TEST_SetSideStreamDelayNs(0);
          const std::string shape = absl::StrFormat("keys %d of %d K%d h%d", n, bound, K, H);
          const std::string how = absl::StrCat(ActName(t), run < 2 ? " eager" : " graph",
                                               run > 0 ? ", side delayed" : "");
          ReportExact("indexed mla decode ids", shape, how, DlI(got_ids.as<int32_t>(), K),
                      DlI(want_ids.as<int32_t>(), K));
          const std::vector<float> g = Dl(got.as<float>(), H * vd), r = Dl(want.as<float>(), H * vd);
          const bool finite = std::all_of(r.begin(), r.end(), [](float v) { return std::isfinite(v); }) &&
                              std::any_of(r.begin(), r.end(), [](float v) { return v != 0.f; });
          bool same = finite && std::memcmp(g.data(), r.data(), g.size() * 4) == 0;
          if (bf) {  // the bf16 copies' bits
            const std::vector<float> gb2 = Dl(got_b.as<float>(), H * vd / 2), rb2 = Dl(want_b.as<float>(), H * vd / 2);
            same = same && std::memcmp(gb2.data(), rb2.data(), gb2.size() * 4) == 0;
          }
          ReportExact("indexed mla decode out", shape, how, {same ? 0 : 1}, {0});
        }
      }
      if (exec != nullptr) cudaGraphExecDestroy(exec);
      // Refused, nothing launched: no scratch, MLA not reading the indexer's ids, another K.
      EXPECT_EQ(IndexedMlaDecode(ix, got_ids.as<int32_t>(), nullptr, got_a, embed_q->dev.view, unembed->dev.view,
                                 t, got.as<float>(), st, gb, dpos.as<int32_t>(), scratch.data(), side)
                    .code(),
                absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(IndexedMlaDecode(ix, want_ids.as<int32_t>(), ix_scratch.data(), got_a, embed_q->dev.view,
                                 unembed->dev.view, t, got.as<float>(), st, gb, dpos.as<int32_t>(),
                                 scratch.data(), side)
                    .code(),
                absl::StatusCode::kInvalidArgument);
      cpu::IndexerArgs other = ix;
      other.K = K / 2;
      EXPECT_EQ(IndexedMlaDecode(other, got_ids.as<int32_t>(), ix_scratch.data(), got_a, embed_q->dev.view,
                                 unembed->dev.view, t, got.as<float>(), st, gb, dpos.as<int32_t>(),
                                 scratch.data(), side)
                    .code(),
                absl::StatusCode::kInvalidArgument);
    }
  }
  cudaEventDestroy(side.fork);
  cudaEventDestroy(side.join);
  cudaStreamDestroy(side.stream);
  cudaStreamDestroy(st);
}

TEST_F(GpuTest, MoeRouting) {
  // DeepSeek / GLM: sigmoid + bias, group-limited for n_group > 1.
  struct D {
    int64_t E, k, ng, tg;
    bool norm;
    float scale;
  };
  // n_group 1 runs the two-round rank kernel: E not a multiple of a warp, and k above a
  // warp's 32 (every expert a candidate).
  for (D d : {D{16, 4, 4, 2, true, 2.5f}, D{256, 8, 1, 1, true, 2.5f}, D{256, 8, 8, 4, true, 2.5f},
              D{8, 2, 1, 1, false, 1.f}, D{64, 6, 8, 3, true, 16.f}, D{512, 8, 1, 1, true, 2.5f},
              D{100, 6, 1, 1, true, 1.f}, D{96, 40, 1, 1, false, 1.f}}) {
    const int64_t T = 37;
    const std::vector<float> logits = RandomFloats(T * d.E, 1400 + d.E, 2.f, true);
    const std::vector<float> bias = RandomFloats(d.E, 1401, 0.3f, false);
    cpu::SigmoidRouting r{d.E, d.k, d.ng, d.tg, d.norm, d.scale};
    std::vector<int32_t> ids(T * d.k);
    std::vector<float> w(T * d.k);
    cpu::RouteSigmoid(logits.data(), bias.data(), T, r, ids.data(), w.data());
    DeviceBuffer dl = UpF(logits), db = UpF(bias), di = Zeros(ids.size()), dw = Zeros(w.size());
    ASSERT_TRUE(RouteSigmoid(dl.as<float>(), db.as<float>(), T, r, di.as<int32_t>(), dw.as<float>(), nullptr).ok());
    const std::string shape = absl::StrFormat("T%d E%d k%d g%d/%d", T, d.E, d.k, d.ng, d.tg);
    ReportExact("route sigmoid ids", shape, d.norm ? "norm" : "no norm", DlI(di.as<int32_t>(), ids.size()), ids);
    Report("route sigmoid weights", shape, d.norm ? "norm" : "no norm", Dl(dw.as<float>(), w.size()), w,
           kTolRouteWeights);
  }
  // Ties: equal scores everywhere but a few experts, so the k-th place is a tie that the
  // lowest index wins (across lanes and warps), at T = 1 and 5; at T = 3 seven leaders sit
  // in one warp and the 8th place is a tie of three experts in three other warps.
  for (int64_t T : {int64_t{1}, int64_t{5}, int64_t{3}}) {
    const int64_t E = 256, k = 8;
    std::vector<float> logits(T * E, 0.25f), bias(E, 0.f);
    for (int64_t t = 0; t < T; ++t) {
      if (T == 3) {
        for (int64_t e = 96; e < 128; e += 5) logits[t * E + e] = 1.5f;  // 7 leaders in warp 3
        for (int64_t e : {int64_t{250}, int64_t{40 + t}, int64_t{130}}) logits[t * E + e] = 1.f;
        continue;
      }
      for (int64_t e : {int64_t{200}, int64_t{37}, int64_t{255}, int64_t{64 + t}}) logits[t * E + e] = 1.5f;
    }
    cpu::SigmoidRouting r{E, k, 1, 1, true, 2.5f};
    std::vector<int32_t> ids(T * k);
    std::vector<float> w(T * k);
    cpu::RouteSigmoid(logits.data(), bias.data(), T, r, ids.data(), w.data());
    DeviceBuffer dl = UpF(logits), db = UpF(bias), di = Zeros(ids.size()), dw = Zeros(w.size());
    ASSERT_TRUE(RouteSigmoid(dl.as<float>(), db.as<float>(), T, r, di.as<int32_t>(), dw.as<float>(), nullptr).ok());
    const std::string shape = absl::StrFormat("T%d E%d k%d ties", T, E, k);
    ReportExact("route sigmoid ids", shape, "norm", DlI(di.as<int32_t>(), ids.size()), ids);
    Report("route sigmoid weights", shape, "norm", Dl(dw.as<float>(), w.size()), w, kTolRouteWeights);
  }
  // Qwen3-MoE: softmax top-k.
  struct Q {
    int64_t E, k;
    bool norm;
  };
  for (Q qc : {Q{128, 8, true}, Q{8, 2, false}, Q{16, 4, true}, Q{60, 4, true}}) {
    for (cpu::ActDType t : kActs) {
      const int64_t T = 29;
      const std::vector<float> gates = RandomFloats(T * qc.E, 1500 + qc.E, 2.f, t == cpu::ActDType::kBF16);
      std::vector<int32_t> ids(T * qc.k);
      std::vector<float> sc(T * qc.k);
      cpu::RouteSoftmax(gates.data(), T, qc.E, qc.k, qc.norm, t, ids.data(), sc.data());
      DeviceBuffer dg = UpF(gates), di = Zeros(ids.size()), ds = Zeros(sc.size());
      ASSERT_TRUE(RouteSoftmax(dg.as<float>(), T, qc.E, qc.k, qc.norm, t, di.as<int32_t>(), ds.as<float>(), nullptr).ok());
      const std::string shape = absl::StrFormat("T%d E%d k%d", T, qc.E, qc.k);
      const std::string mode = absl::StrCat(qc.norm ? "norm " : "no norm ", ActName(t));
      ReportExact("route softmax ids", shape, mode, DlI(di.as<int32_t>(), ids.size()), ids);
      Report("route softmax scores", shape, mode, Dl(ds.as<float>(), sc.size()), sc,
             t == cpu::ActDType::kBF16 ? kTolEwBf16 : kTolRouteWeights);
    }
  }
}

// Stacked gate/up [E, inter, hidden] and down [E, hidden, inter] (three seeds from `seed`).
struct Experts {
  std::unique_ptr<TestWeight> gate, up, down;
};
Experts MakeExperts(const FormatCase& f, int64_t E, int64_t hidden, int64_t inter,
                    uint32_t& seed) {
  Experts x;
  x.gate = MakeWeight(f.spec, f.dtype, E, inter, hidden, ++seed);
  x.up = MakeWeight(f.spec, f.dtype, E, inter, hidden, ++seed);
  x.down = MakeWeight(f.spec, f.dtype, E, hidden, inter, ++seed);
  return x;
}

// The decode GEMV with SwiGLU fused into its output (QMatmulTSwiGlu): the same bits, f32 and
// bf16 copy, as QMatmulTMany (gate, up) + SwiGlu, and within the bf16 elementwise tolerance
// of the CPU (cpu::SwiGlu over the reference products rounded to bf16). mxfp4 and 4-bit
// affine (groups 32 / 64 / 128 with bf16 scales, 64 with fp16): single matrices with row and
// K tails at m = 1 and 2, a lm_head-wide row, and stacked experts with ids (one out of range:
// NaN rows in both) plus the shared expert as alt problems. Refused with FailedPrecondition
// (nothing written) where it does not apply: 8-bit affine, m = 3, gate and up of different
// rows, no round_bf16.
TEST_F(GpuTest, SwiGluGemvMatchesSeparateLaunches) {
  if (!dev_->mma_bf16_subnormals) GTEST_SKIP() << "no mxfp4 column split on this device";
  const QuantSpec mx{QuantMode::kMxfp4, 4, 32};
  uint32_t seed = 9100;
  struct Case {
    int64_t E, rows, cols, m, T, k;  // E > 1: T tokens x k slots + T shared-expert problems
  };
  int fused_cases = 0;
  const FormatCase formats[] = {{mx, DType::kU8},
                                {{QuantMode::kAffine, 4, 32}, DType::kBF16},
                                {{QuantMode::kAffine, 4, 64}, DType::kBF16},
                                {{QuantMode::kAffine, 4, 128}, DType::kBF16},
                                {{QuantMode::kAffine, 4, 64}, DType::kF16}};
  for (const FormatCase& f : formats) {
    for (const Case c : {Case{1, 72, 2944, 1, 1, 1}, Case{1, 72, 2944, 2, 1, 1}, Case{1, 264, 6144, 1, 1, 1},
                         Case{1, 40, 12352, 2, 1, 1}, Case{8, 136, 1024, 1, 2, 3}}) {
      if (c.cols % f.spec.group_size != 0) continue;
      auto gate = MakeWeight(f.spec, f.dtype, c.E, c.rows, c.cols, ++seed);
      auto up = MakeWeight(f.spec, f.dtype, c.E, c.rows, c.cols, ++seed);
      auto sg = MakeWeight(f.spec, f.dtype, 1, c.rows, c.cols, ++seed);
      auto su = MakeWeight(f.spec, f.dtype, 1, c.rows, c.cols, ++seed);
      ASSERT_TRUE(gate && up && sg && su);
      const bool experts = c.E > 1;
      const int64_t xrows = experts ? c.T : c.m;
      const int64_t problems = experts ? c.T * c.k + c.T : 1;
      const std::vector<float> x = RandomFloats(xrows * c.cols, ++seed);
      absl::StatusOr<DeviceBuffer> dx = DeviceBuffer::FromVector(ToBf16Bits(x));
      ASSERT_TRUE(dx.ok()) << dx.status();
      std::vector<int32_t> ids;
      for (int64_t s = 0; s < c.T * c.k; ++s) ids.push_back(static_cast<int32_t>((3 * s + 1) % c.E));
      if (experts) ids[4] = 99;  // out of range: NaN rows
      DeviceBuffer di = UpI(ids.empty() ? std::vector<int32_t>{0} : ids);
      QMatmulArgs a;
      a.x = dx->data();
      a.x_dtype = DType::kBF16;
      a.m = c.m;
      a.round_bf16 = true;
      if (experts) {
        a.problems = problems;
        a.expert_ids = di.as<int32_t>();
        a.x_problem_stride = c.cols;
        a.x_problem_div = c.k;
        a.y_problem_stride = c.rows;
        a.alt_problems = c.T;
        a.alt[0] = &sg->dev.view;
        a.alt[1] = &su->dev.view;
      }
      const size_t n = static_cast<size_t>(problems * c.m * c.rows);
      DeviceBuffer fy = Zeros(n), fb = Zeros((n + 1) / 2), g = Zeros(n), u = Zeros(n), sy = Zeros(n),
                   sb = Zeros((n + 1) / 2);
      QMatmulArgs f = a;
      f.y = fy.as<float>();
      f.y_bf16 = reinterpret_cast<uint16_t*>(fb.data());
      const absl::StatusOr<std::string> desc = DescribeQmmSwiGlu(gate->dev.view, up->dev.view, f);
      ASSERT_TRUE(desc.ok()) << desc.status();
      EXPECT_NE(desc->find(" swiglu"), std::string::npos) << *desc;
      ASSERT_TRUE(QMatmulTSwiGlu(gate->dev.view, up->dev.view, f, nullptr).ok());
      const DeviceQuantWeight* gu[] = {&gate->dev.view, &up->dev.view};
      float* gu_out[] = {g.as<float>(), u.as<float>()};
      ASSERT_TRUE(QMatmulTMany(gu, gu_out, a, nullptr).ok());
      ASSERT_TRUE(SwiGlu(DevArray{g.data(), DType::kF32}, DevArray{u.data(), DType::kF32}, static_cast<int64_t>(n),
                         cpu::ActDType::kBF16, DevMutArray{sy.data(), DType::kF32}, nullptr,
                         reinterpret_cast<uint16_t*>(sb.data()))
                      .ok());
      const std::vector<float> fused = Dl(fy.as<float>(), n), separate = Dl(sy.as<float>(), n);
      const std::vector<float> fused_b = Dl(fb.as<float>(), (n + 1) / 2), separate_b = Dl(sb.as<float>(), (n + 1) / 2);
      const std::string shape = absl::StrFormat("M%d %s%s", c.m, gate->Shape(), experts ? " experts+shared" : "");
      EXPECT_EQ(0, std::memcmp(fused.data(), separate.data(), n * 4)) << shape << ": f32 output differs";
      EXPECT_EQ(0, std::memcmp(fused_b.data(), separate_b.data(), n * 2)) << shape << ": bf16 copy differs";
      ++fused_cases;
      if (experts) {
        int64_t nan_rows = 0;
        for (int64_t r = 0; r < c.rows; ++r) nan_rows += std::isnan(fused[4 * c.rows + r]);
        EXPECT_EQ(nan_rows, c.rows) << "a bad expert id must give NaN rows";
        continue;
      }
      // Against the CPU: products rounded to bf16, then cpu::SwiGlu.
      std::vector<float> rg = CpuMatmulT(*gate, x, c.m), ru = CpuMatmulT(*up, x, c.m), ref(n);
      for (float& v : rg) v = cpu::RoundAct(v, cpu::ActDType::kBF16);
      for (float& v : ru) v = cpu::RoundAct(v, cpu::ActDType::kBF16);
      cpu::SwiGlu(rg.data(), ru.data(), static_cast<int64_t>(n), cpu::ActDType::kBF16, ref.data());
      Report("qmm_t swiglu[gemv] x=BF16", shape, gate->Mode(), fused, ref, kTolEwBf16, c.rows);
    }
  }
  EXPECT_GT(fused_cases, 0);
  // Refusals: nothing launched, FailedPrecondition.
  auto g1 = MakeWeight(mx, DType::kU8, 1, 64, 1024, ++seed);
  auto u2 = MakeWeight(mx, DType::kU8, 1, 128, 1024, ++seed);
  auto ag = MakeWeight(QuantSpec{QuantMode::kAffine, 8, 64}, DType::kBF16, 1, 64, 1024, ++seed);
  auto au = MakeWeight(QuantSpec{QuantMode::kAffine, 8, 64}, DType::kBF16, 1, 64, 1024, ++seed);
  ASSERT_TRUE(g1 && u2 && ag && au);
  QMatmulArgs r;
  r.x_dtype = DType::kBF16;
  r.m = 1;
  r.round_bf16 = true;
  EXPECT_EQ(DescribeQmmSwiGlu(g1->dev.view, u2->dev.view, r).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(DescribeQmmSwiGlu(ag->dev.view, au->dev.view, r).status().code(), absl::StatusCode::kFailedPrecondition);
  QMatmulArgs r3 = r;
  r3.m = 3;
  EXPECT_EQ(DescribeQmmSwiGlu(g1->dev.view, g1->dev.view, r3).status().code(), absl::StatusCode::kFailedPrecondition);
  QMatmulArgs rn = r;
  rn.round_bf16 = false;
  EXPECT_EQ(DescribeQmmSwiGlu(g1->dev.view, g1->dev.view, rn).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(DescribeQmmSwiGlu(g1->dev.view, g1->dev.view, r).ok());
}

// The selected experts of every token in one gathered launch per matrix, then the combine.
TEST_F(GpuTest, MoeExpertsAndCombine) {
  const int64_t E = 8, hidden = 128, inter = 64, T = 5, k = 3;
  uint32_t seed = 1600;
  for (const FormatCase& f : {FormatCase{{QuantMode::kMxfp4, 4, 32}, DType::kU8},
                              FormatCase{{QuantMode::kAffine, 4, 64}, DType::kBF16},
                              FormatCase{{QuantMode::kAffine, 8, 64}, DType::kBF16}}) {
    auto [gate, up, down] = MakeExperts(f, E, hidden, inter, seed);
    ASSERT_TRUE(gate && up && down);
    std::vector<int32_t> ids;
    std::mt19937 rng(seed);
    for (int64_t r = 0; r < T; ++r) {
      std::vector<int32_t> all(E);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      std::sort(all.begin(), all.begin() + k);
      ids.insert(ids.end(), all.begin(), all.begin() + k);
    }
    for (cpu::ActDType t : kActs) {
      const bool bf = t == cpu::ActDType::kBF16;
      const std::vector<float> x = RandomFloats(T * hidden, ++seed, 1.f, bf);
      std::vector<float> ref(T * k * hidden);
      cpu::ExpertsSwiGlu(gate->host, up->host, down->host, x.data(), T, ids.data(), k, t, ref.data());
      DeviceBuffer dx = UpF(x), di = UpI(ids), dy = Zeros(ref.size());
      absl::Status st = ExpertsSwiGlu(gate->dev.view, up->dev.view, down->dev.view, dx.as<float>(), T,
                                      di.as<int32_t>(), k, t, dy.as<float>(), nullptr);
      ASSERT_TRUE(st.ok()) << st;
      const std::vector<float> got = Dl(dy.as<float>(), ref.size());
      Report("moe experts swiglu", absl::StrFormat("T%d k%d of %dx%dx%d", T, k, E, inter, hidden),
             absl::StrCat(gate->Mode(), " ", ActName(t)), got, ref, bf ? kTolEwBf16 : kTolMatmul, hidden);
      if (bf) {  // x's bf16 copy handed in (the CUDA backend's reuse): the same bits
        DeviceBuffer xb = Zeros((x.size() + 1) / 2), dy2 = Zeros(ref.size());
        ASSERT_TRUE(ToBf16(dx.as<float>(), T * hidden, xb.as<uint16_t>(), nullptr).ok());
        st = ExpertsSwiGlu(gate->dev.view, up->dev.view, down->dev.view, dx.as<float>(), T,
                           di.as<int32_t>(), k, t, dy2.as<float>(), nullptr, ExpertsPath::kAuto,
                           xb.as<uint16_t>());
        ASSERT_TRUE(st.ok()) << st;
        const std::vector<float> got2 = Dl(dy2.as<float>(), ref.size());
        EXPECT_EQ(std::memcmp(got2.data(), got.data(), got.size() * sizeof(float)), 0) << gate->Mode();
        // The caller's scratch instead of stream-ordered allocations: the same bits.
        const size_t sb = ExpertsScratchBytes(gate->dev.view, up->dev.view, down->dev.view, T, k, t);
        ASSERT_GT(sb, 0u);
        absl::StatusOr<DeviceBuffer> scratch = DeviceBuffer::Allocate(sb);
        ASSERT_TRUE(scratch.ok()) << scratch.status();
        DeviceBuffer dy3 = Zeros(ref.size());
        st = ExpertsSwiGlu(gate->dev.view, up->dev.view, down->dev.view, dx.as<float>(), T,
                           di.as<int32_t>(), k, t, dy3.as<float>(), nullptr, ExpertsPath::kAuto,
                           xb.as<uint16_t>(), nullptr, scratch->data());
        ASSERT_TRUE(st.ok()) << st;
        EXPECT_EQ(std::memcmp(Dl(dy3.as<float>(), ref.size()).data(), got.data(), got.size() * sizeof(float)), 0)
            << gate->Mode() << " with scratch";
        Report("moe experts swiglu x-bf16", absl::StrFormat("T%d k%d of %dx%dx%d", T, k, E, inter, hidden),
               absl::StrCat(gate->Mode(), " ", ActName(t)), got2, ref, kTolEwBf16, hidden);
      }
      // The shared expert as T more problems of the same launches (ExpertsTakeShared: bf16
      // only); reference: the routed rows, then the shared MLP as one expert per token.
      auto sg = MakeWeight(f.spec, f.dtype, 1, inter, hidden, ++seed);
      auto su = MakeWeight(f.spec, f.dtype, 1, inter, hidden, ++seed);
      auto sd = MakeWeight(f.spec, f.dtype, 1, hidden, inter, ++seed);
      ASSERT_TRUE(sg && su && sd);
      const SharedExpertWeights sh{&sg->dev.view, &su->dev.view, &sd->dev.view};
      // Formats the decode GEMV runs (mxfp4, affine 4-bit) take it; fp32 activations and
      // formats on the exact SIMT kernels (affine 8-bit) do not, and are refused if forced.
      const bool takes = ExpertsTakeShared(gate->dev.view, up->dev.view, down->dev.view, sh, T, k, t);
      EXPECT_EQ(takes, bf && f.spec.bits == 4) << gate->Mode() << " " << ActName(t);
      if (!takes) {
        DeviceBuffer dj = Zeros(ref.size() + T * hidden);
        EXPECT_EQ(ExpertsSwiGlu(gate->dev.view, up->dev.view, down->dev.view, dx.as<float>(), T,
                                di.as<int32_t>(), k, t, dj.as<float>(), nullptr, ExpertsPath::kAuto,
                                nullptr, &sh)
                      .code(),
                  absl::StatusCode::kInvalidArgument);
      } else {
        std::vector<float> sref(T * hidden);
        const std::vector<int32_t> zeros(T, 0);
        cpu::ExpertsSwiGlu(sg->host, su->host, sd->host, x.data(), T, zeros.data(), 1, t, sref.data());
        std::vector<float> jref = ref;
        jref.insert(jref.end(), sref.begin(), sref.end());
        DeviceBuffer dj = Zeros(jref.size());
        st = ExpertsSwiGlu(gate->dev.view, up->dev.view, down->dev.view, dx.as<float>(), T,
                           di.as<int32_t>(), k, t, dj.as<float>(), nullptr, ExpertsPath::kAuto,
                           nullptr, &sh);
        ASSERT_TRUE(st.ok()) << st;
        {  // with the caller's scratch: the same bits
          absl::StatusOr<DeviceBuffer> scratch = DeviceBuffer::Allocate(
              ExpertsScratchBytes(gate->dev.view, up->dev.view, down->dev.view, T, k, t, ExpertsPath::kAuto, true));
          ASSERT_TRUE(scratch.ok()) << scratch.status();
          DeviceBuffer dj2 = Zeros(jref.size());
          ASSERT_TRUE(ExpertsSwiGlu(gate->dev.view, up->dev.view, down->dev.view, dx.as<float>(), T,
                                    di.as<int32_t>(), k, t, dj2.as<float>(), nullptr, ExpertsPath::kAuto,
                                    nullptr, &sh, scratch->data())
                          .ok());
          EXPECT_EQ(std::memcmp(Dl(dj2.as<float>(), jref.size()).data(), Dl(dj.as<float>(), jref.size()).data(),
                                jref.size() * sizeof(float)),
                    0)
              << gate->Mode() << " +shared with scratch";
        }
        Report("moe experts swiglu +shared", absl::StrFormat("T%d k%d+1 of %dx%dx%d", T, k, E, inter, hidden),
               absl::StrCat(gate->Mode(), " ", ActName(t)), Dl(dj.as<float>(), jref.size()), jref,
               kTolEwBf16, hidden);
        // A shared expert of another shape does not ride along (and is refused if forced).
        auto wrong = MakeWeight(f.spec, f.dtype, 1, 2 * inter, hidden, ++seed);
        const SharedExpertWeights bad{&wrong->dev.view, &su->dev.view, &sd->dev.view};
        EXPECT_FALSE(ExpertsTakeShared(gate->dev.view, up->dev.view, down->dev.view, bad, T, k, t));
        EXPECT_EQ(ExpertsSwiGlu(gate->dev.view, up->dev.view, down->dev.view, dx.as<float>(), T,
                                di.as<int32_t>(), k, t, dj.as<float>(), nullptr, ExpertsPath::kAuto,
                                nullptr, &bad)
                      .code(),
                  absl::StatusCode::kInvalidArgument);
      }
      // Combine on the reference's expert outputs (both modes, with and without shared).
      const std::vector<float> w = RandomFloats(T * k, ++seed, 0.5f, false);
      const std::vector<float> shared = RandomFloats(T * hidden, ++seed, 1.f, bf);
      for (cpu::CombineMode mode : {cpu::CombineMode::kFp32Sum, cpu::CombineMode::kRoundedProducts}) {
        const bool with_shared = mode == cpu::CombineMode::kFp32Sum;
        std::vector<float> cref(T * hidden);
        cpu::MoeCombine(ref.data(), w.data(), with_shared ? shared.data() : nullptr, T, k, hidden, mode, t,
                        cref.data());
        DeviceBuffer dr = UpF(ref), dw = UpF(w), ds = UpF(shared), dout = Zeros(cref.size());
        ASSERT_TRUE(MoeCombine(dr.as<float>(), dw.as<float>(), with_shared ? ds.as<float>() : nullptr, T, k,
                               hidden, mode, t, dout.as<float>(), nullptr)
                        .ok());
        Report(with_shared ? "moe combine fp32 +shared" : "moe combine rounded",
               absl::StrFormat("T%d k%d h%d", T, k, hidden), ActName(t), Dl(dout.as<float>(), cref.size()),
               cref, EwTol(t));
      }
    }
  }
}

// The whole MoE block (MoeBlock): with the shared expert on a side stream and without one,
// eagerly and replayed from a CUDA graph, the same bits as the block's ops launched one after
// another on one stream (each op is checked against the CPU above). Every run gets new
// activations and the side stream is also delayed by 2 ms before the shared expert
// (TEST_SetSideStreamDelayNs), so that a combine not joined to the side stream would read a
// previous run's shared rows, or none. Refused where it does not apply.
void CheckMoeBlock(const FormatCase& f, int64_t E, int64_t k, int64_t hidden, int64_t inter,
                   const cpu::SigmoidRouting& r, std::initializer_list<int64_t> tokens,
                   uint32_t seed, bool fused_router) {
  auto [gate, up, down] = MakeExperts(f, E, hidden, inter, seed);
  auto sg = MakeWeight(f.spec, f.dtype, 1, inter, hidden, ++seed);
  auto su = MakeWeight(f.spec, f.dtype, 1, inter, hidden, ++seed);
  auto sd = MakeWeight(f.spec, f.dtype, 1, hidden, inter, ++seed);
  auto router = MakeWeight({QuantMode::kNone, 0, 0}, DType::kBF16, 1, E, hidden, ++seed);
  ASSERT_TRUE(gate && up && down && sg && su && sd && router);
  const auto bf16 = cpu::ActDType::kBF16;
  const std::string mode = gate->Mode();
  cudaStream_t st = nullptr;
  SideStream side;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&side.stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&side.fork, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&side.join, cudaEventDisableTiming), cudaSuccess);
  DeviceBuffer bias = UpF(RandomFloats(E, ++seed, 0.3f, false));
  DeviceBuffer ticket = Zeros(1);
  for (const int64_t T : tokens) {
    const std::string shape = absl::StrFormat("T%d k%d of %dx%dx%d +shared%s", T, k, E, inter, hidden,
                                              fused_router ? ", fused router" : "");
    DeviceBuffer dx = Zeros(T * hidden), xb = Zeros(T * hidden), out = Zeros(T * hidden);
    DeviceBuffer logits = Zeros(T * E), ids = Zeros(T * k), wts = Zeros(T * k),
                 y = Zeros(T * k * hidden), ys = Zeros(T * hidden), g = Zeros(T * inter),
                 u = Zeros(T * inter), gb = Zeros(T * inter), want = Zeros(T * hidden);
    MoeBlockArgs a;
    a.router = &router->dev.view;
    a.bias = bias.as<float>();
    a.routing = r;
    a.gate = &gate->dev.view;
    a.up = &up->dev.view;
    a.down = &down->dev.view;
    a.shared = SharedExpertWeights{&sg->dev.view, &su->dev.view, &sd->dev.view};
    a.x = dx.as<float>();
    a.x_bf16 = xb.as<uint16_t>();
    a.T = T;
    a.router_overlap = 2;  // scheduling only: the composed ops below launch without PDL
    a.out = out.as<float>();
    a.router_ticket = fused_router ? ticket.as<unsigned>() : nullptr;
    ASSERT_TRUE(MoeBlockApplies(a)) << mode << " " << shape;
    if (fused_router) {
      ASSERT_TRUE(RouterRouteApplies(router->dev.view, r, T)) << shape;
    }
    absl::StatusOr<DeviceBuffer> scratch = DeviceBuffer::Allocate(MoeBlockScratchBytes(a));
    ASSERT_TRUE(scratch.ok()) << scratch.status();
    void* const sp = scratch->data();
    // New activations, then the reference: the block's ops one after another on `st`.
    auto next_x = [&]() -> absl::Status {
      const std::vector<float> x = RandomFloats(T * hidden, ++seed, 1.f, true);
      RING_CUDA_RETURN_IF_ERROR(cudaMemcpy(dx.data(), x.data(), x.size() * 4, cudaMemcpyHostToDevice));
      RING_RETURN_IF_ERROR(ToBf16(dx.as<float>(), T * hidden, xb.as<uint16_t>(), st));
      QMatmulArgs ra;
      ra.x = xb.data();
      ra.x_dtype = DType::kBF16;
      ra.m = T;
      ra.round_bf16 = true;
      ra.y = logits.as<float>();
      if (fused_router) {
        RING_RETURN_IF_ERROR(RouterRoute(router->dev.view, xb.as<uint16_t>(), T, bias.as<float>(), r,
                                         logits.as<float>(), ids.as<int32_t>(), wts.as<float>(),
                                         ticket.as<unsigned>(), st));
      } else {
        RING_RETURN_IF_ERROR(QMatmulT(router->dev.view, ra, st));
        RING_RETURN_IF_ERROR(RouteSigmoid(logits.as<float>(), bias.as<float>(), T, r, ids.as<int32_t>(),
                                          wts.as<float>(), st));
      }
      RING_RETURN_IF_ERROR(ExpertsSwiGlu(gate->dev.view, up->dev.view, down->dev.view, dx.as<float>(), T,
                                         ids.as<int32_t>(), k, bf16, y.as<float>(), st,
                                         ExpertsPath::kPerSlot, xb.as<uint16_t>()));
      // The shared expert as LinearSwiGlu (or LinearMany and SwiGlu) and Linear launch it.
      QMatmulArgs q = ra;
      q.y = g.as<float>();
      q.y_bf16 = gb.as<uint16_t>();
      const absl::Status fused = QMatmulTSwiGlu(sg->dev.view, su->dev.view, q, st);
      if (absl::IsFailedPrecondition(fused)) {
        const DeviceQuantWeight* gu[] = {&sg->dev.view, &su->dev.view};
        float* gu_out[] = {g.as<float>(), u.as<float>()};
        q.y_bf16 = nullptr;
        RING_RETURN_IF_ERROR(QMatmulTMany(gu, gu_out, q, st));
        RING_RETURN_IF_ERROR(SwiGlu(DevArray{g.data(), DType::kF32}, DevArray{u.data(), DType::kF32}, T * inter,
                                    bf16, DevMutArray{g.data(), DType::kF32}, st, gb.as<uint16_t>()));
      } else {
        RING_RETURN_IF_ERROR(fused);
      }
      QMatmulArgs d = ra;
      d.x = gb.data();
      d.y = ys.as<float>();
      RING_RETURN_IF_ERROR(QMatmulT(sd->dev.view, d, st));
      RING_RETURN_IF_ERROR(MoeCombine(y.as<float>(), wts.as<float>(), ys.as<float>(), T, k, hidden,
                                      cpu::CombineMode::kFp32Sum, bf16, want.as<float>(), st));
      RING_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(st));
      return absl::OkStatus();
    };
    auto check = [&](const char* how) {
      EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
      const std::vector<float> got = Dl(out.as<float>(), T * hidden), ref = Dl(want.as<float>(), T * hidden);
      const bool same = std::memcmp(got.data(), ref.data(), got.size() * 4) == 0;
      const bool finite = std::all_of(ref.begin(), ref.end(), [](float v) { return std::isfinite(v); }) &&
                          std::any_of(ref.begin(), ref.end(), [](float v) { return v != 0.f; });
      ReportExact("moe block", shape, absl::StrCat(mode, " ", how), {same && finite ? 0 : 1}, {0});
    };
    for (const int64_t delay : {int64_t{0}, int64_t{2000000}}) {
      TEST_SetSideStreamDelayNs(delay);
      const char* d = delay > 0 ? ", side delayed" : "";
      ASSERT_TRUE(next_x().ok());
      ASSERT_TRUE(MoeBlock(a, sp, st, nullptr).ok());
      check(absl::StrCat("one stream", d).c_str());
      ASSERT_TRUE(next_x().ok());
      ASSERT_TRUE(MoeBlock(a, sp, st, &side).ok());
      check(absl::StrCat("side stream", d).c_str());
      // Captured once, replayed on two sets of activations.
      cudaGraphExec_t exec = CaptureGraph(st, [&] { return MoeBlock(a, sp, st, &side); });
      ASSERT_NE(exec, nullptr);
      for (int rep = 0; rep < 2; ++rep) {
        ASSERT_TRUE(next_x().ok());
        ReplayGraph(exec, st);
        check(absl::StrCat("side stream, graph", d).c_str());
      }
      cudaGraphExecDestroy(exec);
    }
    TEST_SetSideStreamDelayNs(0);
  }
  // Refused (nothing launched): too many tokens, a shared expert of another shape.
  MoeBlockArgs bad;
  bad.router = &router->dev.view;
  bad.routing = r;
  bad.gate = &gate->dev.view;
  bad.up = &up->dev.view;
  bad.down = &down->dev.view;
  bad.shared = SharedExpertWeights{&sg->dev.view, &su->dev.view, &sd->dev.view};
  DeviceBuffer dx = Zeros(9 * hidden), out = Zeros(9 * hidden);
  bad.bias = bias.as<float>();
  bad.x = dx.as<float>();
  bad.x_bf16 = reinterpret_cast<const uint16_t*>(dx.data());
  bad.out = out.as<float>();
  bad.T = 9;
  DeviceBuffer some = Zeros(1 << 20);
  EXPECT_EQ(MoeBlockScratchBytes(bad), 0u);
  EXPECT_EQ(MoeBlock(bad, some.data(), st, &side).code(), absl::StatusCode::kInvalidArgument);
  bad.T = 1;
  ASSERT_TRUE(MoeBlockApplies(bad));
  EXPECT_EQ(MoeBlock(bad, nullptr, st, &side).code(), absl::StatusCode::kInvalidArgument);
  auto wrong = MakeWeight(f.spec, f.dtype, 1, 2 * inter, hidden, ++seed);
  bad.shared.gate = &wrong->dev.view;
  EXPECT_FALSE(MoeBlockApplies(bad));
  EXPECT_EQ(MoeBlock(bad, some.data(), st, &side).code(), absl::StatusCode::kInvalidArgument);
  cudaEventDestroy(side.fork);
  cudaEventDestroy(side.join);
  cudaStreamDestroy(side.stream);
  cudaStreamDestroy(st);
}

TEST_F(GpuTest, MoeBlockSideStream) {
  for (const FormatCase& f : {FormatCase{{QuantMode::kMxfp4, 4, 32}, DType::kU8},
                              FormatCase{{QuantMode::kAffine, 4, 64}, DType::kBF16}}) {
    SCOPED_TRACE(f.spec.ToString());
    CheckMoeBlock(f, 16, 4, 512, 256, cpu::SigmoidRouting{16, 4, 4, 2, true, 2.5f}, {1, 2, 5, 8}, 7100,
                  false);
    CheckMoeBlock(f, 16, 4, 512, 256, cpu::SigmoidRouting{16, 4, 1, 1, true, 2.5f}, {1, 2, 5, 8}, 7150,
                  true);
  }
  // Formats off the decode GEMV's tensor cores are refused.
  auto g = MakeWeight({QuantMode::kAffine, 8, 64}, DType::kBF16, 4, 64, 128, 7190);
  auto s = MakeWeight({QuantMode::kAffine, 8, 64}, DType::kBF16, 1, 64, 128, 7191);
  auto sdn = MakeWeight({QuantMode::kAffine, 8, 64}, DType::kBF16, 1, 128, 64, 7192);
  auto dn = MakeWeight({QuantMode::kAffine, 8, 64}, DType::kBF16, 4, 128, 64, 7193);
  auto router = MakeWeight({QuantMode::kNone, 0, 0}, DType::kBF16, 1, 4, 128, 7194);
  ASSERT_TRUE(g && s && sdn && dn && router);
  DeviceBuffer buf = Zeros(1024);
  MoeBlockArgs a;
  a.router = &router->dev.view;
  a.bias = buf.as<float>();
  a.routing = cpu::SigmoidRouting{4, 2, 1, 1, true, 1.f};
  a.gate = a.up = &g->dev.view;
  a.down = &dn->dev.view;
  a.shared = SharedExpertWeights{&s->dev.view, &s->dev.view, &sdn->dev.view};
  a.x = buf.as<float>();
  a.x_bf16 = reinterpret_cast<const uint16_t*>(buf.data());
  a.out = buf.as<float>();
  a.T = 1;
  EXPECT_FALSE(MoeBlockApplies(a));
}

TEST_F(GpuTest, MoeBlockSideStreamGlm52Shapes) {
  if (!FullRun()) GTEST_SKIP() << "set RING_GPU_FULL=1 for the GLM-5.2 MoE block";
  // GLM-5.2's expert, shared-expert and router shapes (16 of its 256 experts), k = 8.
  for (const bool fused : {false, true}) {
    CheckMoeBlock(FormatCase{{QuantMode::kMxfp4, 4, 32}, DType::kU8}, 16, 8, 6144, 2048,
                  cpu::SigmoidRouting{16, 8, 1, 1, true, 2.5f}, {1, 2}, 7200, fused);
  }
}

// The router GEMV and the routing in one launch (RouterRoute): logits within the GEMV
// tolerance of the CPU's (bf16 weights and rows, fp32 sums rounded to bf16), and ids and
// weights exactly what RouteSigmoid makes of those logits; eagerly and replayed from a graph
// (each launch must leave its ticket zero for the next). GLM-5.2's router (256 x 6144, k 8)
// at 1, 2 and 8 tokens, an expert count off the warp size and odd (one row in the last
// block), rows shorter than a block's vectors, ties. Refused where it does not apply.
TEST_F(GpuTest, RouterRoute) {
  struct C {
    int64_t E, k, hidden, T;
    bool ties;
  };
  cudaStream_t st = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  uint32_t seed = 7300;
  for (const C& c : {C{256, 8, 6144, 1, false}, C{256, 8, 6144, 2, false}, C{256, 8, 6144, 8, false},
                     C{97, 6, 4096, 5, false}, C{16, 4, 512, 3, false}, C{512, 8, 2048, 1, false},
                     C{256, 8, 1024, 2, true}}) {
    auto router = MakeWeight({QuantMode::kNone, 0, 0}, DType::kBF16, 1, c.E, c.hidden, ++seed);
    ASSERT_TRUE(router);
    const cpu::SigmoidRouting r{c.E, c.k, 1, 1, true, 2.5f};
    ASSERT_TRUE(RouterRouteApplies(router->dev.view, r, c.T));
    std::vector<float> x = RandomFloats(c.T * c.hidden, ++seed, 1.f, true);
    if (c.ties) std::fill(x.begin(), x.end(), 0.f);  // every logit 0: the lowest ids win
    const std::vector<float> bias = RandomFloats(c.E, ++seed, c.ties ? 0.f : 0.3f, false);
    const std::vector<uint16_t> xb = ToBf16Bits(x);
    DeviceBuffer dx = Zeros((xb.size() + 1) / 2), db = UpF(bias), ticket = Zeros(1);
    ASSERT_EQ(cudaMemcpy(dx.data(), xb.data(), xb.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    DeviceBuffer logits = Zeros(c.T * c.E), ids = Zeros(c.T * c.k), wts = Zeros(c.T * c.k);
    DeviceBuffer want_ids = Zeros(c.T * c.k), want_wts = Zeros(c.T * c.k);
    auto launch = [&] {
      return RouterRoute(router->dev.view, dx.as<uint16_t>(), c.T, db.as<float>(), r, logits.as<float>(),
                         ids.as<int32_t>(), wts.as<float>(), ticket.as<unsigned>(), st);
    };
    // CPU logits: fp32 dot products of the bf16 values, rounded to bf16.
    std::vector<float> ref(c.T * c.E);
    const std::vector<float> wf = FromBf16Bits(std::vector<uint16_t>(
        reinterpret_cast<const uint16_t*>(router->wbytes.data()),
        reinterpret_cast<const uint16_t*>(router->wbytes.data()) + c.E * c.hidden));
    for (int64_t t = 0; t < c.T; ++t) {
      for (int64_t e = 0; e < c.E; ++e) {
        float acc = 0.f;
        for (int64_t i = 0; i < c.hidden; ++i) acc += x[t * c.hidden + i] * wf[e * c.hidden + i];
        ref[t * c.E + e] = RoundBf16(acc);
      }
    }
    const std::string shape = absl::StrFormat("T%d E%d k%d h%d%s", c.T, c.E, c.k, c.hidden, c.ties ? " ties" : "");
    cudaGraphExec_t exec = nullptr;
    for (int run = 0; run < 3; ++run) {  // eager, then a graph replayed twice
      ASSERT_EQ(cudaMemset(logits.data(), 0xff, c.T * c.E * 4), cudaSuccess);
      ASSERT_EQ(cudaMemset(ids.data(), 0xff, c.T * c.k * 4), cudaSuccess);
      if (run == 0) {
        ASSERT_TRUE(launch().ok());
      } else {
        if (exec == nullptr) exec = CaptureGraph(st, launch);
        ASSERT_NE(exec, nullptr);
        ReplayGraph(exec, st);
      }
      ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
      const char* how = run == 0 ? "eager" : "graph";
      const std::vector<float> got = Dl(logits.as<float>(), ref.size());
      Report("router+route logits", shape, how, got, ref, kTolMatmul);
      ASSERT_TRUE(RouteSigmoid(logits.as<float>(), db.as<float>(), c.T, r, want_ids.as<int32_t>(),
                               want_wts.as<float>(), st).ok());
      ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
      ReportExact("router+route ids", shape, how, DlI(ids.as<int32_t>(), c.T * c.k),
                  DlI(want_ids.as<int32_t>(), c.T * c.k));
      const std::vector<float> gw = Dl(wts.as<float>(), c.T * c.k), ww = Dl(want_wts.as<float>(), c.T * c.k);
      ReportExact("router+route weights", shape, how,
                  {std::memcmp(gw.data(), ww.data(), gw.size() * 4) == 0 ? 0 : 1}, {0});
      ReportExact("router+route ticket", shape, how, DlI(ticket.as<int32_t>(), 1), {0});
    }
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (c.ties) {
      std::vector<int32_t> lowest;
      for (int64_t t = 0; t < c.T; ++t)
        for (int64_t e = 0; e < c.k; ++e) lowest.push_back(static_cast<int32_t>(e));
      ReportExact("router+route ids", shape, "ties: lowest ids", DlI(ids.as<int32_t>(), c.T * c.k), lowest);
    }
  }
  // Refused: groups, too many tokens, a quantized router, rows too long, no ticket.
  auto router = MakeWeight({QuantMode::kNone, 0, 0}, DType::kBF16, 1, 16, 512, 7390);
  auto q = MakeWeight({QuantMode::kMxfp4, 4, 32}, DType::kU8, 1, 16, 512, 7391);
  auto wide = MakeWeight({QuantMode::kNone, 0, 0}, DType::kBF16, 1, 16, 16416, 7392);
  ASSERT_TRUE(router && q && wide);
  const cpu::SigmoidRouting r{16, 4, 1, 1, true, 1.f};
  EXPECT_TRUE(RouterRouteApplies(router->dev.view, r, 8));
  EXPECT_FALSE(RouterRouteApplies(router->dev.view, cpu::SigmoidRouting{16, 4, 4, 2, true, 1.f}, 1));
  EXPECT_FALSE(RouterRouteApplies(router->dev.view, r, 9));
  EXPECT_FALSE(RouterRouteApplies(q->dev.view, r, 1));
  EXPECT_FALSE(RouterRouteApplies(wide->dev.view, r, 1));  // 16416 > 8 * 4 * 512 (a block's bound)
  DeviceBuffer buf = Zeros(4096);
  EXPECT_EQ(RouterRoute(router->dev.view, buf.as<uint16_t>(), 1, buf.as<float>(), r, buf.as<float>(),
                        buf.as<int32_t>(), buf.as<float>(), nullptr, st)
                .code(),
            absl::StatusCode::kInvalidArgument);
  cudaStreamDestroy(st);
}

// ---- grouped experts (prefill) ----------------------------------------------------------
// Routing patterns for the grouped path: ids [T, k], each token's k experts distinct.
enum class Routing { kRandom, kUnbalanced, kSomeEmpty, kOneTakesAll, kBadId };
const char* RoutingName(Routing r) {
  switch (r) {
    case Routing::kRandom: return "random";
    case Routing::kUnbalanced: return "unbalanced";
    case Routing::kSomeEmpty: return "some experts empty";
    case Routing::kOneTakesAll: return "one expert takes all";
    case Routing::kBadId: return "one id out of range";
  }
  return "?";
}
std::vector<int32_t> RouteIds(Routing r, int64_t T, int64_t k, int64_t E, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> pool(E);
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
    if (r == Routing::kUnbalanced || r == Routing::kOneTakesAll) {
      // Expert 0 in (unbalanced: 3 of 4) every token's set; the rest random.
      if (r == Routing::kOneTakesAll || t % 4 != 0) {
        std::iter_swap(pool.begin(), std::find(pool.begin(), pool.end(), 0));
      }
    } else if (r == Routing::kSomeEmpty) {
      // Only the first k + 2 experts of a fixed odd-numbered set are ever chosen.
      std::vector<int32_t> used;
      for (int32_t e = 1; e < E && static_cast<int64_t>(used.size()) < k + 2; e += 2) used.push_back(e);
      std::shuffle(used.begin(), used.end(), rng);
      pool = used;
    }
    std::sort(pool.begin(), pool.begin() + k);
    ids.insert(ids.end(), pool.begin(), pool.begin() + k);
  }
  if (r == Routing::kBadId) ids[ids.size() / 2] = static_cast<int32_t>(E);
  return ids;
}

// One grouped-experts case against cpu::ExpertsSwiGlu (bf16 activations); slots with an id
// out of range must come back as NaN rows and are left out of the comparison. A second
// run must be bit-identical (the grouping is deterministic).
void CheckGroupedExperts(const TestWeight& gate, const TestWeight& up, const TestWeight& down,
                         int64_t T, int64_t k, Routing routing, ExpertsPath path, uint32_t seed) {
  const int64_t E = gate.batch, hidden = down.rows;
  const cpu::ActDType t = cpu::ActDType::kBF16;
  const std::vector<int32_t> ids = RouteIds(routing, T, k, E, seed);
  const std::vector<float> x = RandomFloats(T * hidden, seed + 1, 1.f, true);
  std::vector<float> ref(T * k * hidden, 0.f);
  std::vector<int32_t> ids_ref = ids;
  std::vector<bool> bad(T * k, false);
  for (int64_t s = 0; s < T * k; ++s) {
    if (ids[s] < 0 || ids[s] >= E) {
      bad[s] = true;
      ids_ref[s] = 0;
    }
  }
  cpu::ExpertsSwiGlu(gate.host, up.host, down.host, x.data(), T, ids_ref.data(), k, t, ref.data());
  DeviceBuffer dx = UpF(x), di = UpI(ids), dy = Zeros(ref.size()), dy2 = Zeros(ref.size());
  // The second run forces the grouped path: bit-identical results also show that kAuto
  // took it.
  for (auto [out, p] : {std::pair{&dy, path}, std::pair{&dy2, ExpertsPath::kGrouped}}) {
    absl::Status st = ExpertsSwiGlu(gate.dev.view, up.dev.view, down.dev.view, dx.as<float>(), T,
                                    di.as<int32_t>(), k, t, out->as<float>(), nullptr, p);
    ASSERT_TRUE(st.ok()) << st;
  }
  std::vector<float> got = Dl(dy.as<float>(), ref.size());
  const std::vector<float> again = Dl(dy2.as<float>(), ref.size());
  EXPECT_EQ(std::memcmp(got.data(), again.data(), got.size() * sizeof(float)), 0)
      << "two runs of the grouped experts differ";
  int64_t nan_rows_ok = 0, nbad = 0;
  for (int64_t s = 0; s < T * k; ++s) {
    if (!bad[s]) continue;
    ++nbad;
    bool all_nan = true;
    for (int64_t d = 0; d < hidden; ++d) all_nan = all_nan && std::isnan(got[s * hidden + d]);
    nan_rows_ok += all_nan;
    std::fill_n(got.begin() + s * hidden, hidden, 0.f);
    std::fill_n(ref.begin() + s * hidden, hidden, 0.f);
  }
  EXPECT_EQ(nan_rows_ok, nbad) << "slots with an out-of-range id must be NaN rows";
  const bool affine = gate.spec.mode == QuantMode::kAffine;
  Report(absl::StrFormat("moe experts grouped%s", path == ExpertsPath::kGrouped ? " (forced)" : ""),
         absl::StrFormat("T%d k%d of %dx%dx%d", T, k, E, gate.rows, hidden),
         absl::StrCat(gate.Mode(), " bf16 ", RoutingName(routing)), got, ref,
         affine ? kTolExpertsAffineGemm : kTolMatmul, hidden);
}

TEST_F(GpuTest, MoeExpertsGrouped) {
  const int64_t E = 8, hidden = 128, inter = 64;
  uint32_t seed = 1700;
  for (const FormatCase& f : {FormatCase{{QuantMode::kMxfp4, 4, 32}, DType::kU8},
                              FormatCase{{QuantMode::kMxfp8, 8, 32}, DType::kU8},
                              FormatCase{{QuantMode::kNone, 0, 0}, DType::kBF16},
                              FormatCase{{QuantMode::kAffine, 4, 64}, DType::kBF16}}) {
    auto [gate, up, down] = MakeExperts(f, E, hidden, inter, seed);
    ASSERT_TRUE(gate && up && down);
    // kAuto takes the grouped path for these sizes except on affine (kept exact per slot).
    const ExpertsPath path =
        f.spec.mode == QuantMode::kAffine ? ExpertsPath::kGrouped : ExpertsPath::kAuto;
    for (Routing r : {Routing::kRandom, Routing::kUnbalanced, Routing::kSomeEmpty,
                      Routing::kOneTakesAll, Routing::kBadId}) {
      CheckGroupedExperts(*gate, *up, *down, 40, 2, r, path, ++seed);
    }
    // Several tiles for one expert (300 rows > 128 tokens per tile) and k = 1.
    CheckGroupedExperts(*gate, *up, *down, 300, 1, Routing::kOneTakesAll, path, ++seed);
    CheckGroupedExperts(*gate, *up, *down, 300, 3, Routing::kUnbalanced, path, ++seed);
  }
}

// The grouped launch's tile choices: automatic (each expert's whole 128-token tiles on the
// large tile, rests of at most 64 tokens on the small one, two launches), each single tile
// forced, and the split forced; both MMA families. Row counts per expert cover whole tiles
// plus short and long rests (300 rows = 2 x 128 + 44, 225 = 128 + 97) and experts with
// only a rest.
TEST_F(GpuTest, GroupedExpertsTileChoices) {
  const int64_t E = 8, hidden = 256, inter = 128;
  uint32_t seed = 1750;
  std::vector<std::pair<int, bool>> configs;
  for (bool wg : {true, false}) {
    if (wg && !dev_->wgmma) continue;
    for (int tile : {-1, 0, 1, 2, 3}) configs.push_back({tile, wg});
  }
  for (const FormatCase& f : {FormatCase{{QuantMode::kMxfp4, 4, 32}, DType::kU8},
                              FormatCase{{QuantMode::kAffine, 4, 64}, DType::kBF16}}) {
    auto [gate, up, down] = MakeExperts(f, E, hidden, inter, seed);
    ASSERT_TRUE(gate && up && down);
    for (const auto& [grouped, wg] : configs) {
      SCOPED_TRACE(absl::StrFormat("grouped tile %d wgmma %d", grouped, wg));
      TEST_SetGemmTile(-1, wg);
      TEST_SetGroupedGemmTile(grouped);
      CheckGroupedExperts(*gate, *up, *down, 300, 1, Routing::kOneTakesAll, ExpertsPath::kGrouped, ++seed);
      CheckGroupedExperts(*gate, *up, *down, 300, 3, Routing::kUnbalanced, ExpertsPath::kGrouped, ++seed);
      CheckGroupedExperts(*gate, *up, *down, 40, 2, Routing::kSomeEmpty, ExpertsPath::kGrouped, ++seed);
    }
  }
  TEST_SetGemmTile(-1);
  TEST_SetGroupedGemmTile(-1);
}

// GLM-5.2's expert shapes (16 of the 256 experts, top-8) and a Qwen3-30B-A3B-like shape
// (hidden 2048, moe_intermediate 768, top-8; 32 of the 128 experts).
TEST_F(GpuTest, GroupedExpertsModelShapes) {
  if (!FullRun()) GTEST_SKIP() << "set RING_GPU_FULL=1 for the model expert shapes";
  struct Case {
    int64_t E, hidden, inter, T;
  };
  uint32_t seed = 1800;
  for (const Case& c : {Case{16, 6144, 2048, 64}, Case{32, 2048, 768, 96}}) {
    for (const FormatCase& f : {FormatCase{{QuantMode::kMxfp4, 4, 32}, DType::kU8},
                                FormatCase{{QuantMode::kAffine, 4, 64}, DType::kBF16}}) {
      auto [gate, up, down] = MakeExperts(f, c.E, c.hidden, c.inter, seed);
      ASSERT_TRUE(gate && up && down);
      const ExpertsPath path =
          f.spec.mode == QuantMode::kAffine ? ExpertsPath::kGrouped : ExpertsPath::kAuto;
      CheckGroupedExperts(*gate, *up, *down, c.T, 8, Routing::kUnbalanced, path, ++seed);
      CheckGroupedExperts(*gate, *up, *down, c.T, 8, Routing::kSomeEmpty, path, ++seed);
    }
  }
}

TEST_F(GpuTest, ArgMax) {
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{4, 300}, {3, 154880}, {1, 7}, {2, 151936}}) {
    std::vector<float> x = RandomFloats(rows * n, 1700 + n, 3.f, true);
    // Ties: copy each row's maximum to a later and an earlier position.
    for (int64_t r = 0; r < rows; ++r) {
      float* xr = x.data() + r * n;
      const int64_t m = cpu::ArgMax(xr, n);
      xr[(m + n / 2) % n] = xr[m];
      if (r % 2 == 1) xr[0] = xr[m];
    }
    std::vector<int32_t> ref(rows);
    for (int64_t r = 0; r < rows; ++r) ref[r] = static_cast<int32_t>(cpu::ArgMax(x.data() + r * n, n));
    DeviceBuffer dx = UpF(x), dout = Zeros(rows);
    ASSERT_TRUE(ArgMaxRows(dx.as<float>(), rows, n, dout.as<int32_t>(), nullptr).ok());
    ReportExact("argmax", absl::StrFormat("%dx%d", rows, n), "ties", DlI(dout.as<int32_t>(), rows), ref);
  }
}

// Rows wide enough for several blocks per row (ArgMaxRows splits a row into contiguous
// slices of ceil(n / blocks), up to 8): maxima in the last slice, equal maxima on both sides
// of a slice boundary, NaN (below every number, except in column 0 where cpu::ArgMax keeps
// it), infinities, signed zeros, and widths around the one-block / several-block switch.
TEST_F(GpuTest, ArgMaxAcrossBlocks) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t n : {int64_t{154880}, int64_t{154879}, int64_t{4095}, int64_t{4097}, int64_t{12289}}) {
    const int64_t rows = 10;
    std::vector<float> x = RandomFloats(rows * n, 1900 + static_cast<uint32_t>(n), 3.f, true);
    const int64_t per = (n + 7) / 8;  // the slice of 8 blocks; a tie straddles its boundary
    for (int64_t r = 0; r < rows; ++r) {
      float* xr = x.data() + r * n;
      switch (r) {
        case 0: xr[n - 1] = 100.f; break;                                        // last slice
        case 1: xr[per - 1] = xr[per] = xr[n - 2] = 100.f; break;                // straddling tie
        case 2: xr[0] = nan; break;                                              // NaN in column 0
        case 3:                                                                  // NaN elsewhere
          for (int64_t i = 1; i < n; i += 97) xr[i] = nan;
          xr[per] = nan;
          xr[per + 1] = 50.f;
          break;
        case 4: std::fill(xr, xr + n, -inf); break;
        case 5:
          std::fill(xr, xr + n, -inf);
          xr[n / 2] = xr[n - 1] = inf;
          break;
        case 6: std::fill(xr, xr + n, nan); break;
        case 7:  // the maximum is zero, first as -0
          for (int64_t i = 0; i < n; ++i) xr[i] = -std::fabs(xr[i]) - 1.f;
          xr[3] = -0.f;
          xr[n - 5] = 0.f;
          break;
        case 8: std::fill(xr, xr + n, 1.f); break;  // all equal
        default: xr[n - 1] = xr[cpu::ArgMax(xr, n)]; break;  // a tie in the last slice
      }
    }
    std::vector<int32_t> ref(rows);
    for (int64_t r = 0; r < rows; ++r) ref[r] = static_cast<int32_t>(cpu::ArgMax(x.data() + r * n, n));
    DeviceBuffer dx = UpF(x), dout = Zeros(rows);
    ASSERT_TRUE(ArgMaxRows(dx.as<float>(), rows, n, dout.as<int32_t>(), nullptr).ok());
    ReportExact("argmax", absl::StrFormat("%dx%d", rows, n), "edge rows", DlI(dout.as<int32_t>(), rows), ref);
  }
}

// ---- sampling ---------------------------------------------------------------------------
// SampleRow against the oracle cpu::SampleToken on the same request. Ids are exact except
// boundary cases (sampling.cuh): a GPU id that differs must be what the CPU picks for a
// uniform within 1e-9 of the draw; the table's mode column says how many there were.
// Logprobs and top_logprobs values: NMSE <= 1e-10 (same float up to the last bits of the
// double log-sum-exp). Logits are bf16-rounded, so ties are common, as in real rows.
struct SampleCase {
  const char* name;
  SamplingParams p;
  bool penalties = false;
};

// Compares SampleRow on row x with cpu::SampleToken for each case at a spread of uniforms
// (the comparison rule is the section comment's).
void CompareSampleRow(const std::vector<float>& x, const std::string& shape,
                      const std::vector<SampleCase>& cases,
                      const std::vector<std::pair<int32_t, int32_t>>& counts) {
  static const std::vector<double> kUniforms = {0.0,  1e-12, 0.01,  0.1,  0.25,  0.333,    0.5,   0.6180339887,
                                                0.75, 0.9,   0.99,  0.999, 0.42, 0.077, 0.999999, 0.5e-6};
  const int64_t vocab = static_cast<int64_t>(x.size());
  DeviceBuffer dx = UpF(x);
  for (const SampleCase& c : cases) {
    std::vector<int32_t> got, ref;
    std::vector<float> got_lp, ref_lp;
    int boundary = 0;
    for (double u : kUniforms) {
      SampleRequest req;
      req.params = c.p;
      if (c.penalties) {
        req.params.frequency_penalty = 0.4f;
        req.params.presence_penalty = 0.6f;
        req.counts = counts;
      }
      req.params.seed = 1;
      req.uniform = u;
      const SampledToken want = cpu::SampleToken(x, req);
      SampledToken have;
      const absl::Status st = SampleRow(dx.as<float>(), vocab, req, &have, nullptr);
      ASSERT_TRUE(st.ok()) << st;
      int32_t expect = want.id;
      if (have.id != want.id) {
        for (double d : {-1e-9, 1e-9}) {
          SampleRequest near = req;
          near.uniform = std::clamp(u + d, 0.0, std::nextafter(1.0, 0.0));
          if (cpu::SampleToken(x, near).id == have.id) expect = have.id;
        }
        boundary += expect == have.id;
      }
      got.push_back(have.id);
      ref.push_back(expect);
      if (c.p.logprobs) {
        got_lp.push_back(have.logprob);
        ref_lp.push_back(want.logprob);
      }
      ASSERT_EQ(have.top_logprobs.size(), want.top_logprobs.size());
      for (size_t j = 0; j < want.top_logprobs.size(); ++j) {
        got.push_back(have.top_logprobs[j].first);
        ref.push_back(want.top_logprobs[j].first);
        got_lp.push_back(have.top_logprobs[j].second);
        ref_lp.push_back(want.top_logprobs[j].second);
      }
    }
    ReportExact("sample ids", shape, absl::StrFormat("%s, %d boundary", c.name, boundary), got, ref);
    if (!ref_lp.empty()) Report("sample logprobs", shape, c.name, got_lp, ref_lp, 1e-10);
  }
}

TEST_F(GpuTest, SampleRowMatchesCpu) {
  const std::vector<SampleCase> cases = {
      {"greedy lp top5", {.temperature = 0.f, .top_logprobs = 5, .logprobs = true}},
      {"greedy penalties", {.temperature = 0.f}, true},
      {"T0.7", {.temperature = 0.7f}},
      {"T1 lp top20", {.top_logprobs = 20, .logprobs = true}},
      {"T1.9 penalties", {.temperature = 1.9f}, true},
      {"top-k 1", {.top_k = 1}},
      {"top-k 50", {.temperature = 0.9f, .top_k = 50, .top_logprobs = 3, .logprobs = true}},
      {"top-k 10000 top-p 0.9", {.top_p = 0.9f, .top_k = 10000}},  // full-sort path
      {"top-p 0.9", {.top_p = 0.9f}},
      {"top-p 0.999 T2", {.temperature = 2.f, .top_p = 0.999f}},  // wide: full sort
      {"min-p 0.05", {.min_p = 0.05f}},
      {"k40 p0.8 minp0.02 pen",
       {.temperature = 0.8f, .top_p = 0.8f, .top_k = 40, .min_p = 0.02f, .top_logprobs = 2,
        .logprobs = true},
       true},
  };
  for (int64_t vocab : {int64_t{1000}, int64_t{151936}, int64_t{154880}}) {
    for (float sigma : {3.f, 1.f}) {
      std::vector<float> x = RandomFloats(vocab, 2100 + vocab + static_cast<int>(sigma), sigma, true);
      const int64_t m = cpu::ArgMax(x.data(), vocab);
      x[(m + vocab / 3) % vocab] = x[m];  // a tie at the top
      std::mt19937 rng(static_cast<uint32_t>(vocab));
      std::vector<std::pair<int32_t, int32_t>> counts = {{static_cast<int32_t>(m), 3}};
      for (int i = 0; i < 40; ++i) {
        const int32_t tok = static_cast<int32_t>(rng() % vocab);
        if (std::none_of(counts.begin(), counts.end(), [&](auto& e) { return e.first == tok; })) {
          counts.emplace_back(tok, 1 + static_cast<int32_t>(rng() % 4));
        }
      }
      CompareSampleRow(x, absl::StrFormat("V%d sigma%.0f", vocab, sigma), cases, counts);
    }
  }
}

// Rows built so that the sampler's multi-block passes (each block of the cluster owns a
// contiguous slice of the row) meet their edge cases: a top-k / candidate set whose ties at
// the K-th value overflow the list and must be filled in id order across slices, maxima in
// the last slice, slices holding only -inf (masked tokens), and NaN for greedy (cpu::ArgMax's
// rule: ignored, except in column 0).
TEST_F(GpuTest, SampleRowAcrossBlocks) {
  const int64_t vocab = 154880;
  std::mt19937 rng(77);
  {
    // 3000 twos and 5000 ones among zeros: every top-k above 3000 ends in ties at 1.
    std::vector<float> x(vocab, 0.f);
    std::vector<int32_t> ids(vocab);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    for (int i = 0; i < 8000; ++i) x[ids[i]] = i < 3000 ? 2.f : 1.f;
    CompareSampleRow(x, "V154880 ties 2/1/0", {
        {"greedy top20", {.temperature = 0.f, .top_logprobs = 20, .logprobs = true}},
        {"top-k 3500", {.top_k = 3500}},
        {"top-k 4096 T0.5", {.temperature = 0.5f, .top_k = 4096}},
        {"top-k 2999", {.top_k = 2999}},
        {"top-p 0.1", {.top_p = 0.1f}},
        {"top-p 0.5", {.top_p = 0.5f}},  // past the candidate list: full sort
        {"T1", {}},
    }, {});
  }
  {
    // The first half masked, the maximum in the last slice, a tie for it in slice 6.
    std::vector<float> x = RandomFloats(vocab, 78, 3.f, true);
    std::fill(x.begin(), x.begin() + vocab / 2, -std::numeric_limits<float>::infinity());
    x[vocab - 1] = x[vocab - 1 - vocab / 8] = 20.f;
    const std::vector<std::pair<int32_t, int32_t>> counts = {{static_cast<int32_t>(vocab - 1), 1}, {5, 2}};
    CompareSampleRow(x, "V154880 half -inf", {
        {"greedy lp top5", {.temperature = 0.f, .top_logprobs = 5, .logprobs = true}},
        {"greedy penalties", {.temperature = 0.f}, true},
        {"T1 lp", {.logprobs = true}},
        {"top-k 50 pen", {.top_k = 50}, true},
        {"top-p 0.9", {.top_p = 0.9f}},
        {"min-p 0.1", {.min_p = 0.1f}},
    }, counts);
  }
  {
    // Greedy with NaN: in column 0 it is the answer; elsewhere it never is.
    std::vector<float> x = RandomFloats(vocab, 79, 3.f, true);
    for (int64_t i = 1; i < vocab; i += 1001) x[i] = std::numeric_limits<float>::quiet_NaN();
    CompareSampleRow(x, "V154880 NaN", {{"greedy", {.temperature = 0.f}}}, {});
    x[0] = std::numeric_limits<float>::quiet_NaN();
    CompareSampleRow(x, "V154880 NaN at 0", {{"greedy", {.temperature = 0.f}}}, {});
  }
}

TEST_F(GpuTest, SampleRowRejectsBadRequests) {
  DeviceBuffer dx = UpF(std::vector<float>(16, 0.f));
  SampleRequest req;
  SampledToken out;
  req.uniform = 1.0;
  EXPECT_EQ(SampleRow(dx.as<float>(), 16, req, &out, nullptr).code(), absl::StatusCode::kInvalidArgument);
  req.uniform = 0.5;
  req.counts = {{16, 1}};
  EXPECT_EQ(SampleRow(dx.as<float>(), 16, req, &out, nullptr).code(), absl::StatusCode::kInvalidArgument);
  req.counts.clear();
  EXPECT_TRUE(SampleRow(dx.as<float>(), 16, req, &out, nullptr).ok());
  EXPECT_EQ(out.id, 8);  // all equal: the uniform's share of 16 equal weights
}

// ---- real model shapes (RING_GPU_FULL=1) ----------------------------------------------------
struct ModelShape {
  const char* name;
  int64_t rows, cols;
  bool gemm;  // also run a prefill-sized M
};

void RunModelShapes(const std::vector<ModelShape>& shapes, QuantSpec spec, DType sd) {
  uint32_t seed = 500;
  for (const ModelShape& s : shapes) {
    auto w = MakeWeight(spec, sd, 1, s.rows, s.cols, ++seed);
    ASSERT_NE(w, nullptr);
    std::vector<int64_t> ms = {1, 8};
    // Prefill GEMM: the 128 x 64 tile (M = 64) and a large tile with an M tail (M = 300).
    if (s.gemm) ms.insert(ms.end(), {64, 300});
    for (int64_t m : ms) {
      const std::vector<float> x = RandomFloats(m * s.cols, seed + m, 1.f, true);
      const std::vector<float> ref = CpuMatmulT(*w, x, m);
      QMatmulArgs probe;
      probe.x_dtype = DType::kBF16;
      probe.m = m;
      const std::string kernel = KernelOf(*w, probe);
      Report(absl::StrFormat("qmm_t[%s] x=BF16", kernel),
             absl::StrFormat("%s M%d %dx%d", s.name, m, s.rows, s.cols), w->Mode(),
             GpuMatmulT(*w, x, m, DType::kBF16, QmmPath::kAuto), ref, MatmulTol(*w, kernel), s.rows);
      if (m == 1) {
        Report("qmm_t[simt] x=F32", absl::StrFormat("%s M1 %dx%d", s.name, s.rows, s.cols), w->Mode(),
               GpuMatmulT(*w, x, 1, DType::kF32, QmmPath::kSimt), ref, kTolMatmul, s.rows);
      }
    }
  }
}

TEST_F(GpuTest, Glm52Shapes) {
  if (!FullRun()) GTEST_SKIP() << "set RING_GPU_FULL=1 for the GLM-5.2 shapes";
  RunModelShapes({{"q_a_proj", 2048, 6144, true},
                  {"q_b_proj", 16384, 2048, true},
                  {"kv_a_proj", 576, 6144, true},
                  {"o_proj", 6144, 16384, true},
                  {"lm_head", 154880, 6144, false}},
                 {QuantMode::kMxfp4, 4, 32}, DType::kU8);
}

TEST_F(GpuTest, Glm52ExpertsGather) {
  if (!FullRun()) GTEST_SKIP() << "set RING_GPU_FULL=1 for the GLM-5.2 expert shapes";
  const int64_t experts = 12, k = 8;
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{2048, 6144}, {6144, 2048}}) {
    auto w = MakeWeight({QuantMode::kMxfp4, 4, 32}, DType::kU8, experts, rows, cols, 600 + rows);
    ASSERT_NE(w, nullptr);
    const std::vector<int32_t> ids = {7, 2, 11, 0, 5, 9, 3, 10};
    // gate/up: one token's row shared by its 8 experts; down: one row per slot.
    for (int64_t div : {k, int64_t{1}}) {
      const int64_t xrows = div == k ? 1 : k;
      const std::vector<float> x = RandomFloats(xrows * cols, 601, 1.f, true);
      std::vector<float> ref;
      for (int64_t p = 0; p < k; ++p) {
        std::vector<float> xp(x.begin() + (p / div) * cols, x.begin() + (p / div + 1) * cols);
        std::vector<float> yp = CpuMatmulT(*w, xp, 1, ids[p]);
        ref.insert(ref.end(), yp.begin(), yp.end());
      }
      absl::StatusOr<DeviceBuffer> dids = DeviceBuffer::FromVector(ids);
      ASSERT_TRUE(dids.ok());
      QMatmulArgs a;
      a.problems = k;
      a.expert_ids = dids->as<int32_t>();
      a.x_problem_stride = cols;
      a.x_problem_div = div;
      a.y_problem_stride = rows;
      Report(div == k ? "qmm_t gather (gate/up)" : "qmm_t gather (down)",
             absl::StrFormat("8 of %dx%dx%d", experts, rows, cols), w->Mode(),
             GpuMatmulT(*w, x, 1, DType::kBF16, QmmPath::kAuto, a, k * rows), ref, kTolMatmul, rows);
    }
  }
}

TEST_F(GpuTest, Qwen3Shapes) {
  if (!FullRun()) GTEST_SKIP() << "set RING_GPU_FULL=1 for the Qwen3-8B shapes";
  RunModelShapes({{"q/o_proj", 4096, 4096, true},
                  {"gate/up", 12288, 4096, true},
                  {"down", 4096, 12288, true}},
                 {QuantMode::kAffine, 4, 64}, DType::kBF16);
}

}  // namespace
}  // namespace ring::cuda
