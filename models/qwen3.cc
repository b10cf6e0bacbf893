// Layer program of qwen3 and qwen3_moe (shared spec §5): GQA attention with per-head
// RMSNorm on q and k before a half-split RoPE, SwiGLU MLP, and for Qwen3-MoE a softmax
// router over all experts with top-k (no shared expert, no scaling factor).
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/status.h"
#include "models/families.h"

namespace ring::internal {
namespace {

using cpu::RoundAct;

struct QwenLayer {
  TensorView input_norm, post_norm, q_norm, k_norm;
  QuantWeight q_proj, k_proj, v_proj, o_proj;
  bool moe = false;
  Mlp dense;
  QuantWeight router;
  Experts experts;
};

struct KvCache {
  std::vector<float> k, v;  // [S, kv_heads, head_dim]
};

class QwenSequence : public SequenceState {
 public:
  explicit QwenSequence(int64_t layers) : caches(layers) {}
  int64_t cache_bytes() const override {
    int64_t b = 0;
    for (const auto& c : caches) b += 4 * (c.k.size() + c.v.size());
    return b;
  }
  std::vector<KvCache> caches;
};

class QwenStage : public LayeredStage {
 public:
  using LayeredStage::LayeredStage;
  absl::Status Load();
  std::unique_ptr<Sequence> NewSequence() const override {
    return std::make_unique<QwenSequence>(range().end - range().begin);
  }

 protected:
  BlockNorms Norms(int64_t layer) const override {
    const QwenLayer& L = layers_[layer - range().begin];
    return {L.input_norm, L.post_norm};
  }
  absl::Status Attention(int64_t layer, SequenceState& seq, const float* x, int64_t rows,
                         TopkCarry& carry, float* out) const override;
  void FeedForward(int64_t layer, const float* x, int64_t rows, float* out) const override;

 private:
  void Moe(const QwenLayer& L, const float* x, int64_t T, float* out) const;
  std::vector<QwenLayer> layers_;
  RopeTable rope_;
  int64_t head_dim_ = 0;
};

absl::Status QwenStage::Load() {
  const ModelConfig& c = ctx_.cfg;
  WeightLoader w(*ctx_.ckpt, c);
  const int64_t H = c.num_attention_heads, KV = c.num_key_value_heads, hid = c.hidden_size;
  head_dim_ = c.head_dim;
  if (H <= 0 || KV <= 0 || H % KV != 0 || head_dim_ <= 0 || head_dim_ % 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        ctx_.ckpt->dir(), "/config.json: need num_attention_heads divisible by "
        "num_key_value_heads and an even head_dim"));
  }
  RING_ASSIGN_OR_RETURN(rope_, MakeRope(c.rope, head_dim_, /*traditional=*/false));
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

void QwenStage::Moe(const QwenLayer& L, const float* x, int64_t T, float* out) const {
  const ModelConfig& c = ctx_.cfg;
  const auto t = ctx_.act;
  const int64_t E = c.num_experts, K = c.num_experts_per_tok, hid = c.hidden_size;
  std::vector<float> gates(T * E);
  Linear(L.router, x, T, t, gates.data());
  cpu::ParallelFor(T, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> p(E), y(K * hid);
    for (int64_t r = r0; r < r1; ++r) {
      // softmax(precise=True): fp32 inside, the probabilities stored in the act dtype.
      const float* g = gates.data() + r * E;
      float mx = g[0];
      for (int64_t e = 1; e < E; ++e) mx = std::max(mx, g[e]);
      float sum = 0.f;
      for (int64_t e = 0; e < E; ++e) sum += (p[e] = std::exp(g[e] - mx));
      for (int64_t e = 0; e < E; ++e) p[e] = RoundAct(p[e] / sum, t);
      std::vector<int32_t> ids = cpu::TopKIndices(p.data(), E, K);
      std::vector<float> sc(K);
      float denom = 0.f;
      for (int64_t k = 0; k < K; ++k) denom += (sc[k] = p[ids[k]]);
      if (c.norm_topk_prob) {
        denom = RoundAct(denom, t);
        for (auto& v : sc) v = RoundAct(v / denom, t);
      }
      RunExperts(L.experts, x + r * hid, ids.data(), K, t, y.data());
      for (int64_t d = 0; d < hid; ++d) {
        float acc = 0.f;
        for (int64_t k = 0; k < K; ++k) acc += RoundAct(y[k * hid + d] * sc[k], t);
        out[r * hid + d] = RoundAct(acc, t);
      }
    }
  });
}

absl::Status QwenStage::Attention(int64_t layer, SequenceState& seq_base, const float* xn,
                                  int64_t T, TopkCarry& /*carry*/, float* out) const {
  auto& seq = static_cast<QwenSequence&>(seq_base);
  const ModelConfig& c = ctx_.cfg;
  const auto t = ctx_.act;
  const int64_t H = c.num_attention_heads, KV = c.num_key_value_heads;
  const int64_t d = head_dim_, offset = seq.position_;
  const QwenLayer& L = layers_[layer - range().begin];
  KvCache& cache = seq.caches[layer - range().begin];
  const float eps = static_cast<float>(c.rms_norm_eps);

  std::vector<float> q(T * H * d), k(T * KV * d), v(T * KV * d);
  Linear(L.q_proj, xn, T, t, q.data());
  Linear(L.k_proj, xn, T, t, k.data());
  Linear(L.v_proj, xn, T, t, v.data());
  cpu::RmsNorm(q.data(), T * H, d, L.q_norm, eps, t, q.data());
  cpu::RmsNorm(k.data(), T * KV, d, L.k_norm, eps, t, k.data());
  ApplyRope(rope_, q.data(), T, H, d, H * d, offset, t);
  ApplyRope(rope_, k.data(), T, KV, d, KV * d, offset, t);
  cache.k.insert(cache.k.end(), k.begin(), k.end());
  cache.v.insert(cache.v.end(), v.begin(), v.end());
  const int64_t S = offset + T;
  std::vector<float> attn(T * H * d);
  cpu::AttentionArgs args{q.data(), H * d, cache.k.data(), KV * d, cache.v.data(), KV * d,
                          T, S, H, KV, d, d, 1.f / std::sqrt(static_cast<float>(d)), nullptr,
                          T > 1 ? offset : -1};
  cpu::Attention(args, t, attn.data());
  Linear(L.o_proj, attn.data(), T, t, out);
  return absl::OkStatus();
}

void QwenStage::FeedForward(int64_t layer, const float* x, int64_t T, float* out) const {
  const QwenLayer& L = layers_[layer - range().begin];
  if (L.moe) {
    Moe(L, x, T, out);
  } else {
    RunMlp(L.dense, x, T, ctx_.act, out);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Stage>> NewQwen3Stage(StageContext ctx) {
  auto stage = std::make_unique<QwenStage>(std::move(ctx));
  RING_RETURN_IF_ERROR(stage->Load());
  return stage;
}

}  // namespace ring::internal
