// models/verify.h: the lockstep backend that runs every op on the device under test and on
// the CPU reference, and the verification driver around it.
#include "models/verify.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <mutex>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "kernels/status.h"
#include "models/backend.h"
#include "models/families.h"

namespace ring {

double VerifyOpTolerance(const std::string& op, cpu::ActDType act) {
  // Isolated errors: the device op on exactly the reference's inputs. Correct kernels differ
  // from the reference only by fp32 summation order (and the rare bf16/f16 rounding flip that
  // order causes), which the op harness (kernels/cuda/ops_harness_test.cc) measures at
  // NMSE <= ~1e-6 for elementwise ops and <= ~3e-5 for matmuls on bf16-rounded affine
  // weights. The tolerances sit above those with margin and far below what a real defect
  // does (one mxfp4 group with a wrong scale in a 6144-wide row: NMSE ~ 32/6144 = 5e-3).
  const bool f32 = act == cpu::ActDType::kF32;
  if (op == "IndexerTopK" || op == "ArgMax" || op == "RouteSigmoid" || op == "RouteSoftmax" ||
      op == "Sample") {
    // Index outputs: near-ties may flip between summation orders; 1% of entries. (Sample is
    // one id per call: a draw within ~1e-10 of a bucket boundary, kernels/cuda/sampling.cuh.)
    return 0.01;
  }
  if (op == "Linear" || op == "ExpertsSwiGlu" || op == "MlaAttention" || op == "Attention") {
    return f32 ? 1e-7 : 1e-4;
  }
  if (op == "Embed" || op == "Add") return 0;  // gathers and sums of two: exact
  return f32 ? 1e-8 : 1e-5;  // norms, RoPE, SwiGLU, scaling, MoE combine
}

namespace {

using internal::Backend;
using internal::Buffer;
using internal::RopeTable;
using cpu::ActDType;

void Accumulate(const float* d, const float* c, int64_t n, TensorDiff& t, double& num,
                double& den) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(d[i])) ++t.nan;
    if (std::isinf(d[i])) ++t.inf;
    if (std::isnan(c[i])) ++t.ref_nan;
    if (std::isinf(c[i])) ++t.ref_inf;
    if (!std::isfinite(d[i]) || !std::isfinite(c[i])) continue;
    const double e = static_cast<double>(d[i]) - c[i];
    num += e * e;
    den += static_cast<double>(c[i]) * c[i];
    t.max_abs = std::max(t.max_abs, std::fabs(e));
  }
  t.n += n;
}

void Finish(TensorDiff& t, double num, double den) {
  t.nmse = den > 0 ? num / den : (num > 0 ? INFINITY : 0);
  t.rel = std::sqrt(t.nmse);
  if (t.nan + t.inf > t.ref_nan + t.ref_inf) {  // a device NaN is never "close"
    t.nmse = t.rel = INFINITY;
  }
}

// One op argument in the device's address space: `bytes` from `p`.
struct Region {
  const void* p;
  int64_t bytes;
  bool is_int = false;
  // Outputs that are not contiguous: the (offset, length) pieces, in floats from p, that
  // are the op's (the gaps belong to other data and are not compared). Empty: all of it.
  std::vector<std::pair<int64_t, int64_t>> pieces;
  // An output of an op with several (LinearMany: one per weight): when the op is wrong on
  // its own, the check names the outputs that are wrong on their own by these names.
  std::string name;
};
Region F(const void* p, int64_t n) { return {p, n * 4, false, {}, {}}; }
Region I(const void* p, int64_t n) { return {p, n * 4, true, {}, {}}; }

// Maps a device-space pointer to the pointer an op call should use.
using Mapper = std::function<void*(const void*)>;
template <typename T>
T* M(const Mapper& m, T* p) {
  return static_cast<T*>(m(p));
}

// What the lockstep backend observed, in program order.
struct Recorder {
  int step = 0;
  int64_t layer = -1;
  int op_index = 0;
  cpu::ActDType act = cpu::ActDType::kBF16;
  double op_tol_scale = 1;
  double layer_tol = 0.01;
  std::vector<OpCheck> ops;
  std::vector<LayerCheck> layers;
};

// Allocation map device pointer -> reference buffer; shared with the buffers' deleters so it
// outlives the backend if a buffer does.
struct AllocMap {
  std::mutex mu;
  std::map<uintptr_t, std::pair<int64_t, Buffer>> by_base;  // base -> (bytes, ref buffer)
};

class LockstepBackend final : public Backend {
 public:
  LockstepBackend(std::shared_ptr<Backend> dev, std::shared_ptr<Backend> ref, Recorder* rec)
      : dev_(std::move(dev)), ref_(std::move(ref)), rec_(rec),
        allocs_(std::make_shared<AllocMap>()) {}

  std::string name() const override { return dev_->name(); }
  bool concurrent() const override { return false; }
  absl::Status BeginStep() override {
    RING_RETURN_IF_ERROR(ref_->BeginStep());
    return dev_->BeginStep();
  }
  absl::Status EndStep() override {
    RING_RETURN_IF_ERROR(ref_->EndStep());
    return dev_->EndStep();
  }

  absl::StatusOr<Buffer> Alloc(int64_t bytes) override {
    RING_ASSIGN_OR_RETURN(Buffer d, dev_->Alloc(bytes));
    RING_ASSIGN_OR_RETURN(Buffer c, ref_->Alloc(bytes));
    if (d.data() == nullptr) return d;
    const uintptr_t key = reinterpret_cast<uintptr_t>(d.data());
    {
      std::lock_guard<std::mutex> l(allocs_->mu);
      allocs_->by_base.insert_or_assign(key, std::make_pair(bytes, c));
    }
    auto pair = std::make_shared<std::pair<Buffer, Buffer>>(d, c);
    std::shared_ptr<AllocMap> map = allocs_;
    std::shared_ptr<void> owner(d.data(), [pair, map, key](void*) mutable {
      {
        std::lock_guard<std::mutex> l(map->mu);
        map->by_base.erase(key);
      }
      pair.reset();
    });
    return Buffer(d.data(), bytes, std::move(owner));
  }
  absl::Status Upload(const void* host, int64_t bytes, void* dst) override {
    RING_ASSIGN_OR_RETURN(void* r, Ref(dst));
    RING_RETURN_IF_ERROR(ref_->Upload(host, bytes, r));
    return dev_->Upload(host, bytes, dst);
  }
  absl::Status Download(const void* src, int64_t bytes, void* host) override {
    return dev_->Download(src, bytes, host);  // the stage's results are the device's
  }
  absl::Status Copy2D(const float* src, int64_t src_ld, float* dst, int64_t dst_ld,
                      int64_t rows, int64_t cols) override {
    RING_ASSIGN_OR_RETURN(void* rs, Ref(src));
    RING_ASSIGN_OR_RETURN(void* rd, Ref(dst));
    RING_RETURN_IF_ERROR(ref_->Copy2D(static_cast<float*>(rs), src_ld, static_cast<float*>(rd),
                                      dst_ld, rows, cols));
    return dev_->Copy2D(src, src_ld, dst, dst_ld, rows, cols);
  }
  int64_t FreeBytes() const override { return dev_->FreeBytes(); }

