#include "models/config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/status.h"
#include "nlohmann/json.hpp"

namespace ring {
namespace {

using json = nlohmann::json;

struct FamilyName {
  ModelFamily family;
  const char* name;
};
constexpr FamilyName kFamilies[] = {
    {ModelFamily::kGlmMoeDsa, "glm_moe_dsa"},  {ModelFamily::kDeepseekV32, "deepseek_v32"},
    {ModelFamily::kDeepseekV3, "deepseek_v3"}, {ModelFamily::kQwen3, "qwen3"},
    {ModelFamily::kQwen3Moe, "qwen3_moe"},
};

// Reads typed fields of one JSON object, keeping the first error. An absent field and a
// `null` one read the same (HF writes null for unset optionals such as q_lora_rank) and
// leave the output untouched, so struct defaults apply. Errors name the source file and
// the dotted field path.
class FieldReader {
 public:
  enum Need { kOptional, kRequired };

  FieldReader(const json& obj, absl::string_view source, absl::string_view prefix = "")
      : obj_(obj), source_(source), prefix_(prefix) {}

  const json* Find(absl::string_view key) const {
    auto it = obj_.find(std::string(key));
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  bool Has(absl::string_view key) const { return Find(key) != nullptr; }

  void Int(absl::string_view key, int64_t* out, Need need = kOptional) {
    const json* v = Get(key, need);
    if (v == nullptr) return;
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      Fail(key, "is out of range");
    } else if (v->is_number_integer()) {
      *out = v->get<int64_t>();
    } else if (v->is_number_float() && std::trunc(v->get<double>()) == v->get<double>() &&
               std::fabs(v->get<double>()) < 9.0e18) {
      *out = static_cast<int64_t>(v->get<double>());  // 4096.0 from a Python float
    } else {
      Fail(key, absl::StrCat("must be an integer, got ", v->type_name()));
    }
  }
  void Double(absl::string_view key, double* out, Need need = kOptional) {
    const json* v = Get(key, need);
    if (v == nullptr) return;
    if (v->is_number()) {
      *out = v->get<double>();
    } else {
      Fail(key, absl::StrCat("must be a number, got ", v->type_name()));
    }
  }
  void Bool(absl::string_view key, bool* out, Need need = kOptional) {
    const json* v = Get(key, need);
    if (v == nullptr) return;
    if (v->is_boolean()) {
      *out = v->get<bool>();
    } else {
      Fail(key, absl::StrCat("must be true or false, got ", v->type_name()));
    }
  }
  void String(absl::string_view key, std::string* out, Need need = kOptional) {
    const json* v = Get(key, need);
    if (v == nullptr) return;
    if (v->is_string()) {
      *out = v->get<std::string>();
    } else {
      Fail(key, absl::StrCat("must be a string, got ", v->type_name()));
    }
  }
  void IntList(absl::string_view key, std::vector<int64_t>* out) {
    const json* v = Get(key, kOptional);
    if (v == nullptr) return;
    if (!v->is_array()) return Fail(key, absl::StrCat("must be a list, got ", v->type_name()));
    out->clear();
    for (const json& e : *v) {
      if (!e.is_number_integer()) return Fail(key, "must be a list of integers");
      out->push_back(e.get<int64_t>());
    }
  }
  // Optional int that may be null (q_lora_rank): nullopt when absent or null.
  void OptionalInt(absl::string_view key, std::optional<int64_t>* out) {
    if (!Has(key)) {
      out->reset();
      return;
    }
    int64_t v = 0;
    Int(key, &v);
    *out = v;
  }

  // Range checks on values already read, reported like type errors.
  void Positive(absl::string_view key, int64_t v) {
    if (v <= 0) Fail(key, absl::StrCat("must be positive, got ", v));
  }
  void NonNegative(absl::string_view key, int64_t v) {
    if (v < 0) Fail(key, absl::StrCat("must be >= 0, got ", v));
  }

