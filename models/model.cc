#include "models/model.h"

#include <algorithm>

#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kernels/status.h"
#include "models/backend_decorator.h"
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

absl::Status LayeredStage::RunLayer(int64_t layer, const std::vector<Segment>& segs, float* h,
                                    float* xn, bool xn_ready, const TensorView* next_input_norm,
                                    int64_t rows) const {
  Backend& b = backend();
  const int64_t n = rows * ctx_.cfg.hidden_size, hidden = ctx_.cfg.hidden_size;
  const float eps = static_cast<float>(ctx_.cfg.rms_norm_eps);
  const BlockNorms norms = Norms(layer);
  RING_ASSIGN_OR_RETURN(Buffer o, b.AllocF(n));
  if (!xn_ready) RING_RETURN_IF_ERROR(b.RmsNorm(h, rows, hidden, norms.input, eps, ctx_.act, xn));
  RING_RETURN_IF_ERROR(Attention(layer, segs, xn, rows, o.f()));
  RING_RETURN_IF_ERROR(b.AddRmsNorm(h, o.f(), rows, hidden, norms.post, eps, ctx_.act, h, xn));
  RING_RETURN_IF_ERROR(FeedForward(layer, xn, rows, o.f()));
  if (next_input_norm == nullptr) return b.Add(h, o.f(), n, ctx_.act, h);
  return b.AddRmsNorm(h, o.f(), rows, hidden, *next_input_norm, eps, ctx_.act, h, xn);
}

absl::StatusOr<StageOutput> LayeredStage::Forward(Sequence& seq, const StageInput& in) const {
  return std::move(ForwardBatch({BatchedStep{&seq, &in}})[0]);
}

std::vector<absl::StatusOr<StageOutput>> LayeredStage::ForwardBatch(
    const std::vector<BatchedStep>& steps) const {
  std::vector<absl::StatusOr<StageOutput>> results(steps.size(),
                                                   absl::InternalError("step not run"));
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  if (!backend().concurrent()) lock.lock();
  if (absl::Status s = backend().BeginStep(); !s.ok()) {
    for (auto& r : results) r = s;
    return results;
  }
  // The steps that pass their checks, and their caches made big enough before any layer
  // runs (so a step that does not fit fails alone and changes nothing).
  std::vector<size_t> live;
  std::vector<const StageInput*> ins;
  std::vector<Segment> segs;
  std::vector<TopkState> carries(steps.size());
  int64_t row0 = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    auto* seq = static_cast<SequenceState*>(steps[i].seq);
    bool repeated = false;
    for (const Segment& s : segs) repeated = repeated || s.seq == seq;
    if (repeated) {
      results[i] = absl::InvalidArgumentError("a batch holds one step per sequence");
      continue;
    }
    absl::StatusOr<int64_t> rows = CheckStep(*seq, *steps[i].in);
    absl::Status s = rows.status();
    if (s.ok()) s = ReserveCaches(*seq, seq->position_ + *rows);
    if (!s.ok()) {
      results[i] = s;
      continue;
    }
    live.push_back(i);
    ins.push_back(steps[i].in);
    segs.push_back(Segment{seq, row0, *rows, &carries[i]});
    row0 += *rows;
  }
  std::vector<StageOutput> outs(live.size());
  absl::Status run = live.empty() ? absl::OkStatus() : RunSteps(ins, segs, outs);
  const absl::Status end = backend().EndStep();
  if (run.ok()) run = end;
  for (size_t j = 0; j < live.size(); ++j) {
    if (!run.ok()) {
      results[live[j]] = run;
      continue;
    }
    segs[j].seq->position_ += segs[j].rows;
    results[live[j]] = std::move(outs[j]);
  }
  return results;
}

