// File: models/synth.h
//
// Random checkpoints in exactly the layout mlx-lm's convert/save_model/save_config write
// (shared spec §2-§4), for every supported family, at toy or real dimensions, in every
// MLX quantization mode. Used by tests and by `ringctl synth`.
//
// What is written to SynthOptions::out_dir:
//   model.safetensors or model-0000i-of-0000N.safetensors (+ model.safetensors.index.json),
//   config.json (HF fields of the family + "quantization"/"quantization_config"),
//   generation_config.json, tokenizer.json, tokenizer_config.json, chat_template.jinja.
//
// Layout rules mirrored from mlx-lm (utils.quantize_model, nn.quantize, model classes):
//   - a module is quantized iff it has `to_quantized` (Linear, Embedding, SwitchLinear,
//     MultiLinear) and its weight's last dim is a multiple of the group size; norms,
//     LayerNorms and the DeepSeek/GLM router (MoEGate) are never quantized;
//   - quantized: "<m>.weight" U32 [..., in*bits/32], "<m>.scales" [..., in/group] (U8 for
//     mxfp4/mxfp8/nvfp4, the float dtype for affine) and "<m>.biases" (affine only);
//   - experts are stacked into mlp.switch_mlp.{gate,up,down}_proj [E, out, in];
//   - MLA attention has embed_q [H, kv_lora, nope] and unembed_out [H, v, kv_lora]
//     (never kv_b_proj);
//   - Qwen3-MoE routers (mlp.gate) get the per-module override {"group_size": 64,
//     "bits": 8} (affine) as mlx-lm's qwen3_moe quant_predicate does;
//   - float tensors are BF16, except e_score_correction_bias (F32);
//   - IndexShare ("shared") layers of glm_moe_dsa have no indexer tensors;
//   - tied embeddings (Qwen3 small sizes) have no lm_head.
//
// Values are N(mean, std) from a counter-based generator (splitmix64 + Box-Muller), a pure
// function of (seed, tensor name, element index), so the bytes do not depend on the
// thread count or the platform. std = 1/sqrt(fan_in) for projections and the router,
// 1/sqrt(hidden) for embeddings, norms are 1 + N(0, 0.02), biases (LayerNorm,
// e_score_correction_bias) N(0, 0.02).
//
// Generation is tensor by tensor (rows in parallel with cpu::ParallelFor, quantized in
// blocks), handing each tensor to CheckpointWriter, so memory stays bounded by one tensor
// plus one shard, and GLM-5.2 dimensions can be written.
//
//   SynthOptions o;
//   o.preset = "glm-5.2";
//   o.layers = 4;
//   o.quant = {QuantMode::kMxfp4, 4, 32};
//   o.out_dir = "/tmp/glm52-4l";
//   RING_RETURN_IF_ERROR(SynthesizeCheckpoint(o));
#ifndef RINGSERVE_MODELS_SYNTH_H_
#define RINGSERVE_MODELS_SYNTH_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/quant.h"
#include "kernels/tensor.h"
#include "models/bpe_builder.h"
#include "models/config.h"

