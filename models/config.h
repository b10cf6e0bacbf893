// File: models/config.h
//
// config.json of every supported family (HF field names, see shared spec §2 and §5) and
// the MLX "quantization" block with per-module overrides.
//
// Supported model_type: glm_moe_dsa, deepseek_v32, deepseek_v3, qwen3, qwen3_moe.
// Anything else, or a field value this build cannot run (e.g. an unknown rope_type),
// is an InvalidArgument/Unimplemented error that says what is missing.
#ifndef RINGSERVE_MODELS_CONFIG_H_
#define RINGSERVE_MODELS_CONFIG_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/quant.h"

namespace ring {

enum class ModelFamily { kGlmMoeDsa, kDeepseekV32, kDeepseekV3, kQwen3, kQwen3Moe };
const char* ModelFamilyName(ModelFamily f);  // the HF model_type string

struct RopeConfig {
  std::string type = "default";  // "default" | "linear" | "yarn" (deepseek_yarn maps to yarn)
  double theta = 10000.0;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
};

// MLX quantization: a default spec and per-module overrides keyed by module path
// (e.g. "model.layers.3.mlp.gate"). An override of `false` (std::nullopt) means "not
// quantized". Mirrors mlx-lm load_model: a module is quantized iff it has an override
// spec, or the checkpoint has "<path>.scales" (then the default spec applies).
struct QuantizationConfig {
  bool present = false;
  QuantSpec default_spec;  // mode/group/bits of the block (mode defaults to affine)
  std::map<std::string, std::optional<QuantSpec>> overrides;

  // Spec for `module_path` given whether "<module_path>.scales" exists in the checkpoint.
  // Returns mode kNone for an unquantized module.
  QuantSpec SpecFor(const std::string& module_path, bool has_scales) const;
};

struct ModelConfig {
  std::string model_type;
  ModelFamily family = ModelFamily::kQwen3;
  std::string torch_dtype = "bfloat16";  // "dtype" or "torch_dtype": activation dtype

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t intermediate_size = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // qwen3 (defaults to hidden/heads)
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  RopeConfig rope;
  std::vector<int64_t> eos_token_ids;

  // MLA (deepseek_v3 / v32 / glm_moe_dsa).
  std::optional<int64_t> q_lora_rank;  // nullopt: single q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;

  // MoE, DeepSeek style.
  int64_t n_routed_experts = 0;  // 0: no MoE
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  std::string topk_method = "noaux_tc";
  std::string scoring_func = "sigmoid";
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;

  // MoE, Qwen3 style (num_experts / decoder_sparse_step / mlp_only_layers).
  int64_t num_experts = 0;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;

  // DSA indexer (deepseek_v32 / glm_moe_dsa).
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;
  bool indexer_rope_interleave = false;  // GLM default true
  bool rope_interleave = true;           // main MLA rope (mlx: always traditional)
  // Per layer: true = "full" (own indexer), false = "shared" (reuses previous full layer's
  // top-k). Filled from indexer_types, else index_topk_pattern, else index_topk_freq /
  // index_skip_topk_offset; all true when none is given. Size num_hidden_layers.
  std::vector<bool> indexer_full;
  int64_t index_topk_freq = 1;
  int64_t index_skip_topk_offset = 2;

  QuantizationConfig quantization;

  bool is_mla() const;          // deepseek family
  bool has_indexer() const;     // deepseek_v32 / glm_moe_dsa
  bool is_moe_layer(int64_t layer) const;
  // True when `layer` runs its own DSA indexer (has indexer weights): an indexer family
  // and not an IndexShare "shared" layer.
  bool has_indexer_weights(int64_t layer) const;
};

// Parses config.json text. `source` names the file in errors.
absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text,
                                             absl::string_view source);
// Reads <dir>/config.json (and generation_config.json for eos ids when present).
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);

}  // namespace ring

#endif  // RINGSERVE_MODELS_CONFIG_H_