  void BeginLayer(int64_t layer) override {
    rec_->layer = layer;
    rec_->op_index = 0;
  }
  absl::Status EndLayer(int64_t layer, const float* h, int64_t n) override {
    std::vector<float> d(n), c(n);
    RING_RETURN_IF_ERROR(dev_->Download(h, n * 4, d.data()));
    RING_ASSIGN_OR_RETURN(void* r, Ref(h));
    RING_RETURN_IF_ERROR(ref_->Download(r, n * 4, c.data()));
    LayerCheck lc;
    lc.step = rec_->step;
    lc.layer = layer;
    lc.diff = DiffTensors(d, c);
    lc.ok = lc.diff.rel <= rec_->layer_tol;
    rec_->layers.push_back(lc);
    return absl::OkStatus();
  }

  absl::Status AddWeight(const QuantWeight& w) override {
    RING_RETURN_IF_ERROR(ref_->AddWeight(w));
    return dev_->AddWeight(w);
  }
  absl::Status AddTensor(const TensorView& t) override {
    RING_RETURN_IF_ERROR(ref_->AddTensor(t));
    return dev_->AddTensor(t);
  }
  absl::Status AddRope(const RopeTable& r) override {
    RING_RETURN_IF_ERROR(ref_->AddRope(r));
    return dev_->AddRope(r);
  }
  int64_t copied_weight_bytes() const override { return dev_->copied_weight_bytes(); }

