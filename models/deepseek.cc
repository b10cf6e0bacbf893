// Layer program of the DeepSeek family: deepseek_v3, deepseek_v32 and glm_moe_dsa
// (GLM-5.x). MLA attention with the compressed latent KV cache, the DSA lightning indexer
// (v32 / GLM) with GLM-5.2 IndexShare, and DeepSeek MoE (sigmoid + correction bias,
// group-limited top-k, shared experts). Follows shared spec §1 step by step; the comments
// name the MLX rounding points that matter for agreement with mlx-lm. Runs on any backend
// (models/backend.h): the CPU reference engine or a CUDA device.
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/status.h"
#include "models/families.h"

namespace ring::internal {
namespace {


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
  CacheRows latent;   // [S, kv_lora], post-norm
  CacheRows k_pe;     // [S, rope], post-rope
  CacheRows index_k;  // [S, index_head_dim] (full indexer layers only)
};

class MlaSequence : public SequenceState {
 public:
  explicit MlaSequence(int64_t layers) : caches(layers) {}
  int64_t cache_bytes_per_token() const override {
    int64_t b = 0;
    for (const auto& c : caches) b += 4 * (c.latent.width + c.k_pe.width + c.index_k.width);
    return b;
  }
  std::vector<MlaCache> caches;  // indexed by layer - range.begin
};

class MlaStage : public LayeredStage {
 public:
  using LayeredStage::LayeredStage;
  absl::Status Load();
  std::unique_ptr<Sequence> NewSequence() const override {
    auto seq = std::make_unique<MlaSequence>(range().end - range().begin);
    const ModelConfig& c = ctx_.cfg;
    for (int64_t l = range().begin; l < range().end; ++l) {
      MlaCache& cache = seq->caches[l - range().begin];
      const MlaLayer& L = layers_[l - range().begin];
      cache.latent.width = c.kv_lora_rank;
      cache.k_pe.width = c.qk_rope_head_dim;
      cache.index_k.width = L.indexer && !L.indexer_shared ? c.index_head_dim : 0;
    }
    return seq;
  }

 protected:
  BlockNorms Norms(int64_t layer) const override {
    const MlaLayer& L = layers_[layer - range().begin];
    return {L.input_norm, L.post_norm};
  }
  absl::Status ReserveCaches(SequenceState& seq, int64_t rows) const override;
  absl::Status Attention(int64_t layer, const std::vector<Segment>& segs, const float* x,
                         int64_t rows, float* out) const override;
  absl::Status FeedForward(int64_t layer, const float* x, int64_t rows,
                           float* out) const override;

 private:
  // The layer's cache in the segment's sequence.
  MlaCache& CacheOf(int64_t layer, const Segment& s) const {
    return static_cast<MlaSequence&>(*s.seq).caches[layer - range().begin];
  }
  // A full indexer's projections of the layer input x, made in the same call as the
  // attention's (Backend::LinearMany): this step's keys k = wk(x), in scratch rows that each
  // sequence's cache then takes its share of (RunIndexer), so that the projections write the
  // same buffers at every position (a backend can replay them from a graph), and the head
  // weights w = weights_proj(x). q: the indexer's queries wq_b(qr), which Attention makes in
  // the call of q_b_proj on the same qr (one launch on CUDA) when it sets q_done.
  struct IndexerInputs {
    Buffer k, w, q;
    bool q_done = false;
  };
  absl::StatusOr<IndexerInputs> PrepareIndexer(int64_t T) const;
  // Runs the indexer of a full layer and sets each segment's carry: dense when its context is
  // short enough that the layer stays dense, else [rows, index_topk] selected positions.
  // With `deferred` set and one sparse decode row (one segment, one row), the selection
  // itself (IndexerTopK) is left to the caller, which runs it with the row's MLA
  // (Backend::IndexedMlaAttention): *deferred gets its arguments (T = 0 where nothing was
  // left), the carry its buffer.
  absl::Status RunIndexer(const MlaLayer& L, int64_t layer, const std::vector<Segment>& segs,
                          IndexerInputs& in, const float* qr, int64_t T,
                          cpu::IndexerArgs* deferred) const;
  absl::Status Moe(const MlaLayer& L, const float* x, int64_t T, float* out) const;

