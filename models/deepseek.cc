// Layer program of the DeepSeek family: deepseek_v3, deepseek_v32 and glm_moe_dsa
// (GLM-5.x). MLA attention with the compressed latent KV cache, the DSA lightning indexer
// (v32 / GLM) with GLM-5.2 IndexShare, and DeepSeek MoE (sigmoid + correction bias,
// group-limited top-k, shared experts). Follows shared spec §1 step by step; the comments
// name the MLX rounding points that matter for agreement with mlx-lm.
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/status.h"
#include "models/families.h"

namespace ring::internal {
namespace {

using cpu::RoundAct;
using cpu::RoundActInPlace;

constexpr float kBf16Lowest = -3.3895313892515355e38f;  // finfo(bfloat16).min

struct MlaLayer {
  TensorView input_norm, post_norm;
  bool q_lora = false;
  QuantWeight q_a_proj, q_b_proj, q_proj;
  TensorView q_a_norm;
  QuantWeight kv_a_proj;
  TensorView kv_a_norm;
  QuantWeight embed_q, unembed_out, o_proj;
  // Indexer: present on "full" layers of v32/GLM.
  bool indexer = false;
  bool indexer_shared = false;
  QuantWeight wq_b, wk, weights_proj;
  TensorView k_norm_w, k_norm_b;
  // MLP.
  bool moe = false;
  Mlp dense;
  QuantWeight router;  // [E, hidden], unquantized
  TensorView score_bias;
  Experts experts;
  bool has_shared = false;
  Mlp shared;
};

struct MlaCache {
  std::vector<float> latent;   // [S, kv_lora]
  std::vector<float> k_pe;     // [S, rope]
  std::vector<float> index_k;  // [S, index_head_dim]
};

class MlaSequence : public SequenceState {
 public:
  explicit MlaSequence(int64_t layers) : caches(layers) {}
  int64_t cache_bytes() const override {
    int64_t b = 0;
    for (const auto& c : caches) b += 4 * (c.latent.size() + c.k_pe.size() + c.index_k.size());
    return b;
  }
  std::vector<MlaCache> caches;  // indexed by layer - range.begin
};

class MlaStage : public LayeredStage {
 public:
  using LayeredStage::LayeredStage;
  absl::Status Load();
  std::unique_ptr<Sequence> NewSequence() const override {
    return std::make_unique<MlaSequence>(range().end - range().begin);
  }

 protected:
  BlockNorms Norms(int64_t layer) const override {
    const MlaLayer& L = layers_[layer - range().begin];
    return {L.input_norm, L.post_norm};
  }
  absl::Status Attention(int64_t layer, SequenceState& seq, const float* x, int64_t rows,
                         TopkCarry& carry, float* out) const override;
  void FeedForward(int64_t layer, const float* x, int64_t rows, float* out) const override;

 private:
  void Attend(const MlaLayer& L, MlaCache& cache, const float* x, int64_t T, int64_t offset,
              TopkCarry& carry, int64_t layer, float* out) const;
  // Returns false when the context is short enough that the layer stays dense.
  bool RunIndexer(const MlaLayer& L, MlaCache& cache, const float* x, const float* qr,
                  int64_t T, int64_t offset, std::vector<int32_t>* topk) const;
  void Moe(const MlaLayer& L, const float* x, int64_t T, float* out) const;