  // ---- ops: each names its inputs and outputs, then the same call runs three times ----
  absl::Status Linear(const QuantWeight& w, const float* x, int64_t m, ActDType t,
                      float* y) override {
    rec_->act = t;
    return Op("Linear", w.name, {F(x, m * w.cols())}, {F(y, m * w.rows())},
              [&](Backend& b, const Mapper& mp) { return b.Linear(w, M(mp, x), m, t, M(mp, y)); });
  }
  // One op, as the device runs it (CUDA: one launch for all weights), checked as a Linear;
  // when it is wrong, the check names the weights whose own outputs are wrong.
  absl::Status LinearMany(absl::Span<const QuantWeight* const> ws, const float* x, int64_t m,
                          ActDType t, absl::Span<float* const> ys) override {
    if (ws.empty() || ws.size() != ys.size()) return Backend::LinearMany(ws, x, m, t, ys);
    rec_->act = t;
    std::vector<std::string> names;
    std::vector<Region> outs;
    for (size_t i = 0; i < ws.size(); ++i) {
      names.push_back(ws[i]->name);
      outs.push_back(F(ys[i], m * ws[i]->rows()));
      outs.back().name = ws[i]->name;
    }
    return Op("Linear", absl::StrJoin(names, "+"), {F(x, m * ws[0]->cols())}, std::move(outs),
              [&](Backend& b, const Mapper& mp) {
                std::vector<float*> yv;
                for (float* y : ys) yv.push_back(M(mp, y));
                return b.LinearMany(ws, M(mp, x), m, t, yv);
              });
  }
  absl::Status Embed(const QuantWeight& w, const int32_t* host_ids, int64_t n, ActDType t,
                     float* out) override {
    rec_->act = t;
    return Op("Embed", w.name, {}, {F(out, n * w.cols())},
              [&](Backend& b, const Mapper& mp) { return b.Embed(w, host_ids, n, t, M(mp, out)); });
  }
  absl::Status RmsNorm(const float* x, int64_t rows, int64_t dim, const TensorView& w,
                       float eps, ActDType t, float* out) override {
    rec_->act = t;
    return Op("RmsNorm", absl::StrCat(rows, "x", dim), {F(x, rows * dim)}, {F(out, rows * dim)},
              [&](Backend& b, const Mapper& mp) {
                return b.RmsNorm(M(mp, x), rows, dim, w, eps, t, M(mp, out));
              });
  }
  // One op, as the device runs it (CUDA: one kernel), checked as an RmsNorm.
  absl::Status AddRmsNorm(const float* a, const float* b, int64_t rows, int64_t dim,
                          const TensorView& w, float eps, ActDType t, float* sum,
                          float* out) override {
    rec_->act = t;
    const int64_t n = rows * dim;
    return Op("RmsNorm", absl::StrCat(rows, "x", dim, " after add"), {F(a, n), F(b, n)},
              {F(sum, n), F(out, n)}, [&](Backend& be, const Mapper& mp) {
                return be.AddRmsNorm(M(mp, a), M(mp, b), rows, dim, w, eps, t, M(mp, sum),
                                     M(mp, out));
              });
  }
  absl::Status LayerNorm(const float* x, int64_t rows, int64_t dim, const TensorView& w,
                         const TensorView& bias, float eps, ActDType t, float* out) override {
    rec_->act = t;
    return Op("LayerNorm", absl::StrCat(rows, "x", dim), {F(x, rows * dim)}, {F(out, rows * dim)},
              [&](Backend& b, const Mapper& mp) {
                return b.LayerNorm(M(mp, x), rows, dim, w, bias, eps, t, M(mp, out));
              });
  }
  absl::Status Rope(const RopeTable& r, float* x, int64_t tokens, int64_t heads,
                    int64_t head_dim, int64_t stride, int64_t offset, ActDType t) override {
    rec_->act = t;
    // Every head rotates its first r.dims features; x may point into a wider row.
    const int64_t span = tokens > 0 ? (tokens - 1) * stride + (heads - 1) * head_dim + r.dims : 0;
    Region out = F(x, span);
    for (int64_t i = 0; i < tokens; ++i) {
      for (int64_t h = 0; h < heads; ++h) out.pieces.emplace_back(i * stride + h * head_dim, r.dims);
    }
    return Op("Rope", absl::StrCat(tokens, "x", heads, "x", head_dim), {F(x, span)}, {out},
              [&](Backend& b, const Mapper& mp) {
                return b.Rope(r, M(mp, x), tokens, heads, head_dim, stride, offset, t);
              });
  }
  // One op, as the device runs it (CUDA fuses the four steps into one kernel).
  absl::Status HeadNormRope(const RopeTable& r, float* q, int64_t q_heads,
                            const TensorView& q_norm, float* k, int64_t k_heads,
                            const TensorView& k_norm, int64_t tokens, int64_t head_dim, float eps,
                            int64_t offset, ActDType t, const KvRows* kv) override {
    rec_->act = t;
    const int64_t nq = tokens * q_heads * head_dim, nk = tokens * k_heads * head_dim;
    const std::string shape = absl::StrCat(tokens, "x", q_heads, "+", k_heads, "x", head_dim);
    if (kv == nullptr) {
      return Op("HeadNormRope", shape, {F(q, nq), F(k, nk)}, {F(q, nq), F(k, nk)},
                [&](Backend& b, const Mapper& mp) {
                  return b.HeadNormRope(r, M(mp, q), q_heads, q_norm, M(mp, k), k_heads, k_norm,
                                        tokens, head_dim, eps, offset, t, nullptr);
                });
    }
    return Op("HeadNormRope", shape, {F(q, nq), F(k, nk), F(kv->v, nk)},
              {F(q, nq), F(kv->k_rows, nk), F(kv->v_rows, nk)}, [&](Backend& b, const Mapper& mp) {
                const KvRows mkv{M(mp, kv->v), M(mp, kv->k_rows), M(mp, kv->v_rows)};
                return b.HeadNormRope(r, M(mp, q), q_heads, q_norm, M(mp, k), k_heads, k_norm,
                                      tokens, head_dim, eps, offset, t, &mkv);
              });
  }
  // One op, as the device runs it (CUDA: one kernel for the key norm, both RoPEs, the scale).
  absl::Status IndexerNormRope(const RopeTable& r, float* q, int64_t T, int64_t heads, int64_t d, float* k,
                               const TensorView& norm_w, const TensorView& norm_b, float eps, int64_t offset,
                               float* w, int64_t n_w, float wscale, ActDType t,
                               float* k_rows) override {
    rec_->act = t;
    const int64_t nq = T * heads * d, nk = T * d;
    std::vector<Region> in = {F(q, nq), F(k, nk)};
    std::vector<Region> out = {F(q, nq), F(k_rows != nullptr ? k_rows : k, nk)};
    if (w != nullptr) {
      in.push_back(F(w, n_w));
      out.push_back(F(w, n_w));
    }
    return Op("IndexerNormRope", absl::StrCat(T, "x", heads, "x", d), in, out, [&](Backend& b, const Mapper& mp) {
      return b.IndexerNormRope(r, M(mp, q), T, heads, d, M(mp, k), norm_w, norm_b, eps, offset,
                               w != nullptr ? M(mp, w) : nullptr, n_w, wscale, t,
                               k_rows != nullptr ? M(mp, k_rows) : nullptr);
    });
  }
  // One op, as the device runs it (CUDA: one kernel for the copies, the norm and both RoPEs).
  absl::Status MlaKvRope(const RopeTable& r, const float* ckv, int64_t T, int64_t kvl, int64_t rope,
                         const TensorView& kv_norm, float eps, float* latent, float* k_pe, float* q,
                         int64_t H, int64_t qd, int64_t offset, ActDType t) override {
    rec_->act = t;
    const int64_t nc = T * (kvl + rope), nq = T * H * qd;
    return Op("MlaKvRope", absl::StrCat(T, "x", kvl, "+", rope, " q ", H, "x", qd),
              {F(ckv, nc), F(q, nq)}, {F(latent, T * kvl), F(k_pe, T * rope), F(q, nq)},
              [&](Backend& b, const Mapper& mp) {
                return b.MlaKvRope(r, M(mp, ckv), T, kvl, rope, kv_norm, eps, M(mp, latent), M(mp, k_pe),
                                   M(mp, q), H, qd, offset, t);
              });
  }
  absl::Status SwiGlu(const float* gate, const float* up, int64_t n, ActDType t,
                      float* out) override {
    rec_->act = t;
    return Op("SwiGlu", absl::StrCat(n), {F(gate, n), F(up, n)}, {F(out, n)},
              [&](Backend& b, const Mapper& mp) {
                return b.SwiGlu(M(mp, gate), M(mp, up), n, t, M(mp, out));
              });
  }
  absl::Status Add(const float* a, const float* c, int64_t n, ActDType t, float* out) override {
    rec_->act = t;
    return Op("Add", absl::StrCat(n), {F(a, n), F(c, n)}, {F(out, n)},
              [&](Backend& b, const Mapper& mp) { return b.Add(M(mp, a), M(mp, c), n, t, M(mp, out)); });
  }
  absl::Status ScaleRound(float* x, int64_t n, float s, ActDType t) override {
    rec_->act = t;
    return Op("ScaleRound", absl::StrCat(n), {F(x, n)}, {F(x, n)},
              [&](Backend& b, const Mapper& mp) { return b.ScaleRound(M(mp, x), n, s, t); });
  }
  absl::Status Attention(const cpu::AttentionArgs& a, ActDType t, float* out) override {
    rec_->act = t;
    std::vector<Region> in = {F(a.q, Span(a.L, a.q_stride, a.hq * a.dk)),
                              F(a.k, Span(a.S, a.k_stride, a.hkv * a.dk)),
                              F(a.v, Span(a.S, a.v_stride, a.hkv * a.dv))};
    if (a.add_mask != nullptr) in.push_back(F(a.add_mask, a.hq * a.L * a.S));
    return Op("Attention", absl::StrCat("L", a.L, " S", a.S, " h", a.hq, "/", a.hkv), in,
              {F(out, a.L * a.hq * a.dv)}, [&](Backend& b, const Mapper& mp) {
                cpu::AttentionArgs m = a;
                m.q = M(mp, a.q);
                m.k = M(mp, a.k);
                m.v = M(mp, a.v);
                m.add_mask = a.add_mask ? M(mp, a.add_mask) : nullptr;
                return b.Attention(m, t, M(mp, out));
              });
  }
  absl::Status MlaAttention(const cpu::MlaAttentionArgs& a, const QuantWeight& embed_q,
                            const QuantWeight& unembed_out, ActDType t, float* out) override {
    rec_->act = t;
    std::vector<Region> in = {F(a.q, a.T * a.H * (a.nope + a.rope)), F(a.latent, a.S * a.kvl),
                              F(a.k_pe, a.S * a.rope)};
    if (a.topk != nullptr) in.push_back(I(a.topk, a.T * a.K));
    return Op("MlaAttention",
              absl::StrCat(a.T == 1 ? "absorbed" : "expanded", a.topk ? " sparse" : " dense",
                           " T", a.T, " S", a.S),
              in, {F(out, a.T * a.H * a.vd)}, [&](Backend& b, const Mapper& mp) {
                cpu::MlaAttentionArgs m = a;
                m.q = M(mp, a.q);
                m.latent = M(mp, a.latent);
                m.k_pe = M(mp, a.k_pe);
                m.topk = a.topk ? M(mp, a.topk) : nullptr;
                return b.MlaAttention(m, embed_q, unembed_out, t, M(mp, out));
              });
  }
  absl::Status IndexerTopK(const cpu::IndexerArgs& a, ActDType t, int32_t* topk) override {
    rec_->act = t;
    return Op("IndexerTopK", absl::StrCat("T", a.T, " S", a.S, " K", a.K),
              {F(a.q, a.T * a.heads * a.dim), F(a.keys, a.S * a.dim), F(a.w, a.T * a.heads)},
              {I(topk, a.T * a.K)}, [&](Backend& b, const Mapper& mp) {
                cpu::IndexerArgs m = a;
                m.q = M(mp, a.q);
                m.keys = M(mp, a.keys);
                m.w = M(mp, a.w);
                return b.IndexerTopK(m, t, M(mp, topk));
              });
  }
  absl::Status RouteSigmoid(const float* logits, const TensorView& bias, int64_t T,
                            const cpu::SigmoidRouting& r, int32_t* ids,
                            float* weights) override {
    return Op("RouteSigmoid", absl::StrCat("T", T, " E", r.E, " k", r.k), {F(logits, T * r.E)},
              {I(ids, T * r.k), F(weights, T * r.k)}, [&](Backend& b, const Mapper& mp) {
                return b.RouteSigmoid(M(mp, logits), bias, T, r, M(mp, ids), M(mp, weights));
              });
  }
  absl::Status RouteSoftmax(const float* gates, int64_t T, int64_t E, int64_t k,
                            bool norm_topk_prob, ActDType t, int32_t* ids,
                            float* scores) override {
    rec_->act = t;
    return Op("RouteSoftmax", absl::StrCat("T", T, " E", E, " k", k), {F(gates, T * E)},
              {I(ids, T * k), F(scores, T * k)}, [&](Backend& b, const Mapper& mp) {
                return b.RouteSoftmax(M(mp, gates), T, E, k, norm_topk_prob, t, M(mp, ids),
                                      M(mp, scores));
              });
  }
  absl::Status ExpertsSwiGlu(const QuantWeight& gate, const QuantWeight& up,
                             const QuantWeight& down, const float* x, int64_t T,
                             const int32_t* ids, int64_t k, ActDType t, float* y) override {
    rec_->act = t;
    return Op("ExpertsSwiGlu", gate.name, {F(x, T * gate.cols()), I(ids, T * k)},
              {F(y, T * k * down.rows())}, [&](Backend& b, const Mapper& mp) {
                return b.ExpertsSwiGlu(gate, up, down, M(mp, x), T, M(mp, ids), k, t, M(mp, y));
              });
  }
  absl::Status MoeCombine(const float* y, const float* w, const float* shared, int64_t T,
                          int64_t k, int64_t hidden, cpu::CombineMode mode, ActDType t,
                          float* out) override {
    rec_->act = t;
    std::vector<Region> in = {F(y, T * k * hidden), F(w, T * k)};
    if (shared != nullptr) in.push_back(F(shared, T * hidden));
    return Op("MoeCombine", absl::StrCat("T", T, " k", k), in, {F(out, T * hidden)},
              [&](Backend& b, const Mapper& mp) {
                return b.MoeCombine(M(mp, y), M(mp, w), shared ? M(mp, shared) : nullptr, T, k,
                                    hidden, mode, t, M(mp, out));
              });
  }
  absl::Status ArgMax(const float* x, int64_t rows, int64_t n, int32_t* host_out) override {
    return HostIdsOp("ArgMax", absl::StrCat(rows, "x", n), x, rows * n,
                     [&](Backend& b, const float* in, Run run, std::vector<int32_t>* ids) {
                       ids->resize(rows);
                       RING_RETURN_IF_ERROR(b.ArgMax(in, rows, n, ids->data()));
                       if (run == Run::kComposed) std::copy(ids->begin(), ids->end(), host_out);
                       return absl::OkStatus();
                     });
  }
  absl::Status Sample(const float* logits_row, int64_t vocab, const SampleRequest& req,
                      SampledToken* host_out) override {
    return HostIdsOp("Sample", absl::StrCat("1x", vocab), logits_row, vocab,
                     [&](Backend& b, const float* in, Run run, std::vector<int32_t>* ids) {
                       SampledToken t;
                       RING_RETURN_IF_ERROR(b.Sample(in, vocab, req, &t));
                       *ids = {t.id};
                       if (run == Run::kComposed) *host_out = std::move(t);
                       return absl::OkStatus();
                     });
  }