  void Fail(absl::string_view key, absl::string_view what) {
    Fail(absl::InvalidArgumentError(absl::StrCat(source_, ": field '", prefix_, key, "' ", what)));
  }
  void Fail(absl::Status s) {
    if (status_.ok()) status_ = std::move(s);
  }
  const absl::Status& status() const { return status_; }

 private:
  const json* Get(absl::string_view key, Need need) {
    const json* v = Find(key);
    if (v == nullptr && need == kRequired) Fail(key, "is required");
    return v;
  }

  const json& obj_;
  std::string source_;
  std::string prefix_;
  absl::Status status_;
};

// --- MLX quantization block ----------------------------------------------------------

// {"group_size", "bits", "mode"}; a missing mode is affine (as in mlx's to_quantized, which
// is what per-module overrides are passed to), missing sizes take the mode's defaults.
// `path` is the dotted field name for errors.
absl::StatusOr<QuantSpec> ParseSpecObject(const json& obj, absl::string_view source,
                                          const std::string& path) {
  FieldReader r(obj, source, path + ".");
  std::string mode_name = "affine";
  r.String("mode", &mode_name);
  RING_RETURN_IF_ERROR(r.status());
  absl::StatusOr<QuantMode> mode = ParseQuantMode(mode_name);
  if (!mode.ok() || *mode == QuantMode::kNone) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": field '", path, ".mode' is \"",
                                                   mode_name,
                                                   "\"; expected affine, mxfp4, mxfp8 or nvfp4"));
  }
  QuantSpec spec = DefaultQuantSpec(*mode);
  int64_t group = spec.group_size, bits = spec.bits;
  r.Int("group_size", &group);
  r.Int("bits", &bits);
  RING_RETURN_IF_ERROR(r.status());
  spec.group_size = static_cast<int>(std::clamp<int64_t>(group, -1, 1 << 20));
  spec.bits = static_cast<int>(std::clamp<int64_t>(bits, -1, 64));
  if (!ValidateQuantSpec(spec).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": field '", path, "' asks for ", mode_name, " with group_size ",
                     group, " and bits ", bits, ", which MLX does not support"));
  }
  return spec;
}

absl::Status ParseQuantization(const json& root, absl::string_view source, QuantizationConfig* q) {
  FieldReader top(root, source);
  std::string field = "quantization";
  const json* block = top.Find(field);
  if (block == nullptr) {
    field = "quantization_config";
    block = top.Find(field);
    if (block == nullptr) return absl::OkStatus();
    // Checkpoints converted elsewhere carry only a quant_method. mlx-lm loads mxfp4/mxfp8
    // ones (gpt-oss style) with fixed defaults; anything else is not an MLX layout.
    if (block->is_object() && block->contains("quant_method")) {
      FieldReader r(*block, source, field + ".");
      std::string method;
      r.String("quant_method", &method);
      RING_RETURN_IF_ERROR(r.status());
      if (method != "mxfp4" && method != "mxfp8") {
        return absl::UnimplementedError(
            absl::StrCat(source, ": quantization_config.quant_method \"", method,
                         "\" is not an MLX format; convert the checkpoint with mlx_lm.convert"));
      }
      q->present = true;
      q->default_spec = DefaultQuantSpec(*ParseQuantMode(method));
      return absl::OkStatus();
    }
  }
  if (!block->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": field '", field, "' must be an object"));
  }
  RING_ASSIGN_OR_RETURN(const QuantSpec spec, ParseSpecObject(*block, source, field));
  q->present = true;
  q->default_spec = spec;
  // Every other key naming a module is an override: false (keep it unquantized), true
  // (quantize with the block's spec, as mlx's nn.quantize does) or a spec object. Keys
  // with other values cannot be module overrides and are ignored.
  for (const auto& [key, value] : block->items()) {
    if (key == "group_size" || key == "bits" || key == "mode") continue;
    if (value.is_boolean()) {
      q->overrides[key] = value.get<bool>() ? std::optional<QuantSpec>(spec) : std::nullopt;
    } else if (value.is_object()) {
      RING_ASSIGN_OR_RETURN(q->overrides[key], ParseSpecObject(value, source, field + "." + key));
    }
  }
  return absl::OkStatus();
}

