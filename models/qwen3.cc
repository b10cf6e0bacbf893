// Layer program of qwen3 and qwen3_moe (shared spec §5): GQA attention with per-head
// RMSNorm on q and k before a half-split RoPE, SwiGLU MLP, and for Qwen3-MoE a softmax
// router over all experts with top-k (no shared expert, no scaling factor). Runs on any
// backend (models/backend.h).
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/status.h"
#include "models/families.h"

namespace ring::internal {
namespace {

struct QwenLayer {
  TensorView input_norm, post_norm, q_norm, k_norm;
  QuantWeight q_proj, k_proj, v_proj, o_proj;
  bool moe = false;
  Mlp dense;
  QuantWeight router;
  Experts experts;
};

struct KvCache {
  CacheRows k, v;  // [S, kv_heads * head_dim]
};

class QwenSequence : public SequenceState {
 public:
  explicit QwenSequence(int64_t layers) : caches(layers) {}
  int64_t cache_bytes_per_token() const override {
    int64_t b = 0;
    for (const auto& c : caches) b += 4 * (c.k.width + c.v.width);
    return b;
  }
  std::vector<KvCache> caches;
};

class QwenStage : public LayeredStage {
 public:
  using LayeredStage::LayeredStage;
  absl::Status Load();
  std::unique_ptr<Sequence> NewSequence() const override {
    auto seq = std::make_unique<QwenSequence>(range().end - range().begin);
    for (KvCache& c : seq->caches) {
      c.k.width = c.v.width = ctx_.cfg.num_key_value_heads * head_dim_;
    }
    return seq;
  }

 protected:
  BlockNorms Norms(int64_t layer) const override {
    const QwenLayer& L = layers_[layer - range().begin];
    return {L.input_norm, L.post_norm};
  }
  absl::Status ReserveCaches(SequenceState& seq, int64_t rows) const override;
  absl::Status Attention(int64_t layer, const std::vector<Segment>& segs, const float* x,
                         int64_t rows, float* out) const override;
  absl::Status FeedForward(int64_t layer, const float* x, int64_t rows,
                           float* out) const override;

 private:
  absl::Status Moe(const QwenLayer& L, const float* x, int64_t T, float* out) const;
  std::vector<QwenLayer> layers_;
  RopeTable rope_;
  int64_t head_dim_ = 0;
};

absl::Status QwenStage::Load() {
  const ModelConfig& c = ctx_.cfg;
  WeightLoader w(*ctx_.ckpt, c, backend());
  const int64_t H = c.num_attention_heads, KV = c.num_key_value_heads, hid = c.hidden_size;
  head_dim_ = c.head_dim;
  if (H <= 0 || KV <= 0 || H % KV != 0 || head_dim_ <= 0 || head_dim_ % 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        ctx_.ckpt->dir(), "/config.json: need num_attention_heads divisible by "
        "num_key_value_heads and an even head_dim"));
  }
  RING_ASSIGN_OR_RETURN(rope_, MakeRope(c.rope, head_dim_, /*traditional=*/false));
  RING_RETURN_IF_ERROR(backend().AddRope(rope_));
  const int64_t d = head_dim_;
  for (int64_t l = range().begin; l < range().end; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    QwenLayer L;
    RING_ASSIGN_OR_RETURN(L.input_norm, w.Tensor(p + "input_layernorm.weight", {hid}));
    RING_ASSIGN_OR_RETURN(L.post_norm, w.Tensor(p + "post_attention_layernorm.weight", {hid}));
    const std::string a = p + "self_attn.";
    RING_ASSIGN_OR_RETURN(L.q_proj, w.Linear(a + "q_proj", {}, H * d, hid));
    RING_ASSIGN_OR_RETURN(L.k_proj, w.Linear(a + "k_proj", {}, KV * d, hid));
    RING_ASSIGN_OR_RETURN(L.v_proj, w.Linear(a + "v_proj", {}, KV * d, hid));
    RING_ASSIGN_OR_RETURN(L.o_proj, w.Linear(a + "o_proj", {}, hid, H * d));
    RING_ASSIGN_OR_RETURN(L.q_norm, w.Tensor(a + "q_norm.weight", {d}));
    RING_ASSIGN_OR_RETURN(L.k_norm, w.Tensor(a + "k_norm.weight", {d}));
    L.moe = c.is_moe_layer(l);
    if (L.moe) {
      const int64_t E = c.num_experts;
      if (c.num_experts_per_tok <= 0 || c.num_experts_per_tok > E) {
        return absl::InvalidArgumentError("need 0 < num_experts_per_tok <= num_experts");
      }
      RING_ASSIGN_OR_RETURN(L.router, w.Linear(p + "mlp.gate", {}, E, hid));
      RING_ASSIGN_OR_RETURN(L.experts, LoadExperts(w, p + "mlp.switch_mlp", E, hid,
                                                   c.moe_intermediate_size));
    } else {
      RING_ASSIGN_OR_RETURN(L.dense, LoadMlp(w, p + "mlp", hid, c.intermediate_size));
    }
    layers_.push_back(std::move(L));
  }
  return LoadEnds(w);
}

