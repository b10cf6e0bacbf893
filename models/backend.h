// File: models/backend.h  (internal to models/)
//
// The compute backend the layer programs run on. There is ONE copy of each family's model
// logic (deepseek.cc, qwen3.cc, the block loop in model.cc); it calls the operations below,
// and a backend implements them: backend_cpu.cc with the fp32 reference ops of
// kernels/cpu (the oracle), cuda/backend_cuda.cc with the kernels of kernels/cuda, which the
// op harness checks against exactly those reference ops. This interface is the single
// dispatch point between a layer program and a device.
//
// Memory: activations, caches and index buffers live in backend memory (host memory on the
// CPU, device memory on CUDA) and are handed around as raw pointers into Buffers, exactly
// like the CPU engine's float buffers; pointer arithmetic (row offsets) is valid on both.
// Activations are fp32 holding values rounded to the activation dtype, so both backends
// round at the same points. Host data crosses only through Upload/Download.
//
// Weights stay described by the checkpoint's QuantWeight/TensorView; WeightLoader registers
// every tensor it hands out (AddWeight/AddTensor), and the CUDA backend keeps a device copy
// keyed by the host tensor's address.
//
// Ordering: operations are executed in call order; results are visible to later calls and
// to Download (which waits for them). Errors of asynchronous device work surface at the
// next Download or EndStep.
#ifndef RINGSERVE_MODELS_BACKEND_H_
#define RINGSERVE_MODELS_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/cpu/model_ops.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/sampling.h"
#include "kernels/quant.h"
#include "kernels/tensor.h"

namespace ring::internal {

using cpu::ActDType;

// Backend memory; copies share the allocation (freed with the last copy).
class Buffer {
 public:
  Buffer() = default;
  Buffer(void* data, int64_t bytes, std::shared_ptr<void> owner)
      : data_(data), bytes_(bytes), owner_(std::move(owner)) {}
  void* data() const { return data_; }
  float* f() const { return static_cast<float*>(data_); }
  int32_t* i() const { return static_cast<int32_t*>(data_); }
  int64_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  int64_t bytes_ = 0;
  std::shared_ptr<void> owner_;
};

// Inverse frequencies of a RoPE over `dims` features and the factor the rotated slice is
// multiplied by first (YaRN's mscale ratio; 1 otherwise), as mlx-lm's initialize_rope.
struct RopeTable {
  std::vector<float> inv_freq;
  float pre_scale = 1.f;
  int64_t dims = 0;
  bool traditional = false;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda:0"
  // Whether Forward of different sequences may run at the same time on this backend.
  virtual bool concurrent() const = 0;
  // Brackets one stage step: BeginStep binds the backend to the calling thread, EndStep
  // waits for the step's work and reports any asynchronous device fault.
  virtual absl::Status BeginStep() { return absl::OkStatus(); }
  virtual absl::Status EndStep() { return absl::OkStatus(); }

  // ---- memory ----
  virtual absl::StatusOr<Buffer> Alloc(int64_t bytes) = 0;  // uninitialised
  absl::StatusOr<Buffer> AllocF(int64_t n) { return Alloc(n * static_cast<int64_t>(sizeof(float))); }
  // Queues a copy of `host` to `dst`; `host` may be reused as soon as it returns.
  virtual absl::Status Upload(const void* host, int64_t bytes, void* dst) = 0;
  virtual absl::Status Download(const void* src, int64_t bytes, void* host) = 0;
  // Download without waiting: `host` (which must stay valid) is written by the time the next
  // call that waits for the device returns OK (Download, ArgMax, Sample, EndStep), so that
  // the results a step hands back cost one wait, not one each. Default: Download.
  virtual absl::Status DownloadLater(const void* src, int64_t bytes, void* host) {
    return Download(src, bytes, host);
  }
  // dst[r * dst_ld + c] = src[r * src_ld + c] for r < rows, c < cols (floats).
  virtual absl::Status Copy2D(const float* src, int64_t src_ld, float* dst, int64_t dst_ld,
                              int64_t rows, int64_t cols) = 0;
  // Bytes the backend could still allocate (-1: unknown), for error messages.
  virtual int64_t FreeBytes() const { return -1; }

  // ---- where the layer program is (for observing backends: models/verify.cc) ----
  // Ops after BeginLayer(l) belong to layer l; -1 is the embedding before the first layer,
  // num_layers the final norm and LM head. EndLayer hands over the layer's output (h, n
  // floats in backend memory). Other backends ignore both.
  virtual void BeginLayer(int64_t /*layer*/) {}
  virtual absl::Status EndLayer(int64_t /*layer*/, const float* /*h*/, int64_t /*n*/) {
    return absl::OkStatus();
  }