 private:
  static int64_t Span(int64_t rows, int64_t stride, int64_t width) {
    return rows > 0 ? (rows - 1) * stride + width : 0;
  }

  static std::vector<float> Gather(const std::vector<float>& v,
                                   const std::vector<std::pair<int64_t, int64_t>>& pieces) {
    std::vector<float> out;
    for (const auto& [off, len] : pieces) out.insert(out.end(), v.begin() + off, v.begin() + off + len);
    return out;
  }

  // The reference backend's pointer for a device pointer (inside one of our allocations).
  absl::StatusOr<void*> Ref(const void* p) const {
    if (p == nullptr) return nullptr;
    const uintptr_t u = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> l(allocs_->mu);
    auto it = allocs_->by_base.upper_bound(u);
    if (it != allocs_->by_base.begin()) {
      --it;
      if (u <= it->first + static_cast<uintptr_t>(it->second.first)) {
        return static_cast<char*>(it->second.second.data()) + (u - it->first);
      }
    }
    return absl::InternalError("verify: an op was given memory the stage did not allocate");
  }

  OpCheck NewCheck(const std::string& op, const std::string& detail) {
    OpCheck oc;
    oc.step = rec_->step;
    oc.layer = rec_->layer;
    oc.index = rec_->op_index++;
    oc.op = op;
    oc.detail = detail;
    oc.tolerance = VerifyOpTolerance(op, rec_->act) * rec_->op_tol_scale;
    return oc;
  }
  void Judge(OpCheck& oc) {
    const TensorDiff& d = oc.isolated;
    const bool bad_nan = d.nan + d.inf > d.ref_nan + d.ref_inf;
    oc.isolated_ok = !bad_nan && (d.is_int ? d.mismatch <= oc.tolerance : d.nmse <= oc.tolerance);
    rec_->ops.push_back(std::move(oc));
  }
  static TensorDiff DiffInts(const std::vector<int32_t>& d, const std::vector<int32_t>& c) {
    TensorDiff t;
    t.is_int = true;
    t.n = static_cast<int64_t>(c.size());
    int64_t bad = 0;
    for (size_t i = 0; i < c.size() && i < d.size(); ++i) bad += d[i] != c[i];
    t.mismatch = t.n > 0 ? static_cast<double>(bad) / t.n : 0;
    return t;
  }

