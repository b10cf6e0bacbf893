// Random mlx-lm-layout checkpoints. See synth.h.
#include "models/synth.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/status.h"
#include "models/safetensors.h"
#include "nlohmann/json.hpp"

namespace ring {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

constexpr char kGlm[] = "glm_moe_dsa";
constexpr char kDsV32[] = "deepseek_v32";
constexpr char kDsV3[] = "deepseek_v3";
constexpr char kQwen3[] = "qwen3";
constexpr char kQwen3Moe[] = "qwen3_moe";

// --- deterministic generator -----------------------------------------------------------

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t Fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// Box-Muller on two splitmix64 outputs: the pair of normals of stream `key` at `pair`.
void NormalPair(uint64_t key, uint64_t pair, double* z) {
  const uint64_t a = Mix64(key + (2 * pair + 1) * kGolden);
  const uint64_t b = Mix64(key + (2 * pair + 2) * kGolden);
  const double u1 = static_cast<double>((a >> 11) + 1) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;        // [0, 1)
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double theta = 6.283185307179586 * u2;
  z[0] = r * std::cos(theta);
  z[1] = r * std::sin(theta);
}

// Fills out[0, n) with the values of elements [first, first + n) of a parameter, each
// rounded to the parameter's float dtype (bf16, or fp32).
void GenerateValues(const ModelParam& p, uint64_t key, uint64_t first, int64_t n,
                    float* out) {
  uint64_t cached = ~0ull;
  double z[2] = {0.0, 0.0};
  const bool bf16 = p.dtype == DType::kBF16;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t idx = first + static_cast<uint64_t>(i);
    if ((idx >> 1) != cached) {
      cached = idx >> 1;
      NormalPair(key, cached, z);
    }
    float v = static_cast<float>(p.std * z[idx & 1]);
    if (p.mean != 0.0f) {
      // Through a volatile, so that no compiler fuses the multiply and the add into an FMA
      // (GCC contracts even across the float cast): the bytes must not depend on the build.
      volatile float scaled = v;
      v = p.mean + scaled;
    }
    out[i] = bf16 ? RoundBf16(v) : v;
  }
}

// --- presets -----------------------------------------------------------------------------

bool IsDeepseekFamily(const std::string& t) { return t == kGlm || t == kDsV32 || t == kDsV3; }
bool IsQwenFamily(const std::string& t) { return t == kQwen3 || t == kQwen3Moe; }
bool HasIndexerFamily(const std::string& t) { return t == kGlm || t == kDsV32; }

ModelFamily FamilyOf(const std::string& t) {
  if (t == kGlm) return ModelFamily::kGlmMoeDsa;
  if (t == kDsV32) return ModelFamily::kDeepseekV32;
  if (t == kDsV3) return ModelFamily::kDeepseekV3;
  if (t == kQwen3Moe) return ModelFamily::kQwen3Moe;
  return ModelFamily::kQwen3;
}

// What the config.json needs beyond ModelConfig.
struct PresetExtras {
  bool explicit_indexer_types = false;  // GLM-5.2 style IndexShare (indexer_types list)
  int64_t head_dim_field = 0;           // GLM's informational "head_dim" (0: omit)
  int64_t num_nextn_predict_layers = 0;
  std::string transformers_version = "4.57.1";
};

struct Preset {
  ModelConfig config;
  PresetExtras extras;
};

std::string DefaultArchOf(const std::string& preset) {
  if (preset == "glm-5.2" || preset == "glm-5") return kGlm;
  if (preset == "qwen3-0.6b" || preset == "qwen3-8b") return kQwen3;
  if (preset == "qwen3-30b-a3b") return kQwen3Moe;
  return kGlm;  // tiny
}

void SetMla(ModelConfig& c, int64_t heads, int64_t q_lora, int64_t kv_lora, int64_t nope,
            int64_t rope, int64_t v) {
  c.num_attention_heads = heads;
  c.num_key_value_heads = heads;
  c.q_lora_rank = q_lora;
  c.kv_lora_rank = kv_lora;
  c.qk_nope_head_dim = nope;
  c.qk_rope_head_dim = rope;
  c.v_head_dim = v;
}

void SetDeepseekMoe(ModelConfig& c, int64_t experts, int64_t top_k, int64_t moe_inter,
                    int64_t shared, int64_t first_dense, int64_t n_group, int64_t topk_group,
                    double scaling) {
  c.n_routed_experts = experts;
  c.num_experts_per_tok = top_k;
  c.moe_intermediate_size = moe_inter;
  c.n_shared_experts = shared;
  c.first_k_dense_replace = first_dense;
  c.n_group = n_group;
  c.topk_group = topk_group;
  c.routed_scaling_factor = scaling;
  c.moe_layer_freq = 1;
  c.topk_method = "noaux_tc";
  c.scoring_func = "sigmoid";
  c.norm_topk_prob = true;
}

