// File: models/verify.h
//
// Proves a device computes a stage of a real model like the CPU reference, and when it does
// not, finds the op that is wrong. This is what `ringctl verify` runs, and what a worker
// runs before it joins a ring (admission gate) and while it serves (shadow checks).
//
//   VerifyOptions o;
//   o.model_dir = "/models/glm-5.2-mxfp4"; o.layers = {40, 44};
//   o.device = {DeviceSpec::Kind::kCuda, 0}; o.prompt_len = 32;
//   RING_ASSIGN_OR_RETURN(VerifyReport r, Verify(o));
//   std::cout << FormatVerifyReport(r, /*all_ops=*/false);
//
// How: the stage's layer program runs once on a lockstep backend that executes every op on
// the device under test AND on the CPU reference (each with its own memory: the device's
// composed state is never corrected). For every op it records
//   composed: device output vs CPU output of the same op, each on its own inputs (the
//             difference accumulated so far);
//   isolated: the device op re-run on a copy of the CPU's inputs vs the CPU output (is
//             this op itself wrong?).
// After every layer it compares the layer outputs (relative difference ||d - c|| / ||c||).
// Steps: one prefill of the prompt, then `decode_steps` single-token steps (greedy tokens of
// the CPU reference when the stage is last, else the next prompt-like tokens), so both MLA
// paths (expanded prefill, absorbed decode) and the DSA sparse path (prompt > index_topk)
// are covered. A stage that starts at layer A > 0 gets the hidden state (and the IndexShare
// top-k carry) that the CPU reference's layers [0, A) compute for the same tokens.
//
// Bisection: the first (step, layer) whose output is over `tolerance` is reported with its
// ops; the first of them whose isolated error is over its op tolerance is named; if none is,
// the error comes from accumulation across ops (the report says so, with the numbers).
#ifndef RINGSERVE_MODELS_VERIFY_H_
#define RINGSERVE_MODELS_VERIFY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/model.h"

namespace ring {

struct VerifyOptions {
  std::string model_dir;
  StageRange layers;                // of the checkpoint; end -1: to the last layer
  DeviceSpec device;                // under test; the reference is always the CPU engine
  std::vector<int32_t> tokens;      // prompt; empty: prompt_len seeded random tokens
  int64_t prompt_len = 16;
  uint64_t seed = 1;
  int decode_steps = 2;
  double tolerance = 0.01;          // of a layer output's relative difference
  // Multiplies every op's isolated tolerance (VerifyOpTolerance).
  double op_tolerance_scale = 1.0;
  std::optional<cpu::ActDType> act_dtype;  // default: the checkpoint's
  // Also measure the checkpoint's noise floor: the CPU engine against itself with every
  // matmul output perturbed by noise_jitter (relative). A layer over `tolerance` still
  // passes when it is within floor_factor x the floor at that layer and step: random or
  // badly conditioned weights (MoE routing near-ties) amplify any rounding difference, and
  // a correct device cannot do better than the reference against itself.
  bool noise_floor = false;
  double noise_jitter = 1e-6;
  double floor_factor = 2.0;
  std::string TEST_fault;           // applied to the device under test only (model.h)
  // Explicit inputs, one per step (tokens for a first stage, else hidden + top-k carry),
  // e.g. what the previous stage of a ring produced (admission gate). When set, tokens,
  // prompt_len, decode_steps and the CPU prefix are not used.
  std::vector<StageInput> inputs;
};

// Difference of a device tensor d from the reference c (both the same length).
struct TensorDiff {
  int64_t n = 0;
  double rel = 0;       // ||d - c|| / ||c|| (0 when both are 0)
  double nmse = 0;      // sum (d - c)^2 / sum c^2
  double max_abs = 0;   // max |d - c| over finite pairs
  int64_t nan = 0, inf = 0;       // in d
  int64_t ref_nan = 0, ref_inf = 0;  // in c
  bool is_int = false;  // index outputs: `mismatch` is the fraction of differing entries
  double mismatch = 0;
};

struct OpCheck {
  int step = 0;
  int64_t layer = 0;       // -1: embedding, num_layers: final norm + head
  int index = 0;           // position of the op within its layer and step
  std::string op;          // "Linear", "RmsNorm", "MlaAttention", ...
  std::string detail;      // the weight's name for matmuls; shapes otherwise
  TensorDiff composed, isolated;
  double tolerance = 0;    // on isolated.nmse (or isolated.mismatch for index outputs)
  bool isolated_ok = true;
};

struct LayerCheck {
  int step = 0;
  int64_t layer = 0;
  TensorDiff diff;  // of the layer's output hidden state
  double floor_rel = -1;  // VerifyOptions::noise_floor: the reference against itself; -1 off
  bool ok = true;
};

struct VerifyStep {
  int step = 0;
  std::string kind;     // "prefill" or "decode"
  int64_t rows = 0, first_position = 0;
  bool sparse = false;  // context longer than index_topk (DSA selects keys)
};

struct VerifyReport {
  std::string model_dir, device, reference = "cpu";
  int64_t layer_begin = 0, layer_end = 0, num_layers = 0;
  double tolerance = 0;
  std::vector<VerifyStep> steps;
  std::vector<LayerCheck> layers;
  std::vector<OpCheck> ops;
  TensorDiff output;           // of the stage's output (hidden or logits) over all steps
  bool ok = true;              // no layer over tolerance and no op wrong in isolation
  int first_bad_layer = -1;    // index into `layers`
  int culprit_op = -1;         // index into `ops`: the op the bisection names
  std::string diagnosis;       // one paragraph for humans
  std::vector<StageOutput> outputs;  // the device's output of every step
};

// Difference of `device` from `reference` (float tensors; a length mismatch is an infinite
// difference). Shared by verify and the worker's shadow checker so both judge alike.
TensorDiff DiffTensors(const std::vector<float>& device, const std::vector<float>& reference);

// Whether a layer output `d` away from the reference passes: within `tolerance`, or, when
// the reference's own noise floor at that layer was measured (`floor_rel` >= 0, see
// VerifyOptions::noise_floor), within floor_factor x that floor and free of NaN/Inf.
bool LayerWithinTolerance(const TensorDiff& d, double floor_rel, double tolerance,
                          double floor_factor);

// The written tolerance of one op's isolated error: NMSE for float outputs, the fraction of
// differing entries for index outputs (top-k, routing). See verify.cc for the reasoning.
double VerifyOpTolerance(const std::string& op, cpu::ActDType act);

absl::StatusOr<VerifyReport> Verify(const VerifyOptions& options);

// Human-readable report: steps, per-layer table, the bisected layer's ops (all ops with
// all_ops), the diagnosis.
std::string FormatVerifyReport(const VerifyReport& r, bool all_ops);

}  // namespace ring

#endif  // RINGSERVE_MODELS_VERIFY_H_
