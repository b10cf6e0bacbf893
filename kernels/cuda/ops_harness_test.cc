// GPU op harness in the spirit of llama.cpp's test-backend-ops: every CUDA op, on every
// weight format and a set of shapes, against the CPU reference (kernels/quant.h,
// kernels/cpu/ops.h), with a written NMSE tolerance per op. Prints one table row per case:
//   op | shape | mode | NMSE | tolerance | PASS/FAIL
// Skips (GTEST_SKIP) when no CUDA device is visible, so CI without a GPU passes cleanly.
// RING_GPU_FULL=1 adds the real GLM-5.2 and Qwen3-8B shapes (0.5 GB lm_head included).
//
// Tolerances (NMSE = sum (gpu - ref)^2 / sum ref^2):
//   kTolMatmul 1e-5: the SIMT path uses the reference's weight values and fp32
//     accumulation (expected NMSE ~K * 2^-48 < 1e-10); fp modes on the tensor cores are
//     exact too (their values are bf16). The allowance is for affine weights on the tensor
//     cores: they enter the MMA rounded to bf16 (mx.dequantize / MLX CUDA semantics) while
//     QMatmulT uses fp32 scale*q + bias, a relative error <= 2^-9 per weight, NMSE ~1e-6.
//     x is never rounded (the tensor-core path is only taken for bf16 x). A wrong nibble,
//     scale, row or k-permutation gives NMSE >= 1e-3.
//   kTolEwF32 1e-9: fp32 norms/rope/swiglu differ only by summation order and the last ulp
//     of expf/sinf/cosf (relative ~3e-7, NMSE ~1e-13).
//   kTolEwBf16 1e-6: those same fp32 differences occasionally move a value across a bf16
//     rounding boundary (probability ~1e-7/2^-8 per element, each flip ~2^-16 relative
//     squared); a missing or extra rounding step gives NMSE ~1e-5.
//   kTolExact 0: Add and the embedding gather are bit-exact by construction.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/qgemv.cuh"
#include "kernels/dtype.h"
#include "kernels/quant.h"