// DeepSeek-V3 style YaRN (the real V3/V3.2 configs).
void SetDeepseekYarn(ModelConfig& c) {
  c.rope.type = "yarn";
  c.rope.theta = 10000.0;
  c.rope.factor = 40.0;
  c.rope.original_max_position_embeddings = 4096;
  c.rope.beta_fast = 32.0;
  c.rope.beta_slow = 1.0;
  c.rope.mscale = 1.0;
  c.rope.mscale_all_dim = 1.0;
  c.max_position_embeddings = 163840;
}

absl::StatusOr<Preset> MakePreset(const std::string& preset, const std::string& arch) {
  Preset p;
  ModelConfig& c = p.config;
  c.model_type = arch;
  c.family = FamilyOf(arch);
  c.torch_dtype = "bfloat16";
  c.attention_bias = false;
  c.rope = RopeConfig();
  auto mismatch = [&]() {
    return absl::InvalidArgumentError(absl::StrCat("preset '", preset, "' is a ",
                                                   DefaultArchOf(preset),
                                                   " model; it cannot be built as --arch ",
                                                   arch));
  };
  if (preset == "tiny") {
    c.vocab_size = 1024;
    c.hidden_size = 128;
    c.num_hidden_layers = 4;
    c.intermediate_size = 256;
    c.max_position_embeddings = 4096;
    if (IsDeepseekFamily(arch)) {
      // Every quantized last axis (128, 256) is a multiple of every group size.
      SetMla(c, 4, 128, 128, 128, 32, 64);
      c.rms_norm_eps = 1e-6;
      if (arch == kGlm) {
        SetDeepseekMoe(c, 8, 2, 128, 1, 1, 1, 1, 2.5);
        c.rms_norm_eps = 1e-5;
        c.rope.theta = 1000000.0;
        c.indexer_rope_interleave = true;
        // GLM-5.2 style IndexShare at toy scale: layers F F S F.
        c.index_topk_freq = 2;
        c.index_skip_topk_offset = 2;
        p.extras.explicit_indexer_types = true;
        p.extras.head_dim_field = 32;
        p.extras.transformers_version = "5.0.0";
      } else {
        SetDeepseekMoe(c, 8, 2, 128, 1, 1, 2, 1, 2.5);
        SetDeepseekYarn(c);
      }
      if (HasIndexerFamily(arch)) {
        c.index_n_heads = 4;
        c.index_head_dim = 64;
        c.index_topk = 16;
      }
    } else if (IsQwenFamily(arch)) {
      c.num_attention_heads = 4;
      c.num_key_value_heads = 2;
      c.head_dim = 64;
      c.rms_norm_eps = 1e-6;
      c.rope.theta = 1000000.0;
      c.tie_word_embeddings = arch == kQwen3;  // exercise both head layouts
      if (arch == kQwen3Moe) {
        c.num_experts = 8;
        c.num_experts_per_tok = 2;
        c.moe_intermediate_size = 128;
        c.decoder_sparse_step = 1;
        c.norm_topk_prob = true;
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown --arch '", arch, "'; known: ",
                                                     absl::StrJoin(SynthArchNames(), ", ")));
    }
    return p;
  }
  if (preset == "glm-5.2" || preset == "glm-5") {
    if (arch != kGlm) return mismatch();
    c.vocab_size = 154880;
    c.hidden_size = 6144;
    c.num_hidden_layers = 78;
    c.intermediate_size = 12288;
    SetMla(c, 64, 2048, 512, 192, 64, 256);
    SetDeepseekMoe(c, 256, 8, 2048, 1, 3, 1, 1, 2.5);
    c.rms_norm_eps = 1e-5;
    c.indexer_rope_interleave = true;
    c.index_n_heads = 32;
    c.index_head_dim = 128;
    c.index_topk = 2048;
    p.extras.num_nextn_predict_layers = 1;
    p.extras.transformers_version = "5.0.0";
    if (preset == "glm-5.2") {
      c.rope.theta = 8000000.0;
      c.max_position_embeddings = 1048576;
      c.index_topk_freq = 4;
      c.index_skip_topk_offset = 3;
      p.extras.explicit_indexer_types = true;
      p.extras.head_dim_field = 192;  // as shipped; not used by mlx-lm (spec §2)
    } else {
      c.rope.theta = 1000000.0;
      c.max_position_embeddings = 202752;
      p.extras.head_dim_field = 64;
    }
    return p;
  }
  if (preset == "qwen3-0.6b" || preset == "qwen3-8b" || preset == "qwen3-30b-a3b") {
    if (arch != DefaultArchOf(preset)) return mismatch();
    c.vocab_size = 151936;
    c.head_dim = 128;
    c.rms_norm_eps = 1e-6;
    c.rope.theta = 1000000.0;
    c.max_position_embeddings = 40960;
    p.extras.transformers_version = "4.51.0";
    if (preset == "qwen3-0.6b") {
      c.hidden_size = 1024;
      c.num_hidden_layers = 28;
      c.num_attention_heads = 16;
      c.num_key_value_heads = 8;
      c.intermediate_size = 3072;
      c.tie_word_embeddings = true;
    } else if (preset == "qwen3-8b") {
      c.hidden_size = 4096;
      c.num_hidden_layers = 36;
      c.num_attention_heads = 32;
      c.num_key_value_heads = 8;
      c.intermediate_size = 12288;
    } else {
      c.hidden_size = 2048;
      c.num_hidden_layers = 48;
      c.num_attention_heads = 32;
      c.num_key_value_heads = 4;
      c.intermediate_size = 6144;
      c.num_experts = 128;
      c.num_experts_per_tok = 8;
      c.moe_intermediate_size = 768;
      c.decoder_sparse_step = 1;
      c.norm_topk_prob = true;
    }
    return p;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown --preset '", preset, "'; known: ",
                                                 absl::StrJoin(SynthPresetNames(), ", ")));
}