  std::vector<MlaLayer> layers_;
  RopeTable rope_, index_rope_;
  float scale_ = 1.f;
};

absl::Status MlaStage::Load() {
  const ModelConfig& c = ctx_.cfg;
  WeightLoader w(*ctx_.ckpt, c);
  const int64_t H = c.num_attention_heads, hid = c.hidden_size;
  const int64_t nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim, vd = c.v_head_dim;
  const int64_t kvl = c.kv_lora_rank;
  if (H <= 0 || kvl <= 0 || rope <= 0 || rope % 2 || nope <= 0 || vd <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        ctx_.ckpt->dir(), "/config.json: MLA needs positive num_attention_heads, kv_lora_rank, "
        "qk_nope_head_dim, v_head_dim and an even qk_rope_head_dim"));
  }
  RING_ASSIGN_OR_RETURN(rope_, MakeRope(c.rope, rope, /*traditional=*/true));
  scale_ = 1.f / std::sqrt(static_cast<float>(nope + rope));
  if (c.rope.type != "default" && c.rope.mscale_all_dim != 0 && c.rope.factor > 1) {
    const double s = 0.1 * c.rope.mscale_all_dim * std::log(c.rope.factor) + 1.0;
    scale_ = static_cast<float>(scale_ * s * s);
  }
  if (c.has_indexer()) {
    if (c.index_head_dim < rope || c.index_n_heads <= 0 || c.index_topk <= 0 || !c.q_lora_rank) {
      return absl::InvalidArgumentError(
          "the DSA indexer needs index_n_heads > 0, index_topk > 0, index_head_dim >= "
          "qk_rope_head_dim and a q_lora_rank");
    }
    RING_ASSIGN_OR_RETURN(index_rope_, MakeRope(c.rope, rope, c.indexer_rope_interleave));
  }
  for (int64_t l = range().begin; l < range().end; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    MlaLayer L;
    RING_ASSIGN_OR_RETURN(L.input_norm, w.Tensor(p + "input_layernorm.weight", {hid}));
    RING_ASSIGN_OR_RETURN(L.post_norm, w.Tensor(p + "post_attention_layernorm.weight", {hid}));
    const std::string a = p + "self_attn.";
    L.q_lora = c.q_lora_rank.has_value();
    if (L.q_lora) {
      const int64_t ql = *c.q_lora_rank;
      RING_ASSIGN_OR_RETURN(L.q_a_proj, w.Linear(a + "q_a_proj", {}, ql, hid));
      RING_ASSIGN_OR_RETURN(L.q_a_norm, w.Tensor(a + "q_a_layernorm.weight", {ql}));
      RING_ASSIGN_OR_RETURN(L.q_b_proj, w.Linear(a + "q_b_proj", {}, H * (nope + rope), ql));
    } else {
      RING_ASSIGN_OR_RETURN(L.q_proj, w.Linear(a + "q_proj", {}, H * (nope + rope), hid));
    }
    RING_ASSIGN_OR_RETURN(L.kv_a_proj, w.Linear(a + "kv_a_proj_with_mqa", {}, kvl + rope, hid));
    RING_ASSIGN_OR_RETURN(L.kv_a_norm, w.Tensor(a + "kv_a_layernorm.weight", {kvl}));
    if (w.Has(a + "kv_b_proj.weight")) {
      return absl::UnimplementedError(absl::StrCat(
          a, "kv_b_proj is an HF-layout tensor; convert the checkpoint with mlx_lm.convert "
             "(RingServe reads the MLX layout with embed_q/unembed_out)"));
    }
    RING_ASSIGN_OR_RETURN(L.embed_q, w.Linear(a + "embed_q", {H}, kvl, nope));
    RING_ASSIGN_OR_RETURN(L.unembed_out, w.Linear(a + "unembed_out", {H}, vd, kvl));
    RING_ASSIGN_OR_RETURN(L.o_proj, w.Linear(a + "o_proj", {}, hid, H * vd));
    if (c.has_indexer()) {
      L.indexer = true;
      L.indexer_shared = !c.has_indexer_weights(l);
      if (!L.indexer_shared) {
        const std::string ix = a + "indexer.";
        const int64_t ih = c.index_n_heads, id = c.index_head_dim;
        RING_ASSIGN_OR_RETURN(L.wq_b, w.Linear(ix + "wq_b", {}, ih * id, *c.q_lora_rank));
        RING_ASSIGN_OR_RETURN(L.wk, w.Linear(ix + "wk", {}, id, hid));
        RING_ASSIGN_OR_RETURN(L.k_norm_w, w.Tensor(ix + "k_norm.weight", {id}));
        RING_ASSIGN_OR_RETURN(L.k_norm_b, w.Tensor(ix + "k_norm.bias", {id}));
        RING_ASSIGN_OR_RETURN(L.weights_proj, w.Linear(ix + "weights_proj", {}, ih, hid));
      }
    }
    const std::string m = p + "mlp.";
    L.moe = c.is_moe_layer(l);
    if (L.moe) {
      const int64_t E = c.n_routed_experts;
      if (c.topk_method != "noaux_tc" || c.scoring_func != "sigmoid") {
        return absl::UnimplementedError(absl::StrCat(
            "MoE routing topk_method='", c.topk_method, "' scoring_func='", c.scoring_func,
            "' is not supported (only noaux_tc + sigmoid, as mlx-lm)"));
      }
      if (c.num_experts_per_tok <= 0 || c.num_experts_per_tok > E || c.n_group <= 0 ||
          E % c.n_group != 0 || c.topk_group > c.n_group) {
        return absl::InvalidArgumentError(
            "MoE config: need 0 < num_experts_per_tok <= n_routed_experts, n_group dividing "
            "n_routed_experts and topk_group <= n_group");
      }
      RING_ASSIGN_OR_RETURN(L.router, w.Linear(m + "gate", {}, E, hid));
      RING_ASSIGN_OR_RETURN(L.score_bias, w.Tensor(m + "gate.e_score_correction_bias", {E}));
      RING_ASSIGN_OR_RETURN(L.experts,
                            LoadExperts(w, m + "switch_mlp", E, hid, c.moe_intermediate_size));
      if (c.n_shared_experts > 0) {
        L.has_shared = true;
        RING_ASSIGN_OR_RETURN(L.shared, LoadMlp(w, m + "shared_experts", hid,
                                                c.moe_intermediate_size * c.n_shared_experts));
      }
    } else {
      RING_ASSIGN_OR_RETURN(L.dense, LoadMlp(w, m.substr(0, m.size() - 1), hid,
                                             c.intermediate_size));
    }
    layers_.push_back(std::move(L));
  }
  return LoadEnds(w);
}