// --- rope ------------------------------------------------------------------------------

absl::Status ParseRope(const json& root, ModelFamily family, absl::string_view source,
                       RopeConfig* rope) {
  FieldReader top(root, source);
  // transformers >= 5 nests rope_theta and the scaling fields in rope_parameters (GLM-5
  // only has that); older configs have rope_scaling plus a top-level rope_theta.
  std::string field = "rope_parameters";
  const json* block = top.Find(field);
  if (block == nullptr) {
    field = "rope_scaling";
    block = top.Find(field);
  }
  if (block != nullptr && !block->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": field '", field, "' must be an object"));
  }
  static const json kNoBlock = json::object();
  FieldReader r(block != nullptr ? *block : kNoBlock, source, field + ".");

  const bool theta_has_default =
      family == ModelFamily::kDeepseekV3 || family == ModelFamily::kDeepseekV32;  // mlx-lm: 1e4
  if (top.Has("rope_theta")) {
    top.Double("rope_theta", &rope->theta);
  } else if (r.Has("rope_theta")) {
    r.Double("rope_theta", &rope->theta);
  } else if (!theta_has_default) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": field 'rope_theta' (or '", field, ".rope_theta') is required"));
  }
  RING_RETURN_IF_ERROR(top.status());
  RING_RETURN_IF_ERROR(r.status());
  if (!(rope->theta > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": rope_theta must be positive"));
  }
  // mlx-lm's qwen3_moe builds a plain nn.RoPE and never looks at rope_scaling.
  if (block == nullptr || family == ModelFamily::kQwen3Moe) return absl::OkStatus();

  // mlx-lm's initialize_rope: "type" wins over "rope_type".
  std::string type = "default";
  r.String(r.Has("type") ? "type" : "rope_type", &type);
  RING_RETURN_IF_ERROR(r.status());
  if (type == "default") return absl::OkStatus();
  if (type != "linear" && type != "yarn" && type != "deepseek_yarn") {
    return absl::UnimplementedError(absl::StrCat(source, ": ", field, " type \"", type,
                                                 "\" is not supported (default, linear, yarn, "
                                                 "deepseek_yarn)"));
  }
  rope->type = type == "linear" ? "linear" : "yarn";
  r.Double("factor", &rope->factor, FieldReader::kRequired);
  r.Int("original_max_position_embeddings", &rope->original_max_position_embeddings);
  r.Double("beta_fast", &rope->beta_fast);
  r.Double("beta_slow", &rope->beta_slow);
  r.Double("mscale", &rope->mscale);
  r.Double("mscale_all_dim", &rope->mscale_all_dim);
  RING_RETURN_IF_ERROR(r.status());
  if (!(rope->factor > 0)) r.Fail("factor", "must be positive");
  r.Positive("original_max_position_embeddings", rope->original_max_position_embeddings);
  return r.status();
}

// --- eos ids ---------------------------------------------------------------------------

absl::Status AppendEosIds(const json& root, absl::string_view source, std::vector<int64_t>* ids) {
  auto it = root.find("eos_token_id");
  if (it == root.end() || it->is_null()) return absl::OkStatus();
  std::vector<int64_t> found;
  if (it->is_number_integer()) {
    found.push_back(it->get<int64_t>());
  } else if (it->is_array() && std::all_of(it->begin(), it->end(),
                                           [](const json& e) { return e.is_number_integer(); })) {
    for (const json& e : *it) found.push_back(e.get<int64_t>());
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": field 'eos_token_id' must be an integer or a list of integers"));
  }
  for (int64_t id : found) {
    if (std::find(ids->begin(), ids->end(), id) == ids->end()) ids->push_back(id);
  }
  return absl::OkStatus();
}

// --- DSA indexer schedule --------------------------------------------------------------