// IndexShare pattern (HF GlmMoeDsaConfig): full iff
// max(i - index_skip_topk_offset + 1, 0) % index_topk_freq == 0.
std::vector<bool> IndexerPattern(int64_t layers, int64_t freq, int64_t offset) {
  std::vector<bool> full(layers);
  for (int64_t i = 0; i < layers; ++i) {
    full[i] = std::max<int64_t>(i - offset + 1, 0) % std::max<int64_t>(freq, 1) == 0;
  }
  return full;
}

// --- config.json ------------------------------------------------------------------------

Json QuantJson(const QuantSpec& s, bool with_mode) {
  Json j = {{"group_size", s.group_size}, {"bits", s.bits}};
  if (with_mode) j["mode"] = QuantModeName(s.mode);
  return j;
}

std::string ArchitectureName(const std::string& t) {
  if (t == kGlm) return "GlmMoeDsaForCausalLM";
  if (t == kDsV32) return "DeepseekV32ForCausalLM";
  if (t == kDsV3) return "DeepseekV3ForCausalLM";
  if (t == kQwen3Moe) return "Qwen3MoeForCausalLM";
  return "Qwen3ForCausalLM";
}

struct TokenIds {
  int64_t eos = 0;               // tokenizer eos (GLM <|endoftext|>, Qwen <|im_end|>)
  int64_t pad = 0;
  std::vector<int64_t> stop;     // generation_config eos_token_id
};

TokenIds IdsFor(const TokenizerFiles& tok, TokenizerStyle style) {
  TokenIds ids;
  if (style == TokenizerStyle::kGlm) {
    ids.eos = tok.TokenId("<|endoftext|>");
    ids.pad = ids.eos;
    ids.stop = {ids.eos, tok.TokenId("<|user|>"), tok.TokenId("<|observation|>")};
  } else {
    ids.eos = tok.TokenId("<|im_end|>");
    ids.pad = tok.TokenId("<|endoftext|>");
    ids.stop = {ids.eos, ids.pad};
  }
  return ids;
}

Json ConfigJson(const ModelConfig& c, const PresetExtras& x, const TokenIds& ids) {
  const std::string& t = c.model_type;
  Json j;
  j["architectures"] = {ArchitectureName(t)};
  j["model_type"] = t;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["intermediate_size"] = c.intermediate_size;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["attention_bias"] = c.attention_bias;
  j["attention_dropout"] = 0.0;
  j["hidden_act"] = "silu";
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  j["transformers_version"] = x.transformers_version;
  if (IsDeepseekFamily(t)) {
    j["q_lora_rank"] = c.q_lora_rank ? Json(*c.q_lora_rank) : Json(nullptr);
    j["kv_lora_rank"] = c.kv_lora_rank;
    j["qk_nope_head_dim"] = c.qk_nope_head_dim;
    j["qk_rope_head_dim"] = c.qk_rope_head_dim;
    j["v_head_dim"] = c.v_head_dim;
    j["n_routed_experts"] = c.n_routed_experts;
    j["n_shared_experts"] = c.n_shared_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["n_group"] = c.n_group;
    j["topk_group"] = c.topk_group;
    j["topk_method"] = c.topk_method;
    j["scoring_func"] = c.scoring_func;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["routed_scaling_factor"] = c.routed_scaling_factor;
    j["first_k_dense_replace"] = c.first_k_dense_replace;
    j["moe_layer_freq"] = c.moe_layer_freq;
    j["num_nextn_predict_layers"] = x.num_nextn_predict_layers;
    if (HasIndexerFamily(t)) {
      j["index_n_heads"] = c.index_n_heads;
      j["index_head_dim"] = c.index_head_dim;
      j["index_topk"] = c.index_topk;
    }
    j["eos_token_id"] = t == kGlm ? Json(ids.stop) : Json(ids.eos);
    j["pad_token_id"] = ids.pad;
    if (t == kGlm) {
      j["dtype"] = c.torch_dtype;
      j["qk_head_dim"] = c.qk_nope_head_dim + c.qk_rope_head_dim;
      if (x.head_dim_field > 0) j["head_dim"] = x.head_dim_field;
      j["rope_parameters"] = {{"rope_theta", c.rope.theta}, {"rope_type", "default"}};
      j["rope_interleave"] = true;
      j["indexer_rope_interleave"] = c.indexer_rope_interleave;
      if (x.explicit_indexer_types) {
        Json types = Json::array();
        for (bool full : c.indexer_full) types.push_back(full ? "full" : "shared");
        j["indexer_types"] = std::move(types);
        j["index_topk_freq"] = c.index_topk_freq;
        j["index_skip_topk_offset"] = c.index_skip_topk_offset;
        j["index_share_for_mtp_iteration"] = true;
        j["moe_router_dtype"] = "float32";
      }
    } else {
      j["torch_dtype"] = c.torch_dtype;
      j["bos_token_id"] = ids.pad;
      j["ep_size"] = 1;
      j["rope_theta"] = c.rope.theta;
      j["rope_scaling"] = {{"type", c.rope.type},
                           {"factor", c.rope.factor},
                           {"original_max_position_embeddings",
                            c.rope.original_max_position_embeddings},
                           {"beta_fast", c.rope.beta_fast},
                           {"beta_slow", c.rope.beta_slow},
                           {"mscale", c.rope.mscale},
                           {"mscale_all_dim", c.rope.mscale_all_dim}};
    }
  } else {
    j["torch_dtype"] = c.torch_dtype;
    j["head_dim"] = c.head_dim;
    j["rope_theta"] = c.rope.theta;
    j["rope_scaling"] = nullptr;
    j["sliding_window"] = nullptr;
    j["use_sliding_window"] = false;
    j["max_window_layers"] = c.num_hidden_layers;
    j["bos_token_id"] = ids.pad;
    j["eos_token_id"] = ids.eos;
    if (t == kQwen3Moe) {
      j["num_experts"] = c.num_experts;
      j["num_experts_per_tok"] = c.num_experts_per_tok;
      j["moe_intermediate_size"] = c.moe_intermediate_size;
      j["decoder_sparse_step"] = c.decoder_sparse_step;
      j["mlp_only_layers"] = c.mlp_only_layers;
      j["norm_topk_prob"] = c.norm_topk_prob;
      j["output_router_logits"] = false;
      j["router_aux_loss_coef"] = 0.001;
    }
  }
  if (c.quantization.present) {
    Json q = QuantJson(c.quantization.default_spec, /*with_mode=*/true);
    for (const auto& [path, spec] : c.quantization.overrides) {
      // mlx-lm's qwen3_moe predicate returns {"group_size": 64, "bits": 8} (no mode).
      q[path] = spec ? QuantJson(*spec, /*with_mode=*/spec->mode != QuantMode::kAffine)
                     : Json(false);
    }
    j["quantization"] = q;
    j["quantization_config"] = q;
  }
  return j;
}