absl::StatusOr<int64_t> LayeredStage::CheckStep(const SequenceState& seq,
                                               const StageInput& in) const {
  const ModelConfig& c = ctx_.cfg;
  const int64_t hidden = c.hidden_size;
  int64_t rows;
  if (is_first()) {
    rows = static_cast<int64_t>(in.tokens.size());
    if (rows == 0) return absl::InvalidArgumentError("empty step: no tokens");
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t tok = in.tokens[r];
      if (tok < 0 || tok >= c.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", tok, " at row ", r, " is outside the vocabulary [0, ",
                         c.vocab_size, ")"));
      }
    }
  } else {
    if (in.hidden.empty() || in.hidden.size() % hidden != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stage starting at layer ", range().begin, " expects hidden rows of width ", hidden,
          ", got ", in.hidden.size(), " floats"));
    }
    rows = static_cast<int64_t>(in.hidden.size()) / hidden;
  }
  if (c.max_position_embeddings > 0 && seq.position_ + rows > c.max_position_embeddings) {
    return absl::OutOfRangeError(absl::StrCat("sequence would reach position ",
                                              seq.position_ + rows, ", past the model's ",
                                              c.max_position_embeddings));
  }
  if (ctx_.max_context > 0 && seq.position_ + rows > ctx_.max_context) {
    return absl::OutOfRangeError(absl::StrCat("sequence would reach position ",
                                              seq.position_ + rows, ", past this stage's ",
                                              "max_context ", ctx_.max_context));
  }
  const TopkCarry& topk_in = in.topk;
  if (!is_first() && !topk_in.dense &&
      static_cast<int64_t>(topk_in.indices.size()) != rows * topk_in.k) {
    return absl::InvalidArgumentError(absl::StrCat(
        "top-k carry from layer ", topk_in.source_layer, " has ", topk_in.indices.size(),
        " indices, expected ", rows, " rows x ", topk_in.k));
  }
  return rows;
}