absl::Status ParseIndexerSchedule(const json& root, absl::string_view source, ModelConfig* c) {
  FieldReader r(root, source);
  const int64_t layers = c->num_hidden_layers;
  r.Int("index_topk_freq", &c->index_topk_freq);
  r.Int("index_skip_topk_offset", &c->index_skip_topk_offset);
  RING_RETURN_IF_ERROR(r.status());
  c->indexer_full.assign(layers, true);

  if (const json* types = r.Find("indexer_types")) {
    if (!types->is_array() || static_cast<int64_t>(types->size()) != layers) {
      r.Fail("indexer_types",
             absl::StrCat("must be a list of ", layers, " entries (one per layer)"));
      return r.status();
    }
    for (int64_t i = 0; i < layers; ++i) {
      const json& t = (*types)[i];
      if (t != "full" && t != "shared") {
        r.Fail("indexer_types", absl::StrCat("entry ", i, " must be \"full\" or \"shared\""));
        return r.status();
      }
      c->indexer_full[i] = t == "full";
    }
  } else if (r.Has("index_topk_pattern")) {
    std::string pattern;
    r.String("index_topk_pattern", &pattern);
    RING_RETURN_IF_ERROR(r.status());
    if (static_cast<int64_t>(pattern.size()) != layers ||
        pattern.find_first_not_of("FS") != std::string::npos) {
      r.Fail("index_topk_pattern", absl::StrCat("must be ", layers, " letters F or S"));
      return r.status();
    }
    for (int64_t i = 0; i < layers; ++i) c->indexer_full[i] = pattern[i] == 'F';
  } else {
    r.Positive("index_topk_freq", c->index_topk_freq);
    r.NonNegative("index_skip_topk_offset", c->index_skip_topk_offset);
    RING_RETURN_IF_ERROR(r.status());
    // HF GlmMoeDsaConfig: full iff max(i - offset + 1, 0) % freq == 0. The defaults (1, 2)
    // make every layer full; GLM-5.2's (4, 3) give 0, 1, 2, 6, 10, ..., 74.
    for (int64_t i = 0; i < layers; ++i) {
      c->indexer_full[i] =
          std::max<int64_t>(i - c->index_skip_topk_offset + 1, 0) % c->index_topk_freq == 0;
    }
  }
  if (layers > 0 && !c->indexer_full[0]) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": layer 0 is a shared indexer layer, but there is no earlier full layer"));
  }
  return absl::OkStatus();
}

// --- families --------------------------------------------------------------------------