Json GenerationConfigJson(TokenizerStyle style, const TokenIds& ids, const PresetExtras& x) {
  Json j;
  j["eos_token_id"] = ids.stop;
  j["pad_token_id"] = ids.pad;
  j["do_sample"] = true;
  j["top_p"] = 0.95;
  j["transformers_version"] = x.transformers_version;
  if (style == TokenizerStyle::kGlm) {
    j["temperature"] = 1.0;
  } else {
    j["bos_token_id"] = ids.pad;
    j["temperature"] = 0.6;
    j["top_k"] = 20;
  }
  return j;
}

const TokenizerFiles& CachedTokenizer(TokenizerStyle style) {
  // model_max_length is patched per checkpoint when written; training is the slow part.
  static const TokenizerFiles* glm = new TokenizerFiles(BuildTokenizerFiles(TokenizerStyle::kGlm, 0));
  static const TokenizerFiles* qwen = new TokenizerFiles(BuildTokenizerFiles(TokenizerStyle::kQwen, 0));
  return style == TokenizerStyle::kGlm ? *glm : *qwen;
}

// --- writing ------------------------------------------------------------------------------

absl::Status WriteTextFile(const fs::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return absl::PermissionDeniedError(absl::StrCat("cannot create ", path.string()));
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  f.close();
  if (!f) return absl::DataLossError(absl::StrCat("failed writing ", path.string()));
  return absl::OkStatus();
}

bool IsCheckpointFile(const std::string& name) {
  static const char* kFiles[] = {"config.json",           "generation_config.json",
                                 "tokenizer.json",        "tokenizer_config.json",
                                 "chat_template.jinja",   "model.safetensors.index.json"};
  for (const char* f : kFiles) {
    if (name == f) return true;
  }
  return absl::StartsWith(name, "model") && absl::EndsWith(name, ".safetensors");
}

absl::Status PrepareOutDir(const std::string& dir, bool overwrite) {
  if (dir.empty()) return absl::InvalidArgumentError("no output directory given");
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    if (!fs::is_directory(dir, ec)) {
      return absl::InvalidArgumentError(absl::StrCat(dir, " exists and is not a directory"));
    }
    std::vector<fs::path> existing;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      if (IsCheckpointFile(e.path().filename().string())) existing.push_back(e.path());
    }
    if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
    if (!existing.empty() && !overwrite) {
      return absl::FailedPreconditionError(
          absl::StrCat(dir, " already holds a checkpoint (", existing.front().filename().string(),
                       "); pass --force to replace it"));
    }
    for (const fs::path& p : existing) {
      fs::remove(p, ec);
      if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot remove ", p.string()));
    }
    return absl::OkStatus();
  }
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  }
  return absl::OkStatus();
}