absl::Status QwenStage::ReserveCaches(SequenceState& seq_base, int64_t rows) const {
  auto& seq = static_cast<QwenSequence&>(seq_base);
  for (int64_t l = range().begin; l < range().end; ++l) {
    KvCache& c = seq.caches[l - range().begin];
    const std::string what = absl::StrCat("KV cache of layer ", l);
    RING_RETURN_IF_ERROR(c.k.Reserve(backend(), seq.position_, rows, ctx_.max_context, what + " (K)"));
    RING_RETURN_IF_ERROR(c.v.Reserve(backend(), seq.position_, rows, ctx_.max_context, what + " (V)"));
  }
  return absl::OkStatus();
}

absl::Status QwenStage::Moe(const QwenLayer& L, const float* x, int64_t T, float* out) const {
  Backend& b = backend();
  const ModelConfig& c = ctx_.cfg;
  const auto t = ctx_.act;
  const int64_t E = c.num_experts, K = c.num_experts_per_tok, hid = c.hidden_size;
  RING_ASSIGN_OR_RETURN(Buffer gates, b.AllocF(T * E));
  RING_RETURN_IF_ERROR(b.Linear(L.router, x, T, t, gates.f()));
  RING_ASSIGN_OR_RETURN(Buffer ids, b.Alloc(T * K * 4));
  RING_ASSIGN_OR_RETURN(Buffer scores, b.AllocF(T * K));
  RING_RETURN_IF_ERROR(
      b.RouteSoftmax(gates.f(), T, E, K, c.norm_topk_prob, t, ids.i(), scores.f()));
  RING_ASSIGN_OR_RETURN(Buffer y, b.AllocF(T * K * hid));
  RING_RETURN_IF_ERROR(b.ExpertsSwiGlu(L.experts.gate, L.experts.up, L.experts.down, x, T,
                                       ids.i(), K, t, y.f()));
  return b.MoeCombine(y.f(), scores.f(), nullptr, T, K, hid, cpu::CombineMode::kRoundedProducts,
                      t, out);
}

absl::Status QwenStage::Attention(int64_t layer, const std::vector<Segment>& segs,
                                  const float* xn, int64_t T, float* out) const {
  Backend& b = backend();
  const ModelConfig& c = ctx_.cfg;
  const auto t = ctx_.act;
  const int64_t H = c.num_attention_heads, KV = c.num_key_value_heads;
  const int64_t d = head_dim_, kvw = KV * d;
  const int64_t l = layer - range().begin;
  const QwenLayer& L = layers_[l];
  const float eps = static_cast<float>(c.rms_norm_eps);
  auto cache_of = [l](const Segment& s) -> KvCache& {
    return static_cast<QwenSequence&>(*s.seq).caches[l];
  };

  // k and v of this step into scratch rows; HeadNormRope writes each sequence's share to its
  // cache rows, so that every op but the cache write and the attention reads and writes the
  // same buffers at every position (a backend can replay the step from a graph).
  RING_ASSIGN_OR_RETURN(Buffer q, b.AllocF(T * H * d));
  RING_ASSIGN_OR_RETURN(Buffer kv, b.AllocF(2 * T * kvw));
  float* k = kv.f();
  float* v = kv.f() + T * kvw;
  RING_RETURN_IF_ERROR(
      b.LinearMany({&L.q_proj, &L.k_proj, &L.v_proj}, xn, T, t, {q.f(), k, v}));
  RING_ASSIGN_OR_RETURN(Buffer attn, b.AllocF(T * H * d));
  for (const Segment& s : segs) {
    KvCache& cache = cache_of(s);
    const int64_t offset = s.seq->position_;
    float* qs = q.f() + s.row0 * H * d;
    const Backend::KvRows rows{v + s.row0 * kvw, cache.k.row(offset), cache.v.row(offset)};
    RING_RETURN_IF_ERROR(b.HeadNormRope(rope_, qs, H, L.q_norm, k + s.row0 * kvw, KV, L.k_norm,
                                        s.rows, d, eps, offset, t, &rows));
    cpu::AttentionArgs args{qs, H * d, cache.k.row(0), kvw, cache.v.row(0), kvw,
                            s.rows, offset + s.rows, H, KV, d, d,
                            1.f / std::sqrt(static_cast<float>(d)), nullptr,
                            s.rows > 1 ? offset : -1};
    RING_RETURN_IF_ERROR(b.Attention(args, t, attn.f() + s.row0 * H * d));
  }
  return b.Linear(L.o_proj, attn.f(), T, t, out);
}

absl::Status QwenStage::FeedForward(int64_t layer, const float* x, int64_t T, float* out) const {
  const QwenLayer& L = layers_[layer - range().begin];
  if (L.moe) return Moe(L, x, T, out);
  return RunMlp(backend(), L.dense, x, T, ctx_.act, out);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Stage>> NewQwen3Stage(StageContext ctx) {
  auto stage = std::make_unique<QwenStage>(std::move(ctx));
  RING_RETURN_IF_ERROR(stage->Load());
  return stage;
}

}  // namespace ring::internal