absl::Status ParseMla(const json& root, absl::string_view source, ModelConfig* c) {
  FieldReader r(root, source);
  if (!root.contains("q_lora_rank")) r.Fail("q_lora_rank", "is required (null for a plain q_proj)");
  r.OptionalInt("q_lora_rank", &c->q_lora_rank);
  r.Int("kv_lora_rank", &c->kv_lora_rank, FieldReader::kRequired);
  r.Int("qk_nope_head_dim", &c->qk_nope_head_dim, FieldReader::kRequired);
  r.Int("qk_rope_head_dim", &c->qk_rope_head_dim, FieldReader::kRequired);
  r.Int("v_head_dim", &c->v_head_dim, FieldReader::kRequired);
  r.Bool("rope_interleave", &c->rope_interleave);
  RING_RETURN_IF_ERROR(r.status());
  if (c->q_lora_rank) r.Positive("q_lora_rank", *c->q_lora_rank);
  r.Positive("kv_lora_rank", c->kv_lora_rank);
  r.Positive("qk_nope_head_dim", c->qk_nope_head_dim);
  r.Positive("qk_rope_head_dim", c->qk_rope_head_dim);
  r.Positive("v_head_dim", c->v_head_dim);
  if (c->qk_rope_head_dim % 2 != 0) r.Fail("qk_rope_head_dim", "must be even (RoPE rotates pairs)");
  // The config's head_dim is unused by mlx-lm's MLA (GLM-5.2 even ships a misleading 192);
  // the q/k head dim is nope + rope.
  c->head_dim = c->qk_nope_head_dim + c->qk_rope_head_dim;

  // DeepSeek-style MoE. n_routed_experts / n_shared_experts may be null (dense model).
  r.Int("n_routed_experts", &c->n_routed_experts);
  r.Int("n_shared_experts", &c->n_shared_experts);
  r.Int("num_experts_per_tok", &c->num_experts_per_tok);
  r.Int("moe_intermediate_size", &c->moe_intermediate_size);
  r.Int("n_group", &c->n_group);
  r.Int("topk_group", &c->topk_group);
  r.String("topk_method", &c->topk_method);
  r.String("scoring_func", &c->scoring_func);
  r.Bool("norm_topk_prob", &c->norm_topk_prob);
  r.Double("routed_scaling_factor", &c->routed_scaling_factor);
  r.Int("first_k_dense_replace", &c->first_k_dense_replace);
  r.Int("moe_layer_freq", &c->moe_layer_freq);
  RING_RETURN_IF_ERROR(r.status());
  r.NonNegative("n_routed_experts", c->n_routed_experts);
  r.NonNegative("n_shared_experts", c->n_shared_experts);
  r.NonNegative("first_k_dense_replace", c->first_k_dense_replace);
  r.Positive("moe_layer_freq", c->moe_layer_freq);
  if (c->n_routed_experts > 0) {
    r.Positive("moe_intermediate_size", c->moe_intermediate_size);
    if (c->num_experts_per_tok < 1 || c->num_experts_per_tok > c->n_routed_experts) {
      r.Fail("num_experts_per_tok",
             absl::StrCat("must be in [1, n_routed_experts = ", c->n_routed_experts, "]"));
    }
    r.Positive("n_group", c->n_group);
    if (c->n_group > 0 && c->n_routed_experts % c->n_group != 0) {
      r.Fail("n_group", "must divide n_routed_experts");
    }
    if (c->topk_group < 1 || c->topk_group > c->n_group)
      r.Fail("topk_group", "must be in [1, n_group]");
  }
  RING_RETURN_IF_ERROR(r.status());
  // mlx-lm's MoEGate implements exactly this router (sigmoid scores, noaux_tc selection).
  if (c->n_routed_experts > 0 && (c->topk_method != "noaux_tc" || c->scoring_func != "sigmoid")) {
    return absl::UnimplementedError(absl::StrCat(source, ": router topk_method \"", c->topk_method,
                                                 "\" / scoring_func \"", c->scoring_func,
                                                 "\" is not supported (noaux_tc / sigmoid)"));
  }
  if (!c->has_indexer()) return absl::OkStatus();

  c->indexer_rope_interleave = c->family == ModelFamily::kGlmMoeDsa;  // mlx-lm #1431
  r.Bool("indexer_rope_interleave", &c->indexer_rope_interleave);
  r.Int("index_n_heads", &c->index_n_heads, FieldReader::kRequired);
  r.Int("index_head_dim", &c->index_head_dim, FieldReader::kRequired);
  r.Int("index_topk", &c->index_topk, FieldReader::kRequired);
  RING_RETURN_IF_ERROR(r.status());
  r.Positive("index_n_heads", c->index_n_heads);
  r.Positive("index_topk", c->index_topk);
  if (c->index_head_dim < c->qk_rope_head_dim) {
    r.Fail("index_head_dim", "must be >= qk_rope_head_dim (RoPE covers its first dims)");
  }
  if (!c->q_lora_rank) r.Fail("q_lora_rank", "must be set: the indexer's wq_b reads the q latent");
  RING_RETURN_IF_ERROR(r.status());
  return ParseIndexerSchedule(root, source, c);
}