// Generates one parameter and hands its stored tensors to the writer.
absl::Status WriteParam(const PlannedParam& pp, uint64_t seed, CheckpointWriter& writer) {
  const ModelParam& p = pp.param;
  const uint64_t key = SynthTensorKey(seed, p.name);
  const int64_t cols = p.shape.back();
  const int64_t rows = NumElements(p.shape) / cols;
  // Rows per task: ~64K elements, so small tensors are one task and big ones spread.
  const int64_t block = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(cols, 1));
  const int64_t num_blocks = (rows + block - 1) / block;

  if (pp.quant.mode == QuantMode::kNone) {
    const int esize = DTypeSize(p.dtype);
    std::vector<uint8_t> bytes(static_cast<size_t>(rows * cols * esize));
    cpu::ParallelFor(num_blocks, 1, [&](int64_t b0, int64_t b1) {
      std::vector<float> vals;
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t r0 = b * block, r1 = std::min(rows, r0 + block);
        const int64_t n = (r1 - r0) * cols;
        vals.resize(static_cast<size_t>(n));
        GenerateValues(p, key, static_cast<uint64_t>(r0 * cols), n, vals.data());
        uint8_t* dst = bytes.data() + r0 * cols * esize;
        if (p.dtype == DType::kF32) {
          std::memcpy(dst, vals.data(), static_cast<size_t>(n) * 4);
        } else {
          for (int64_t i = 0; i < n; ++i) {
            const uint16_t h = FloatToBf16(vals[i]);
            std::memcpy(dst + 2 * i, &h, 2);
          }
        }
      }
    });
    return writer.Add(p.name, p.dtype, p.shape, std::move(bytes));
  }

  const QuantSpec& spec = pp.quant;
  const int64_t w_row_bytes = cols * spec.bits / 8;
  const int64_t groups = cols / spec.group_size;
  const StoredTensor& scales_t = pp.tensors[1];
  const int64_t s_row_bytes = groups * DTypeSize(scales_t.dtype);
  const bool affine = spec.mode == QuantMode::kAffine;
  std::vector<uint8_t> wbytes(static_cast<size_t>(rows * w_row_bytes));
  std::vector<uint8_t> sbytes(static_cast<size_t>(rows * s_row_bytes));
  std::vector<uint8_t> bbytes(affine ? sbytes.size() : 0);
  std::mutex err_mu;
  absl::Status err;
  std::atomic<bool> failed{false};
  cpu::ParallelFor(num_blocks, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> vals;
    for (int64_t b = b0; b < b1 && !failed.load(); ++b) {
      const int64_t r0 = b * block, r1 = std::min(rows, r0 + block);
      const int64_t n = (r1 - r0) * cols;
      vals.resize(static_cast<size_t>(n));
      GenerateValues(p, key, static_cast<uint64_t>(r0 * cols), n, vals.data());
      absl::StatusOr<QuantizedBuffers> q = Quantize(vals.data(), r1 - r0, cols, spec, p.dtype);
      absl::Status st = q.status();
      if (st.ok()) {
        const size_t wn = static_cast<size_t>((r1 - r0) * w_row_bytes);
        const size_t sn = static_cast<size_t>((r1 - r0) * s_row_bytes);
        if (q->weight.size() * 4 != wn || q->scales.size() != sn ||
            (affine && q->biases.size() != sn)) {
          st = absl::InternalError(absl::StrCat("Quantize returned unexpected sizes for ",
                                                p.name));
        } else {
          std::memcpy(wbytes.data() + r0 * w_row_bytes, q->weight.data(), wn);
          std::memcpy(sbytes.data() + r0 * s_row_bytes, q->scales.data(), sn);
          if (affine) std::memcpy(bbytes.data() + r0 * s_row_bytes, q->biases.data(), sn);
        }
      }
      if (!st.ok()) {
        std::lock_guard<std::mutex> l(err_mu);
        if (err.ok()) err = st;
        failed.store(true);
      }
    }
  });
  RING_RETURN_IF_ERROR(err);
  RING_RETURN_IF_ERROR(writer.Add(pp.tensors[0].name, DType::kU32, pp.tensors[0].shape,
                                  std::move(wbytes)));
  RING_RETURN_IF_ERROR(writer.Add(scales_t.name, scales_t.dtype, scales_t.shape,
                                  std::move(sbytes)));
  if (affine) {
    RING_RETURN_IF_ERROR(writer.Add(pp.tensors[2].name, pp.tensors[2].dtype,
                                    pp.tensors[2].shape, std::move(bbytes)));
  }
  return absl::OkStatus();
}

// MLX's combinations (ValidateQuantSpec) minus affine 1-bit, which mlx_lm.convert does not
// offer and config.json parsing rejects.
absl::Status ValidateSynthQuant(const QuantSpec& spec) {
  RING_RETURN_IF_ERROR(ValidateQuantSpec(spec));
  if (spec.mode == QuantMode::kAffine && spec.bits == 1) {
    return absl::InvalidArgumentError("affine bits must be 2, 3, 4, 5, 6 or 8");
  }
  return absl::OkStatus();
}

}  // namespace

