// File: models/model.h
//
// A model stage: layers [begin, end) of one checkpoint, with
// the token embedding when begin == 0 and the final norm + lm_head when end == num_layers.
// Everything that crosses a stage boundary is in StageInput/StageOutput: the hidden
// state, and for GLM-5.2 IndexShare the top-k indices of the last "full" indexer layer
// (a shared layer at the start of a stage needs them; a ring that dropped them would
// silently run that layer dense).
//
//   RING_ASSIGN_OR_RETURN(auto stage, LoadStage(dir, {.begin = 0, .end = 4}));
//   auto seq = stage->NewSequence();
//   StageInput in; in.tokens = {1, 2, 3};
//   RING_ASSIGN_OR_RETURN(StageOutput out, stage->Forward(*seq, in));
//
// The stage runs on the CPU reference engine or on a CUDA device (LoadOptions::device); both
// run the same layer programs (models/backend.h) and give the same StageOutput.
// Forward is not thread-safe per Sequence; different sequences may run concurrently (on a
// GPU they are serialised).
#ifndef RINGSERVE_MODELS_MODEL_H_
#define RINGSERVE_MODELS_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/sampling.h"
#include "models/config.h"

namespace ring {

struct StageRange {
  int64_t begin = 0;
  int64_t end = -1;  // -1: up to the last layer
};

// IndexShare carry: top-k key positions chosen by the most recent "full" indexer layer
// for each query row of this step. `dense` means that layer selected nothing (context
// <= index_topk), so shared layers attend densely too.
struct TopkCarry {
  int64_t source_layer = -1;  // -1: no full layer has run in this step yet
  bool dense = true;
  int64_t k = 0;
  std::vector<int32_t> indices;  // [rows, k]
};

struct StageInput {
  std::vector<int32_t> tokens;   // first stage: token ids of this step
  std::vector<float> hidden;     // later stages: [rows, hidden_size]
  TopkCarry topk;                // later stages: from the previous stage
  // Also return every layer's output (StageOutput::layer_hidden), for shadow checks.
  bool capture_layers = false;
  // Last stage: only the greedy token of each row is wanted (StageOutput::argmax); the
  // logits stay where they were computed (on the GPU for a CUDA stage) and `hidden` returns
  // the final-normed rows the head read instead, [rows, hidden_size], so the caller can
  // still fingerprint them (NaN/Inf). Ignored by other stages.
  bool argmax_only = false;
  // Last stage: sample the next token of the LAST row where the logits are
  // (StageOutput::sampled, cpu::SampleToken semantics; the request carries the draw, so the
  // RNG stays with the caller). As with argmax_only the logits stay on the device and
  // `hidden` returns the final-normed rows. Ignored by other stages.
  std::optional<SampleRequest> sample;
};

struct StageOutput {
  int64_t rows = 0;
  std::vector<float> hidden;  // not last stage: [rows, hidden_size]
  std::vector<float> logits;  // last stage: [rows, vocab] (or [1, vocab], see options)
  std::vector<int32_t> argmax;  // last stage: greedy token of each logits row, computed
                                // where the logits are (on the GPU for a CUDA stage);
                                // empty for a step that sampled instead
  std::optional<SampledToken> sampled;  // last stage, with StageInput::sample
  TopkCarry topk;
  // With StageInput::capture_layers: the hidden state after each layer of the stage,
  // [layers][rows * hidden_size].
  std::vector<std::vector<float>> layer_hidden;
};

// Where a stage runs: "cpu" or "cuda:N" ("cuda" = "cuda:0").
struct DeviceSpec {
  enum class Kind : uint8_t { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int ordinal = 0;
  std::string ToString() const;
};
absl::StatusOr<DeviceSpec> ParseDevice(const std::string& s);
// OK when a stage could run on `d` in this build and on this machine (CUDA: the build has
// the backend and the device is visible).
absl::Status CheckDevice(const DeviceSpec& d);

struct LoadOptions {
  StageRange layers;
  DeviceSpec device;
  // Positions one sequence may reach (prompt + generated); 0: the model's
  // max_position_embeddings. A step past it fails with OutOfRange; caches grow on demand
  // up to it and fail with ResourceExhausted (naming sizes and free memory) when the
  // device cannot hold them.
  int64_t max_context = 0;
  // Diagnostics (CPU backend only): every matmul output is multiplied by 1 +- TEST_jitter
  // (a deterministic pseudo-random sign per element) before rounding. Two runs that differ
  // only by this measure the model's noise floor: how far a perturbation of the size of an
  // fp32 summation-order difference travels, which is what a correct but not bit-identical
  // engine (the GPU) is compared against. 0: off.
  double TEST_jitter = 0;
  // Called (from the loading thread) after each weight tensor of the stage is registered
  // with its device, with the bytes registered so far; at the end they equal
  // Stage::weight_bytes(). For progress bars and a worker's status. May be empty.
  std::function<void(int64_t bytes_loaded)> progress;
  // Test-only: make one kernel of this stage's backend wrong (spec in models/backend.h,
  // NewFaultBackend), so that the precision guard can be shown to catch it. "": off.
  std::string TEST_fault;
  // Round activations to the checkpoint dtype where MLX does (default: from config).
  std::optional<cpu::ActDType> act_dtype;
  // Last stage: logits for every row (true) or only the last row of each step.
  bool all_logits = true;
};

// Per-sequence state of one stage: KV caches of its layers and the position.
class Sequence {
 public:
  virtual ~Sequence() = default;
  virtual int64_t position() const = 0;  // tokens already processed
  // Bytes of KV cache held: position() * cache_bytes_per_token(). The caches grow by one
  // row per token in every layer, so a step of n tokens adds n * cache_bytes_per_token()
  // (what a worker checks against its KV budget before running the step).
  int64_t cache_bytes() const { return position() * cache_bytes_per_token(); }
  virtual int64_t cache_bytes_per_token() const = 0;
};

// One sequence's step in Stage::ForwardBatch.
struct BatchedStep {
  Sequence* seq = nullptr;
  const StageInput* in = nullptr;
};

class Stage {
 public:
  virtual ~Stage() = default;
  virtual const ModelConfig& config() const = 0;
  virtual StageRange range() const = 0;
  bool is_first() const { return range().begin == 0; }
  bool is_last() const { return range().end == config().num_hidden_layers; }
  virtual std::unique_ptr<Sequence> NewSequence() const = 0;
  // Processes one step (a prefill chunk or a single decode token) for `seq`.
  virtual absl::StatusOr<StageOutput> Forward(Sequence& seq, const StageInput& in) const = 0;
  // One step of each of several different sequences in one pass over the weights
  // (continuous batching): the rows of all steps go through the norms, projections, MLP/MoE
  // and LM head together, so each weight is read once per batch; RoPE, cache writes and
  // attention run per sequence at its own position. Result i is what Forward(*steps[i].seq,
  // *steps[i].in) would return: bit for bit on the CPU backend, and on CUDA while the batch
  // has at most 8 rows (the decode GEMV, whose per-row sums do not depend on the other rows).
  // A step with bad input or a cache that does not fit fails alone; a device fault fails
  // every step of the batch, and no failed step advances its sequence. The default runs
  // Forward for each step in turn.
  virtual std::vector<absl::StatusOr<StageOutput>> ForwardBatch(
      const std::vector<BatchedStep>& steps) const;
  // Bytes of weights this stage references.
  virtual int64_t weight_bytes() const = 0;
};

// Loads layers [range.begin, range.end) of the checkpoint in `dir`. Only the tensors of
// those layers (plus embedding / head as needed) are touched.
absl::StatusOr<std::unique_ptr<Stage>> LoadStage(const std::string& dir,
                                                 const LoadOptions& options = {});

// Splits num_layers into `n` contiguous, near-equal ranges (earlier stages get the extra).
std::vector<StageRange> SplitLayers(int64_t num_layers, int n);

}  // namespace ring

#endif  // RINGSERVE_MODELS_MODEL_H_
