// File: models/families.h  (internal to models/)
//
// Constructors of the layer programs, one per architecture family. LoadStage (model.cc)
// opens the checkpoint and config and dispatches here.
#ifndef RINGSERVE_MODELS_FAMILIES_H_
#define RINGSERVE_MODELS_FAMILIES_H_

#include <memory>
#include <mutex>

#include "absl/status/statusor.h"
#include "models/model.h"
#include "models/layers.h"
#include "models/safetensors.h"

namespace ring::internal {

struct StageContext {
  std::unique_ptr<Checkpoint> ckpt;
  ModelConfig cfg;
  StageRange range;  // resolved (end >= 0)
  cpu::ActDType act;
  bool all_logits = true;
  int64_t max_context = 0;  // resolved: positions a sequence may reach (0: unbounded)
  std::shared_ptr<Backend> backend;
};

// Per-sequence state common to all families; families add their per-layer caches.
class SequenceState : public Sequence {
 public:
  int64_t position() const override { return position_; }
  int64_t position_ = 0;
};

// The IndexShare carry while a step runs through a stage (TopkCarry with the indices in
// backend memory).
struct TopkState {
  int64_t source_layer = -1;
  bool dense = true;
  int64_t k = 0;
  Buffer indices;  // [rows, k] int32 when !dense
};

// One sequence's rows in a (batched) step: rows [row0, row0 + rows) of the step's
// activations, at positions seq->position_ ..; `carry` is that sequence's IndexShare carry.
struct Segment {
  SequenceState* seq = nullptr;
  int64_t row0 = 0;
  int64_t rows = 0;
  TopkState* carry = nullptr;
};

// The parts every family shares: input checks, embedding on the first stage, the layer
// loop, and final norm + lm_head on the last. Families implement the layers.
class LayeredStage : public Stage {
 public:
  explicit LayeredStage(StageContext ctx) : ctx_(std::move(ctx)) {}
  const ModelConfig& config() const override { return ctx_.cfg; }
  StageRange range() const override { return ctx_.range; }
  int64_t weight_bytes() const override { return weight_bytes_; }
  absl::StatusOr<StageOutput> Forward(Sequence& seq, const StageInput& in) const override;
  std::vector<absl::StatusOr<StageOutput>> ForwardBatch(
      const std::vector<BatchedStep>& steps) const override;

 protected:
  Backend& backend() const { return *ctx_.backend; }
  // Loads embedding / final norm / head as this stage needs them. Call from the family's
  // factory after the layers.
  absl::Status LoadEnds(const WeightLoader& w);
  // Every family's decoder layer is the same pre-norm residual block,
  //   h = h + Attention(RmsNorm_in(h));  h = h + FeedForward(RmsNorm_post(h)),
  // run here; the families supply the three parts. h is [rows, hidden] (the segments' rows
  // one after the other) and is updated in place. xn [rows, hidden] holds RmsNorm_in(h)
  // on entry when xn_ready (made by the previous layer), and RmsNorm of the result with
  // *next_input_norm on exit when that is given: each residual add is one op with the norm
  // after it (Backend::AddRmsNorm).
  absl::Status RunLayer(int64_t layer, const std::vector<Segment>& segs, float* h, float* xn,
                        bool xn_ready, const TensorView* next_input_norm, int64_t rows) const;
  // Makes every cache of this stage hold `rows` positions (before any layer runs, so a
  // request that does not fit fails with a clear error and changes nothing).
  virtual absl::Status ReserveCaches(SequenceState& seq, int64_t rows) const = 0;
  struct BlockNorms {
    TensorView input, post;
  };
  virtual BlockNorms Norms(int64_t layer) const = 0;
  // out[rows, hidden] = the layer's attention on the normed input x, each segment over its
  // own sequence's cache. Projections run on all rows at once into scratch rows, which each
  // sequence's cache rows then take (with one segment inside the op that norms or rotates
  // them), so that the projections write the same buffers at every position.
  virtual absl::Status Attention(int64_t layer, const std::vector<Segment>& segs,
                                 const float* x, int64_t rows, float* out) const = 0;
  // out[rows, hidden] = the layer's MLP or MoE on the normed input x (rows independent).
  virtual absl::Status FeedForward(int64_t layer, const float* x, int64_t rows,
                                   float* out) const = 0;

  StageContext ctx_;
  int64_t weight_bytes_ = 0;
  QuantWeight embed_;
  TensorView final_norm_;
  QuantWeight head_;  // lm_head, or the embedding when tied

 private:
  // Checks one step's input against the model and this stage; its rows.
  absl::StatusOr<int64_t> CheckStep(const SequenceState& seq, const StageInput& in) const;
  // Runs the checked steps (with their caches reserved) as one batch; fills outs[i].
  absl::Status RunSteps(const std::vector<const StageInput*>& ins, const std::vector<Segment>& segs,
                        std::vector<StageOutput>& outs) const;
  mutable std::mutex mu_;  // serialises Forward on backends without concurrent sequences
};

// deepseek_v3, deepseek_v32, glm_moe_dsa: MLA attention (+ DSA indexer), DeepSeek MoE.
absl::StatusOr<std::unique_ptr<Stage>> NewMlaStage(StageContext ctx);
// qwen3, qwen3_moe: GQA attention with q/k norms, Qwen MoE.
absl::StatusOr<std::unique_ptr<Stage>> NewQwen3Stage(StageContext ctx);

// The backend LoadStage would use for `options` (device, jitter, test fault), and
// LoadStage on a given backend (models/verify.cc runs a stage on an observing backend).
absl::StatusOr<std::shared_ptr<Backend>> NewBackendFor(const LoadOptions& options);
absl::StatusOr<std::unique_ptr<Stage>> LoadStageOn(const std::string& dir,
                                                   const LoadOptions& options,
                                                   std::shared_ptr<Backend> backend);

}  // namespace ring::internal

#endif  // RINGSERVE_MODELS_FAMILIES_H_