// --- public -----------------------------------------------------------------------------

std::vector<std::string> SynthPresetNames() {
  return {"tiny", "glm-5.2", "glm-5", "qwen3-0.6b", "qwen3-8b", "qwen3-30b-a3b"};
}

std::vector<std::string> SynthArchNames() { return {kGlm, kDsV32, kDsV3, kQwen3, kQwen3Moe}; }

uint64_t SynthTensorKey(uint64_t seed, const std::string& name) {
  return Mix64(seed ^ Fnv1a64(name));
}

double SynthNormal(uint64_t key, uint64_t index) {
  double z[2];
  NormalPair(key, index >> 1, z);
  return z[index & 1];
}

std::string ModelParam::module() const {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

std::vector<ModelParam> ModelParams(const ModelConfig& c) {
  std::vector<ModelParam> out;
  auto inv_sqrt = [](int64_t n) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(n))); };
  // A Linear/Embedding/SwitchLinear/MultiLinear weight; fan_in is its last dim.
  auto linear = [&](std::string name, Shape shape, int64_t layer) {
    const float std = inv_sqrt(shape.back());
    out.push_back({std::move(name), std::move(shape), DType::kBF16, true, layer, 0.0f, std});
  };
  auto norm = [&](std::string name, int64_t dim, int64_t layer) {
    out.push_back({std::move(name), {dim}, DType::kBF16, false, layer, 1.0f, 0.02f});
  };
  auto small = [&](std::string name, Shape shape, DType dtype, int64_t layer) {
    out.push_back({std::move(name), std::move(shape), dtype, false, layer, 0.0f, 0.02f});
  };
  const int64_t h = c.hidden_size;

  // Embeddings at 1/sqrt(hidden), as in real checkpoints: tied heads then give logits of
  // order 1, and RMSNorm rescales the layer inputs anyway.
  out.push_back({"model.embed_tokens.weight", {c.vocab_size, h}, DType::kBF16, true, -1,
                 0.0f, inv_sqrt(h)});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    if (IsDeepseekFamily(c.model_type)) {
      const std::string a = p + "self_attn.";
      const int64_t heads = c.num_attention_heads;
      const int64_t q_head = c.qk_nope_head_dim + c.qk_rope_head_dim;
      if (c.q_lora_rank) {
        linear(a + "q_a_proj.weight", {*c.q_lora_rank, h}, i);
        if (c.attention_bias) small(a + "q_a_proj.bias", {*c.q_lora_rank}, DType::kBF16, i);
        norm(a + "q_a_layernorm.weight", *c.q_lora_rank, i);
        linear(a + "q_b_proj.weight", {heads * q_head, *c.q_lora_rank}, i);
      } else {
        linear(a + "q_proj.weight", {heads * q_head, h}, i);
      }
      linear(a + "kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, h}, i);
      if (c.attention_bias) {
        small(a + "kv_a_proj_with_mqa.bias", {c.kv_lora_rank + c.qk_rope_head_dim},
              DType::kBF16, i);
      }
      norm(a + "kv_a_layernorm.weight", c.kv_lora_rank, i);
      linear(a + "embed_q.weight", {heads, c.kv_lora_rank, c.qk_nope_head_dim}, i);
      linear(a + "unembed_out.weight", {heads, c.v_head_dim, c.kv_lora_rank}, i);
      linear(a + "o_proj.weight", {h, heads * c.v_head_dim}, i);
      if (c.attention_bias) small(a + "o_proj.bias", {h}, DType::kBF16, i);
      if (c.has_indexer_weights(i)) {
        const std::string x = a + "indexer.";
        linear(x + "wq_b.weight", {c.index_n_heads * c.index_head_dim, c.q_lora_rank.value_or(h)}, i);
        linear(x + "wk.weight", {c.index_head_dim, h}, i);
        norm(x + "k_norm.weight", c.index_head_dim, i);
        small(x + "k_norm.bias", {c.index_head_dim}, DType::kBF16, i);
        linear(x + "weights_proj.weight", {c.index_n_heads, h}, i);
      }
      const std::string m = p + "mlp.";
      if (c.is_moe_layer(i)) {
        const int64_t e = c.n_routed_experts, mi = c.moe_intermediate_size;
        linear(m + "switch_mlp.gate_proj.weight", {e, mi, h}, i);
        linear(m + "switch_mlp.up_proj.weight", {e, mi, h}, i);
        linear(m + "switch_mlp.down_proj.weight", {e, h, mi}, i);
        // MoEGate: a plain parameter, never quantized.
        out.push_back({m + "gate.weight", {e, h}, DType::kBF16, false, i, 0.0f, inv_sqrt(h)});
        small(m + "gate.e_score_correction_bias", {e}, DType::kF32, i);
        if (c.n_shared_experts > 0) {
          const int64_t si = mi * c.n_shared_experts;
          linear(m + "shared_experts.gate_proj.weight", {si, h}, i);
          linear(m + "shared_experts.up_proj.weight", {si, h}, i);
          linear(m + "shared_experts.down_proj.weight", {h, si}, i);
        }
      } else {
        linear(m + "gate_proj.weight", {c.intermediate_size, h}, i);
        linear(m + "up_proj.weight", {c.intermediate_size, h}, i);
        linear(m + "down_proj.weight", {h, c.intermediate_size}, i);
      }
    } else {
      const std::string a = p + "self_attn.";
      const int64_t hd = c.head_dim > 0 ? c.head_dim : h / c.num_attention_heads;
      linear(a + "q_proj.weight", {c.num_attention_heads * hd, h}, i);
      linear(a + "k_proj.weight", {c.num_key_value_heads * hd, h}, i);
      linear(a + "v_proj.weight", {c.num_key_value_heads * hd, h}, i);
      linear(a + "o_proj.weight", {h, c.num_attention_heads * hd}, i);
      norm(a + "q_norm.weight", hd, i);
      norm(a + "k_norm.weight", hd, i);
      const std::string m = p + "mlp.";
      if (c.is_moe_layer(i)) {
        const int64_t e = c.num_experts, mi = c.moe_intermediate_size;
        linear(m + "gate.weight", {e, h}, i);  // nn.Linear: quantizable (8-bit override)
        linear(m + "switch_mlp.gate_proj.weight", {e, mi, h}, i);
        linear(m + "switch_mlp.up_proj.weight", {e, mi, h}, i);
        linear(m + "switch_mlp.down_proj.weight", {e, h, mi}, i);
      } else {
        linear(m + "gate_proj.weight", {c.intermediate_size, h}, i);
        linear(m + "up_proj.weight", {c.intermediate_size, h}, i);
        linear(m + "down_proj.weight", {h, c.intermediate_size}, i);
      }
    }
    norm(p + "input_layernorm.weight", h, i);
    norm(p + "post_attention_layernorm.weight", h, i);
  }
  norm("model.norm.weight", h, -1);
  if (!c.tie_word_embeddings) linear("lm_head.weight", {c.vocab_size, h}, -1);
  return out;
}

