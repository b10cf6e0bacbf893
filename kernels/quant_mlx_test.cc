// File: kernels/quant_mlx_test.cc
//
// Parity of kernels/quant.h with MLX itself, from fixtures written by
// tests/oracle/quant_fixtures.py (mx.quantize / mx.dequantize / mx.quantized_matmul /
// mx.gather_qmm on MLX's CPU device). The directory comes from RING_QUANT_FIXTURES; CTest
// sets it for the `quant_mlx_parity` test (tests/CMakeTests.cmake), which depends on the
// fixture generator. Without it every case here skips.
//
// What is checked, and how strictly:
//   Dequantize     == mx.dequantize, bit for bit (fp32 view of MLX's output dtype).
//   Quantize       == mx.quantize, byte for byte (weights, scales, biases).
//   QMatmulT/N     vs quantized_matmul with fp32 results (fp32 x, or bf16 x against f32/f16
//                  scales): |ours - mlx| <= 1e-5 * sum_k |x_k| (|s q_k| + |b|) per element.
//                  With bf16 results MLX's CPU backend rounds every product and partial
//                  sum to bf16; the test re-derives MLX's exact output from our decoded
//                  weights (bit for bit), and checks ours against it within the rigorous
//                  bf16 error bound 2^-8 * sum_k (|p_k| + |acc_k|) of that computation.
//   gather_qmm     per token against QMatmulT/N on the selected expert (tolerance as above).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/quant_kernels.h"
#include "kernels/quant.h"
#include "nlohmann/json.hpp"

namespace ring {
namespace {

using nlohmann::json;

// ---- minimal safetensors reader (private to this test) ----------------------------------
// Layout: u64 little-endian header length N, N bytes of JSON
// {name: {"dtype": "BF16", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": ...},
// then the data; offsets are relative to the end of the header.
struct StTensor {
  DType dtype;
  Shape shape;
  const uint8_t* data;
  size_t nbytes;
  TensorView view() const { return TensorView{dtype, shape, data}; }
};

class StFile {
 public:
  bool Load(const std::string& path, std::string* err) {
    std::ifstream f(path, std::ios::binary);
    if (!f) {
      *err = "cannot open " + path;
      return false;
    }
    bytes_.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    if (bytes_.size() < 8) {
      *err = path + ": too short";
      return false;
    }
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i)
      n |= static_cast<uint64_t>(static_cast<uint8_t>(bytes_[i])) << (8 * i);
    if (8 + n > bytes_.size()) {
      *err = path + ": header length past end of file";
      return false;
    }
    json header = json::parse(bytes_.begin() + 8, bytes_.begin() + 8 + n, nullptr, false);
    if (header.is_discarded() || !header.is_object()) {
      *err = path + ": bad header JSON";
      return false;
    }
    const uint8_t* base = reinterpret_cast<const uint8_t*>(bytes_.data()) + 8 + n;
    const size_t data_len = bytes_.size() - 8 - n;
    for (auto& [name, e] : header.items()) {
      if (name == "__metadata__") continue;
      auto dt = ParseDType(e.at("dtype").get<std::string>());
      if (!dt) {
        *err = path + ": unknown dtype for " + name;
        return false;
      }
      const size_t b = e.at("data_offsets").at(0).get<size_t>();
      const size_t en = e.at("data_offsets").at(1).get<size_t>();
      Shape shape = e.at("shape").get<Shape>();
      if (en < b || en > data_len ||
          static_cast<int64_t>(en - b) != NumElements(shape) * DTypeSize(*dt)) {
        *err = path + ": bad offsets for " + name;
        return false;
      }
      tensors_[name] = StTensor{*dt, shape, base + b, en - b};
    }
    return true;
  }
  const StTensor* Find(const std::string& name) const {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
  }