absl::Status ParseQwen(const json& root, absl::string_view source, ModelConfig* c) {
  FieldReader r(root, source);
  c->rope_interleave = false;  // Qwen3 rotates half-split (traditional=False)
  if (r.Has("head_dim")) {
    r.Int("head_dim", &c->head_dim);
  } else if (c->hidden_size % c->num_attention_heads != 0) {
    r.Fail("hidden_size", "must be divisible by num_attention_heads when head_dim is absent");
  } else {
    c->head_dim = c->hidden_size / c->num_attention_heads;
  }
  RING_RETURN_IF_ERROR(r.status());
  r.Positive("head_dim", c->head_dim);
  if (c->head_dim % 2 != 0) r.Fail("head_dim", "must be even (RoPE rotates pairs)");
  if (c->family != ModelFamily::kQwen3Moe) return r.status();

  // HF Qwen3MoeConfig defaults norm_topk_prob to false; configs normally spell it out.
  c->norm_topk_prob = false;
  r.Int("num_experts", &c->num_experts, FieldReader::kRequired);
  r.Int("num_experts_per_tok", &c->num_experts_per_tok, FieldReader::kRequired);
  r.Int("moe_intermediate_size", &c->moe_intermediate_size, FieldReader::kRequired);
  r.Int("decoder_sparse_step", &c->decoder_sparse_step);
  r.IntList("mlp_only_layers", &c->mlp_only_layers);
  r.Bool("norm_topk_prob", &c->norm_topk_prob);
  RING_RETURN_IF_ERROR(r.status());
  r.NonNegative("num_experts", c->num_experts);
  r.Positive("decoder_sparse_step", c->decoder_sparse_step);
  if (c->num_experts > 0) {
    r.Positive("moe_intermediate_size", c->moe_intermediate_size);
    if (c->num_experts_per_tok < 1 || c->num_experts_per_tok > c->num_experts) {
      r.Fail("num_experts_per_tok",
             absl::StrCat("must be in [1, num_experts = ", c->num_experts, "]"));
    }
  }
  for (int64_t layer : c->mlp_only_layers) {
    if (layer < 0 || layer >= c->num_hidden_layers) {
      r.Fail("mlp_only_layers",
             absl::StrCat("has layer ", layer, " outside [0, ", c->num_hidden_layers, ")"));
    }
  }
  return r.status();
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return ss.str();
}

}  // namespace

const char* ModelFamilyName(ModelFamily f) {
  for (const FamilyName& n : kFamilies) {
    if (n.family == f) return n.name;
  }
  return "unknown";
}

QuantSpec QuantizationConfig::SpecFor(const std::string& module_path, bool has_scales) const {
  if (!present) return QuantSpec{};
  if (auto it = overrides.find(module_path); it != overrides.end()) {
    return it->second.value_or(QuantSpec{});
  }
  return has_scales ? default_spec : QuantSpec{};
}

bool ModelConfig::is_mla() const {
  return family == ModelFamily::kGlmMoeDsa || family == ModelFamily::kDeepseekV32 ||
         family == ModelFamily::kDeepseekV3;
}

bool ModelConfig::has_indexer() const {
  return family == ModelFamily::kGlmMoeDsa || family == ModelFamily::kDeepseekV32;
}

bool ModelConfig::has_indexer_weights(int64_t layer) const {
  if (!has_indexer()) return false;
  return layer >= static_cast<int64_t>(indexer_full.size()) || indexer_full[layer];
}