  enum class Run { kReference, kComposed, kIsolated };
  using IdsCall =
      std::function<absl::Status(Backend&, const float*, Run, std::vector<int32_t>*)>;
  // An op whose output is ids in host memory (not a Region): `call` runs on the reference,
  // on the device (composed: its result is the caller's) and on the device over a copy of
  // the reference's input `x` (n floats, isolated); records the id mismatches.
  absl::Status HostIdsOp(const std::string& op, const std::string& detail, const float* x,
                         int64_t n, const IdsCall& call) {
    std::vector<int32_t> c, d, iso;
    RING_ASSIGN_OR_RETURN(void* rx, Ref(x));
    RING_RETURN_IF_ERROR(call(*ref_, static_cast<float*>(rx), Run::kReference, &c));
    RING_RETURN_IF_ERROR(call(*dev_, x, Run::kComposed, &d));
    std::vector<float> hx(n);
    RING_RETURN_IF_ERROR(ref_->Download(rx, n * 4, hx.data()));
    RING_ASSIGN_OR_RETURN(Buffer s, dev_->AllocF(n));
    RING_RETURN_IF_ERROR(dev_->Upload(hx.data(), n * 4, s.data()));
    RING_RETURN_IF_ERROR(call(*dev_, s.f(), Run::kIsolated, &iso));
    OpCheck oc = NewCheck(op, detail);
    oc.composed = DiffInts(d, c);
    oc.isolated = DiffInts(iso, c);
    Judge(oc);
    return absl::OkStatus();
  }

  // Runs `call` on the reference, on the device (composed), and on the device over copies
  // of the reference's inputs (isolated); records the differences of the outputs.
  absl::Status Op(const std::string& op, const std::string& detail, std::vector<Region> ins,
                  std::vector<Region> outs,
                  const std::function<absl::Status(Backend&, const Mapper&)>& call) {
    // Every region an op touches, merged where they overlap (in-place ops, views of one
    // buffer), so the isolated run gets one consistent copy of each. Regions that merely
    // touch stay apart: they may be two allocations that happen to be adjacent on the device
    // (a CUDA memory pool does that) and are not on the reference.
    std::vector<Region> all = ins;
    all.insert(all.end(), outs.begin(), outs.end());
    std::sort(all.begin(), all.end(), [](const Region& a, const Region& b) { return a.p < b.p; });
    std::vector<Region> merged;
    for (const Region& r : all) {
      const char* p = static_cast<const char*>(r.p);
      if (!merged.empty()) {
        Region& last = merged.back();
        const char* end = static_cast<const char*>(last.p) + last.bytes;
        if (p < end) {
          last.bytes = std::max<int64_t>(last.bytes, p + r.bytes - static_cast<const char*>(last.p));
          continue;
        }
      }
      merged.push_back(r);
    }
    // The reference's values of those regions before the op runs.
    std::vector<std::vector<char>> before(merged.size());
    for (size_t i = 0; i < merged.size(); ++i) {
      before[i].resize(merged[i].bytes);
      RING_ASSIGN_OR_RETURN(void* r, Ref(merged[i].p));
      RING_RETURN_IF_ERROR(ref_->Download(r, merged[i].bytes, before[i].data()));
    }
    const Mapper to_ref = [this](const void* p) -> void* {
      absl::StatusOr<void*> r = Ref(p);
      return r.ok() ? *r : nullptr;
    };
    const Mapper same = [](const void* p) { return const_cast<void*>(p); };
    RING_RETURN_IF_ERROR(call(*ref_, to_ref));
    RING_RETURN_IF_ERROR(call(*dev_, same));

    // Isolated: the device op once more, in place on the same device memory (so it reads
    // exactly what the composed call read, padding and alignment included), after the
    // regions were overwritten with the reference's inputs; then the device's own composed
    // state is put back.
    std::vector<std::vector<char>> composed(merged.size());
    for (size_t i = 0; i < merged.size(); ++i) {
      composed[i].resize(merged[i].bytes);
      RING_RETURN_IF_ERROR(dev_->Download(merged[i].p, merged[i].bytes, composed[i].data()));
      RING_RETURN_IF_ERROR(dev_->Upload(before[i].data(), merged[i].bytes, const_cast<void*>(merged[i].p)));
    }
    RING_RETURN_IF_ERROR(call(*dev_, same));
    // Where a region's bytes are, in `composed` (device, composed) and after the isolated
    // call (device memory, read below before the restore).
    auto locate = [&](const void* p, size_t* idx, int64_t* off) {
      const char* c = static_cast<const char*>(p);
      for (size_t i = 0; i < merged.size(); ++i) {
        const char* b = static_cast<const char*>(merged[i].p);
        if (c >= b && c < b + merged[i].bytes) {
          *idx = i;
          *off = c - b;
          return true;
        }
      }
      return false;
    };
    OpCheck oc = NewCheck(op, detail);
    double cn = 0, cd = 0, in = 0, id = 0;
    int64_t int_n = 0, comp_bad = 0, iso_bad = 0;
    bool any_float = false;
    std::vector<std::pair<std::string, TensorDiff>> named;  // isolated, per named output
    for (const Region& r : outs) {
      const int64_t n = r.bytes / 4;
      std::vector<float> d(n), c(n), s(n);
      size_t idx = 0;
      int64_t off = 0;
      if (!locate(r.p, &idx, &off)) return absl::InternalError("verify: output outside its regions");
      std::memcpy(d.data(), composed[idx].data() + off, r.bytes);
      RING_RETURN_IF_ERROR(ref_->Download(to_ref(r.p), r.bytes, c.data()));
      RING_RETURN_IF_ERROR(dev_->Download(r.p, r.bytes, s.data()));
      if (!r.pieces.empty()) {
        for (std::vector<float>* v : {&d, &c, &s}) *v = Gather(*v, r.pieces);
      }
      if (r.is_int) {
        const auto* di = reinterpret_cast<const int32_t*>(d.data());
        const auto* ci = reinterpret_cast<const int32_t*>(c.data());
        const auto* si = reinterpret_cast<const int32_t*>(s.data());
        for (int64_t i = 0; i < n; ++i) {
          comp_bad += di[i] != ci[i];
          iso_bad += si[i] != ci[i];
        }
        int_n += n;
        continue;
      }
      any_float = true;
      Accumulate(d.data(), c.data(), static_cast<int64_t>(c.size()), oc.composed, cn, cd);
      Accumulate(s.data(), c.data(), static_cast<int64_t>(c.size()), oc.isolated, in, id);
      if (!r.name.empty()) {
        TensorDiff own;
        double on = 0, od = 0;
        Accumulate(s.data(), c.data(), static_cast<int64_t>(c.size()), own, on, od);
        Finish(own, on, od);
        named.emplace_back(r.name, own);
      }
    }
    for (size_t i = 0; i < merged.size(); ++i) {
      RING_RETURN_IF_ERROR(dev_->Upload(composed[i].data(), merged[i].bytes, const_cast<void*>(merged[i].p)));
    }
    Finish(oc.composed, cn, cd);
    Finish(oc.isolated, in, id);
    if (int_n > 0) {
      oc.composed.mismatch = static_cast<double>(comp_bad) / int_n;
      oc.isolated.mismatch = static_cast<double>(iso_bad) / int_n;
      if (!any_float) {
        oc.composed.is_int = oc.isolated.is_int = true;
        oc.composed.n = oc.isolated.n = int_n;
      }
    }
    Judge(oc);
    // An index output with mismatches also fails on the float tolerance's terms.
    if (int_n > 0 && any_float && oc.isolated.mismatch > 0.01) rec_->ops.back().isolated_ok = false;
    OpCheck& judged = rec_->ops.back();
    if (!judged.isolated_ok && !named.empty()) {
      std::vector<std::string> wrong;
      for (const auto& [name, own] : named) {
        if (!(own.nmse <= judged.tolerance)) wrong.push_back(name);
      }
      if (!wrong.empty()) judged.detail = absl::StrJoin(wrong, "+");
    }
    return absl::OkStatus();
  }

