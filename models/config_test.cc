#include "models/config.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/temp_dir_for_test.h"

namespace ring {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// zai-org/GLM-5 config.json as given in shared spec §2, plus the block mlx_lm.convert
// writes for an mxfp4 conversion (and its quantization_config copy).
constexpr char kGlm5[] = R"({
  "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa",
  "vocab_size": 154880, "hidden_size": 6144, "num_hidden_layers": 78,
  "num_attention_heads": 64, "num_key_value_heads": 64,
  "q_lora_rank": 2048, "kv_lora_rank": 512, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64,
  "qk_head_dim": 256, "v_head_dim": 256, "head_dim": 64,
  "intermediate_size": 12288, "moe_intermediate_size": 2048,
  "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
  "n_group": 1, "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
  "norm_topk_prob": true, "routed_scaling_factor": 2.5,
  "first_k_dense_replace": 3, "moe_layer_freq": 1, "rms_norm_eps": 1e-05,
  "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},
  "rope_interleave": true, "indexer_rope_interleave": true,
  "index_n_heads": 32, "index_head_dim": 128, "index_topk": 2048,
  "max_position_embeddings": 202752, "num_nextn_predict_layers": 1,
  "attention_bias": false, "tie_word_embeddings": false,
  "eos_token_id": [154820, 154827, 154829], "pad_token_id": 154820, "dtype": "bfloat16",
  "quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4"},
  "quantization_config": {"group_size": 32, "bits": 4, "mode": "mxfp4"}
})";

// GLM-5.2 differs from GLM-5 in these fields (spec §2); @EXTRA@ takes the schedule fields.
std::string Glm52(const std::string& extra) {
  std::string text = absl::StrReplaceAll(
      kGlm5, {{R"("rope_theta": 1000000)", R"("rope_theta": 8000000)"},
              {R"("max_position_embeddings": 202752)", R"("max_position_embeddings": 1048576)"},
              {R"("head_dim": 64,)", R"("head_dim": 192, "moe_router_dtype": "float32",)"},
              {R"("topk_method": "noaux_tc", "scoring_func": "sigmoid",)", ""},
              {R"("moe_layer_freq": 1,)", ""},
              {R"("pad_token_id": 154820,)", "\"pad_token_id\": 154820, " + extra + ","}});
  return text;
}

std::vector<int64_t> FullLayers(const ModelConfig& c) {
  std::vector<int64_t> full;
  for (size_t i = 0; i < c.indexer_full.size(); ++i) {
    if (c.indexer_full[i]) full.push_back(static_cast<int64_t>(i));
  }
  return full;
}

// 0, 1, 2, 6, 10, ..., 74: the full layers of GLM-5.2 (spec §1.6).
std::vector<int64_t> Glm52FullLayers() {
  std::vector<int64_t> full = {0, 1, 2};
  for (int64_t i = 6; i <= 74; i += 4) full.push_back(i);
  return full;
}

std::string Glm52IndexerTypes() {
  const std::vector<int64_t> full = Glm52FullLayers();
  std::string list;
  for (int64_t i = 0; i < 78; ++i) {
    list += i ? ", " : "";
    list += std::find(full.begin(), full.end(), i) != full.end() ? "\"full\"" : "\"shared\"";
  }
  return "\"indexer_types\": [" + list + "]";
}