 private:
  std::string bytes_;
  std::map<std::string, StTensor> tensors_;
};

struct Fixtures {
  std::string dir;
  std::string error;  // non-empty: loading failed
  json manifest;
  std::map<std::string, StFile> files;
};

const Fixtures* GetFixtures() {
  static const Fixtures* fx = [] {
    auto* f = new Fixtures;
    const char* dir = std::getenv("RING_QUANT_FIXTURES");
    if (dir == nullptr || *dir == '\0') return f;
    f->dir = dir;
    std::ifstream mf(f->dir + "/manifest.json");
    if (!mf) {
      f->error = "no manifest.json in " + f->dir;
      return f;
    }
    f->manifest = json::parse(mf, nullptr, false);
    if (f->manifest.is_discarded()) {
      f->error = "bad manifest.json";
      return f;
    }
    for (const char* name : {"matmul", "quant", "gather"}) {
      std::string err;
      if (!f->files[name].Load(f->dir + "/" + name + ".safetensors", &err)) {
        f->error = err;
        return f;
      }
    }
    return f;
  }();
  return fx;
}

#define REQUIRE_FIXTURES()                                                                 \
  const Fixtures* fx = GetFixtures();                                                      \
  if (fx->dir.empty()) {                                                                   \
    GTEST_SKIP() << "RING_QUANT_FIXTURES is not set; run `ctest -R quant_mlx_parity` (it " \
                    "generates the MLX fixtures) or point it at the output of "            \
                    "tests/oracle/quant_fixtures.py";                                      \
  }                                                                                        \
  ASSERT_TRUE(fx->error.empty()) << fx->error

// ---- helpers --------------------------------------------------------------------------------

struct Case {
  json j;
  std::string name;
  const StFile* file;
  QuantSpec spec;
  DType dtype;  // source dtype handed to mx.quantize
  float global_scale;

  const StTensor& T(const std::string& role) const {
    const StTensor* t = file->Find(name + "." + role);
    if (t == nullptr) {
      ADD_FAILURE() << "fixture tensor missing: " << name << "." << role;
      static const StTensor empty{DType::kF32, {0}, nullptr, 0};
      return empty;
    }
    return *t;
  }
  bool Has(const std::string& role) const { return file->Find(name + "." + role) != nullptr; }
  QuantWeight Weight() const {
    QuantWeight w;
    w.spec = spec;
    w.weight = T("wq").view();
    w.scales = T("scales").view();
    if (spec.mode == QuantMode::kAffine) w.biases = T("biases").view();
    w.global_scale = global_scale;
    w.name = name;
    return w;
  }
};

DType DTypeFromMlx(const std::string& s) {
  if (s == "bfloat16") return DType::kBF16;
  if (s == "float16") return DType::kF16;
  return DType::kF32;
}

std::vector<Case> Cases(const Fixtures& fx, const std::string& kind) {
  std::vector<Case> out;
  for (const json& j : fx.manifest.at("cases")) {
    if (j.at("kind") != kind) continue;
    Case c;
    c.j = j;
    c.name = j.at("name");
    c.file = &fx.files.at(kind);
    c.spec.mode = ParseQuantMode(j.at("mode").get<std::string>()).value();
    c.spec.bits = j.at("bits");
    c.spec.group_size = j.at("group_size");
    c.dtype = DTypeFromMlx(j.at("dtype"));
    c.global_scale = j.at("global_scale").get<float>();
    out.push_back(c);
  }
  return out;
}

std::vector<float> F32(const StTensor& t) { return ToFloatVector(t.view()); }

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Exact per-element weight pieces of slice b: code value, group scale (matmul semantics)
// and bias, so tests can form sum |x| (|s q| + |b|) and emulate MLX's bf16 arithmetic.
struct Pieces {
  int64_t rows, cols;
  std::vector<float> code, scale, bias;  // rows x cols each
};
Pieces GetPieces(const QuantWeight& w, int64_t b) {
  const cpu::QSlice s = cpu::MakeQSlice(w, b);
  Pieces p{s.rows, s.cols, {}, {}, {}};
  p.code.resize(s.rows * s.cols);
  p.scale.resize(s.rows * s.cols);
  p.bias.assign(s.rows * s.cols, 0.0f);
  std::vector<float> sc(s.groups), bi(s.groups);
  for (int64_t r = 0; r < s.rows; ++r) {
    cpu::LoadRowScales(s, r, 0, s.groups, sc.data(), bi.data());
    for (int64_t g = 0; g < s.groups; ++g) {
      cpu::DecodeGroup(s, r, g, p.code.data() + r * s.cols + g * s.spec.group_size);
      for (int j = 0; j < s.spec.group_size; ++j) {
        p.scale[r * s.cols + g * s.spec.group_size + j] = sc[g];
        if (s.spec.mode == QuantMode::kAffine)
          p.bias[r * s.cols + g * s.spec.group_size + j] = bi[g];
      }
    }
  }
  return p;
}

// den[m, n] = sum_k |x[m,k]| (|s q| + |b|) of W[n, k] (transpose) or W[k, n].
std::vector<double> Denominators(const std::vector<float>& x, int64_t m, const Pieces& p,
                                 bool transpose) {
  const int64_t K = transpose ? p.cols : p.rows;
  const int64_t N = transpose ? p.rows : p.cols;
  std::vector<double> den(m * N, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t n = 0; n < N; ++n) {
      double d = 0;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t e = transpose ? n * p.cols + k : k * p.cols + n;
        d += std::fabs(x[i * K + k]) *
             (std::fabs(static_cast<double>(p.scale[e]) * p.code[e]) + std::fabs(p.bias[e]));
      }
      den[i * N + n] = d;
    }
  return den;
}