  // ---- weights (once per tensor, at load) ----
  virtual absl::Status AddWeight(const QuantWeight& w) = 0;
  virtual absl::Status AddTensor(const TensorView& t) = 0;
  virtual absl::Status AddRope(const RopeTable& r) = 0;
  // Bytes of weights this backend holds a copy of (0 when it reads the checkpoint in place).
  virtual int64_t copied_weight_bytes() const { return 0; }

  // ---- ops (kernels/cpu/ops.h, kernels/cpu/model_ops.h semantics) ----
  // y[m, rows] = round(x[m, cols] @ W^T).
  virtual absl::Status Linear(const QuantWeight& w, const float* x, int64_t m, ActDType t,
                              float* y) = 0;
  // ys[i][m, rows_i] = round(x[m, cols] @ W_i^T) for weights that share x: exactly one
  // Linear per weight, in order (a backend may run them as one kernel).
  virtual absl::Status LinearMany(absl::Span<const QuantWeight* const> ws, const float* x,
                                  int64_t m, ActDType t, absl::Span<float* const> ys) {
    if (ws.size() != ys.size()) return absl::InvalidArgumentError("LinearMany: weights != outputs");
    for (size_t i = 0; i < ws.size(); ++i) {
      absl::Status s = Linear(*ws[i], x, m, t, ys[i]);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  // out[i, :] = round(dequant(W[ids[i], :])); ids are host memory, already range-checked.
  virtual absl::Status Embed(const QuantWeight& w, const int32_t* host_ids, int64_t n,
                             ActDType t, float* out) = 0;
  virtual absl::Status RmsNorm(const float* x, int64_t rows, int64_t dim, const TensorView& w,
                               float eps, ActDType t, float* out) = 0;
  // sum = round(a + b) (sum may alias a), then out = RmsNorm(sum): exactly Add then RmsNorm
  // (a backend may run them as one kernel).
  virtual absl::Status AddRmsNorm(const float* a, const float* b, int64_t rows, int64_t dim,
                                  const TensorView& w, float eps, ActDType t, float* sum,
                                  float* out) {
    absl::Status s = Add(a, b, rows * dim, t, sum);
    return s.ok() ? RmsNorm(sum, rows, dim, w, eps, t, out) : s;
  }
  virtual absl::Status LayerNorm(const float* x, int64_t rows, int64_t dim, const TensorView& w,
                                 const TensorView& b, float eps, ActDType t, float* out) = 0;
  // RoPE of the table (YaRN pre-scale first) on [tokens, heads, head_dim] rows, `stride`
  // floats between tokens, positions offset.. (cpu::Rope).
  virtual absl::Status Rope(const RopeTable& r, float* x, int64_t tokens, int64_t heads,
                            int64_t head_dim, int64_t stride, int64_t offset, ActDType t) = 0;
  // Per-head RmsNorm of q [tokens, q_heads, head_dim] and k [tokens, k_heads, head_dim]
  // (dense rows), then the RoPE of the table on both at positions offset.., in place: exactly
  // the four calls below (a backend may run them as one kernel). With `kv` set, the step's
  // cache write goes with it: k is only read, its normed and rotated rows go to kv->k_rows,
  // and kv->v's rows ([tokens, k_heads, head_dim]) are copied to kv->v_rows (the cache rows
  // at offset.., dense). A backend can then record the op by the position alone.
  struct KvRows {
    const float* v = nullptr;
    float* k_rows = nullptr;
    float* v_rows = nullptr;
  };
  virtual absl::Status HeadNormRope(const RopeTable& r, float* q, int64_t q_heads,
                                    const TensorView& q_norm, float* k, int64_t k_heads,
                                    const TensorView& k_norm, int64_t tokens, int64_t head_dim,
                                    float eps, int64_t offset, ActDType t, const KvRows* kv) {
    const int64_t kw = k_heads * head_dim;
    absl::Status s;
    if (kv != nullptr) {
      s = Copy2D(k, kw, kv->k_rows, kw, tokens, kw);
      if (s.ok()) s = Copy2D(kv->v, kw, kv->v_rows, kw, tokens, kw);
      k = kv->k_rows;
    }
    if (s.ok()) s = RmsNorm(q, tokens * q_heads, head_dim, q_norm, eps, t, q);
    if (s.ok()) s = RmsNorm(k, tokens * k_heads, head_dim, k_norm, eps, t, k);
    if (s.ok()) s = Rope(r, q, tokens, q_heads, head_dim, q_heads * head_dim, offset, t);
    if (s.ok()) s = Rope(r, k, tokens, k_heads, head_dim, kw, offset, t);
    return s;
  }
  // MLA's per-step K/V write (models/deepseek.cc): from ckv = [latent_raw | k_pe_raw]
  // ([T, kvl + rope]) the cache rows latent = RmsNorm(latent_raw) ([T, kvl]) and k_pe =
  // Rope(k_pe_raw) ([T, rope]), and q's rope slice (the last `rope` features of each of the
  // H heads of [T, H, qd]) rotated in place, all at positions offset... Exactly these calls
  // (a backend may run them as one kernel).
  virtual absl::Status MlaKvRope(const RopeTable& r, const float* ckv, int64_t T, int64_t kvl,
                                 int64_t rope, const TensorView& kv_norm, float eps, float* latent,
                                 float* k_pe, float* q, int64_t H, int64_t qd, int64_t offset,
                                 ActDType t) {
    absl::Status s = Copy2D(ckv, kvl + rope, latent, kvl, T, kvl);
    if (s.ok()) s = Copy2D(ckv + kvl, kvl + rope, k_pe, rope, T, rope);
    if (s.ok()) s = RmsNorm(latent, T, kvl, kv_norm, eps, t, latent);
    if (s.ok()) s = Rope(r, q + (qd - rope), T, H, qd, H * qd, offset, t);
    if (s.ok()) s = Rope(r, k_pe, T, 1, rope, rope, offset, t);
    return s;
  }
  // The DSA indexer's per-step preparation for one sequence (models/deepseek.cc): its keys
  // k = LayerNorm(k) ([T, d]), q's ([T, heads, d]) and k's RoPE at positions offset.., and,
  // when w is not null, w = round(w * wscale) ([n_w], the head weights). Exactly these calls
  // (a backend may run them as one kernel). With k_rows set (the key cache's rows at
  // offset..) the keys are only read and their normed, rotated rows go there.
  virtual absl::Status IndexerNormRope(const RopeTable& r, float* q, int64_t T, int64_t heads, int64_t d,
                                       float* k, const TensorView& norm_w, const TensorView& norm_b,
                                       float eps, int64_t offset, float* w, int64_t n_w, float wscale,
                                       ActDType t, float* k_rows) {
    absl::Status s;
    if (k_rows != nullptr) {
      s = Copy2D(k, d, k_rows, d, T, d);
      k = k_rows;
    }
    if (s.ok()) s = LayerNorm(k, T, d, norm_w, norm_b, eps, t, k);
    if (s.ok()) s = Rope(r, q, T, heads, d, heads * d, offset, t);
    if (s.ok()) s = Rope(r, k, T, 1, d, d, offset, t);
    if (s.ok() && w != nullptr) s = ScaleRound(w, n_w, wscale, t);
    return s;
  }
  virtual absl::Status SwiGlu(const float* gate, const float* up, int64_t n, ActDType t,
                              float* out) = 0;
  // out[m, rows] = SwiGlu(round(x @ gate^T), round(x @ up^T)): the SwiGLU MLP's first half
  // (gate and up of the same shape) as one op, exactly LinearMany({gate, up}) then SwiGlu, bit
  // for bit. False, with nothing run, where a backend has no joint form for these arguments:
  // the caller then runs the two itself (RunMlp).
  virtual absl::StatusOr<bool> LinearSwiGlu(const QuantWeight& /*gate*/, const QuantWeight& /*up*/,
                                            const float* /*x*/, int64_t /*m*/, ActDType /*t*/,
                                            float* /*out*/) {
    return false;
  }
  virtual absl::Status Add(const float* a, const float* b, int64_t n, ActDType t,
                           float* out) = 0;
  // x[i] = round(x[i] * s).
  virtual absl::Status ScaleRound(float* x, int64_t n, float s, ActDType t) = 0;
  virtual absl::Status Attention(const cpu::AttentionArgs& a, ActDType t, float* out) = 0;
  virtual absl::Status MlaAttention(const cpu::MlaAttentionArgs& a, const QuantWeight& embed_q,
                                    const QuantWeight& unembed_out, ActDType t, float* out) = 0;
  virtual absl::Status IndexerTopK(const cpu::IndexerArgs& a, ActDType t, int32_t* topk) = 0;
  // IndexerTopK(ix, t, topk) and then MlaAttention(a, ...) with a.topk == topk, in one op, so
  // that a backend may run the parts of MLA that do not read the selection (the queries'
  // latent projection) beside the indexer (the CUDA backend's side stream). False, with
  // nothing run, where a backend has no joint form: the caller runs the two itself.
  virtual absl::StatusOr<bool> IndexedMlaAttention(const cpu::IndexerArgs& /*ix*/, int32_t* /*topk*/,
                                                   const cpu::MlaAttentionArgs& /*a*/,
                                                   const QuantWeight& /*embed_q*/,
                                                   const QuantWeight& /*unembed_out*/, ActDType /*t*/,
                                                   float* /*out*/) {
    return false;
  }
  virtual absl::Status RouteSigmoid(const float* logits, const TensorView& bias, int64_t T,
                                    const cpu::SigmoidRouting& r, int32_t* ids,
                                    float* weights) = 0;
  virtual absl::Status RouteSoftmax(const float* gates, int64_t T, int64_t E, int64_t k,
                                    bool norm_topk_prob, ActDType t, int32_t* ids,
                                    float* scores) = 0;
  virtual absl::Status ExpertsSwiGlu(const QuantWeight& gate, const QuantWeight& up,
                                     const QuantWeight& down, const float* x, int64_t T,
                                     const int32_t* ids, int64_t k, ActDType t, float* y) = 0;
  // The routed experts (as ExpertsSwiGlu) and a shared expert, the SwiGLU MLP
  // shared_gate/up/down on x, in one op: y [T, k + 1, hidden] with the shared expert's T
  // rows after the T * k routed ones (at y + T * k * hidden). False, with nothing run, where
  // a backend has no joint form for these arguments: the caller then runs the two itself.
  virtual absl::StatusOr<bool> ExpertsSwiGluShared(
      const QuantWeight& /*gate*/, const QuantWeight& /*up*/, const QuantWeight& /*down*/,
      const QuantWeight& /*shared_gate*/, const QuantWeight& /*shared_up*/,
      const QuantWeight& /*shared_down*/, const float* /*x*/, int64_t /*T*/,
      const int32_t* /*ids*/, int64_t /*k*/, ActDType /*t*/, float* /*y*/) {
    return false;
  }
  virtual absl::Status MoeCombine(const float* y, const float* w, const float* shared,
                                  int64_t T, int64_t k, int64_t hidden, cpu::CombineMode mode,
                                  ActDType t, float* out) = 0;
  // A sigmoid-routed MoE block with a shared expert in one op: out = MoeCombine (fp32 sum)
  // of RouteSigmoid over Linear(router, x), the routed experts (ExpertsSwiGlu) and the shared
  // expert's SwiGLU MLP, as MlaStage::Moe composes them from the ops above, so that a backend
  // may overlap the shared expert with the routing (the CUDA backend's side stream). False,
  // with nothing run, where a backend has no joint form: the caller composes the ops itself.
  struct MoeBlockWeights {
    const QuantWeight* router = nullptr;
    const TensorView* score_bias = nullptr;
    const QuantWeight* gate = nullptr;
    const QuantWeight* up = nullptr;
    const QuantWeight* down = nullptr;
    const QuantWeight* shared_gate = nullptr;
    const QuantWeight* shared_up = nullptr;
    const QuantWeight* shared_down = nullptr;
  };
  virtual absl::StatusOr<bool> MoeBlock(const MoeBlockWeights& /*w*/,
                                        const cpu::SigmoidRouting& /*r*/, const float* /*x*/,
                                        int64_t /*T*/, ActDType /*t*/, float* /*out*/) {
    return false;
  }
  // host_out[r] = argmax of row r of x [rows, n] (lowest index on ties).
  virtual absl::Status ArgMax(const float* x, int64_t rows, int64_t n, int32_t* host_out) = 0;
  // *host_out = cpu::SampleToken of one row of logits [vocab] for `req`, computed where the
  // row is: only the token (and its logprobs) crosses to the host. InvalidArgument when `req`
  // does not Validate(vocab).
  virtual absl::Status Sample(const float* logits_row, int64_t vocab, const SampleRequest& req,
                              SampledToken* host_out) = 0;
};

// jitter: LoadOptions::TEST_jitter.
std::shared_ptr<Backend> NewCpuBackend(double jitter = 0);
// "cuda:N". Unimplemented when this build has no CUDA backend; FailedPrecondition when no
// such device is visible.
absl::StatusOr<std::shared_ptr<Backend>> NewCudaBackend(int ordinal);

// Test-only fault injection (LoadOptions::TEST_fault): `inner` with one kernel made wrong
// the way real kernel bugs are. Specs (InvalidArgument on anything else):
//   "scale:NAME[:G]"    every matmul with a weight whose name contains NAME reads scale
//                       group G (default 0) of every row at twice its value (mxfp/nvfp:
//                       exponent + 1; affine and float weights: x2) — a wrong scale on one
//                       quantization group;
//   "bf16-accum:rms_norm"  RMSNorm sums its squares in bf16 instead of fp32.
absl::StatusOr<std::shared_ptr<Backend>> NewFaultBackend(std::shared_ptr<Backend> inner,
                                                         const std::string& spec);

}  // namespace ring::internal

#endif  // RINGSERVE_MODELS_BACKEND_H_