namespace ring::cuda {
namespace {

constexpr double kTolMatmul = 1e-5;
constexpr double kTolEwF32 = 1e-9;
constexpr double kTolEwBf16 = 1e-6;
constexpr double kTolExact = 0.0;

bool FullRun() {
  const char* v = std::getenv("RING_GPU_FULL");
  return v != nullptr && std::string(v) == "1";
}

// ---- the table -------------------------------------------------------------------------
struct Row {
  std::string op, shape, mode;
  double nmse, tol;
  bool pass;
};
std::vector<Row>& Table() {
  static auto* t = new std::vector<Row>();
  return *t;
}
void PrintRow(const Row& r) {
  std::printf("| %-22s | %-26s | %-34s | %10.3e | %8.1e | %s |\n", r.op.c_str(), r.shape.c_str(),
              r.mode.c_str(), r.nmse, r.tol, r.pass ? "PASS" : "FAIL");
  std::fflush(stdout);
}

class TableEnvironment : public ::testing::Environment {
 public:
  void TearDown() override {
    if (Table().empty()) return;
    int fails = 0;
    std::printf("\n| %-22s | %-26s | %-34s | %10s | %8s | %s |\n", "op", "shape", "mode", "NMSE",
                "tol", "result");
    for (const Row& r : Table()) {
      PrintRow(r);
      fails += !r.pass;
    }
    std::printf("%zu cases, %d failed\n", Table().size(), fails);
  }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new TableEnvironment);

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

void Report(const std::string& op, const std::string& shape, const std::string& mode,
            const std::vector<float>& got, const std::vector<float>& ref, double tol) {
  ASSERT_EQ(got.size(), ref.size());
  const double e = Nmse(got, ref);
  Row r{op, shape, mode, e, tol, e <= tol};
  PrintRow(r);
  Table().push_back(r);
  EXPECT_LE(e, tol) << op << " " << shape << " " << mode;
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
  for (int64_t b = 0; b < batch; ++b) {
    // Weight-like magnitudes with a few outliers, rounded to the model dtype (bf16).
    std::vector<float> w = RandomFloats(rows * cols, seed + 17 * b, 0.05f);
    if (dense) {
      for (float f : w) {
        if (t->dense_dtype == DType::kF32) {
          const size_t o = t->wbytes.size();
          t->wbytes.resize(o + 4);
          std::memcpy(&t->wbytes[o], &f, 4);
        } else {
          const uint16_t h = t->dense_dtype == DType::kBF16 ? FloatToBf16(f) : FloatToF16(f);
          t->wbytes.push_back(h & 0xff);
          t->wbytes.push_back(h >> 8);
        }
      }
      continue;
    }
    absl::StatusOr<QuantizedBuffers> q =
        Quantize(w.data(), rows, cols, spec, t->scale_dtype, global_scale);
    EXPECT_TRUE(q.ok()) << q.status();
    if (!q.ok()) return nullptr;
    const uint8_t* wb = reinterpret_cast<const uint8_t*>(q->weight.data());
    t->wbytes.insert(t->wbytes.end(), wb, wb + q->weight.size() * 4);
    t->sbytes.insert(t->sbytes.end(), q->scales.begin(), q->scales.end());
    t->bbytes.insert(t->bbytes.end(), q->biases.begin(), q->biases.end());
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

std::vector<float> CpuMatmulT(const TestWeight& w, const std::vector<float>& x, int64_t m,
                              int64_t b = 0) {
  std::vector<float> y(m * w.rows);
  ring::QMatmulT(x.data(), m, w.host, b, y.data());
  return y;
}

// ---- tests -------------------------------------------------------------------------------
TEST_F(GpuTest, DeviceReport) {
  std::printf("%s\n", dev_->ToString().c_str());
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

// Every format x {fp32, bf16 x} x {1, 5, 37 rows}, auto path and forced SIMT. Shapes have
// a row tail (72 = 4.5 tiles of 16) and a k tail (320 = 2.5 slices of 128).
TEST_F(GpuTest, MatmulAllFormats) {
  const int64_t rows = 72, cols = 320;
  uint32_t seed = 100;
  for (const FormatCase& f : AllFormats()) {
    auto w = MakeWeight(f.spec, f.dtype, 1, rows, cols, ++seed, f.global_scale);
    ASSERT_NE(w, nullptr);
    for (int64_t m : {1, 5, 37}) {
      for (DType xd : {DType::kF32, DType::kBF16}) {
        const std::vector<float> x = RandomFloats(m * cols, seed * 7 + m, 1.f, xd == DType::kBF16);
        const std::vector<float> ref = CpuMatmulT(*w, x, m);
        QMatmulArgs probe;
        probe.x_dtype = xd;
        absl::StatusOr<QmmPath> auto_used = ResolveQmmPath(w->dev.view, probe);
        ASSERT_TRUE(auto_used.ok()) << auto_used.status();
        for (QmmPath path : {QmmPath::kAuto, QmmPath::kSimt}) {
          // Forced SIMT is a separate case only where auto picked the tensor cores.
          if (path == QmmPath::kSimt && *auto_used == QmmPath::kSimt) continue;
          const QmmPath used = path == QmmPath::kAuto ? *auto_used : QmmPath::kSimt;
          const std::vector<float> got = GpuMatmulT(*w, x, m, xd, path);
          Report(absl::StrFormat("qmm_t[%s] x=%s", QmmPathName(used), DTypeName(xd)),
                 absl::StrFormat("M%d %s", m, w->Shape()), w->Mode(), got, ref, kTolMatmul);
        }
      }
    }
  }
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
  Report("qmm_t round_bf16", "M2 64x256", w->Mode(), got, ref, kTolMatmul);
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
        Report(absl::StrFormat("qmm_t batched x=%s", DTypeName(xd)), "4 problems M3 " + w->Shape(),
               w->Mode(), got, ref, kTolMatmul);
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
        Report(absl::StrFormat("qmm_t gather x=%s", DTypeName(xd)), "2 tok x 3 of 6 " + w->Shape(),
               w->Mode(), got, ref, kTolMatmul);
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
TEST_F(GpuTest, MatmulTransposeFalse) {
  const int64_t heads = 3, rows = 512, cols = 192;
  for (const FormatCase& f : {FormatCase{{QuantMode::kMxfp4, 4, 32}, DType::kU8},
                              FormatCase{{QuantMode::kAffine, 4, 64}, DType::kBF16},
                              FormatCase{{QuantMode::kAffine, 6, 32}, DType::kF32},
                              FormatCase{{QuantMode::kNvfp4, 4, 16}, DType::kU8},
                              FormatCase{{QuantMode::kNone, 0, 0}, DType::kBF16}}) {
    auto w = MakeWeight(f.spec, f.dtype, heads, rows, cols, 53);
    ASSERT_NE(w, nullptr);
    for (int64_t m : {1, 7}) {
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
        Report(absl::StrFormat("qmm_n x=%s", DTypeName(xd)), absl::StrFormat("M%d %s", m, w->Shape()),
               w->Mode(), *got, ref, kTolMatmul);
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
  for (S s : {S{4, 6144}, S{3, 2048}, S{64 * 2, 128}, S{2, 512}, S{5, 100}}) {
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
    if (s.gemm) ms.push_back(64);
    for (int64_t m : ms) {
      const std::vector<float> x = RandomFloats(m * s.cols, seed + m, 1.f, true);
      const std::vector<float> ref = CpuMatmulT(*w, x, m);
      Report("qmm_t x=BF16", absl::StrFormat("%s M%d %dx%d", s.name, m, s.rows, s.cols), w->Mode(),
             GpuMatmulT(*w, x, m, DType::kBF16, QmmPath::kAuto), ref, kTolMatmul);
      if (m == 1) {
        Report("qmm_t[simt] x=F32", absl::StrFormat("%s M1 %dx%d", s.name, s.rows, s.cols), w->Mode(),
               GpuMatmulT(*w, x, 1, DType::kF32, QmmPath::kSimt), ref, kTolMatmul);
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
             GpuMatmulT(*w, x, 1, DType::kBF16, QmmPath::kAuto, a, k * rows), ref, kTolMatmul);
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
