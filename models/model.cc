#include "models/model.h"

#include "absl/strings/str_cat.h"
#include "kernels/status.h"
#include "models/families.h"
#include "models/layers.h"

namespace ring {
namespace internal {

absl::Status LayeredStage::LoadEnds(const WeightLoader& w) {
  const ModelConfig& c = ctx_.cfg;
  const bool tied = c.tie_word_embeddings;
  if (is_first() || (is_last() && tied)) {
    RING_ASSIGN_OR_RETURN(embed_, w.Linear("model.embed_tokens", {}, c.vocab_size, c.hidden_size));
  }
  if (is_last()) {
    RING_ASSIGN_OR_RETURN(final_norm_, w.Tensor("model.norm.weight", {c.hidden_size}));
    if (tied) {
      head_ = embed_;
    } else {
      RING_ASSIGN_OR_RETURN(head_, w.Linear("lm_head", {}, c.vocab_size, c.hidden_size));
    }
  }
  weight_bytes_ = w.bytes();
  return absl::OkStatus();
}

absl::Status LayeredStage::RunLayer(int64_t layer, SequenceState& seq, float* h, int64_t rows,
                                    TopkCarry& carry) const {
  const int64_t n = rows * ctx_.cfg.hidden_size;
  const float eps = static_cast<float>(ctx_.cfg.rms_norm_eps);
  const BlockNorms norms = Norms(layer);
  std::vector<float> xn(n), o(n);
  cpu::RmsNorm(h, rows, ctx_.cfg.hidden_size, norms.input, eps, ctx_.act, xn.data());
  RING_RETURN_IF_ERROR(Attention(layer, seq, xn.data(), rows, carry, o.data()));
  cpu::Add(h, o.data(), n, ctx_.act, h);
  cpu::RmsNorm(h, rows, ctx_.cfg.hidden_size, norms.post, eps, ctx_.act, xn.data());
  FeedForward(layer, xn.data(), rows, o.data());
  cpu::Add(h, o.data(), n, ctx_.act, h);
  return absl::OkStatus();
}

absl::StatusOr<StageOutput> LayeredStage::Forward(Sequence& seq_base,
                                                  const StageInput& in) const {
  auto& seq = static_cast<SequenceState&>(seq_base);
  const ModelConfig& c = ctx_.cfg;
  const int64_t hidden = c.hidden_size;
  int64_t rows;
  std::vector<float> h;
  if (is_first()) {
    rows = static_cast<int64_t>(in.tokens.size());
    if (rows == 0) return absl::InvalidArgumentError("empty step: no tokens");
    h.resize(rows * hidden);
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t tok = in.tokens[r];
      if (tok < 0 || tok >= c.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", tok, " at row ", r, " is outside the vocabulary [0, ",
                         c.vocab_size, ")"));
      }
      DequantizeRows(embed_, 0, tok, tok + 1, h.data() + r * hidden);
    }
    cpu::RoundActInPlace(h.data(), h.size(), ctx_.act);
  } else {
    if (in.hidden.empty() || in.hidden.size() % hidden != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stage starting at layer ", range().begin, " expects hidden rows of width ", hidden,
          ", got ", in.hidden.size(), " floats"));
    }
    rows = static_cast<int64_t>(in.hidden.size()) / hidden;
    h = in.hidden;
  }
  if (c.max_position_embeddings > 0 && seq.position_ + rows > c.max_position_embeddings) {
    return absl::OutOfRangeError(absl::StrCat("sequence would reach position ",
                                              seq.position_ + rows, ", past the model's ",
                                              c.max_position_embeddings));
  }
  StageOutput out;
  out.rows = rows;
  out.topk = is_first() ? TopkCarry{} : in.topk;
  for (int64_t l = range().begin; l < range().end; ++l) {
    RING_RETURN_IF_ERROR(RunLayer(l, seq, h.data(), rows, out.topk));
  }
  seq.position_ += rows;
  if (!is_last()) {
    out.hidden = std::move(h);
    return out;
  }
  const int64_t first_row = ctx_.all_logits ? 0 : rows - 1;
  const int64_t n = rows - first_row;
  std::vector<float> normed(n * hidden);
  cpu::RmsNorm(h.data() + first_row * hidden, n, hidden, final_norm_,
               static_cast<float>(c.rms_norm_eps), ctx_.act, normed.data());
  out.logits.resize(n * c.vocab_size);
  Linear(head_, normed.data(), n, ctx_.act, out.logits.data());
  return out;
}

}  // namespace internal

std::vector<StageRange> SplitLayers(int64_t num_layers, int n) {
  std::vector<StageRange> out;
  int64_t begin = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t len = num_layers / n + (i < num_layers % n ? 1 : 0);
    out.push_back({begin, begin + len});
    begin += len;
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Stage>> LoadStage(const std::string& dir,
                                                 const LoadOptions& options) {
  internal::StageContext ctx;
  RING_ASSIGN_OR_RETURN(ctx.cfg, LoadModelConfig(dir));
  RING_ASSIGN_OR_RETURN(ctx.ckpt, Checkpoint::Open(dir));
  const int64_t n = ctx.cfg.num_hidden_layers;
  ctx.range = options.layers;
  if (ctx.range.end < 0) ctx.range.end = n;
  if (ctx.range.begin < 0 || ctx.range.begin >= ctx.range.end || ctx.range.end > n) {
    return absl::InvalidArgumentError(absl::StrCat("layer range [", ctx.range.begin, ", ",
                                                   ctx.range.end, ") is not inside [0, ", n,
                                                   ") of ", dir));
  }
  ctx.all_logits = options.all_logits;
  if (options.act_dtype) {
    ctx.act = *options.act_dtype;
  } else {
    // MLX's activation dtype follows the embedding's output dtype: the float weight's
    // dtype, the affine scales' dtype, or bf16 for the fp (mx/nv) modes.
    const bool quantized = ctx.ckpt->Has("model.embed_tokens.scales");
    auto desc = ctx.ckpt->Describe(quantized ? "model.embed_tokens.scales"
                                             : "model.embed_tokens.weight");
    DType d = DType::kBF16;
    if (desc.ok() && desc->dtype != DType::kU8) d = desc->dtype;
    ctx.act = d == DType::kF32 ? cpu::ActDType::kF32
              : d == DType::kF16 ? cpu::ActDType::kF16
                                 : cpu::ActDType::kBF16;
  }
  switch (ctx.cfg.family) {
    case ModelFamily::kGlmMoeDsa:
    case ModelFamily::kDeepseekV32:
    case ModelFamily::kDeepseekV3:
      return internal::NewMlaStage(std::move(ctx));
    case ModelFamily::kQwen3:
    case ModelFamily::kQwen3Moe:
      return internal::NewQwen3Stage(std::move(ctx));
  }
  return absl::UnimplementedError("unknown model family");
}

}  // namespace ring