namespace ring {

// Preset names: "tiny" (every family), "glm-5.2", "glm-5" (glm_moe_dsa), "qwen3-0.6b",
// "qwen3-8b" (qwen3), "qwen3-30b-a3b" (qwen3_moe).
std::vector<std::string> SynthPresetNames();
// Families: glm_moe_dsa, deepseek_v32, deepseek_v3, qwen3, qwen3_moe.
std::vector<std::string> SynthArchNames();

struct SynthProgress {
  std::string tensor;         // parameter just written (logical name)
  int64_t params_done = 0;    // parameters written so far
  int64_t params_total = 0;
  uint64_t bytes_done = 0;    // checkpoint bytes generated so far
  uint64_t bytes_total = 0;
};

struct SynthOptions {
  std::string arch;             // HF model_type; empty: the preset's family (tiny: glm_moe_dsa)
  std::string preset = "tiny";
  std::optional<int64_t> layers;      // num_hidden_layers override (>= 1)
  std::optional<int64_t> index_topk;  // DSA families only
  uint64_t seed = 0;
  QuantSpec quant{QuantMode::kMxfp4, 4, 32};  // mode kNone: unquantized bf16 checkpoint
  std::string out_dir;
  uint64_t max_shard_bytes = 5ull << 30;  // mlx-lm MAX_FILE_SIZE_GB
  // Remove an existing checkpoint (model*.safetensors, index, json files) in out_dir first.
  // Without it a directory that already holds a checkpoint is an error.
  bool overwrite = false;
  // Called after each parameter is generated (from the calling thread). May be empty.
  std::function<void(const SynthProgress&)> progress;
};

// One logical parameter of a model, named as in mlx-lm's module tree.
struct ModelParam {
  std::string name;         // e.g. "model.layers.0.self_attn.q_a_proj.weight"
  Shape shape;              // logical (unquantized) shape
  DType dtype = DType::kBF16;  // float dtype when stored unquantized
  bool quantizable = false;    // the mlx module has to_quantized and this is its weight
  int64_t layer = -1;          // decoder layer, -1 for embeddings/final norm/head
  float mean = 0.0f;           // synthetic init distribution
  float std = 0.0f;

  // Module path: name without the trailing ".weight" (or ".bias", ...).
  std::string module() const;
};

// A tensor as stored in the safetensors files.
struct StoredTensor {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t nbytes() const { return static_cast<uint64_t>(NumElements(shape)) * DTypeSize(dtype); }
};


// Every parameter of the model described by `config`, in mlx module order.
std::vector<ModelParam> ModelParams(const ModelConfig& config);

// The tensors a parameter is stored as under `spec` (mode kNone: the float tensor itself).
// `scale_dtype` is the dtype of affine scales/biases (the model's float dtype).
std::vector<StoredTensor> StoredTensorsFor(const ModelParam& param, const QuantSpec& spec,
                                           DType scale_dtype = DType::kBF16);

struct PlannedParam {
  ModelParam param;
  QuantSpec quant;  // mode kNone: stored as param.dtype
  std::vector<StoredTensor> tensors;
};

// Everything SynthesizeCheckpoint will write, computed without generating any data.
struct SynthPlan {
  ModelConfig config;                 // the model as our engine sees it
  std::string config_json;            // config.json
  std::string generation_config_json; // generation_config.json
  TokenizerStyle tokenizer_style = TokenizerStyle::kGlm;
  std::vector<PlannedParam> params;   // mlx module order (the order they are written)
  uint64_t total_bytes = 0;           // sum of stored tensor bytes
  uint64_t total_parameters = 0;      // logical parameter count (as mlx-lm counts it)

  // All stored tensors, sorted by name.
  std::vector<StoredTensor> Tensors() const;
};

// Resolves preset/arch/overrides/quantization and plans the checkpoint. InvalidArgument
// for an unknown preset or arch, a preset that does not fit the arch, a bad quant spec or
// override.
absl::StatusOr<SynthPlan> PlanSynthCheckpoint(const SynthOptions& options);

// Plans and writes the checkpoint to options.out_dir (created if needed).
absl::Status SynthesizeCheckpoint(const SynthOptions& options);

// Parses "mxfp4", "mxfp8", "nvfp4", "affine" (4-bit, group 64), "affine<B>" (e.g.
// "affine8"), "bf16"/"none"; bits/group_size override the mode's defaults when > 0.
// The result is validated (ValidateQuantSpec).
absl::StatusOr<QuantSpec> ParseSynthQuant(const std::string& mode, int bits, int group_size);

// The deterministic generator: element `index` of the N(0,1) stream keyed by `key`.
// Exposed for tests.
double SynthNormal(uint64_t key, uint64_t index);
// Key of a tensor's stream: splitmix64(seed ^ fnv1a64(name)).
uint64_t SynthTensorKey(uint64_t seed, const std::string& name);

}  // namespace ring

#endif  // RINGSERVE_MODELS_SYNTH_H_
