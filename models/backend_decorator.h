// File: models/backend_decorator.h  (internal to models/)
//
// A Backend that passes every call to an inner backend, for decorators that change a few
// operations and leave the rest alone (models/fault_backend.cc).
#ifndef RINGSERVE_MODELS_BACKEND_DECORATOR_H_
#define RINGSERVE_MODELS_BACKEND_DECORATOR_H_

#include <memory>
#include <string>
#include <utility>

#include "models/backend.h"

namespace ring::internal {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::shared_ptr<Backend> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  bool concurrent() const override { return inner_->concurrent(); }
  absl::Status BeginStep() override { return inner_->BeginStep(); }
  absl::Status EndStep() override { return inner_->EndStep(); }
  absl::StatusOr<Buffer> Alloc(int64_t bytes) override { return inner_->Alloc(bytes); }
  absl::Status Upload(const void* host, int64_t bytes, void* dst) override {
    return inner_->Upload(host, bytes, dst);
  }
  absl::Status Download(const void* src, int64_t bytes, void* host) override {
    return inner_->Download(src, bytes, host);
  }
  absl::Status DownloadLater(const void* src, int64_t bytes, void* host) override {
    return inner_->DownloadLater(src, bytes, host);
  }
  absl::Status Copy2D(const float* src, int64_t src_ld, float* dst, int64_t dst_ld,
                      int64_t rows, int64_t cols) override {
    return inner_->Copy2D(src, src_ld, dst, dst_ld, rows, cols);
  }
  int64_t FreeBytes() const override { return inner_->FreeBytes(); }
  void BeginLayer(int64_t layer) override { inner_->BeginLayer(layer); }
  absl::Status EndLayer(int64_t layer, const float* h, int64_t n) override {
    return inner_->EndLayer(layer, h, n);
  }
  absl::Status AddWeight(const QuantWeight& w) override { return inner_->AddWeight(w); }
  absl::Status AddTensor(const TensorView& t) override { return inner_->AddTensor(t); }
  absl::Status AddRope(const RopeTable& r) override { return inner_->AddRope(r); }
  int64_t copied_weight_bytes() const override { return inner_->copied_weight_bytes(); }
  absl::Status Linear(const QuantWeight& w, const float* x, int64_t m, ActDType t,
                      float* y) override {
    return inner_->Linear(w, x, m, t, y);
  }
  absl::Status LinearMany(absl::Span<const QuantWeight* const> ws, const float* x, int64_t m,
                          ActDType t, absl::Span<float* const> ys) override {
    return inner_->LinearMany(ws, x, m, t, ys);
  }
  absl::Status Embed(const QuantWeight& w, const int32_t* host_ids, int64_t n, ActDType t,
                     float* out) override {
    return inner_->Embed(w, host_ids, n, t, out);
  }
  absl::Status RmsNorm(const float* x, int64_t rows, int64_t dim, const TensorView& w,
                       float eps, ActDType t, float* out) override {
    return inner_->RmsNorm(x, rows, dim, w, eps, t, out);
  }
  absl::Status AddRmsNorm(const float* a, const float* b, int64_t rows, int64_t dim,
                          const TensorView& w, float eps, ActDType t, float* sum,
                          float* out) override {
    return inner_->AddRmsNorm(a, b, rows, dim, w, eps, t, sum, out);
  }
  absl::Status LayerNorm(const float* x, int64_t rows, int64_t dim, const TensorView& w,
                         const TensorView& b, float eps, ActDType t, float* out) override {
    return inner_->LayerNorm(x, rows, dim, w, b, eps, t, out);
  }
  absl::Status Rope(const RopeTable& r, float* x, int64_t tokens, int64_t heads,
                    int64_t head_dim, int64_t stride, int64_t offset, ActDType t) override {
    return inner_->Rope(r, x, tokens, heads, head_dim, stride, offset, t);
  }
  absl::Status HeadNormRope(const RopeTable& r, float* q, int64_t q_heads,
                            const TensorView& q_norm, float* k, int64_t k_heads,
                            const TensorView& k_norm, int64_t tokens, int64_t head_dim, float eps,
                            int64_t offset, ActDType t, const KvRows* kv) override {
    return inner_->HeadNormRope(r, q, q_heads, q_norm, k, k_heads, k_norm, tokens, head_dim, eps,
                                offset, t, kv);
  }
  absl::Status MlaKvRope(const RopeTable& r, const float* ckv, int64_t T, int64_t kvl, int64_t rope,
                         const TensorView& kv_norm, float eps, float* latent, float* k_pe, float* q,
                         int64_t H, int64_t qd, int64_t offset, ActDType t) override {
    return inner_->MlaKvRope(r, ckv, T, kvl, rope, kv_norm, eps, latent, k_pe, q, H, qd, offset, t);
  }
  absl::Status IndexerNormRope(const RopeTable& r, float* q, int64_t T, int64_t heads, int64_t d, float* k,
                               const TensorView& norm_w, const TensorView& norm_b, float eps, int64_t offset,
                               float* w, int64_t n_w, float wscale, ActDType t,
                               float* k_rows) override {
    return inner_->IndexerNormRope(r, q, T, heads, d, k, norm_w, norm_b, eps, offset, w, n_w, wscale, t,
                                   k_rows);
  }
  absl::StatusOr<bool> LinearSwiGlu(const QuantWeight& gate, const QuantWeight& up, const float* x,
                                    int64_t m, ActDType t, float* out) override {
    return inner_->LinearSwiGlu(gate, up, x, m, t, out);
  }
  absl::Status SwiGlu(const float* gate, const float* up, int64_t n, ActDType t,
                      float* out) override {
    return inner_->SwiGlu(gate, up, n, t, out);
  }
  absl::Status Add(const float* a, const float* b, int64_t n, ActDType t, float* out) override {
    return inner_->Add(a, b, n, t, out);
  }
  absl::Status ScaleRound(float* x, int64_t n, float s, ActDType t) override {
    return inner_->ScaleRound(x, n, s, t);
  }
  absl::Status Attention(const cpu::AttentionArgs& a, ActDType t, float* out) override {
    return inner_->Attention(a, t, out);
  }
  absl::Status MlaAttention(const cpu::MlaAttentionArgs& a, const QuantWeight& embed_q,
                            const QuantWeight& unembed_out, ActDType t, float* out) override {
    return inner_->MlaAttention(a, embed_q, unembed_out, t, out);
  }
  absl::Status IndexerTopK(const cpu::IndexerArgs& a, ActDType t, int32_t* topk) override {
    return inner_->IndexerTopK(a, t, topk);
  }
  absl::Status RouteSigmoid(const float* logits, const TensorView& bias, int64_t T,
                            const cpu::SigmoidRouting& r, int32_t* ids,
                            float* weights) override {
    return inner_->RouteSigmoid(logits, bias, T, r, ids, weights);
  }
  absl::Status RouteSoftmax(const float* gates, int64_t T, int64_t E, int64_t k,
                            bool norm_topk_prob, ActDType t, int32_t* ids,
                            float* scores) override {
    return inner_->RouteSoftmax(gates, T, E, k, norm_topk_prob, t, ids, scores);
  }
  absl::Status ExpertsSwiGlu(const QuantWeight& gate, const QuantWeight& up,
                             const QuantWeight& down, const float* x, int64_t T,
                             const int32_t* ids, int64_t k, ActDType t, float* y) override {
    return inner_->ExpertsSwiGlu(gate, up, down, x, T, ids, k, t, y);
  }
  absl::StatusOr<bool> ExpertsSwiGluShared(const QuantWeight& gate, const QuantWeight& up,
                                           const QuantWeight& down, const QuantWeight& shared_gate,
                                           const QuantWeight& shared_up,
                                           const QuantWeight& shared_down, const float* x,
                                           int64_t T, const int32_t* ids, int64_t k, ActDType t,
                                           float* y) override {
    return inner_->ExpertsSwiGluShared(gate, up, down, shared_gate, shared_up, shared_down, x, T,
                                       ids, k, t, y);
  }
  absl::Status MoeCombine(const float* y, const float* w, const float* shared, int64_t T,
                          int64_t k, int64_t hidden, cpu::CombineMode mode, ActDType t,
                          float* out) override {
    return inner_->MoeCombine(y, w, shared, T, k, hidden, mode, t, out);
  }
  absl::StatusOr<bool> MoeBlock(const MoeBlockWeights& w, const cpu::SigmoidRouting& r,
                                const float* x, int64_t T, ActDType t, float* out) override {
    return inner_->MoeBlock(w, r, x, T, t, out);
  }
  absl::StatusOr<bool> IndexedMlaAttention(const cpu::IndexerArgs& ix, int32_t* topk,
                                           const cpu::MlaAttentionArgs& a, const QuantWeight& embed_q,
                                           const QuantWeight& unembed_out, ActDType t,
                                           float* out) override {
    return inner_->IndexedMlaAttention(ix, topk, a, embed_q, unembed_out, t, out);
  }
  absl::Status ArgMax(const float* x, int64_t rows, int64_t n, int32_t* host_out) override {
    return inner_->ArgMax(x, rows, n, host_out);
  }
  absl::Status Sample(const float* logits_row, int64_t vocab, const SampleRequest& req,
                      SampledToken* host_out) override {
    return inner_->Sample(logits_row, vocab, req, host_out);
  }

 protected:
  Backend& inner() const { return *inner_; }

 private:
  std::shared_ptr<Backend> inner_;
};

}  // namespace ring::internal

#endif  // RINGSERVE_MODELS_BACKEND_DECORATOR_H_