std::vector<StoredTensor> StoredTensorsFor(const ModelParam& param, const QuantSpec& spec,
                                           DType scale_dtype) {
  if (spec.mode == QuantMode::kNone || !param.quantizable) {
    return {{param.name, param.dtype, param.shape}};
  }
  const std::string m = param.module();
  Shape w = param.shape, s = param.shape;
  w.back() = param.shape.back() * spec.bits / 32;
  s.back() = param.shape.back() / spec.group_size;
  const DType sd = spec.mode == QuantMode::kAffine ? scale_dtype : DType::kU8;
  std::vector<StoredTensor> t = {{m + ".weight", DType::kU32, w}, {m + ".scales", sd, s}};
  if (spec.mode == QuantMode::kAffine) t.push_back({m + ".biases", sd, s});
  return t;
}

std::vector<StoredTensor> SynthPlan::Tensors() const {
  std::vector<StoredTensor> all;
  for (const PlannedParam& p : params) all.insert(all.end(), p.tensors.begin(), p.tensors.end());
  std::sort(all.begin(), all.end(),
            [](const StoredTensor& a, const StoredTensor& b) { return a.name < b.name; });
  return all;
}

absl::StatusOr<QuantSpec> ParseSynthQuant(const std::string& mode, int bits, int group_size) {
  QuantSpec spec;
  if (mode == "bf16" || mode == "none") {
    if (bits > 0 || group_size > 0) {
      return absl::InvalidArgumentError("--bits/--group-size make no sense with --quant bf16");
    }
    return QuantSpec{};
  }
  std::string base = mode;
  int mode_bits = 0;
  if (absl::StartsWith(mode, "affine") && mode.size() > 6) {
    if (!absl::SimpleAtoi(mode.substr(6), &mode_bits)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown --quant '", mode, "'"));
    }
    base = "affine";
  }
  absl::StatusOr<QuantMode> m = ParseQuantMode(base);
  if (!m.ok() || *m == QuantMode::kNone) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown --quant '", mode,
                     "'; use mxfp4, mxfp8, nvfp4, affine, affine<bits> or bf16"));
  }
  spec = DefaultQuantSpec(*m);
  if (mode_bits > 0) spec.bits = mode_bits;
  if (bits > 0) {
    if (mode_bits > 0 && bits != mode_bits) {
      return absl::InvalidArgumentError(absl::StrCat("--quant ", mode, " contradicts --bits ", bits));
    }
    spec.bits = bits;
  }
  if (group_size > 0) spec.group_size = group_size;
  RING_RETURN_IF_ERROR(ValidateSynthQuant(spec));
  return spec;
}