absl::Status LayeredStage::RunSteps(const std::vector<const StageInput*>& ins,
                                    const std::vector<Segment>& segs,
                                    std::vector<StageOutput>& outs) const {
  Backend& b = backend();
  const ModelConfig& c = ctx_.cfg;
  const int64_t hidden = c.hidden_size;
  const int64_t rows = segs.back().row0 + segs.back().rows;
  RING_ASSIGN_OR_RETURN(Buffer h, b.AllocF(rows * hidden));
  b.BeginLayer(-1);
  if (is_first()) {
    std::vector<int32_t> tokens;
    tokens.reserve(rows);
    for (const StageInput* in : ins) tokens.insert(tokens.end(), in->tokens.begin(), in->tokens.end());
    RING_RETURN_IF_ERROR(b.Embed(embed_, tokens.data(), rows, ctx_.act, h.f()));
  }
  bool capture = false;
  for (size_t i = 0; i < segs.size(); ++i) {
    const StageInput& in = *ins[i];
    const Segment& s = segs[i];
    capture = capture || in.capture_layers;
    if (is_first()) continue;
    RING_RETURN_IF_ERROR(
        b.Upload(in.hidden.data(), s.rows * hidden * 4, h.f() + s.row0 * hidden));
    TopkState& carry = *s.carry;
    carry.source_layer = in.topk.source_layer;
    carry.dense = in.topk.dense;
    carry.k = in.topk.k;
    if (!in.topk.dense && !in.topk.indices.empty()) {
      RING_ASSIGN_OR_RETURN(carry.indices, b.Alloc(in.topk.indices.size() * 4));
      RING_RETURN_IF_ERROR(
          b.Upload(in.topk.indices.data(), in.topk.indices.size() * 4, carry.indices.data()));
    }
  }
  // The normed input of the next layer, made by the same op as this layer's last residual
  // add where the next layer is in this stage.
  RING_ASSIGN_OR_RETURN(Buffer xn, b.AllocF(rows * hidden));
  // The head norms every row of a step (all_logits) or its last; where that is every row
  // (also: decode, one row a sequence), the last layer's residual add makes the head's
  // normed rows itself (one launch less), as it makes the next layer's input elsewhere.
  const bool head_rows_all =
      ctx_.all_logits ||
      std::all_of(segs.begin(), segs.end(), [](const Segment& s) { return s.rows == 1; });
  const bool head_norm_in_layer = is_last() && head_rows_all && range().end > range().begin;
  for (int64_t l = range().begin; l < range().end; ++l) {
    b.BeginLayer(l);
    const bool has_next = l + 1 < range().end;
    const BlockNorms next = has_next ? Norms(l + 1) : BlockNorms{};
    const TensorView* next_norm = has_next             ? &next.input
                                  : head_norm_in_layer ? &final_norm_
                                                       : nullptr;
    RING_RETURN_IF_ERROR(RunLayer(l, segs, h.f(), xn.f(), /*xn_ready=*/l > range().begin,
                                  next_norm, rows));
    RING_RETURN_IF_ERROR(b.EndLayer(l, h.f(), rows * hidden));
    if (!capture) continue;
    for (size_t i = 0; i < segs.size(); ++i) {
      if (!ins[i]->capture_layers) continue;
      auto& layer = outs[i].layer_hidden.emplace_back(segs[i].rows * hidden);
      RING_RETURN_IF_ERROR(
          b.Download(h.f() + segs[i].row0 * hidden, segs[i].rows * hidden * 4, layer.data()));
    }
  }
  b.BeginLayer(c.num_hidden_layers);
  for (size_t i = 0; i < segs.size(); ++i) {
    const TopkState& carry = *segs[i].carry;
    StageOutput& out = outs[i];
    out.rows = segs[i].rows;
    out.topk.source_layer = carry.source_layer;
    out.topk.dense = carry.dense;
    out.topk.k = carry.k;
    if (!carry.dense && carry.k > 0) {
      // Not waited for here: the hidden rows' download below (or the head's arg-max or
      // sampling on the last stage) waits once for both. A wait here drained the stream
      // before the head was queued (~15 us of idle GPU a step on an H200).
      out.topk.indices.resize(out.rows * carry.k);
      RING_RETURN_IF_ERROR(b.DownloadLater(carry.indices.data(), out.rows * carry.k * 4,
                                           out.topk.indices.data()));
    }
  }
  if (!is_last()) {
    std::vector<float> all(rows * hidden);
    RING_RETURN_IF_ERROR(b.Download(h.data(), rows * hidden * 4, all.data()));
    for (size_t i = 0; i < segs.size(); ++i) {
      const float* first = all.data() + segs[i].row0 * hidden;
      outs[i].hidden.assign(first, first + segs[i].rows * hidden);
    }
    return absl::OkStatus();
  }
  // The head reads every row of a step (all_logits) or its last; those rows of all steps
  // are normed into one matrix so that the LM head's weights are read once.
  std::vector<int64_t> head_row0(segs.size());
  int64_t n = 0;
  for (size_t i = 0; i < segs.size(); ++i) {
    head_row0[i] = n;
    n += ctx_.all_logits ? segs[i].rows : 1;
  }
  Buffer normed = xn;  // head_norm_in_layer: row r of xn is head row r (n == rows)
  if (!head_norm_in_layer) {
    RING_ASSIGN_OR_RETURN(normed, b.AllocF(n * hidden));
    for (size_t i = 0; i < segs.size(); ++i) {
      const int64_t first_row = ctx_.all_logits ? 0 : segs[i].rows - 1;
      RING_RETURN_IF_ERROR(b.RmsNorm(h.f() + (segs[i].row0 + first_row) * hidden,
                                     segs[i].rows - first_row, hidden, final_norm_,
                                     static_cast<float>(c.rms_norm_eps), ctx_.act,
                                     normed.f() + head_row0[i] * hidden));
    }
  }
  RING_ASSIGN_OR_RETURN(Buffer logits, b.AllocF(n * c.vocab_size));
  RING_RETURN_IF_ERROR(b.Linear(head_, normed.f(), n, ctx_.act, logits.f()));
  // What leaves the device is queued first and waited for once, by the arg-max or the
  // first sampling (a token-only decode step: one wait, not two or three).
  // Head rows of segment i.
  auto head_rows = [&](size_t i) {
    return (i + 1 < segs.size() ? head_row0[i + 1] : n) - head_row0[i];
  };
  bool greedy = false;
  for (size_t i = 0; i < segs.size(); ++i) {
    const StageInput& in = *ins[i];
    StageOutput& out = outs[i];
    const int64_t k = head_rows(i);
    greedy = greedy || !in.sample.has_value();
    if (in.argmax_only || in.sample.has_value()) {
      out.hidden.resize(k * hidden);
      RING_RETURN_IF_ERROR(b.DownloadLater(normed.f() + head_row0[i] * hidden, k * hidden * 4,
                                           out.hidden.data()));
    } else {
      out.logits.resize(k * c.vocab_size);
      RING_RETURN_IF_ERROR(b.DownloadLater(logits.f() + head_row0[i] * c.vocab_size,
                                           k * c.vocab_size * 4, out.logits.data()));
    }
  }
  std::vector<int32_t> argmax(greedy ? n : 0);
  if (greedy) RING_RETURN_IF_ERROR(b.ArgMax(logits.f(), n, c.vocab_size, argmax.data()));
  for (size_t i = 0; i < segs.size(); ++i) {
    const StageInput& in = *ins[i];
    StageOutput& out = outs[i];
    const int64_t k = head_rows(i);
    if (!in.sample.has_value()) {
      out.argmax.assign(argmax.begin() + head_row0[i], argmax.begin() + head_row0[i] + k);
      continue;
    }
    const float* seg_logits = logits.f() + head_row0[i] * c.vocab_size;
    out.sampled.emplace();
    RING_RETURN_IF_ERROR(b.Sample(seg_logits + (k - 1) * c.vocab_size, c.vocab_size,
                                  *in.sample, &*out.sampled));
  }
  return absl::OkStatus();
}

}  // namespace internal