TEST(ModelConfigTest, Glm5) {
  auto c = ParseModelConfig(kGlm5, "glm5/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kGlmMoeDsa);
  EXPECT_STREQ(ModelFamilyName(c->family), "glm_moe_dsa");
  EXPECT_EQ(c->torch_dtype, "bfloat16");
  EXPECT_EQ(c->vocab_size, 154880);
  EXPECT_EQ(c->hidden_size, 6144);
  EXPECT_EQ(c->num_hidden_layers, 78);
  EXPECT_EQ(c->num_key_value_heads, 64);
  EXPECT_EQ(c->q_lora_rank, 2048);
  EXPECT_EQ(c->kv_lora_rank, 512);
  EXPECT_EQ(c->qk_nope_head_dim, 192);
  EXPECT_EQ(c->qk_rope_head_dim, 64);
  EXPECT_EQ(c->v_head_dim, 256);
  EXPECT_EQ(c->head_dim, 256) << "MLA ignores the config's head_dim";
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_EQ(c->rope.type, "default");
  EXPECT_DOUBLE_EQ(c->rope.theta, 1e6);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(154820, 154827, 154829));
  EXPECT_EQ(c->n_routed_experts, 256);
  EXPECT_EQ(c->n_shared_experts, 1);
  EXPECT_EQ(c->num_experts_per_tok, 8);
  EXPECT_DOUBLE_EQ(c->routed_scaling_factor, 2.5);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_TRUE(c->is_mla());
  EXPECT_TRUE(c->has_indexer());
  EXPECT_TRUE(c->indexer_rope_interleave);
  EXPECT_TRUE(c->rope_interleave);
  EXPECT_EQ(c->index_topk, 2048);
  EXPECT_EQ(c->indexer_full, std::vector<bool>(78, true)) << "GLM-5: every layer is full";
  EXPECT_FALSE(c->is_moe_layer(0));
  EXPECT_FALSE(c->is_moe_layer(2));
  EXPECT_TRUE(c->is_moe_layer(3));
  EXPECT_TRUE(c->is_moe_layer(77));
  EXPECT_FALSE(c->is_moe_layer(78));

  const QuantizationConfig& q = c->quantization;
  EXPECT_TRUE(q.present);
  const QuantSpec mxfp4{QuantMode::kMxfp4, 4, 32};
  EXPECT_EQ(q.default_spec, mxfp4);
  EXPECT_TRUE(q.overrides.empty());
  EXPECT_EQ(q.SpecFor("model.layers.3.mlp.switch_mlp.up_proj", true), mxfp4);
  // The router gate has no scales in the checkpoint: plain bf16.
  EXPECT_EQ(q.SpecFor("model.layers.3.mlp.gate", false).mode, QuantMode::kNone);
}