absl::StatusOr<SynthPlan> PlanSynthCheckpoint(const SynthOptions& o) {
  const std::string arch = o.arch.empty() ? DefaultArchOf(o.preset) : o.arch;
  const std::vector<std::string> arches = SynthArchNames();
  if (std::find(arches.begin(), arches.end(), arch) == arches.end()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown --arch '", arch, "'; known: ",
                                                   absl::StrJoin(arches, ", ")));
  }
  RING_ASSIGN_OR_RETURN(Preset preset, MakePreset(o.preset, arch));
  ModelConfig& c = preset.config;
  if (o.layers) {
    if (*o.layers < 1 || *o.layers > 1000) {
      return absl::InvalidArgumentError(absl::StrCat("--layers must be in [1, 1000], got ", *o.layers));
    }
    c.num_hidden_layers = *o.layers;
  }
  if (o.index_topk) {
    if (!HasIndexerFamily(arch)) {
      return absl::InvalidArgumentError(absl::StrCat("--index-topk applies to glm_moe_dsa and ",
                                                     "deepseek_v32 only, not ", arch));
    }
    if (*o.index_topk < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--index-topk must be >= 1, got ", *o.index_topk));
    }
    c.index_topk = *o.index_topk;
  }
  if (HasIndexerFamily(arch)) {
    c.indexer_full = preset.extras.explicit_indexer_types
                         ? IndexerPattern(c.num_hidden_layers, c.index_topk_freq,
                                          c.index_skip_topk_offset)
                         : std::vector<bool>(c.num_hidden_layers, true);
  }

  SynthPlan plan;
  plan.tokenizer_style = IsQwenFamily(arch) ? TokenizerStyle::kQwen : TokenizerStyle::kGlm;
  const TokenizerFiles& tok = CachedTokenizer(plan.tokenizer_style);
  if (tok.vocab_size > c.vocab_size) {
    return absl::InternalError(absl::StrCat("tokenizer has ", tok.vocab_size,
                                            " ids, more than vocab_size ", c.vocab_size));
  }
  const TokenIds ids = IdsFor(tok, plan.tokenizer_style);
  c.eos_token_ids = ids.stop;

  // Quantization, as mlx_lm.utils.quantize_model decides it.
  const bool quantized = o.quant.mode != QuantMode::kNone;
  if (quantized) RING_RETURN_IF_ERROR(ValidateSynthQuant(o.quant));
  c.quantization = QuantizationConfig();
  c.quantization.present = quantized;
  if (quantized) c.quantization.default_spec = o.quant;
  const QuantSpec router_override{QuantMode::kAffine, 8, 64};
  for (const ModelParam& p : ModelParams(c)) {
    PlannedParam pp;
    pp.param = p;
    if (quantized && p.quantizable && p.shape.back() % o.quant.group_size == 0) {
      pp.quant = o.quant;
      if (arch == kQwen3Moe && absl::EndsWith(p.module(), "mlp.gate")) {
        pp.quant = router_override;
        c.quantization.overrides[p.module()] = router_override;
      }
    }
    pp.tensors = StoredTensorsFor(p, pp.quant, p.dtype);
    for (const StoredTensor& t : pp.tensors) plan.total_bytes += t.nbytes();
    plan.total_parameters += static_cast<uint64_t>(NumElements(p.shape));
    plan.params.push_back(std::move(pp));
  }
  plan.config = c;
  plan.config_json = ConfigJson(c, preset.extras, ids).dump(4);
  plan.generation_config_json = GenerationConfigJson(plan.tokenizer_style, ids, preset.extras).dump(2);
  return plan;
}

absl::Status SynthesizeCheckpoint(const SynthOptions& o) {
  RING_ASSIGN_OR_RETURN(SynthPlan plan, PlanSynthCheckpoint(o));
  RING_RETURN_IF_ERROR(PrepareOutDir(o.out_dir, o.overwrite));

  CheckpointWriter writer(o.out_dir, o.max_shard_bytes);
  SynthProgress progress;
  progress.params_total = static_cast<int64_t>(plan.params.size());
  progress.bytes_total = plan.total_bytes;
  for (const PlannedParam& pp : plan.params) {
    RING_RETURN_IF_ERROR(WriteParam(pp, o.seed, writer));
    progress.tensor = pp.param.name;
    ++progress.params_done;
    for (const StoredTensor& t : pp.tensors) progress.bytes_done += t.nbytes();
    if (o.progress) o.progress(progress);
  }
  RING_RETURN_IF_ERROR(writer.Finish(plan.total_parameters));

  // Tokenizer and metadata last: a directory with config.json is a complete checkpoint.
  TokenizerFiles tok = CachedTokenizer(plan.tokenizer_style);
  Json tok_cfg = Json::parse(tok.tokenizer_config_json);
  tok_cfg["model_max_length"] = plan.config.max_position_embeddings;
  const fs::path dir(o.out_dir);
  RING_RETURN_IF_ERROR(WriteTextFile(dir / "tokenizer.json", tok.tokenizer_json));
  RING_RETURN_IF_ERROR(WriteTextFile(dir / "tokenizer_config.json", tok_cfg.dump(2)));
  RING_RETURN_IF_ERROR(WriteTextFile(dir / "chat_template.jinja", tok.chat_template));
  RING_RETURN_IF_ERROR(WriteTextFile(dir / "generation_config.json", plan.generation_config_json));
  RING_RETURN_IF_ERROR(WriteTextFile(dir / "config.json", plan.config_json));
  return absl::OkStatus();
}

}  // namespace ring