// MLX CPU quantized_matmul with bf16 x (T = bf16, no SIMD on x86): returns the exact bf16
// outputs and the rounding-error bound 2^-8 * sum(|p_k| + |acc_k|) of that computation.
// Affine and transpose=False: acc = bf16(acc + bf16(x * w)) with w the bf16 dequantized
// value (fp N: w = bf16(bf16(x * s) * e), computed as a product of x); fp modes with
// transpose=True sum each group in bf16 first and then add bf16(s * group_sum).
void EmulateMlxBf16(const std::vector<float>& x, int64_t m, const QuantWeight& w,
                    const std::vector<float>& deq, const Pieces& p, bool transpose,
                    std::vector<float>* y, std::vector<double>* bound) {
  const int64_t K = transpose ? p.cols : p.rows;
  const int64_t N = transpose ? p.rows : p.cols;
  const int gs = w.spec.group_size;
  y->assign(m * N, 0.0f);
  bound->assign(m * N, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.0f, gsum = 0.0f;
      double b = 0.0, gbound = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t e = transpose ? n * p.cols + k : k * p.cols + n;
        const float xv = x[i * K + k];
        float prod;
        if (w.spec.mode == QuantMode::kAffine) {
          prod = RoundBf16(xv * deq[e]);
        } else if (!transpose) {
          prod = RoundBf16(RoundBf16(xv * p.scale[e]) * p.code[e]);
          b += std::fabs(prod);  // the inner rounding of x * s, carried through * e
        } else {
          const float pe = RoundBf16(xv * p.code[e]);
          gsum = RoundBf16(gsum + pe);
          gbound += std::fabs(pe) + std::fabs(gsum);
          if ((k + 1) % gs == 0) {
            const float sg = RoundBf16(p.scale[e] * gsum);
            acc = RoundBf16(acc + sg);
            b += std::fabs(p.scale[e]) * gbound + std::fabs(sg) + std::fabs(acc);
            gsum = 0.0f;
            gbound = 0.0;
          }
          continue;
        }
        acc = RoundBf16(acc + prod);
        b += std::fabs(prod) + std::fabs(acc);
      }
      (*y)[i * N + n] = acc;
      (*bound)[i * N + n] = b * std::ldexp(1.0, -8);
    }
}

// Counts and reports elements with |ours - ref| > tol.
int CompareTol(const std::string& what, const std::vector<float>& ours,
               const std::vector<float>& ref, const std::vector<double>& tol) {
  int bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs(static_cast<double>(ours[i]) - ref[i]);
    if (!(d <= tol[i])) {
      if (bad < 3) {
        ADD_FAILURE() << what << " element " << i << ": ours " << ours[i] << " mlx " << ref[i]
                      << " |diff| " << d << " > tol " << tol[i];
      }
      ++bad;
    }
  }
  return bad;
}

// ---- tests ----------------------------------------------------------------------------------

TEST(QuantMlx, ManifestCoversEveryFormat) {
  REQUIRE_FIXTURES();
  std::set<std::string> seen;
  for (const Case& c : Cases(*fx, "matmul")) {
    seen.insert(c.spec.ToString() + "/" + DTypeName(c.dtype) + (c.global_scale != 0 ? "/gs" : ""));
  }
  for (int bits : {1, 2, 3, 4, 5, 6, 8})
    for (int g : {32, 64, 128})
      for (const char* dt : {"F32", "BF16", "F16"}) {
        const std::string key = QuantSpec{QuantMode::kAffine, bits, g}.ToString() + "/" + dt;
        EXPECT_TRUE(seen.count(key)) << key;
      }
  for (const char* dt : {"F32", "BF16", "F16"}) {
    for (const char* key : {"mxfp4/g32/b4/", "mxfp8/g32/b8/", "nvfp4/g16/b4/"}) {
      EXPECT_TRUE(seen.count(std::string(key) + dt)) << key << dt;
    }
    EXPECT_TRUE(seen.count(std::string("nvfp4/g16/b4/") + dt + "/gs")) << dt;
  }
  EXPECT_FALSE(Cases(*fx, "quant").empty());
  EXPECT_FALSE(Cases(*fx, "gather").empty());
}