  std::shared_ptr<Backend> dev_, ref_;
  Recorder* rec_;
  std::shared_ptr<AllocMap> allocs_;
};

std::string FmtDiff(const TensorDiff& d) {
  if (d.is_int) return absl::StrFormat("%.4f mism", d.mismatch);
  std::string s = absl::StrFormat("%9.3e %9.3e %9.3e", d.rel, d.nmse, d.max_abs);
  if (d.nan + d.inf > 0) absl::StrAppend(&s, absl::StrFormat(" nan%d inf%d", d.nan, d.inf));
  if (d.mismatch > 0) absl::StrAppend(&s, absl::StrFormat(" idx-mism %.4f", d.mismatch));
  return s;
}

std::string LayerName(int64_t layer, int64_t num_layers) {
  if (layer < 0) return "embed";
  if (layer >= num_layers) return "head";
  return absl::StrCat(layer);
}

}  // namespace

absl::StatusOr<VerifyReport> Verify(const VerifyOptions& o) {
  RING_ASSIGN_OR_RETURN(ModelConfig cfg, LoadModelConfig(o.model_dir));
  const int64_t nl = cfg.num_hidden_layers;
  StageRange range = o.layers;
  if (range.end < 0) range.end = nl;
  if (range.begin < 0 || range.begin >= range.end || range.end > nl) {
    return absl::InvalidArgumentError(absl::StrCat("layers [", range.begin, ", ", range.end,
                                                   ") are not inside [0, ", nl, ") of ",
                                                   o.model_dir));
  }
  if (o.decode_steps < 0) return absl::InvalidArgumentError("decode_steps must be >= 0");
  if (o.tolerance <= 0) return absl::InvalidArgumentError("tolerance must be > 0");

  const bool explicit_inputs = !o.inputs.empty();
  std::vector<int32_t> prompt = o.tokens;
  std::mt19937_64 rng(o.seed);
  auto random_token = [&] {
    return static_cast<int32_t>(rng() % static_cast<uint64_t>(cfg.vocab_size));
  };
  if (explicit_inputs) {
    prompt.clear();
  } else if (prompt.empty()) {
    if (o.prompt_len < 1) return absl::InvalidArgumentError("prompt_len must be >= 1");
    for (int64_t i = 0; i < o.prompt_len; ++i) prompt.push_back(random_token());
  }
  for (int32_t t : prompt) {
    if (t < 0 || t >= cfg.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("token ", t, " is outside the vocabulary [0, ", cfg.vocab_size, ")"));
    }
  }
  std::vector<std::vector<int32_t>> steps;
  std::vector<int64_t> step_rows;
  if (explicit_inputs) {
    for (const StageInput& in : o.inputs) {
      const int64_t rows = range.begin == 0 ? static_cast<int64_t>(in.tokens.size())
                                            : static_cast<int64_t>(in.hidden.size()) /
                                                  std::max<int64_t>(cfg.hidden_size, 1);
      if (rows < 1) return absl::InvalidArgumentError("verify: an explicit input step is empty");
      steps.push_back(in.tokens);
      step_rows.push_back(rows);
    }
  } else {
    steps.push_back(prompt);
    for (int i = 0; i < o.decode_steps; ++i) steps.push_back({random_token()});
    for (const auto& s : steps) step_rows.push_back(static_cast<int64_t>(s.size()));
  }
  int64_t total_rows = 0;
  for (int64_t r : step_rows) total_rows += r;

  LoadOptions lo;
  lo.act_dtype = o.act_dtype;
  lo.all_logits = false;  // the head on the last row of each step: a long prompt's
                          // logits would dominate the CPU reference's time
  lo.max_context = total_rows;
  // The stage's input for each step: the CPU reference's layers [0, begin).
  std::unique_ptr<Stage> prefix;
  std::unique_ptr<Sequence> prefix_seq;
  if (range.begin > 0 && !explicit_inputs) {
    LoadOptions po = lo;
    po.layers = {0, range.begin};
    RING_ASSIGN_OR_RETURN(prefix, LoadStage(o.model_dir, po));
    prefix_seq = prefix->NewSequence();
  }

  // The stage's input of every step (the same for every pass below).
  std::vector<StageInput> inputs;
  for (size_t s = 0; s < steps.size(); ++s) {
    StageInput in;
    if (explicit_inputs) {
      in = o.inputs[s];
    } else if (prefix) {
      StageInput pin;
      pin.tokens = steps[s];
      RING_ASSIGN_OR_RETURN(StageOutput pout, prefix->Forward(*prefix_seq, pin));
      in.hidden = std::move(pout.hidden);
      in.topk = std::move(pout.topk);
    } else {
      in.tokens = steps[s];
    }
    inputs.push_back(std::move(in));
  }
  prefix_seq.reset();
  prefix.reset();

  VerifyReport rep;
  rep.model_dir = o.model_dir;
  rep.device = o.device.ToString();
  rep.num_layers = nl;
  rep.layer_begin = range.begin;
  rep.layer_end = range.end;
  rep.tolerance = o.tolerance;
  int64_t position = 0;
  for (size_t s = 0; s < steps.size(); ++s) {
    VerifyStep vs;
    vs.step = static_cast<int>(s);
    vs.kind = s == 0 ? "prefill" : "decode";
    vs.rows = step_rows[s];
    vs.first_position = position;
    vs.sparse = cfg.has_indexer() && cfg.index_topk > 0 && position + vs.rows > cfg.index_topk;
    rep.steps.push_back(vs);
    position += vs.rows;
  }

  // One lockstep pass of the stage over `inputs` with the device backend of `dev_opts`.
  auto run_pass = [&](const LoadOptions& dev_opts, Recorder& rec,
                      std::vector<StageOutput>* outputs) -> absl::Status {
    RING_ASSIGN_OR_RETURN(std::shared_ptr<internal::Backend> dev, internal::NewBackendFor(dev_opts));
    auto lockstep = std::make_shared<LockstepBackend>(std::move(dev), internal::NewCpuBackend(), &rec);
    RING_ASSIGN_OR_RETURN(std::unique_ptr<Stage> stage,
                          internal::LoadStageOn(o.model_dir, dev_opts, lockstep));
    std::unique_ptr<Sequence> seq = stage->NewSequence();
    for (size_t s = 0; s < inputs.size(); ++s) {
      rec.step = static_cast<int>(s);
      absl::StatusOr<StageOutput> out = stage->Forward(*seq, inputs[s]);
      if (!out.ok()) {
        return absl::Status(out.status().code(),
                            absl::StrCat("verify step ", s, " (", rep.steps[s].kind, ") on ",
                                         dev_opts.device.ToString(), ": ", out.status().message()));
      }
      if (outputs) outputs->push_back(*std::move(out));
    }
    return absl::OkStatus();
  };

  LoadOptions dev_opts = lo;
  dev_opts.layers = range;
  dev_opts.device = o.device;
  dev_opts.TEST_fault = o.TEST_fault;
  Recorder rec;
  rec.layer_tol = o.tolerance;
  rec.op_tol_scale = o.op_tolerance_scale;
  RING_RETURN_IF_ERROR(run_pass(dev_opts, rec, &rep.outputs));
  rep.layers = std::move(rec.layers);
  rep.ops = std::move(rec.ops);

  if (o.noise_floor) {
    // The checkpoint's noise floor: the CPU engine against itself with every matmul output
    // perturbed by a relative 1e-6 (LoadOptions::TEST_jitter), the size of an fp32
    // summation-order difference. Where the model amplifies such noise (near-ties in MoE
    // routing or DSA top-k flip a discrete choice), a correct device is as far off as this.
    LoadOptions floor_opts = lo;
    floor_opts.layers = range;
    floor_opts.TEST_jitter = o.noise_jitter;
    Recorder floor_rec;
    floor_rec.layer_tol = o.tolerance;
    RING_RETURN_IF_ERROR(run_pass(floor_opts, floor_rec, nullptr));
    for (LayerCheck& l : rep.layers) {
      for (const LayerCheck& f : floor_rec.layers) {
        if (f.step == l.step && f.layer == l.layer) l.floor_rel = f.diff.rel;
      }
      l.ok = LayerWithinTolerance(l.diff, l.floor_rel, o.tolerance, o.floor_factor);
    }
  }

  // The stage's output: the head's logits on the last stage, else the last layer's output.
  for (const OpCheck& oc : rep.ops) {
    if (oc.layer >= nl && oc.op == "Linear" && oc.composed.rel >= rep.output.rel) rep.output = oc.composed;
  }
  if (range.end < nl) {
    for (const LayerCheck& lc : rep.layers) {
      if (lc.layer == range.end - 1 && lc.diff.rel >= rep.output.rel) rep.output = lc.diff;
    }
  }

  // Bisection.
  for (size_t i = 0; i < rep.layers.size(); ++i) {
    if (!rep.layers[i].ok) {
      rep.first_bad_layer = static_cast<int>(i);
      break;
    }
  }
  int first_iso_bad = -1;
  for (size_t i = 0; i < rep.ops.size(); ++i) {
    if (!rep.ops[i].isolated_ok) {
      first_iso_bad = static_cast<int>(i);
      break;
    }
  }
  rep.ok = rep.first_bad_layer < 0 && first_iso_bad < 0;
  auto op_words = [&](const OpCheck& oc) {
    return absl::StrCat("op #", oc.index, " ", oc.op, " (", oc.detail, ") of layer ",
                        LayerName(oc.layer, nl), " in step ", oc.step, " (",
                        rep.steps[oc.step].kind, ")");
  };
  auto iso_words = [&](const OpCheck& oc) {
    return oc.isolated.is_int
               ? absl::StrFormat("%.2f%% of its indices differ (tolerance %.2f%%)",
                                 100 * oc.isolated.mismatch, 100 * oc.tolerance)
               : absl::StrFormat("isolated NMSE %.3e > tolerance %.1e, rel %.3e, max abs err "
                                 "%.3e%s",
                                 oc.isolated.nmse, oc.tolerance, oc.isolated.rel,
                                 oc.isolated.max_abs,
                                 oc.isolated.mismatch > 0
                                     ? absl::StrFormat(", %.2f%% of its indices differ",
                                                       100 * oc.isolated.mismatch)
                                     : std::string());
  };
  if (rep.first_bad_layer >= 0) {
    const LayerCheck& bad = rep.layers[rep.first_bad_layer];
    std::string head = absl::StrFormat(
        "layer %d in step %d (%s) is over tolerance: relative difference %.3e > %.3g "
        "(NMSE %.3e, max abs err %.3e, NaN %d, Inf %d).",
        bad.layer, bad.step, rep.steps[bad.step].kind, bad.diff.rel, o.tolerance, bad.diff.nmse,
        bad.diff.max_abs, bad.diff.nan, bad.diff.inf);
    for (size_t i = 0; i < rep.ops.size(); ++i) {
      const OpCheck& oc = rep.ops[i];
      if (oc.step == bad.step && oc.layer == bad.layer && !oc.isolated_ok) {
        rep.culprit_op = static_cast<int>(i);
        break;
      }
    }
    if (rep.culprit_op >= 0) {
      const OpCheck& oc = rep.ops[rep.culprit_op];
      rep.diagnosis = absl::StrCat(head, " The first op of that layer that is wrong on its own: ",
                                   op_words(oc), " — on the reference's inputs it gives ",
                                   iso_words(oc), ".");
    } else if (first_iso_bad >= 0) {
      rep.culprit_op = first_iso_bad;
      const OpCheck& oc = rep.ops[first_iso_bad];
      rep.diagnosis = absl::StrCat(
          head, " No op of that layer is wrong on its own; an earlier one is: ", op_words(oc),
          " — ", iso_words(oc), "; its error carried into this layer.");
    } else {
      double worst = 0;
      const OpCheck* w = nullptr;
      for (const OpCheck& oc : rep.ops) {
        if (oc.step == bad.step && oc.layer == bad.layer && !oc.isolated.is_int &&
            oc.isolated.nmse / std::max(oc.tolerance, 1e-30) >= worst) {
          worst = oc.isolated.nmse / std::max(oc.tolerance, 1e-30);
          w = &oc;
        }
      }
      // A discrete choice (MoE routing, DSA top-k) that the device and the reference made
      // differently from slightly different inputs, while the op itself is exact.
      std::string flips;
      for (const OpCheck& oc : rep.ops) {
        if (oc.step == bad.step && oc.layer == bad.layer && oc.composed.mismatch > 0 &&
            oc.isolated.mismatch == 0) {
          absl::StrAppendFormat(&flips,
                                " %s (%s) chose differently in %.2f%% of its entries from "
                                "inputs that differ by %.2e (relative), and chooses identically "
                                "on identical inputs: near-ties turned a small difference into a "
                                "different discrete choice.",
                                oc.op, oc.detail, 100 * oc.composed.mismatch, oc.composed.rel);
        }
      }
      rep.diagnosis = absl::StrCat(
          head, " Every op of that layer is within its tolerance on the reference's inputs, so "
                "the error comes from accumulation across ops",
          w ? absl::StrFormat(" (largest isolated error: %s %s, NMSE %.3e of tolerance %.1e)",
                              w->op, w->detail, w->isolated.nmse, w->tolerance)
            : std::string(),
          ".", flips,
          o.noise_floor ? "" : " Run with --noise-floor to compare against the checkpoint's own "
                               "noise floor.");
    }
  } else if (first_iso_bad >= 0) {
    rep.culprit_op = first_iso_bad;
    const OpCheck& oc = rep.ops[first_iso_bad];
    rep.diagnosis = absl::StrCat("Every layer is within tolerance, but ", op_words(oc),
                                 " is wrong on its own: ", iso_words(oc), ".");
  } else {
    int over_tol = 0;
    for (const LayerCheck& l : rep.layers) over_tol += l.diff.rel > o.tolerance;
    rep.diagnosis = absl::StrFormat(
        "OK: every layer within relative difference %.3g%s (worst %.3e) and every op within its "
        "isolated tolerance; stage output relative difference %.3e.",
        o.tolerance,
        over_tol > 0 ? absl::StrFormat(" or within %.3g x the checkpoint's noise floor (%d layer "
                                       "checks needed the floor)",
                                       o.floor_factor, over_tol)
                     : std::string(),
        rep.layers.empty() ? 0.0
                           : std::max_element(rep.layers.begin(), rep.layers.end(),
                                              [](const LayerCheck& a, const LayerCheck& b) {
                                                return a.diff.rel < b.diff.rel;
                                              })->diff.rel,
        rep.output.rel);
  }
  return rep;
}