bool ModelConfig::is_moe_layer(int64_t layer) const {
  if (layer < 0 || layer >= num_hidden_layers) return false;
  if (is_mla()) {
    return n_routed_experts > 0 && layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
  }
  if (family == ModelFamily::kQwen3Moe) {
    return num_experts > 0 &&
           std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) ==
               mlp_only_layers.end() &&
           (layer + 1) % decoder_sparse_step == 0;
  }
  return false;
}

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text,
                                             absl::string_view source) {
  const json root = json::parse(json_text.begin(), json_text.end(), nullptr,
                                /*allow_exceptions=*/false);
  if (root.is_discarded())
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON"));
  if (!root.is_object())
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));

  ModelConfig c;
  FieldReader r(root, source);
  r.String("model_type", &c.model_type, FieldReader::kRequired);
  RING_RETURN_IF_ERROR(r.status());
  const FamilyName* family =
      std::find_if(std::begin(kFamilies), std::end(kFamilies),
                   [&](const FamilyName& f) { return c.model_type == f.name; });
  if (family == std::end(kFamilies)) {
    std::vector<std::string> names;
    for (const FamilyName& f : kFamilies) names.push_back(f.name);
    return absl::UnimplementedError(absl::StrCat(source, ": model_type \"", c.model_type,
                                                 "\" is not supported (",
                                                 absl::StrJoin(names, ", "), ")"));
  }
  c.family = family->family;

  // transformers >= 5 writes "dtype"; older configs "torch_dtype".
  r.String(r.Has("dtype") ? "dtype" : "torch_dtype", &c.torch_dtype);
  r.Int("vocab_size", &c.vocab_size, FieldReader::kRequired);
  r.Int("hidden_size", &c.hidden_size, FieldReader::kRequired);
  r.Int("num_hidden_layers", &c.num_hidden_layers, FieldReader::kRequired);
  r.Int("intermediate_size", &c.intermediate_size, FieldReader::kRequired);
  r.Int("num_attention_heads", &c.num_attention_heads, FieldReader::kRequired);
  r.Int("num_key_value_heads", &c.num_key_value_heads);
  r.Double("rms_norm_eps", &c.rms_norm_eps);
  r.Int("max_position_embeddings", &c.max_position_embeddings);
  r.Bool("tie_word_embeddings", &c.tie_word_embeddings);
  r.Bool("attention_bias", &c.attention_bias);
  RING_RETURN_IF_ERROR(r.status());
  if (!r.Has("num_key_value_heads")) c.num_key_value_heads = c.num_attention_heads;
  if (c.torch_dtype != "bfloat16" && c.torch_dtype != "float16" && c.torch_dtype != "float32") {
    r.Fail(r.Has("dtype") ? "dtype" : "torch_dtype",
           absl::StrCat("is \"", c.torch_dtype, "\"; expected bfloat16, float16 or float32"));
  }
  r.Positive("vocab_size", c.vocab_size);
  r.Positive("hidden_size", c.hidden_size);
  r.Positive("num_hidden_layers", c.num_hidden_layers);
  r.Positive("intermediate_size", c.intermediate_size);
  r.Positive("num_attention_heads", c.num_attention_heads);
  r.Positive("num_key_value_heads", c.num_key_value_heads);
  r.NonNegative("max_position_embeddings", c.max_position_embeddings);
  if (!(c.rms_norm_eps > 0)) r.Fail("rms_norm_eps", "must be positive");
  if (r.status().ok() && c.num_attention_heads % c.num_key_value_heads != 0) {
    r.Fail("num_key_value_heads", "must divide num_attention_heads");
  }
  RING_RETURN_IF_ERROR(r.status());

  RING_RETURN_IF_ERROR(AppendEosIds(root, source, &c.eos_token_ids));
  RING_RETURN_IF_ERROR(ParseRope(root, c.family, source, &c.rope));
  RING_RETURN_IF_ERROR(c.is_mla() ? ParseMla(root, source, &c) : ParseQwen(root, source, &c));
  RING_RETURN_IF_ERROR(ParseQuantization(root, source, &c.quantization));
  return c;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir) {
  const std::filesystem::path base(dir);
  const std::string config_path = (base / "config.json").string();
  RING_ASSIGN_OR_RETURN(std::string text, ReadTextFile(config_path));
  RING_ASSIGN_OR_RETURN(ModelConfig c, ParseModelConfig(text, config_path));

  // mlx-lm adds generation_config.json's eos ids to the config's.
  const std::string gen_path = (base / "generation_config.json").string();
  std::error_code ec;
  if (!std::filesystem::exists(gen_path, ec)) return c;
  RING_ASSIGN_OR_RETURN(std::string gen_text, ReadTextFile(gen_path));
  const json gen = json::parse(gen_text, nullptr, /*allow_exceptions=*/false);
  if (gen.is_discarded() || !gen.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(gen_path, ": not a valid JSON object"));
  }
  RING_RETURN_IF_ERROR(AppendEosIds(gen, gen_path, &c.eos_token_ids));
  return c;
}

}  // namespace ring