bool MlaStage::RunIndexer(const MlaLayer& L, MlaCache& cache, const float* x, const float* qr,
                          int64_t T, int64_t offset, std::vector<int32_t>* topk) const {
  const ModelConfig& c = ctx_.cfg;
  const auto t = ctx_.act;
  const int64_t ih = c.index_n_heads, id = c.index_head_dim, hid = c.hidden_size;
  std::vector<float> q(T * ih * id), k(T * id);
  Linear(L.wq_b, qr, T, t, q.data());
  Linear(L.wk, x, T, t, k.data());
  cpu::LayerNorm(k.data(), T, id, L.k_norm_w, L.k_norm_b, 1e-5f, t, k.data());
  ApplyRope(index_rope_, q.data(), T, ih, id, ih * id, offset, t);
  ApplyRope(index_rope_, k.data(), T, 1, id, id, offset, t);
  cache.index_k.insert(cache.index_k.end(), k.begin(), k.end());
  const int64_t S = offset + T;
  if (S <= c.index_topk) return false;
  // scores[h][t][j] = relu(q_th . k_j) (bf16 matmul), times w_th = weights_proj(x) * scale.
  std::vector<float> w(T * ih);
  Linear(L.weights_proj, x, T, t, w.data());
  const float wscale = static_cast<float>(1.0 / std::sqrt(double(ih)) / std::sqrt(double(id)));
  for (auto& v : w) v = RoundAct(v * wscale, t);
  std::vector<float> total(T * S);
  topk->assign(T * c.index_topk, 0);
  cpu::ParallelFor(T, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> hs(S);
    for (int64_t r = t0; r < t1; ++r) {
      float* tot = total.data() + r * S;
      for (int64_t hh = 0; hh < ih; ++hh) {
        const float* qh = q.data() + (r * ih + hh) * id;
        for (int64_t j = 0; j < S; ++j) {
          const float* kj = cache.index_k.data() + j * id;
          float dot = 0.f;
          for (int64_t d = 0; d < id; ++d) dot += qh[d] * kj[d];
          dot = std::max(RoundAct(dot, t), 0.f);
          const float sc = RoundAct(dot * w[r * ih + hh], t);
          // mlx-lm sums heads one at a time in bf16 for s > 1 and with mx.sum (fp32
          // accumulation, one rounding) for s == 1.
          if (T > 1) {
            tot[j] = hh == 0 ? sc : RoundAct(tot[j] + sc, t);
          } else {
            tot[j] = hh == 0 ? sc : tot[j] + sc;
          }
        }
      }
      if (T == 1) {
        for (int64_t j = 0; j < S; ++j) tot[j] = RoundAct(tot[j], t);
      } else {
        for (int64_t j = offset + r + 1; j < S; ++j)
          tot[j] = -std::numeric_limits<float>::infinity();
      }
      std::vector<int32_t> sel = cpu::TopKIndices(tot, S, c.index_topk);
      std::copy(sel.begin(), sel.end(), topk->begin() + r * c.index_topk);
    }
  });
  (void)hid;
  return true;
}