std::vector<absl::StatusOr<StageOutput>> Stage::ForwardBatch(
    const std::vector<BatchedStep>& steps) const {
  std::vector<absl::StatusOr<StageOutput>> out;
  out.reserve(steps.size());
  for (const BatchedStep& s : steps) out.push_back(Forward(*s.seq, *s.in));
  return out;
}

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

std::string DeviceSpec::ToString() const {
  return kind == Kind::kCpu ? "cpu" : absl::StrCat("cuda:", ordinal);
}

absl::StatusOr<DeviceSpec> ParseDevice(const std::string& s) {
  DeviceSpec d;
  if (s == "cpu") return d;
  if (s == "cuda" || s == "gpu") {
    d.kind = DeviceSpec::Kind::kCuda;
    return d;
  }
  if (s.rfind("cuda:", 0) == 0 && absl::SimpleAtoi(s.substr(5), &d.ordinal) && d.ordinal >= 0) {
    d.kind = DeviceSpec::Kind::kCuda;
    return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device '", s, "': expected cpu, cuda or cuda:N"));
}

absl::Status CheckDevice(const DeviceSpec& d) {
  if (d.kind == DeviceSpec::Kind::kCpu) return absl::OkStatus();
  return internal::NewCudaBackend(d.ordinal).status();
}

namespace internal {
namespace {

// LoadOptions::progress: counts the bytes of each distinct tensor registered.
class ProgressBackend final : public ForwardingBackend {
 public:
  ProgressBackend(std::shared_ptr<Backend> inner, std::function<void(int64_t)> progress)
      : ForwardingBackend(std::move(inner)), progress_(std::move(progress)) {}
  absl::Status AddWeight(const QuantWeight& w) override {
    RING_RETURN_IF_ERROR(inner().AddWeight(w));
    const int64_t n = w.weight.nbytes() + (w.scales.present() ? w.scales.nbytes() : 0) +
                      (w.biases.present() ? w.biases.nbytes() : 0);
    Count(w.weight.data, n);
    return absl::OkStatus();
  }
  absl::Status AddTensor(const TensorView& t) override {
    RING_RETURN_IF_ERROR(inner().AddTensor(t));
    Count(t.data, t.nbytes());
    return absl::OkStatus();
  }

 private:
  void Count(const void* key, int64_t n) {
    if (!seen_.insert(key).second) return;  // tied embeddings register twice
    bytes_ += n;
    progress_(bytes_);
  }
  const std::function<void(int64_t)> progress_;
  std::set<const void*> seen_;
  int64_t bytes_ = 0;
};

}  // namespace

absl::StatusOr<std::shared_ptr<Backend>> NewBackendFor(const LoadOptions& options) {
  if (options.TEST_jitter != 0 && options.device.kind != DeviceSpec::Kind::kCpu) {
    return absl::InvalidArgumentError("TEST_jitter is a CPU-backend diagnostic");
  }
  std::shared_ptr<Backend> b;
  if (options.device.kind == DeviceSpec::Kind::kCuda) {
    RING_ASSIGN_OR_RETURN(b, NewCudaBackend(options.device.ordinal));
  } else {
    b = NewCpuBackend(options.TEST_jitter);
  }
  if (!options.TEST_fault.empty()) {
    RING_ASSIGN_OR_RETURN(b, NewFaultBackend(std::move(b), options.TEST_fault));
  }
  if (options.progress) b = std::make_shared<ProgressBackend>(std::move(b), options.progress);
  return b;
}

absl::StatusOr<std::unique_ptr<Stage>> LoadStageOn(const std::string& dir,
                                                   const LoadOptions& options,
                                                   std::shared_ptr<Backend> backend) {
  StageContext ctx;
  ctx.backend = std::move(backend);
  if (options.max_context < 0) return absl::InvalidArgumentError("max_context must be >= 0");
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
  ctx.max_context = options.max_context > 0 ? options.max_context : ctx.cfg.max_position_embeddings;
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
      return NewMlaStage(std::move(ctx));
    case ModelFamily::kQwen3:
    case ModelFamily::kQwen3Moe:
      return NewQwen3Stage(std::move(ctx));
  }
  return absl::UnimplementedError("unknown model family");
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<Stage>> LoadStage(const std::string& dir,
                                                 const LoadOptions& options) {
  RING_ASSIGN_OR_RETURN(std::shared_ptr<internal::Backend> b, internal::NewBackendFor(options));
  return internal::LoadStageOn(dir, options, std::move(b));
}

}  // namespace ring
