// The CPU backend: host memory and the reference ops of kernels/cpu, unchanged. Weights are
// read in place from the memory-mapped checkpoint.
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/status.h"
#include "models/backend.h"

#ifndef RING_HAVE_CUDA
#include "absl/status/status.h"
#endif

namespace ring::internal {
namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(double jitter) : jitter_(static_cast<float>(jitter)) {}
  std::string name() const override { return "cpu"; }
  bool concurrent() const override { return true; }

  absl::StatusOr<Buffer> Alloc(int64_t bytes) override {
    if (bytes < 0) return absl::InvalidArgumentError("negative allocation");
    const size_t n = (static_cast<size_t>(bytes) + 63) / 64 * 64;
    void* p = n == 0 ? nullptr : std::aligned_alloc(64, n);
    if (n != 0 && p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
    }
    return Buffer(p, bytes, std::shared_ptr<void>(p, [](void* q) { std::free(q); }));
  }
  absl::Status Upload(const void* host, int64_t bytes, void* dst) override {
    if (bytes > 0) std::memcpy(dst, host, bytes);
    return absl::OkStatus();
  }
  absl::Status Download(const void* src, int64_t bytes, void* host) override {
    if (bytes > 0) std::memcpy(host, src, bytes);
    return absl::OkStatus();
  }
  absl::Status Copy2D(const float* src, int64_t src_ld, float* dst, int64_t dst_ld,
                      int64_t rows, int64_t cols) override {
    for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * dst_ld, src + r * src_ld, cols * 4);
    return absl::OkStatus();
  }

  absl::Status AddWeight(const QuantWeight&) override { return absl::OkStatus(); }
  absl::Status AddTensor(const TensorView&) override { return absl::OkStatus(); }
  absl::Status AddRope(const RopeTable&) override { return absl::OkStatus(); }

  absl::Status Linear(const QuantWeight& w, const float* x, int64_t m, ActDType t,
                      float* y) override {
    QMatmulT(x, m, w, 0, y);
    if (jitter_ != 0.f) Jitter(y, m * w.rows());
    cpu::RoundActInPlace(y, m * w.rows(), t);
    return absl::OkStatus();
  }
  absl::Status Embed(const QuantWeight& w, const int32_t* ids, int64_t n, ActDType t,
                     float* out) override {
    const int64_t cols = w.cols();
    for (int64_t r = 0; r < n; ++r) DequantizeRows(w, 0, ids[r], ids[r] + 1, out + r * cols);
    cpu::RoundActInPlace(out, n * cols, t);
    return absl::OkStatus();
  }
  absl::Status RmsNorm(const float* x, int64_t rows, int64_t dim, const TensorView& w, float eps,
                       ActDType t, float* out) override {
    cpu::RmsNorm(x, rows, dim, w, eps, t, out);
    return absl::OkStatus();
  }
  absl::Status LayerNorm(const float* x, int64_t rows, int64_t dim, const TensorView& w,
                         const TensorView& b, float eps, ActDType t, float* out) override {
    cpu::LayerNorm(x, rows, dim, w, b, eps, t, out);
    return absl::OkStatus();
  }
  absl::Status Rope(const RopeTable& r, float* x, int64_t tokens, int64_t heads,
                    int64_t head_dim, int64_t stride, int64_t offset, ActDType t) override {
    if (r.pre_scale != 1.f) {
      for (int64_t tok = 0; tok < tokens; ++tok)
        for (int64_t h = 0; h < heads; ++h) {
          float* v = x + tok * stride + h * head_dim;
          for (int64_t d = 0; d < r.dims; ++d) v[d] = cpu::RoundAct(v[d] * r.pre_scale, t);
        }
    }
    cpu::Rope(x, tokens, heads, head_dim, stride, r.dims, r.traditional, r.inv_freq, offset, t);
    return absl::OkStatus();
  }
  absl::Status SwiGlu(const float* gate, const float* up, int64_t n, ActDType t,
                      float* out) override {
    cpu::SwiGlu(gate, up, n, t, out);
    return absl::OkStatus();
  }
  absl::Status Add(const float* a, const float* b, int64_t n, ActDType t, float* out) override {
    cpu::Add(a, b, n, t, out);
    return absl::OkStatus();
  }
  absl::Status ScaleRound(float* x, int64_t n, float s, ActDType t) override {
    for (int64_t i = 0; i < n; ++i) x[i] = cpu::RoundAct(x[i] * s, t);
    return absl::OkStatus();
  }
  absl::Status Attention(const cpu::AttentionArgs& a, ActDType t, float* out) override {
    cpu::Attention(a, t, out);
    return absl::OkStatus();
  }
  absl::Status MlaAttention(const cpu::MlaAttentionArgs& a, const QuantWeight& embed_q,
                            const QuantWeight& unembed_out, ActDType t, float* out) override {
    cpu::MlaAttention(a, embed_q, unembed_out, t, out);
    return absl::OkStatus();
  }
  absl::Status IndexerTopK(const cpu::IndexerArgs& a, ActDType t, int32_t* topk) override {
    cpu::IndexerTopK(a, t, topk);
    return absl::OkStatus();
  }
  absl::Status RouteSigmoid(const float* logits, const TensorView& bias, int64_t T,
                            const cpu::SigmoidRouting& r, int32_t* ids, float* weights) override {
    const std::vector<float> b = ToFloatVector(bias);
    cpu::RouteSigmoid(logits, b.data(), T, r, ids, weights);
    return absl::OkStatus();
  }
  absl::Status RouteSoftmax(const float* gates, int64_t T, int64_t E, int64_t k,
                            bool norm_topk_prob, ActDType t, int32_t* ids,
                            float* scores) override {
    cpu::RouteSoftmax(gates, T, E, k, norm_topk_prob, t, ids, scores);
    return absl::OkStatus();
  }
  absl::Status ExpertsSwiGlu(const QuantWeight& gate, const QuantWeight& up,
                             const QuantWeight& down, const float* x, int64_t T,
                             const int32_t* ids, int64_t k, ActDType t, float* y) override {
    cpu::ExpertsSwiGlu(gate, up, down, x, T, ids, k, t, y);
    return absl::OkStatus();
  }
  absl::Status MoeCombine(const float* y, const float* w, const float* shared, int64_t T,
                          int64_t k, int64_t hidden, cpu::CombineMode mode, ActDType t,
                          float* out) override {
    cpu::MoeCombine(y, w, shared, T, k, hidden, mode, t, out);
    return absl::OkStatus();
  }
  absl::Status ArgMax(const float* x, int64_t rows, int64_t n, int32_t* out) override {
    for (int64_t r = 0; r < rows; ++r) out[r] = static_cast<int32_t>(cpu::ArgMax(x + r * n, n));
    return absl::OkStatus();
  }
  absl::Status Sample(const float* logits_row, int64_t vocab, const SampleRequest& req,
                      SampledToken* out) override {
    RING_RETURN_IF_ERROR(req.Validate(vocab));
    *out = cpu::SampleToken(absl::MakeConstSpan(logits_row, vocab), req);
    return absl::OkStatus();
  }

 private:
  // y[i] *= 1 +- jitter, the sign from a hash of (call, i): deterministic for a given
  // sequence of calls.
  void Jitter(float* y, int64_t n) {
    const uint64_t call = calls_.fetch_add(1);
    for (int64_t i = 0; i < n; ++i) {
      uint64_t h = (call * 0x9E3779B97F4A7C15ull) ^ (static_cast<uint64_t>(i) * 0xBF58476D1CE4E5B9ull);
      h ^= h >> 31;
      h *= 0x94D049BB133111EBull;
      h ^= h >> 29;
      y[i] *= (h & 1) ? 1.f + jitter_ : 1.f - jitter_;
    }
  }
  const float jitter_;
  std::atomic<uint64_t> calls_{0};
};

}  // namespace

std::shared_ptr<Backend> NewCpuBackend(double jitter) {
  return std::make_shared<CpuBackend>(jitter);
}

#ifndef RING_HAVE_CUDA
absl::StatusOr<std::shared_ptr<Backend>> NewCudaBackend(int ordinal) {
  return absl::UnimplementedError(
      "this build has no CUDA backend (configure with nvcc available, RING_ENABLE_CUDA=ON)");
}
#endif

}  // namespace ring::internal