void MlaStage::Attend(const MlaLayer& L, MlaCache& cache, const float* x, int64_t T,
                      int64_t offset, TopkCarry& carry, int64_t layer, float* out) const {
  const ModelConfig& c = ctx_.cfg;
  const auto t = ctx_.act;
  const int64_t H = c.num_attention_heads, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim;
  const int64_t qd = nope + rope, vd = c.v_head_dim, kvl = c.kv_lora_rank;

  std::vector<float> qr, q(T * H * qd);
  if (L.q_lora) {
    const int64_t ql = *c.q_lora_rank;
    qr.resize(T * ql);
    Linear(L.q_a_proj, x, T, t, qr.data());
    cpu::RmsNorm(qr.data(), T, ql, L.q_a_norm, 1e-6f, t, qr.data());
    Linear(L.q_b_proj, qr.data(), T, t, q.data());
  } else {
    Linear(L.q_proj, x, T, t, q.data());
  }
  std::vector<float> ckv(T * (kvl + rope));
  Linear(L.kv_a_proj, x, T, t, ckv.data());
  std::vector<float> latent(T * kvl), kpe(T * rope);
  for (int64_t r = 0; r < T; ++r) {
    std::copy_n(ckv.data() + r * (kvl + rope), kvl, latent.data() + r * kvl);
    std::copy_n(ckv.data() + r * (kvl + rope) + kvl, rope, kpe.data() + r * rope);
  }
  cpu::RmsNorm(latent.data(), T, kvl, L.kv_a_norm, 1e-6f, t, latent.data());
  ApplyRope(rope_, q.data() + nope, T, H, qd, H * qd, offset, t);
  ApplyRope(rope_, kpe.data(), T, 1, rope, rope, offset, t);
  cache.latent.insert(cache.latent.end(), latent.begin(), latent.end());
  cache.k_pe.insert(cache.k_pe.end(), kpe.begin(), kpe.end());
  const int64_t S = offset + T;

  // Sparse selection: a full layer runs its indexer; a shared one reuses the carry.
  std::vector<int32_t> topk;
  bool sparse = false;
  if (L.indexer && !L.indexer_shared) {
    sparse = RunIndexer(L, cache, x, qr.data(), T, offset, &topk);
    carry.source_layer = layer;
    carry.dense = !sparse;
    carry.k = sparse ? c.index_topk : 0;
    carry.indices = topk;
  } else if (L.indexer_shared && carry.source_layer >= 0 && !carry.dense) {
    sparse = true;
    topk = carry.indices;
  }
  const int64_t K = sparse ? c.index_topk : 0;

  // Keys visible to each query: decode with top-k gathers K cached rows; otherwise all S.
  const bool gather = sparse && T == 1;
  const int64_t Sk = gather ? K : S;
  std::vector<float> glat, gpe;
  const float* lat = cache.latent.data();
  const float* pe = cache.k_pe.data();
  if (gather) {
    glat.resize(K * kvl);
    gpe.resize(K * rope);
    for (int64_t j = 0; j < K; ++j) {
      std::copy_n(cache.latent.data() + topk[j] * kvl, kvl, glat.data() + j * kvl);
      std::copy_n(cache.k_pe.data() + topk[j] * rope, rope, gpe.data() + j * rope);
    }
    lat = glat.data();
    pe = gpe.data();
  }
  // pe_scores[h][i][j] = round(round(q_pe * scale) . k_pe_j), masked to bf16's lowest.
  std::vector<float> qpe(T * H * rope);
  for (int64_t r = 0; r < T; ++r)
    for (int64_t hh = 0; hh < H; ++hh)
      for (int64_t d = 0; d < rope; ++d)
        qpe[(r * H + hh) * rope + d] = RoundAct(q[(r * H + hh) * qd + nope + d] * scale_, t);
  std::vector<float> pe_scores(H * T * Sk);
  std::vector<uint8_t> allowed;
  if (T > 1) {
    allowed.assign(T * Sk, 0);
    for (int64_t i = 0; i < T; ++i) {
      if (sparse) {
        for (int64_t s = 0; s < K; ++s) allowed[i * Sk + topk[i * K + s]] = 1;
      } else {
        std::fill_n(allowed.begin() + i * Sk, Sk, 1);
      }
      for (int64_t j = offset + i + 1; j < Sk; ++j) allowed[i * Sk + j] = 0;
    }
  }
  cpu::ParallelFor(H, 1, [&](int64_t h0, int64_t h1) {
    for (int64_t hh = h0; hh < h1; ++hh) {
      float* ps = pe_scores.data() + hh * T * Sk;
      cpu::MatMulABt(qpe.data() + hh * rope, H * rope, pe, rope, T, Sk, rope, ps, Sk, t);
      if (!allowed.empty()) {
        for (int64_t i = 0; i < T * Sk; ++i)
          if (!allowed[i]) ps[i] = kBf16Lowest;
      }
    }
  });
  std::vector<float> qn(T * H * nope);
  for (int64_t r = 0; r < T; ++r)
    for (int64_t hh = 0; hh < H; ++hh)
      std::copy_n(q.data() + (r * H + hh) * qd, nope, qn.data() + (r * H + hh) * nope);

  std::vector<float> attn(T * H * vd);
  if (T > 1) {
    // Expanded form: per-head keys latent @ W_UK and values latent @ W_UV^T.
    std::vector<float> kexp(Sk * H * nope), vexp(Sk * H * vd);
    cpu::ParallelFor(H, 1, [&](int64_t h0, int64_t h1) {
      std::vector<float> kb(Sk * nope), vb(Sk * vd);
      for (int64_t hh = h0; hh < h1; ++hh) {
        QMatmulN(lat, Sk, L.embed_q, hh, kb.data());
        QMatmulT(lat, Sk, L.unembed_out, hh, vb.data());
        for (int64_t j = 0; j < Sk; ++j) {
          for (int64_t d = 0; d < nope; ++d)
            kexp[(j * H + hh) * nope + d] = RoundAct(kb[j * nope + d], t);
          for (int64_t d = 0; d < vd; ++d)
            vexp[(j * H + hh) * vd + d] = RoundAct(vb[j * vd + d], t);
        }
      }
    });
    cpu::AttentionArgs args{qn.data(), H * nope, kexp.data(), H * nope, vexp.data(), H * vd,
                            T, Sk, H, H, nope, vd, scale_, pe_scores.data(), -1};
    cpu::Attention(args, t, attn.data());
  } else {
    // Absorbed form: queries move into the latent space, K = V = latent (one KV head).
    std::vector<float> qlat(H * kvl), olat(H * kvl);
    for (int64_t hh = 0; hh < H; ++hh) {
      QMatmulT(qn.data() + hh * nope, 1, L.embed_q, hh, qlat.data() + hh * kvl);
    }
    RoundActInPlace(qlat.data(), qlat.size(), t);
    cpu::AttentionArgs args{qlat.data(), H * kvl, lat, kvl, lat, kvl,
                            1, Sk, H, 1, kvl, kvl, scale_, pe_scores.data(), -1};
    cpu::Attention(args, t, olat.data());
    for (int64_t hh = 0; hh < H; ++hh) {
      QMatmulT(olat.data() + hh * kvl, 1, L.unembed_out, hh, attn.data() + hh * vd);
    }
    RoundActInPlace(attn.data(), attn.size(), t);
  }
  Linear(L.o_proj, attn.data(), T, t, out);
}