TEST(ModelConfigTest, Glm52IndexerTypesList) {
  auto c = ParseModelConfig(Glm52(Glm52IndexerTypes()), "glm52/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->rope.theta, 8e6);
  EXPECT_EQ(c->head_dim, 256);
  EXPECT_EQ(c->topk_method, "noaux_tc") << "engine default when the config omits it";
  EXPECT_EQ(c->scoring_func, "sigmoid");
  EXPECT_EQ(c->moe_layer_freq, 1);
  EXPECT_EQ(FullLayers(*c), Glm52FullLayers());
  EXPECT_EQ(FullLayers(*c).size(), 21u);
}

// Without indexer_types the schedule comes from HF's formula
// full iff max(i - index_skip_topk_offset + 1, 0) % index_topk_freq == 0.
TEST(ModelConfigTest, Glm52FreqAndOffsetOnly) {
  auto c = ParseModelConfig(Glm52(R"("index_topk_freq": 4, "index_skip_topk_offset": 3)"),
                            "glm52/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->index_topk_freq, 4);
  EXPECT_EQ(c->index_skip_topk_offset, 3);
  const std::vector<int64_t> full = FullLayers(*c);
  EXPECT_EQ(full, Glm52FullLayers());
  EXPECT_EQ(full.size(), 21u);
  EXPECT_EQ(78 - full.size(), 57u);
  // GLM-5.2's config also carries "index_topk_pattern": null, which must not count.
  auto with_null = ParseModelConfig(
      Glm52(R"("index_topk_freq": 4, "index_skip_topk_offset": 3, "index_topk_pattern": null)"),
      "glm52/config.json");
  ASSERT_TRUE(with_null.ok()) << with_null.status();
  EXPECT_EQ(FullLayers(*with_null), Glm52FullLayers());
}

TEST(ModelConfigTest, IndexTopkPattern) {
  std::string pattern(78, 'S');
  pattern[0] = pattern[5] = 'F';
  auto c = ParseModelConfig(Glm52("\"index_topk_pattern\": \"" + pattern + "\""), "p.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(FullLayers(*c), ElementsAre(0, 5));
}

TEST(ModelConfigTest, IndexerScheduleErrors) {
  const std::string types = Glm52IndexerTypes();
  const std::string short_list = absl::StrReplaceAll(types, {{"[\"full\", ", "["}});
  const std::string bad_value = absl::StrReplaceAll(types, {{"[\"full\"", "[\"half\""}});
  const std::string shared_first = absl::StrReplaceAll(types, {{"[\"full\"", "[\"shared\""}});
  for (const std::string& extra :
       {short_list, bad_value, std::string(R"("index_topk_pattern": "FSX")"),
        std::string(R"("index_topk_freq": 0)"), std::string(R"("indexer_types": "full")")}) {
    auto c = ParseModelConfig(Glm52(extra), "glm52/config.json");
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << extra;
    EXPECT_THAT(c.status().message(), HasSubstr("glm52/config.json")) << extra;
  }
  EXPECT_THAT(ParseModelConfig(Glm52(short_list), "c.json").status().message(),
              HasSubstr("indexer_types"));
  EXPECT_THAT(ParseModelConfig(Glm52(shared_first), "c.json").status().message(),
              HasSubstr("layer 0"));
}

constexpr char kDeepseekV3Lite[] = R"({
  "model_type": "deepseek_v3", "vocab_size": 129280, "hidden_size": 2048,
  "num_hidden_layers": 27, "intermediate_size": 10944, "moe_intermediate_size": 1408,
  "num_attention_heads": 16, "num_key_value_heads": 16,
  "q_lora_rank": null, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64, "v_head_dim": 128,
  "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
  "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5,
  "first_k_dense_replace": 1, "moe_layer_freq": 1, "rms_norm_eps": 1e-06,
  "rope_theta": 10000, "max_position_embeddings": 163840,
  "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                   "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
  "eos_token_id": 1, "torch_dtype": "bfloat16"
})";

TEST(ModelConfigTest, DeepseekV3YarnAndNoQLora) {
  auto c = ParseModelConfig(kDeepseekV3Lite, "dsv3.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kDeepseekV3);
  EXPECT_FALSE(c->q_lora_rank.has_value());
  EXPECT_TRUE(c->is_mla());
  EXPECT_FALSE(c->has_indexer());
  EXPECT_TRUE(c->indexer_full.empty());
  EXPECT_EQ(c->rope.type, "yarn");
  EXPECT_DOUBLE_EQ(c->rope.theta, 1e4);
  EXPECT_DOUBLE_EQ(c->rope.factor, 40);
  EXPECT_EQ(c->rope.original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(c->rope.beta_fast, 32);
  EXPECT_DOUBLE_EQ(c->rope.beta_slow, 1);
  EXPECT_DOUBLE_EQ(c->rope.mscale, 0.707);
  EXPECT_DOUBLE_EQ(c->rope.mscale_all_dim, 0.707);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(1));
  EXPECT_FALSE(c->is_moe_layer(0));
  EXPECT_TRUE(c->is_moe_layer(1));
  EXPECT_TRUE(c->is_moe_layer(26));
  EXPECT_FALSE(c->quantization.present);
  EXPECT_EQ(c->quantization.SpecFor("model.layers.1.mlp.gate", true).mode, QuantMode::kNone);

  // "rope_type": "deepseek_yarn" is the same rope; moe_layer_freq 2 skips odd layers.
  auto v2 = ParseModelConfig(
      absl::StrReplaceAll(kDeepseekV3Lite,
                          {{R"("type": "yarn")", R"("rope_type": "deepseek_yarn")"},
                           {R"("moe_layer_freq": 1)", R"("moe_layer_freq": 2)"}}),
      "dsv3.json");
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(v2->rope.type, "yarn");
  EXPECT_FALSE(v2->is_moe_layer(1));
  EXPECT_TRUE(v2->is_moe_layer(2));
}

TEST(ModelConfigTest, DeepseekV32IndexerDefaults) {
  const std::string text = absl::StrReplaceAll(
      kDeepseekV3Lite, {{R"("model_type": "deepseek_v3")", R"("model_type": "deepseek_v32")"},
                        {R"("q_lora_rank": null)", R"("q_lora_rank": 1536, "index_n_heads": 64,
                           "index_head_dim": 128, "index_topk": 2048)"}});
  auto c = ParseModelConfig(text, "dsv32.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->has_indexer());
  EXPECT_FALSE(c->indexer_rope_interleave) << "deepseek_v32 defaults to half-split";
  EXPECT_EQ(c->indexer_full, std::vector<bool>(27, true));
}

constexpr char kQwen3[] = R"({
  "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024,
  "num_hidden_layers": 28, "intermediate_size": 3072, "num_attention_heads": 16,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000, "max_position_embeddings": 40960,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "eos_token_id": 151645,
  "quantization": {"group_size": 64, "bits": 4}
})";

TEST(ModelConfigTest, Qwen3Defaults) {
  auto c = ParseModelConfig(kQwen3, "qwen3.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kQwen3);
  EXPECT_EQ(c->head_dim, 64) << "hidden / heads";
  EXPECT_EQ(c->num_key_value_heads, 16) << "defaults to num_attention_heads";
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->rope_interleave);
  EXPECT_FALSE(c->is_mla());
  EXPECT_FALSE(c->is_moe_layer(0));
  EXPECT_DOUBLE_EQ(c->rope.theta, 1e6);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(151645));
  const QuantSpec affine{QuantMode::kAffine, 4, 64};
  EXPECT_EQ(c->quantization.default_spec, affine) << "no mode means affine";
  EXPECT_EQ(c->quantization.SpecFor("model.layers.0.self_attn.q_proj", true), affine);

  auto explicit_dims = ParseModelConfig(
      absl::StrReplaceAll(
          kQwen3, {{R"("num_attention_heads": 16,)",
                    R"("num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,)"}}),
      "qwen3.json");
  ASSERT_TRUE(explicit_dims.ok()) << explicit_dims.status();
  EXPECT_EQ(explicit_dims->head_dim, 128);
  EXPECT_EQ(explicit_dims->num_key_value_heads, 8);
}

constexpr char kQwen3Moe[] = R"({
  "model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048,
  "num_hidden_layers": 48, "intermediate_size": 6144, "moe_intermediate_size": 768,
  "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
  "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
  "mlp_only_layers": [1], "norm_topk_prob": true, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000, "rope_scaling": {"rope_type": "llama3", "factor": 8},
  "max_position_embeddings": 40960, "tie_word_embeddings": false,
  "dtype": "bfloat16", "eos_token_id": [151645, 151643],
  "quantization": {"group_size": 64, "bits": 4, "mode": "affine",
                   "model.layers.0.mlp.gate": {"group_size": 64, "bits": 8},
                   "model.layers.2.mlp.gate": false,
                   "model.layers.3.mlp.gate": {"mode": "mxfp8"}}
})";

TEST(ModelConfigTest, Qwen3MoeOverrides) {
  auto c = ParseModelConfig(kQwen3Moe, "qwen3moe.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kQwen3Moe);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->num_experts, 128);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_EQ(c->rope.type, "default") << "mlx-lm's qwen3_moe ignores rope_scaling";
  EXPECT_TRUE(c->is_moe_layer(0));
  EXPECT_FALSE(c->is_moe_layer(1)) << "in mlp_only_layers";
  EXPECT_TRUE(c->is_moe_layer(47));

  const QuantizationConfig& q = c->quantization;
  ASSERT_EQ(q.overrides.size(), 3u);
  const QuantSpec int8{QuantMode::kAffine, 8, 64};
  EXPECT_EQ(q.SpecFor("model.layers.0.mlp.gate", false), int8) << "an override needs no scales";
  EXPECT_EQ(q.SpecFor("model.layers.2.mlp.gate", true).mode, QuantMode::kNone) << "false wins";
  EXPECT_EQ(q.SpecFor("model.layers.3.mlp.gate", true), (QuantSpec{QuantMode::kMxfp8, 8, 32}));
  EXPECT_EQ(q.SpecFor("model.layers.0.mlp.switch_mlp.up_proj", true),
            (QuantSpec{QuantMode::kAffine, 4, 64}));
  EXPECT_EQ(q.SpecFor("model.layers.0.input_layernorm", false).mode, QuantMode::kNone);

  auto decoder_step = ParseModelConfig(
      absl::StrReplaceAll(kQwen3Moe,
                          {{R"("decoder_sparse_step": 1)", R"("decoder_sparse_step": 2)"}}),
      "qwen3moe.json");
  ASSERT_TRUE(decoder_step.ok());
  EXPECT_FALSE(decoder_step->is_moe_layer(0));
  EXPECT_TRUE(decoder_step->is_moe_layer(3));
}

TEST(ModelConfigTest, QuantizationVariants) {
  auto only_config = ParseModelConfig(
      absl::StrReplaceAll(kQwen3, {{R"("quantization")", R"("quantization_config")"}}), "q.json");
  ASSERT_TRUE(only_config.ok()) << only_config.status();
  EXPECT_EQ(only_config->quantization.default_spec, (QuantSpec{QuantMode::kAffine, 4, 64}));

  auto legacy = ParseModelConfig(
      absl::StrReplaceAll(kQwen3, {{R"("quantization": {"group_size": 64, "bits": 4})",
                                    R"("quantization_config": {"quant_method": "mxfp4"})"}}),
      "q.json");
  ASSERT_TRUE(legacy.ok()) << legacy.status();
  EXPECT_TRUE(legacy->quantization.present);
  EXPECT_EQ(legacy->quantization.default_spec, (QuantSpec{QuantMode::kMxfp4, 4, 32}));

  auto nvfp4 = ParseModelConfig(
      absl::StrReplaceAll(kQwen3, {{R"({"group_size": 64, "bits": 4})", R"({"mode": "nvfp4"})"}}),
      "q.json");
  ASSERT_TRUE(nvfp4.ok()) << nvfp4.status();
  EXPECT_EQ(nvfp4->quantization.default_spec, (QuantSpec{QuantMode::kNvfp4, 4, 16}));
}

struct BadConfig {
  std::string text;
  absl::StatusCode code;
  std::vector<std::string> mentions;
};

TEST(ModelConfigTest, ErrorsNameFieldAndFile) {
  auto qwen = [](std::vector<std::pair<std::string, std::string>> edits) {
    std::string t = kQwen3;
    for (const auto& [from, to] : edits) t = absl::StrReplaceAll(t, {{from, to}});
    return t;
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  const auto kUnimplemented = absl::StatusCode::kUnimplemented;
  const std::vector<BadConfig> cases = {
      {"{not json", kInvalid, {"JSON"}},
      {"[1]", kInvalid, {"JSON object"}},
      {qwen({{R"("model_type": "qwen3")", R"("model_type": "llama")"}}), kUnimplemented, {"llama"}},
      {qwen({{R"("model_type": "qwen3",)", ""}}), kInvalid, {"model_type", "required"}},
      {qwen({{R"("hidden_size": 1024,)", ""}}), kInvalid, {"hidden_size", "required"}},
      {qwen({{R"("hidden_size": 1024)", R"("hidden_size": "1024")"}}),
       kInvalid,
       {"hidden_size", "integer"}},
      {qwen({{R"("hidden_size": 1024)", R"("hidden_size": 1024.5)"}}),
       kInvalid,
       {"hidden_size", "integer"}},
      {qwen({{R"("vocab_size": 151936)", R"("vocab_size": -1)"}}),
       kInvalid,
       {"vocab_size", "positive"}},
      {qwen({{R"("hidden_size": 1024)", R"("hidden_size": 1000)"}}),
       kInvalid,
       {"hidden_size", "divisible"}},
      {qwen({{R"("num_attention_heads": 16,)",
              R"("num_attention_heads": 16, "num_key_value_heads": 5,)"}}),
       kInvalid,
       {"num_key_value_heads"}},
      {qwen({{R"("tie_word_embeddings": true)", R"("tie_word_embeddings": "yes")"}}),
       kInvalid,
       {"tie_word_embeddings"}},
      {qwen({{R"("rope_theta": 1000000,)", ""}}), kInvalid, {"rope_theta"}},
      {qwen({{R"("rope_theta": 1000000,)",
              R"("rope_theta": 1e6, "rope_scaling": {"type": "longrope"},)"}}),
       kUnimplemented,
       {"longrope"}},
      {qwen({{R"("rope_theta": 1000000,)",
              R"("rope_theta": 1e6, "rope_scaling": {"type": "yarn"},)"}}),
       kInvalid,
       {"rope_scaling.factor"}},
      {qwen({{R"("eos_token_id": 151645)", R"("eos_token_id": "eos")"}}),
       kInvalid,
       {"eos_token_id"}},
      {qwen({{R"("torch_dtype": "bfloat16")", R"("torch_dtype": "int4")"}}),
       kInvalid,
       {"torch_dtype"}},
      {qwen({{R"("bits": 4)", R"("bits": 7)"}}), kInvalid, {"quantization", "bits 7"}},
      {qwen({{R"("bits": 4)", R"("bits": 4, "mode": "int4")"}}), kInvalid, {"quantization.mode"}},
      {qwen({{R"("bits": 4)", R"("bits": 4, "lm_head": {"bits": "8"})"}}),
       kInvalid,
       {"quantization.lm_head.bits"}},
      {qwen({{R"("quantization": {"group_size": 64, "bits": 4})",
              R"("quantization_config": {"quant_method": "fp8"})"}}),
       kUnimplemented,
       {"fp8"}},
      {qwen({{R"("quantization": {"group_size": 64, "bits": 4})", R"("quantization": 4)"}}),
       kInvalid,
       {"quantization"}},
      {absl::StrReplaceAll(kDeepseekV3Lite, {{R"("kv_lora_rank": 512,)", ""}}),
       kInvalid,
       {"kv_lora_rank"}},
      {absl::StrReplaceAll(kDeepseekV3Lite, {{R"("q_lora_rank": null,)", ""}}),
       kInvalid,
       {"q_lora_rank"}},
      {absl::StrReplaceAll(kDeepseekV3Lite,
                           {{R"("num_experts_per_tok": 6)", R"("num_experts_per_tok": 65)"}}),
       kInvalid,
       {"num_experts_per_tok"}},
      {absl::StrReplaceAll(kDeepseekV3Lite,
                           {{R"("n_group": 8)", R"("topk_method": "greedy", "n_group": 8)"}}),
       kUnimplemented,
       {"greedy"}},
      {absl::StrReplaceAll(kGlm5, {{R"("index_topk": 2048,)", ""}}), kInvalid, {"index_topk"}},
      {absl::StrReplaceAll(
           kGlm5, {{R"("rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},)", ""}}),
       kInvalid,
       {"rope_theta"}},
      {absl::StrReplaceAll(kQwen3Moe,
                           {{R"("mlp_only_layers": [1])", R"("mlp_only_layers": [48])"}}),
       kInvalid,
       {"mlp_only_layers"}},
      {absl::StrReplaceAll(kQwen3Moe, {{R"("num_experts": 128,)", ""}}), kInvalid, {"num_experts"}},
  };
  for (const BadConfig& bad : cases) {
    auto c = ParseModelConfig(bad.text, "models/x/config.json");
    ASSERT_FALSE(c.ok()) << bad.text;
    EXPECT_EQ(c.status().code(), bad.code) << c.status();
    EXPECT_THAT(c.status().message(), HasSubstr("models/x/config.json")) << c.status();
    for (const std::string& m : bad.mentions) {
      EXPECT_THAT(c.status().message(), HasSubstr(m)) << bad.text;
    }
  }
}

class LoadModelConfigTest : public TempDirTest {
 protected:
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
};

TEST_F(LoadModelConfigTest, MergesGenerationConfigEos) {
  Write("config.json", kQwen3);
  auto plain = LoadModelConfig(dir_.string());
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_THAT(plain->eos_token_ids, ElementsAre(151645));

  Write("generation_config.json", R"({"eos_token_id": [151645, 151643], "top_p": 0.8})");
  auto merged = LoadModelConfig(dir_.string());
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_THAT(merged->eos_token_ids, ElementsAre(151645, 151643));

  Write("generation_config.json", R"({"eos_token_id": [151645,)");
  auto bad = LoadModelConfig(dir_.string());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("generation_config.json"));
}

TEST_F(LoadModelConfigTest, ErrorsNameTheFile) {
  EXPECT_EQ(LoadModelConfig(dir_.string()).status().code(), absl::StatusCode::kNotFound);
  Write("config.json", R"({"model_type": "qwen3"})");
  auto c = LoadModelConfig(dir_.string());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(),
              AllOf(HasSubstr((dir_ / "config.json").string()), HasSubstr("vocab_size")));
}

}  // namespace
}  // namespace ring