TEST(QuantMlx, DequantizeIsBitExact) {
  REQUIRE_FIXTURES();
  int checked = 0;
  for (const std::string kind : {"matmul", "quant", "gather"}) {
    for (const Case& c : Cases(*fx, kind)) {
      SCOPED_TRACE(c.name);
      const QuantWeight w = c.Weight();
      ASSERT_TRUE(ValidateQuantWeight(w).ok()) << ValidateQuantWeight(w);
      const StTensor& deq = c.T("deq");
      EXPECT_EQ(DequantizeDType(w), deq.dtype);
      const std::vector<float> ref = F32(deq);
      const std::vector<float> ours = Dequantize(w);
      ASSERT_EQ(ours.size(), ref.size());
      int bad = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        const bool same =
            Bits(ours[i]) == Bits(ref[i]) || (std::isnan(ours[i]) && std::isnan(ref[i]));
        if (!same && bad++ < 3) {
          ADD_FAILURE() << "element " << i << ": ours " << ours[i] << " (0x" << std::hex
                        << Bits(ours[i]) << ") mlx " << ref[i] << " (0x" << Bits(ref[i]) << std::dec
                        << ")";
        }
      }
      EXPECT_EQ(bad, 0);
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(QuantMlx, QuantizeIsByteIdentical) {
  REQUIRE_FIXTURES();
  int checked = 0;
  for (const std::string kind : {"matmul", "quant"}) {
    for (const Case& c : Cases(*fx, kind)) {
      SCOPED_TRACE(c.name);
      const StTensor& src = c.T("w_src");
      ASSERT_EQ(src.dtype, c.dtype);
      const std::vector<float> w = F32(src);
      auto q = Quantize(w.data(), src.shape[0], src.shape[1], c.spec, c.dtype, c.global_scale);
      ASSERT_TRUE(q.ok()) << q.status();
      const StTensor& wq = c.T("wq");
      const StTensor& sc = c.T("scales");
      ASSERT_EQ(q->weight.size() * 4, wq.nbytes);
      ASSERT_EQ(q->scales.size(), sc.nbytes);
      EXPECT_EQ(q->scale_dtype, sc.dtype);
      const int64_t words_per_row = wq.shape.back();
      const int64_t groups = sc.shape.back();
      int bad = 0;
      for (size_t i = 0; i < q->weight.size(); ++i) {
        uint32_t ref;
        std::memcpy(&ref, wq.data + 4 * i, 4);
        if (ref != q->weight[i] && bad++ < 3) {
          ADD_FAILURE() << "weight word " << i << " (row " << i / words_per_row << "): ours 0x"
                        << std::hex << q->weight[i] << " mlx 0x" << ref << std::dec;
        }
      }
      const int esize = DTypeSize(sc.dtype);
      for (size_t i = 0; i < q->scales.size(); ++i) {
        if (q->scales[i] != sc.data[i] && bad++ < 6) {
          ADD_FAILURE() << "scale byte " << i << " (row " << i / esize / groups << ", group "
                        << (i / esize) % groups << "): ours " << int(q->scales[i]) << " mlx "
                        << int(sc.data[i]);
        }
      }
      if (c.spec.mode == QuantMode::kAffine) {
        const StTensor& bi = c.T("biases");
        ASSERT_EQ(q->biases.size(), bi.nbytes);
        for (size_t i = 0; i < q->biases.size(); ++i) {
          if (q->biases[i] != bi.data[i] && bad++ < 9) {
            ADD_FAILURE() << "bias byte " << i << ": ours " << int(q->biases[i]) << " mlx "
                          << int(bi.data[i]);
          }
        }
      }
      EXPECT_EQ(bad, 0);
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
}

void CheckMatmul(const Fixtures& fx, bool transpose) {
  const std::string tr = transpose ? "t" : "n";
  int checked = 0, emulated = 0;
  for (const Case& c : Cases(fx, "matmul")) {
    if (!c.j.at("has_matmul").get<bool>()) continue;
    SCOPED_TRACE(c.name + (transpose ? " transpose=True" : " transpose=False"));
    const QuantWeight w = c.Weight();
    const Pieces p = GetPieces(w, 0);
    const int64_t m = c.j.at("m");
    const int64_t N = transpose ? w.rows() : w.cols();
    auto run = [&](const std::vector<float>& x) {
      std::vector<float> y(m * N, std::nanf(""));
      if (transpose) {
        QMatmulT(x.data(), m, w, 0, y.data());
      } else {
        QMatmulN(x.data(), m, w, 0, y.data());
      }
      return y;
    };
    auto tight = [&](const std::vector<float>& x) {
      std::vector<double> tol = Denominators(x, m, p, transpose);
      for (double& t : tol) t = 1e-5 * t;
      return tol;
    };
    // fp32 x: MLX computes in fp32.
    const std::vector<float> x32 = F32(c.T("x32_" + tr));
    const std::vector<float> y32 = F32(c.T("y32_" + tr));
    EXPECT_EQ(c.T("y32_" + tr).dtype, DType::kF32);
    EXPECT_EQ(CompareTol("fp32 x", run(x32), y32, tight(x32)), 0);
    // bf16 x widened to fp32 (the input our engine would see).
    const std::vector<float> xb = F32(c.T("xb_" + tr));
    const std::vector<float> ours_b = run(xb);
    EXPECT_EQ(CompareTol("bf16-valued fp32 x", ours_b, F32(c.T("yb32_" + tr)), tight(xb)), 0);
    // bf16 x as MLX computes it.
    const StTensor& yb = c.T("yb_" + tr);
    const std::vector<float> ybf = F32(yb);
    if (yb.dtype == DType::kF32) {  // promoted with f32/f16 scales: fp32 arithmetic
      EXPECT_EQ(CompareTol("bf16 x (fp32 result)", ours_b, ybf, tight(xb)), 0);
    } else {
      ASSERT_EQ(yb.dtype, DType::kBF16);
      std::vector<float> emu;
      std::vector<double> bound;
      EmulateMlxBf16(xb, m, w, Dequantize(w), p, transpose, &emu, &bound);
      int bad = 0;
      for (size_t i = 0; i < emu.size(); ++i) {
        if (Bits(emu[i]) != Bits(ybf[i]) && bad++ < 3) {
          ADD_FAILURE() << "bf16 emulation element " << i << ": emulated " << emu[i] << " mlx "
                        << ybf[i];
        }
      }
      EXPECT_EQ(bad, 0) << "MLX's bf16 arithmetic is not what the emulation assumes";
      std::vector<double> tol = tight(xb);
      for (size_t i = 0; i < tol.size(); ++i) tol[i] += bound[i];
      EXPECT_EQ(CompareTol("bf16 x (bf16 result)", ours_b, ybf, tol), 0);
      ++emulated;
    }
    ++checked;
  }
  EXPECT_GT(checked, 60);
  EXPECT_GT(emulated, 20);
}

TEST(QuantMlx, MatmulTransposedMatchesMlx) {
  REQUIRE_FIXTURES();
  CheckMatmul(*fx, true);
}

TEST(QuantMlx, MatmulNonTransposedMatchesMlx) {
  REQUIRE_FIXTURES();
  CheckMatmul(*fx, false);
}

TEST(QuantMlx, GatherQmmMatchesPerExpertMatmul) {
  REQUIRE_FIXTURES();
  int checked = 0;
  for (const Case& c : Cases(*fx, "gather")) {
    SCOPED_TRACE(c.name);
    const QuantWeight w = c.Weight();
    ASSERT_TRUE(ValidateQuantWeight(w).ok());
    ASSERT_EQ(w.batch(), c.j.at("experts").get<int64_t>());
    const int64_t tokens = c.j.at("tokens");
    const StTensor& idx_t = c.T("idx");
    ASSERT_EQ(idx_t.dtype, DType::kU32);
    const uint32_t* idx = reinterpret_cast<const uint32_t*>(idx_t.data);
    for (bool transpose : {true, false}) {
      const std::string tr = transpose ? "t" : "n";
      const std::vector<float> x = F32(c.T("x_" + tr));
      const std::vector<float> yref = F32(c.T("y_" + tr));
      const int64_t K = transpose ? w.cols() : w.rows();
      const int64_t N = transpose ? w.rows() : w.cols();
      ASSERT_EQ(static_cast<int64_t>(yref.size()), tokens * N);
      for (int64_t t = 0; t < tokens; ++t) {
        const std::vector<float> xt(x.begin() + t * K, x.begin() + (t + 1) * K);
        std::vector<float> y(N);
        if (transpose) {
          QMatmulT(xt.data(), 1, w, idx[t], y.data());
        } else {
          QMatmulN(xt.data(), 1, w, idx[t], y.data());
        }
        std::vector<double> tol = Denominators(xt, 1, GetPieces(w, idx[t]), transpose);
        for (double& v : tol) v = 1e-5 * v;
        const std::vector<float> yr(yref.begin() + t * N, yref.begin() + (t + 1) * N);
        EXPECT_EQ(CompareTol("token " + std::to_string(t) + " " + tr, y, yr, tol), 0);
      }
    }
    ++checked;
  }
  EXPECT_GE(checked, 7);
}

}  // namespace
}  // namespace ring