  std::vector<MlaLayer> layers_;
  RopeTable rope_, index_rope_;
  float scale_ = 1.f;
};

absl::Status MlaStage::Load() {
  const ModelConfig& c = ctx_.cfg;
  WeightLoader w(*ctx_.ckpt, c, backend());
  const int64_t H = c.num_attention_heads, hid = c.hidden_size;
  const int64_t nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim, vd = c.v_head_dim;
  const int64_t kvl = c.kv_lora_rank;
  if (H <= 0 || kvl <= 0 || rope <= 0 || rope % 2 || nope <= 0 || vd <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        ctx_.ckpt->dir(), "/config.json: MLA needs positive num_attention_heads, kv_lora_rank, "
        "qk_nope_head_dim, v_head_dim and an even qk_rope_head_dim"));
  }
  RING_ASSIGN_OR_RETURN(rope_, MakeRope(c.rope, rope, /*traditional=*/true));
  RING_RETURN_IF_ERROR(backend().AddRope(rope_));
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
    RING_RETURN_IF_ERROR(backend().AddRope(index_rope_));
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

absl::Status MlaStage::ReserveCaches(SequenceState& seq_base, int64_t rows) const {
  auto& seq = static_cast<MlaSequence&>(seq_base);
  for (int64_t l = range().begin; l < range().end; ++l) {
    MlaCache& c = seq.caches[l - range().begin];
    const std::string what = absl::StrCat("KV cache of layer ", l);
    RING_RETURN_IF_ERROR(c.latent.Reserve(backend(), seq.position_, rows, ctx_.max_context,
                                          what + " (MLA latent)"));
    RING_RETURN_IF_ERROR(c.k_pe.Reserve(backend(), seq.position_, rows, ctx_.max_context,
                                        what + " (rope key)"));
    if (c.index_k.width > 0) {
      RING_RETURN_IF_ERROR(c.index_k.Reserve(backend(), seq.position_, rows, ctx_.max_context,
                                             what + " (indexer key)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<MlaStage::IndexerInputs> MlaStage::PrepareIndexer(int64_t T) const {
  Backend& b = backend();
  const ModelConfig& c = ctx_.cfg;
  IndexerInputs in;
  RING_ASSIGN_OR_RETURN(in.k, b.AllocF(T * c.index_head_dim));
  RING_ASSIGN_OR_RETURN(in.w, b.AllocF(T * c.index_n_heads));
  RING_ASSIGN_OR_RETURN(in.q, b.AllocF(T * c.index_n_heads * c.index_head_dim));
  return in;
}

absl::Status MlaStage::RunIndexer(const MlaLayer& L, int64_t layer,
                                  const std::vector<Segment>& segs, IndexerInputs& in,
                                  const float* qr, int64_t T, cpu::IndexerArgs* deferred) const {
  Backend& b = backend();
  const ModelConfig& c = ctx_.cfg;
  const auto t = ctx_.act;
  const int64_t ih = c.index_n_heads, id = c.index_head_dim;
  Buffer& q = in.q;
  float* k = in.k.f();
  if (!in.q_done) RING_RETURN_IF_ERROR(b.Linear(L.wq_b, qr, T, t, q.f()));
  bool any_sparse = false;
  for (const Segment& s : segs) any_sparse = any_sparse || s.seq->position_ + s.rows > c.index_topk;
  // w = round(weights_proj(x) * heads^-0.5 * dim^-0.5), for the scores and top-k below.
  Buffer& w = in.w;
  const float wscale = static_cast<float>(1.0 / std::sqrt(double(ih)) / std::sqrt(double(id)));
  // One sequence: the key norm into its cache rows, both RoPEs and the weights' scale in one
  // call (one launch on CUDA).
  const bool one = segs.size() == 1;
  if (one) {
    const int64_t offset = segs[0].seq->position_;
    RING_RETURN_IF_ERROR(b.IndexerNormRope(index_rope_, q.f(), T, ih, id, k, L.k_norm_w, L.k_norm_b, 1e-5f,
                                           offset, any_sparse ? w.f() : nullptr, T * ih, wscale, t,
                                           CacheOf(layer, segs[0]).index_k.row(offset)));
  } else {
    RING_RETURN_IF_ERROR(b.LayerNorm(k, T, id, L.k_norm_w, L.k_norm_b, 1e-5f, t, k));
  }
  for (const Segment& s : segs) {
    MlaCache& cache = CacheOf(layer, s);
    const int64_t offset = s.seq->position_;
    if (!one) {
      float* ks = cache.index_k.row(offset);
      RING_RETURN_IF_ERROR(b.Copy2D(k + s.row0 * id, id, ks, id, s.rows, id));
      RING_RETURN_IF_ERROR(
          b.Rope(index_rope_, q.f() + s.row0 * ih * id, s.rows, ih, id, ih * id, offset, t));
      RING_RETURN_IF_ERROR(b.Rope(index_rope_, ks, s.rows, 1, id, id, offset, t));
    }
    const bool sparse = offset + s.rows > c.index_topk;
    s.carry->source_layer = layer;
    s.carry->dense = !sparse;
    s.carry->k = sparse ? c.index_topk : 0;
    s.carry->indices = Buffer();
  }
  if (!any_sparse) return absl::OkStatus();
  // The scores and top-k in one op.
  if (!one) RING_RETURN_IF_ERROR(b.ScaleRound(w.f(), T * ih, wscale, t));
  for (const Segment& s : segs) {
    if (s.carry->dense) continue;
    RING_ASSIGN_OR_RETURN(s.carry->indices, b.Alloc(s.rows * c.index_topk * 4));
    cpu::IndexerArgs args;
    args.q = q.f() + s.row0 * ih * id;
    args.keys = CacheOf(layer, s).index_k.row(0);
    args.w = w.f() + s.row0 * ih;
    args.T = s.rows;
    args.S = s.seq->position_ + s.rows;
    args.offset = s.seq->position_;
    args.heads = ih;
    args.dim = id;
    args.K = c.index_topk;
    if (deferred != nullptr && one && s.rows == 1) {
      *deferred = args;
      continue;
    }
    RING_RETURN_IF_ERROR(b.IndexerTopK(args, t, s.carry->indices.i()));
  }
  return absl::OkStatus();
}

absl::Status MlaStage::Attention(int64_t layer, const std::vector<Segment>& segs,
                                 const float* x, int64_t T, float* out) const {
  const MlaLayer& L = layers_[layer - range().begin];
  for (const Segment& s : segs) {
    if (L.indexer_shared && s.carry->source_layer < 0 &&
        s.seq->position_ + s.rows > ctx_.cfg.index_topk) {
      return absl::FailedPreconditionError(absl::StrCat(
          "layer ", layer, " shares the indexer of an earlier layer but no top-k indices "
          "reached this stage; the previous stage must send them"));
    }
  }
  Backend& b = backend();
  const ModelConfig& c = ctx_.cfg;
  const auto t = ctx_.act;
  const int64_t H = c.num_attention_heads, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim;
  const int64_t qd = nope + rope, vd = c.v_head_dim, kvl = c.kv_lora_rank;

  // Everything computed from x in one call (one launch on CUDA): q_a (or q), kv_a, and a
  // full indexer's keys and head weights. ckv = [latent_raw | k_pe]: each sequence's latent
  // is normed and its key rotated in the cache rows of this step.
  Buffer qr;
  RING_ASSIGN_OR_RETURN(Buffer q, b.AllocF(T * H * qd));
  RING_ASSIGN_OR_RETURN(Buffer ckv, b.AllocF(T * (kvl + rope)));
  if (L.q_lora) {
    RING_ASSIGN_OR_RETURN(qr, b.AllocF(T * *c.q_lora_rank));
  }
  std::vector<const QuantWeight*> ws = {L.q_lora ? &L.q_a_proj : &L.q_proj, &L.kv_a_proj};
  std::vector<float*> ys = {L.q_lora ? qr.f() : q.f(), ckv.f()};
  const bool own_indexer = L.indexer && !L.indexer_shared;
  IndexerInputs ix;
  if (own_indexer) {
    RING_ASSIGN_OR_RETURN(ix, PrepareIndexer(T));
    ws.insert(ws.end(), {&L.wk, &L.weights_proj});
    ys.insert(ys.end(), {ix.k.f(), ix.w.f()});
  }
  RING_RETURN_IF_ERROR(b.LinearMany(ws, x, T, t, ys));
  if (L.q_lora) {
    RING_RETURN_IF_ERROR(b.RmsNorm(qr.f(), T, *c.q_lora_rank, L.q_a_norm, 1e-6f, t, qr.f()));
    if (own_indexer) {
      // The indexer's queries come from the same normed q_a rows: one call (one decode GEMV
      // launch on CUDA for both weights).
      RING_RETURN_IF_ERROR(b.LinearMany({&L.q_b_proj, &L.wq_b}, qr.f(), T, t, {q.f(), ix.q.f()}));
      ix.q_done = true;
    } else {
      RING_RETURN_IF_ERROR(b.Linear(L.q_b_proj, qr.f(), T, t, q.f()));
    }
  }
  for (const Segment& s : segs) {
    MlaCache& cache = CacheOf(layer, s);
    const int64_t offset = s.seq->position_;
    float* latent = cache.latent.row(offset);
    float* kpe = cache.k_pe.row(offset);
    // The latent row normed, both RoPEs (spec §1: q_pe and k_pe interleaved at offset).
    RING_RETURN_IF_ERROR(b.MlaKvRope(rope_, ckv.f() + s.row0 * (kvl + rope), s.rows, kvl, rope, L.kv_a_norm,
                                     1e-6f, latent, kpe, q.f() + s.row0 * H * qd, H, qd, offset, t));
  }

  // Sparse selection: a full layer runs its indexer; a shared one reuses the carry.
  cpu::IndexerArgs deferred;  // T = 0: the indexer (if any) has run
  if (own_indexer) RING_RETURN_IF_ERROR(RunIndexer(L, layer, segs, ix, qr.f(), T, &deferred));
  RING_ASSIGN_OR_RETURN(Buffer attn, b.AllocF(T * H * vd));
  for (const Segment& s : segs) {
    const TopkState& carry = *s.carry;
    const bool sparse = L.indexer && carry.source_layer >= 0 && !carry.dense;
    const MlaCache& cache = CacheOf(layer, s);
    cpu::MlaAttentionArgs args;
    args.q = q.f() + s.row0 * H * qd;
    args.latent = cache.latent.row(0);
    args.k_pe = cache.k_pe.row(0);
    args.topk = sparse ? carry.indices.i() : nullptr;
    args.T = s.rows;
    args.S = s.seq->position_ + s.rows;
    args.offset = s.seq->position_;
    args.K = sparse ? c.index_topk : 0;
    args.H = H;
    args.nope = nope;
    args.rope = rope;
    args.vd = vd;
    args.kvl = kvl;
    args.scale = scale_;
    float* const o = attn.f() + s.row0 * H * vd;
    if (deferred.T > 0) {  // the one decode row: its selection, then its MLA
      RING_ASSIGN_OR_RETURN(const bool done, b.IndexedMlaAttention(deferred, carry.indices.i(), args,
                                                                   L.embed_q, L.unembed_out, t, o));
      if (done) continue;
      RING_RETURN_IF_ERROR(b.IndexerTopK(deferred, t, carry.indices.i()));
    }
    RING_RETURN_IF_ERROR(b.MlaAttention(args, L.embed_q, L.unembed_out, t, o));
  }
  return b.Linear(L.o_proj, attn.f(), T, t, out);
}

absl::Status MlaStage::Moe(const MlaLayer& L, const float* x, int64_t T, float* out) const {
  Backend& b = backend();
  const ModelConfig& c = ctx_.cfg;
  const auto t = ctx_.act;
  const int64_t E = c.n_routed_experts, K = c.num_experts_per_tok, hid = c.hidden_size;
  cpu::SigmoidRouting r;
  r.E = E;
  r.k = K;
  r.n_group = c.n_group;
  r.topk_group = c.topk_group;
  r.norm_topk_prob = c.norm_topk_prob;
  r.routed_scaling_factor = static_cast<float>(c.routed_scaling_factor);
  if (L.has_shared) {
    // The whole block as one op where the backend has one (the ops below, composed and
    // launched by the backend).
    Backend::MoeBlockWeights w;
    w.router = &L.router;
    w.score_bias = &L.score_bias;
    w.gate = &L.experts.gate;
    w.up = &L.experts.up;
    w.down = &L.experts.down;
    w.shared_gate = &L.shared.gate;
    w.shared_up = &L.shared.up;
    w.shared_down = &L.shared.down;
    RING_ASSIGN_OR_RETURN(const bool done, b.MoeBlock(w, r, x, T, t, out));
    if (done) return absl::OkStatus();
  }
  RING_ASSIGN_OR_RETURN(Buffer logits, b.AllocF(T * E));
  RING_RETURN_IF_ERROR(b.Linear(L.router, x, T, t, logits.f()));
  RING_ASSIGN_OR_RETURN(Buffer ids, b.Alloc(T * K * 4));
  RING_ASSIGN_OR_RETURN(Buffer wts, b.AllocF(T * K));
  RING_RETURN_IF_ERROR(b.RouteSigmoid(logits.f(), L.score_bias, T, r, ids.i(), wts.f()));
  // y: the T * K routed rows, then the shared expert's T rows.
  RING_ASSIGN_OR_RETURN(Buffer y, b.AllocF(T * (K + (L.has_shared ? 1 : 0)) * hid));
  float* shared = L.has_shared ? y.f() + T * K * hid : nullptr;
  bool joint = false;
  if (L.has_shared) {
    RING_ASSIGN_OR_RETURN(joint, b.ExpertsSwiGluShared(L.experts.gate, L.experts.up, L.experts.down,
                                                       L.shared.gate, L.shared.up, L.shared.down, x,
                                                       T, ids.i(), K, t, y.f()));
  }
  if (!joint) {
    RING_RETURN_IF_ERROR(b.ExpertsSwiGlu(L.experts.gate, L.experts.up, L.experts.down, x, T,
                                         ids.i(), K, t, y.f()));
    // The shared expert after the routed ones (independent of them): router, routing and
    // the experts' gate/up then all read x right after one another, so a backend that keeps
    // a converted copy of x (the CUDA backend's bf16 copy) serves all three and the shared
    // expert's gate/up from it.
    if (L.has_shared) RING_RETURN_IF_ERROR(RunMlp(b, L.shared, x, T, t, shared));
  }
  return b.MoeCombine(y.f(), wts.f(), shared, T, K, hid, cpu::CombineMode::kFp32Sum, t, out);
}

absl::Status MlaStage::FeedForward(int64_t layer, const float* x, int64_t T, float* out) const {
  const MlaLayer& L = layers_[layer - range().begin];
  if (L.moe) return Moe(L, x, T, out);
  return RunMlp(backend(), L.dense, x, T, ctx_.act, out);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Stage>> NewMlaStage(StageContext ctx) {
  auto stage = std::make_unique<MlaStage>(std::move(ctx));
  RING_RETURN_IF_ERROR(stage->Load());
  return stage;
}

}  // namespace ring::internal