void MlaStage::Moe(const MlaLayer& L, const float* x, int64_t T, float* out) const {
  const ModelConfig& c = ctx_.cfg;
  const auto t = ctx_.act;
  const int64_t E = c.n_routed_experts, K = c.num_experts_per_tok, hid = c.hidden_size;
  std::vector<float> logits(T * E);
  Linear(L.router, x, T, t, logits.data());
  std::vector<float> shared;
  if (L.has_shared) {
    shared.resize(T * hid);
    RunMlp(L.shared, x, T, t, shared.data());
  }
  cpu::ParallelFor(T, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> s(E), sel(E), y(K * hid);
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t e = 0; e < E; ++e) {
        s[e] = 1.f / (1.f + std::exp(-logits[r * E + e]));
        sel[e] = s[e] + L.score_bias.at(e);
      }
      if (c.n_group > 1) {
        // Group score = sum of its two best experts; the n_group - topk_group weakest
        // groups are zeroed (set to 0.0, as mlx-lm does, not -inf).
        const int64_t gs = E / c.n_group;
        std::vector<float> gscore(c.n_group);
        for (int64_t g = 0; g < c.n_group; ++g) {
          std::vector<int32_t> top2 = cpu::TopKIndices(sel.data() + g * gs, gs, 2);
          gscore[g] = 0.f;
          for (int32_t i : top2) gscore[g] += sel[g * gs + i];
        }
        std::vector<float> neg(c.n_group);
        for (int64_t g = 0; g < c.n_group; ++g) neg[g] = -gscore[g];
        for (int32_t g : cpu::TopKIndices(neg.data(), c.n_group, c.n_group - c.topk_group))
          std::fill_n(sel.begin() + g * gs, gs, 0.f);
      }
      std::vector<int32_t> ids = cpu::TopKIndices(sel.data(), E, K);
      std::vector<float> wts(K);
      float denom = 0.f;
      for (int64_t k = 0; k < K; ++k) denom += (wts[k] = s[ids[k]]);
      for (int64_t k = 0; k < K; ++k) {
        if (K > 1 && c.norm_topk_prob) wts[k] /= denom;
        wts[k] *= static_cast<float>(c.routed_scaling_factor);
      }
      RunExperts(L.experts, x + r * hid, ids.data(), K, t, y.data());
      for (int64_t d = 0; d < hid; ++d) {
        float acc = 0.f;
        for (int64_t k = 0; k < K; ++k) acc += y[k * hid + d] * wts[k];
        float v = RoundAct(acc, t);
        if (L.has_shared) v = RoundAct(v + shared[r * hid + d], t);
        out[r * hid + d] = v;
      }
    }
  });
}