std::string FormatVerifyReport(const VerifyReport& r, bool all_ops) {
  const int64_t nl = r.num_layers;
  std::string s = absl::StrFormat("verify %s layers [%d, %d) on %s against %s, tolerance %.3g\n",
                                  r.model_dir, r.layer_begin, r.layer_end, r.device, r.reference,
                                  r.tolerance);
  for (const VerifyStep& st : r.steps) {
    absl::StrAppendFormat(&s, "  step %d: %s, %d rows at position %d%s\n", st.step, st.kind,
                          st.rows, st.first_position, st.sparse ? ", DSA sparse" : "");
  }
  const bool floor = !r.layers.empty() && r.layers[0].floor_rel >= 0;
  absl::StrAppend(&s, "\nstep layer        rel       nmse    max_abs  ",
                  floor ? "floor rel  " : "", "result\n");
  for (const LayerCheck& l : r.layers) {
    absl::StrAppendFormat(&s, "%4d %5d  %s  %s%s\n", l.step, l.layer, FmtDiff(l.diff),
                          floor ? absl::StrFormat("%9.3e  ", l.floor_rel) : "",
                          l.ok ? (l.diff.rel > r.tolerance ? "ok (floor)" : "ok") : "OVER");
  }
  absl::StrAppendFormat(&s, "stage output: rel %.3e, NMSE %.3e, max abs err %.3e\n",
                        r.output.rel, r.output.nmse, r.output.max_abs);
  auto op_table = [&](auto keep) {
    absl::StrAppend(&s, "step layer  #  op            detail                              "
                        "composed: rel nmse max_abs          isolated: rel nmse max_abs    "
                        "tol      result\n");
    for (const OpCheck& oc : r.ops) {
      if (!keep(oc)) continue;
      absl::StrAppendFormat(&s, "%4d %5s %2d  %-13s %-35.35s %-34s %-34s %8.1e %s\n", oc.step,
                            LayerName(oc.layer, nl), oc.index,
                            oc.op, oc.detail, FmtDiff(oc.composed), FmtDiff(oc.isolated),
                            oc.tolerance, oc.isolated_ok ? "ok" : "WRONG");
    }
  };
  if (all_ops) {
    absl::StrAppend(&s, "\nops:\n");
    op_table([](const OpCheck&) { return true; });
  } else if (r.first_bad_layer >= 0) {
    const LayerCheck& bad = r.layers[r.first_bad_layer];
    absl::StrAppendFormat(&s, "\nops of layer %d, step %d (bisection):\n", bad.layer, bad.step);
    op_table([&](const OpCheck& oc) { return oc.step == bad.step && oc.layer == bad.layer; });
    if (r.culprit_op >= 0 && (r.ops[r.culprit_op].step != bad.step ||
                              r.ops[r.culprit_op].layer != bad.layer)) {
      const OpCheck& c = r.ops[r.culprit_op];
      op_table([&](const OpCheck& oc) { return &oc == &c; });
    }
  } else if (r.culprit_op >= 0) {
    const OpCheck& c = r.ops[r.culprit_op];
    absl::StrAppend(&s, "\nop wrong in isolation:\n");
    op_table([&](const OpCheck& oc) { return &oc == &c; });
  }
  absl::StrAppendFormat(&s, "\n%s\n%s\n", r.diagnosis, r.ok ? "PASS" : "FAIL");
  return s;
}

TensorDiff DiffTensors(const std::vector<float>& d, const std::vector<float>& c) {
  TensorDiff t;
  double num = 0, den = 0;
  Accumulate(d.data(), c.data(), static_cast<int64_t>(std::min(d.size(), c.size())), t, num, den);
  Finish(t, num, den);
  if (d.size() != c.size()) t.nmse = t.rel = INFINITY;
  return t;
}

bool LayerWithinTolerance(const TensorDiff& d, double floor_rel, double tolerance,
                          double floor_factor) {
  if (d.rel <= tolerance) return true;
  return floor_rel >= 0 && d.rel <= floor_factor * floor_rel && d.nan + d.inf == 0;
}

}  // namespace ring