absl::Status MlaStage::Attention(int64_t layer, SequenceState& seq_base, const float* x,
                                 int64_t T, TopkCarry& carry, float* out) const {
  auto& seq = static_cast<MlaSequence&>(seq_base);
  const MlaLayer& L = layers_[layer - range().begin];
  if (L.indexer_shared && carry.source_layer < 0 &&
      seq.position_ + T > ctx_.cfg.index_topk) {
    return absl::FailedPreconditionError(absl::StrCat(
        "layer ", layer, " shares the indexer of an earlier layer but no top-k indices "
        "reached this stage; the previous stage must send them"));
  }
  Attend(L, seq.caches[layer - range().begin], x, T, seq.position_, carry, layer, out);
  return absl::OkStatus();
}

void MlaStage::FeedForward(int64_t layer, const float* x, int64_t T, float* out) const {
  const MlaLayer& L = layers_[layer - range().begin];
  if (L.moe) {
    Moe(L, x, T, out);
  } else {
    RunMlp(L.dense, x, T, ctx_.act, out);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Stage>> NewMlaStage(StageContext ctx) {
  auto stage = std::make_unique<MlaStage>(std::move(ctx));
  RING_RETURN_IF_ERROR(stage->Load());
  return stage;
}

}  // namespace ring::internal
