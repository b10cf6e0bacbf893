// Tests for models/synth (random mlx-layout checkpoints), models/bpe_builder and
// models/inspect.
#include "models/synth.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/quant.h"
#include "models/bpe_builder.h"
#include "models/config.h"
#include "models/inspect.h"
#include "models/safetensors.h"
#include "nlohmann/json.hpp"

namespace ring {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

std::string TempDir(const std::string& name) {
  const fs::path p = fs::path(::testing::TempDir()) / ("synth_test_" + name);
  fs::remove_all(p);
  return p.string();
}

std::string ReadAll(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void WriteAll(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << s;
}

std::map<std::string, std::string> DirContents(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    out[e.path().filename().string()] = ReadAll(e.path());
  }
  return out;
}

SynthOptions Tiny(const std::string& arch, QuantSpec quant, const std::string& out) {
  SynthOptions o;
  o.arch = arch;
  o.preset = "tiny";
  o.quant = quant;
  o.seed = 1;
  o.out_dir = out;
  return o;
}

const QuantSpec kMxfp4{QuantMode::kMxfp4, 4, 32};
const QuantSpec kAffine4{QuantMode::kAffine, 4, 64};
const QuantSpec kBf16{};

// --- generator ----------------------------------------------------------------------------

TEST(SynthNormalTest, MomentsAndDeterminism) {
  const uint64_t key = SynthTensorKey(42, "model.layers.0.mlp.up_proj.weight");
  double sum = 0, sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double z = SynthNormal(key, i);
    sum += z;
    sq += z * z;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sq / n, 1.0, 0.02);
  EXPECT_EQ(SynthNormal(key, 12345), SynthNormal(key, 12345));
  EXPECT_NE(SynthTensorKey(42, "a"), SynthTensorKey(43, "a"));
  EXPECT_NE(SynthTensorKey(42, "a"), SynthTensorKey(42, "b"));
}

// --- tokenizer ----------------------------------------------------------------------------

TEST(BpeBuilderTest, PreTokenizeFollowsTheRegex) {
  using V = std::vector<std::string>;
  EXPECT_EQ(PreTokenize("Hello world 12345", TokenizerStyle::kGlm),
            (V{"Hello", " world", " ", "123", "45"}));
  EXPECT_EQ(PreTokenize("Hello world 12345", TokenizerStyle::kQwen),
            (V{"Hello", " world", " ", "1", "2", "3", "4", "5"}));
  EXPECT_EQ(PreTokenize("don't  stop!!\n\nok", TokenizerStyle::kGlm),
            (V{"don", "'t", " ", " stop", "!!\n\n", "ok"}));
  EXPECT_EQ(PreTokenize("a  \n b", TokenizerStyle::kGlm), (V{"a", "  \n", " b"}));
  EXPECT_EQ(PreTokenize("你好，世界", TokenizerStyle::kGlm), (V{"你好", "，世界"}));
  EXPECT_EQ(PreTokenize("x   ", TokenizerStyle::kGlm), (V{"x", "   "}));
}

TEST(BpeBuilderTest, TrainingIsDeterministicAndConsistent) {
  const BpeModel a = TrainByteLevelBpe(BpeTrainingSample(), 400, TokenizerStyle::kGlm);
  const BpeModel b = TrainByteLevelBpe(BpeTrainingSample(), 400, TokenizerStyle::kGlm);
  EXPECT_EQ(a.vocab, b.vocab);
  EXPECT_EQ(a.merges, b.merges);
  EXPECT_GE(a.merges.size(), 300u);
  EXPECT_EQ(a.vocab[0], "!");
  EXPECT_EQ(ByteToUnicode(' '), "\xc4\xa0");  // "Ġ"
  std::set<std::string> vocab(a.vocab.begin(), a.vocab.end());
  EXPECT_EQ(vocab.size(), a.vocab.size());
  for (const auto& [l, r] : a.merges) {  // HF BPE requires both parts and the result
    EXPECT_TRUE(vocab.count(l) && vocab.count(r) && vocab.count(l + r)) << l << " " << r;
  }
}

TEST(BpeBuilderTest, TokenizerFilesHaveTheRightSpecialTokens) {
  for (TokenizerStyle style : {TokenizerStyle::kGlm, TokenizerStyle::kQwen}) {
    const TokenizerFiles t = BuildTokenizerFiles(style, 4096);
    EXPECT_LE(t.vocab_size, 1024);
    Json tj = Json::parse(t.tokenizer_json);
    EXPECT_EQ(tj["model"]["type"], "BPE");
    EXPECT_EQ(tj["model"]["vocab"].size(), static_cast<size_t>(t.bpe_vocab_size));
    EXPECT_EQ(tj["pre_tokenizer"]["pretokenizers"][0]["behavior"], "Isolated");
    EXPECT_EQ(tj["decoder"]["type"], "ByteLevel");
    EXPECT_EQ(tj["added_tokens"].size(), t.added_tokens.size());
    for (size_t i = 0; i < t.added_tokens.size(); ++i) {
      EXPECT_EQ(t.added_tokens[i].id, t.bpe_vocab_size + static_cast<int64_t>(i));
    }
    if (style == TokenizerStyle::kGlm) {
      EXPECT_TRUE(tj["normalizer"].is_null());
      for (const char* s : {"[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
                            "<|assistant|>", "<|observation|>", "<think>", "</think>",
                            "<tool_call>", "</tool_call>", "<tool_response>",
                            "</tool_response>", "<|endoftext|>"}) {
        EXPECT_GE(t.TokenId(s), 0) << s;
      }
      EXPECT_NE(t.chat_template.find("[gMASK]<sop>"), std::string::npos);
    } else {
      EXPECT_EQ(tj["normalizer"]["type"], "NFC");
      for (const char* s : {"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>",
                            "</think>", "<tool_call>", "</tool_call>"}) {
        EXPECT_GE(t.TokenId(s), 0) << s;
      }
      EXPECT_NE(t.chat_template.find("<|im_start|>"), std::string::npos);
    }
  }
}

// --- plan ---------------------------------------------------------------------------------

std::map<std::string, StoredTensor> ByName(const std::vector<StoredTensor>& ts) {
  std::map<std::string, StoredTensor> m;
  for (const StoredTensor& t : ts) m.emplace(t.name, t);
  return m;
}

TEST(SynthPlanTest, Glm52FourLayersMatchesTheSpecTable) {
  SynthOptions o;
  o.preset = "glm-5.2";
  o.layers = 4;
  o.quant = kMxfp4;
  absl::StatusOr<SynthPlan> plan = PlanSynthCheckpoint(o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const auto t = ByName(plan->Tensors());
  auto expect = [&](const std::string& name, DType dtype, Shape shape) {
    auto it = t.find(name);
    ASSERT_NE(it, t.end()) << name;
    EXPECT_EQ(it->second.dtype, dtype) << name;
    EXPECT_EQ(it->second.shape, shape) << name;
  };
  expect("model.embed_tokens.weight", DType::kU32, {154880, 768});
  expect("model.embed_tokens.scales", DType::kU8, {154880, 192});
  const std::string l0 = "model.layers.0.", l3 = "model.layers.3.";
  expect(l0 + "input_layernorm.weight", DType::kBF16, {6144});
  expect(l0 + "post_attention_layernorm.weight", DType::kBF16, {6144});
  expect(l0 + "self_attn.q_a_proj.weight", DType::kU32, {2048, 768});
  expect(l0 + "self_attn.q_a_proj.scales", DType::kU8, {2048, 192});
  expect(l0 + "self_attn.q_a_layernorm.weight", DType::kBF16, {2048});
  expect(l0 + "self_attn.q_b_proj.weight", DType::kU32, {16384, 256});
  expect(l0 + "self_attn.q_b_proj.scales", DType::kU8, {16384, 64});
  expect(l0 + "self_attn.kv_a_proj_with_mqa.weight", DType::kU32, {576, 768});
  expect(l0 + "self_attn.kv_a_proj_with_mqa.scales", DType::kU8, {576, 192});
  expect(l0 + "self_attn.kv_a_layernorm.weight", DType::kBF16, {512});
  expect(l0 + "self_attn.embed_q.weight", DType::kU32, {64, 512, 24});
  expect(l0 + "self_attn.embed_q.scales", DType::kU8, {64, 512, 6});
  expect(l0 + "self_attn.unembed_out.weight", DType::kU32, {64, 256, 64});
  expect(l0 + "self_attn.unembed_out.scales", DType::kU8, {64, 256, 16});
  expect(l0 + "self_attn.o_proj.weight", DType::kU32, {6144, 2048});
  expect(l0 + "self_attn.o_proj.scales", DType::kU8, {6144, 512});
  expect(l0 + "self_attn.indexer.wq_b.weight", DType::kU32, {4096, 256});
  expect(l0 + "self_attn.indexer.wq_b.scales", DType::kU8, {4096, 64});
  expect(l0 + "self_attn.indexer.wk.weight", DType::kU32, {128, 768});
  expect(l0 + "self_attn.indexer.k_norm.weight", DType::kBF16, {128});
  expect(l0 + "self_attn.indexer.k_norm.bias", DType::kBF16, {128});
  expect(l0 + "self_attn.indexer.weights_proj.weight", DType::kU32, {32, 768});
  expect(l0 + "self_attn.indexer.weights_proj.scales", DType::kU8, {32, 192});
  expect(l0 + "mlp.gate_proj.weight", DType::kU32, {12288, 768});
  expect(l0 + "mlp.up_proj.weight", DType::kU32, {12288, 768});
  expect(l0 + "mlp.down_proj.weight", DType::kU32, {6144, 1536});
  expect(l3 + "mlp.gate.weight", DType::kBF16, {256, 6144});
  expect(l3 + "mlp.gate.e_score_correction_bias", DType::kF32, {256});
  expect(l3 + "mlp.switch_mlp.gate_proj.weight", DType::kU32, {256, 2048, 768});
  expect(l3 + "mlp.switch_mlp.gate_proj.scales", DType::kU8, {256, 2048, 192});
  expect(l3 + "mlp.switch_mlp.up_proj.weight", DType::kU32, {256, 2048, 768});
  expect(l3 + "mlp.switch_mlp.down_proj.weight", DType::kU32, {256, 6144, 256});
  expect(l3 + "mlp.switch_mlp.down_proj.scales", DType::kU8, {256, 6144, 64});
  expect(l3 + "mlp.shared_experts.gate_proj.weight", DType::kU32, {2048, 768});
  expect(l3 + "mlp.shared_experts.down_proj.weight", DType::kU32, {6144, 256});
  expect("model.norm.weight", DType::kBF16, {6144});
  expect("lm_head.weight", DType::kU32, {154880, 768});
  expect("lm_head.scales", DType::kU8, {154880, 192});

  // Layer 3 is an IndexShare "shared" layer: no indexer tensors, no gate quantization,
  // no kv_b_proj anywhere, nothing past layer 3, no biases in an fp mode.
  for (const auto& [name, tensor] : t) {
    EXPECT_FALSE(absl::StartsWith(name, l3 + "self_attn.indexer.")) << name;
    EXPECT_EQ(name.find("kv_b_proj"), std::string::npos) << name;
    EXPECT_FALSE(absl::StartsWith(name, "model.layers.4.")) << name;
    EXPECT_FALSE(absl::EndsWith(name, ".biases")) << name;
  }
  EXPECT_FALSE(t.count(l3 + "mlp.gate.scales"));
  EXPECT_FALSE(t.count(l0 + "mlp.switch_mlp.gate_proj.weight"));
  EXPECT_EQ(plan->config.indexer_full, (std::vector<bool>{true, true, true, false}));

  Json cfg = Json::parse(plan->config_json);
  EXPECT_EQ(cfg["model_type"], "glm_moe_dsa");
  EXPECT_EQ(cfg["num_hidden_layers"], 4);
  EXPECT_EQ(cfg["rope_parameters"]["rope_theta"], 8000000.0);
  EXPECT_EQ(cfg["index_topk"], 2048);
  EXPECT_EQ(cfg["indexer_types"], Json({"full", "full", "full", "shared"}));
  EXPECT_EQ(cfg["quantization"], Json({{"group_size", 32}, {"bits", 4}, {"mode", "mxfp4"}}));
  EXPECT_EQ(cfg["quantization_config"], cfg["quantization"]);
  for (const char* k : {"first_k_dense_replace", "n_routed_experts", "n_shared_experts",
                        "num_experts_per_tok", "routed_scaling_factor", "topk_method",
                        "scoring_func", "moe_layer_freq", "n_group", "topk_group",
                        "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                        "v_head_dim", "index_n_heads", "index_head_dim", "eos_token_id",
                        "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings"}) {
    EXPECT_TRUE(cfg.contains(k)) << k;
  }
  // About 12.5e9 logical parameters, ~6.5 GiB of mxfp4 (4.25 bits per weight).
  EXPECT_GT(plan->total_parameters, 12'000'000'000ull);
  EXPECT_LT(plan->total_parameters, 13'000'000'000ull);
  EXPECT_NEAR(static_cast<double>(plan->total_bytes) * 8 / plan->total_parameters, 4.25, 0.05);

  // The config we write parses back to the same structure.
  absl::StatusOr<ModelConfig> parsed = ParseModelConfig(plan->config_json, "synth");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->family, ModelFamily::kGlmMoeDsa);
  EXPECT_EQ(parsed->num_hidden_layers, 4);
  EXPECT_EQ(parsed->indexer_full, plan->config.indexer_full);
  EXPECT_EQ(parsed->index_topk, 2048);
  EXPECT_EQ(parsed->quantization.default_spec, kMxfp4);
  EXPECT_DOUBLE_EQ(parsed->rope.theta, 8e6);
}

TEST(SynthPlanTest, Glm52FullDepthHas21FullIndexerLayers) {
  SynthOptions o;
  o.preset = "glm-5.2";
  absl::StatusOr<SynthPlan> plan = PlanSynthCheckpoint(o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  int full = 0;
  for (bool f : plan->config.indexer_full) full += f;
  EXPECT_EQ(plan->config.num_hidden_layers, 78);
  EXPECT_EQ(full, 21);
  int wq_b = 0;
  for (const StoredTensor& t : plan->Tensors()) {
    wq_b += absl::EndsWith(t.name, "indexer.wq_b.weight");
  }
  EXPECT_EQ(wq_b, 21);
  for (int i : {0, 1, 2, 6, 10, 74}) EXPECT_TRUE(plan->config.indexer_full[i]) << i;
  for (int i : {3, 4, 5, 7, 75, 77}) EXPECT_FALSE(plan->config.indexer_full[i]) << i;
}

TEST(SynthPlanTest, QwenPresetsHaveRealShapes) {
  SynthOptions o;
  o.preset = "qwen3-0.6b";
  o.quant = kAffine4;
  absl::StatusOr<SynthPlan> plan = PlanSynthCheckpoint(o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto t = ByName(plan->Tensors());
  EXPECT_FALSE(t.count("lm_head.weight"));  // tied
  EXPECT_EQ(t.at("model.embed_tokens.weight").shape, (Shape{151936, 128}));
  EXPECT_EQ(t.at("model.embed_tokens.biases").dtype, DType::kBF16);
  EXPECT_EQ(t.at("model.layers.27.self_attn.q_proj.weight").shape, (Shape{2048, 128}));
  EXPECT_EQ(t.at("model.layers.27.self_attn.k_proj.scales").shape, (Shape{1024, 16}));
  EXPECT_EQ(t.at("model.layers.0.self_attn.q_norm.weight").shape, (Shape{128}));
  EXPECT_EQ(t.at("model.layers.0.mlp.down_proj.weight").shape, (Shape{1024, 384}));

  o.preset = "qwen3-30b-a3b";
  plan = PlanSynthCheckpoint(o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  t = ByName(plan->Tensors());
  EXPECT_EQ(t.at("lm_head.weight").shape, (Shape{151936, 256}));
  // Router: affine 8-bit, group 64, recorded as a per-module override.
  EXPECT_EQ(t.at("model.layers.47.mlp.gate.weight").shape, (Shape{128, 512}));
  EXPECT_EQ(t.at("model.layers.47.mlp.gate.scales").shape, (Shape{128, 32}));
  EXPECT_EQ(t.at("model.layers.47.mlp.switch_mlp.down_proj.weight").shape,
            (Shape{128, 2048, 96}));
  Json cfg = Json::parse(plan->config_json);
  EXPECT_EQ(cfg["quantization"]["model.layers.0.mlp.gate"],
            Json({{"group_size", 64}, {"bits", 8}}));
  EXPECT_EQ(cfg["quantization"]["mode"], "affine");
  EXPECT_EQ(cfg["num_experts"], 128);
}

TEST(SynthPlanTest, GroupSizeThatDoesNotDivideLeavesModuleUnquantized) {
  // mlx-lm quantizes a module only if weight.shape[-1] % group_size == 0.
  SynthOptions o;
  o.preset = "qwen3-0.6b";
  o.quant = QuantSpec{QuantMode::kAffine, 4, 128};
  o.layers = 1;
  absl::StatusOr<SynthPlan> plan = PlanSynthCheckpoint(o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // All of Qwen3-0.6B's input dims (1024, 2048, 3072) divide 128: everything quantized.
  for (const PlannedParam& p : plan->params) {
    EXPECT_EQ(p.quant.mode == QuantMode::kNone, !p.param.quantizable) << p.param.name;
  }
  ModelParam odd{"x.weight", {8, 96}, DType::kBF16, true, -1, 0, 1};
  EXPECT_EQ(StoredTensorsFor(odd, QuantSpec{}).size(), 1u);
}

TEST(SynthPlanTest, RejectsBadOptions) {
  SynthOptions o;
  o.preset = "nope";
  EXPECT_EQ(PlanSynthCheckpoint(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.preset = "glm-5.2";
  o.arch = "qwen3";
  EXPECT_EQ(PlanSynthCheckpoint(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.preset = "tiny";
  o.arch = "llama";
  EXPECT_EQ(PlanSynthCheckpoint(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.arch = "qwen3";
  o.index_topk = 64;
  EXPECT_EQ(PlanSynthCheckpoint(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.index_topk.reset();
  o.layers = 0;
  EXPECT_EQ(PlanSynthCheckpoint(o).status().code(), absl::StatusCode::kInvalidArgument);

  EXPECT_FALSE(ParseSynthQuant("mxfp4", 0, 64).ok());
  EXPECT_FALSE(ParseSynthQuant("affine", 7, 0).ok());
  EXPECT_FALSE(ParseSynthQuant("affine", 1, 0).ok());
  EXPECT_FALSE(ParseSynthQuant("affine", 4, 16).ok());
  EXPECT_FALSE(ParseSynthQuant("int4", 0, 0).ok());
  EXPECT_FALSE(ParseSynthQuant("bf16", 4, 0).ok());
  EXPECT_EQ(*ParseSynthQuant("affine8", 0, 128), (QuantSpec{QuantMode::kAffine, 8, 128}));
  EXPECT_EQ(*ParseSynthQuant("affine", 0, 0), (QuantSpec{QuantMode::kAffine, 4, 64}));
  EXPECT_EQ(*ParseSynthQuant("nvfp4", 0, 0), (QuantSpec{QuantMode::kNvfp4, 4, 16}));
  EXPECT_EQ(*ParseSynthQuant("mxfp8", 0, 0), (QuantSpec{QuantMode::kMxfp8, 8, 32}));
  EXPECT_EQ(ParseSynthQuant("bf16", 0, 0)->mode, QuantMode::kNone);
}

// --- written checkpoints ------------------------------------------------------------------

TEST(SynthWriteTest, SameSeedSameBytes) {
  const std::string a = TempDir("det_a"), b = TempDir("det_b"), c = TempDir("det_c");
  ASSERT_TRUE(SynthesizeCheckpoint(Tiny("glm_moe_dsa", kMxfp4, a)).ok());
  ASSERT_TRUE(SynthesizeCheckpoint(Tiny("glm_moe_dsa", kMxfp4, b)).ok());
  SynthOptions oc = Tiny("glm_moe_dsa", kMxfp4, c);
  oc.seed = 2;
  ASSERT_TRUE(SynthesizeCheckpoint(oc).ok());
  const auto ca = DirContents(a), cb = DirContents(b), cc = DirContents(c);
  ASSERT_EQ(ca.size(), cb.size());
  for (const auto& [name, bytes] : ca) {
    ASSERT_TRUE(cb.count(name)) << name;
    EXPECT_TRUE(bytes == cb.at(name)) << name << " differs between two runs";
  }
  ASSERT_TRUE(cc.count("model.safetensors"));
  EXPECT_TRUE(ca.at("model.safetensors") != cc.at("model.safetensors"));
  EXPECT_TRUE(ca.at("config.json") == cc.at("config.json"));
}

TEST(SynthWriteTest, RefusesToOverwriteWithoutForce) {
  const std::string dir = TempDir("overwrite");
  SynthOptions o = Tiny("qwen3", kBf16, dir);
  ASSERT_TRUE(SynthesizeCheckpoint(o).ok());
  EXPECT_EQ(SynthesizeCheckpoint(o).code(), absl::StatusCode::kFailedPrecondition);
  o.overwrite = true;
  EXPECT_TRUE(SynthesizeCheckpoint(o).ok());
}

struct FamilyCase {
  std::string arch;
  QuantSpec quant;
};

class SynthFamilyTest : public ::testing::TestWithParam<FamilyCase> {};

TEST_P(SynthFamilyTest, WritesReopensAndMatchesThePlan) {
  const FamilyCase& fc = GetParam();
  const std::string dir = TempDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  SynthOptions o = Tiny(fc.arch, fc.quant, dir);
  absl::StatusOr<SynthPlan> plan = PlanSynthCheckpoint(o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  int64_t calls = 0;
  o.progress = [&](const SynthProgress& p) {
    ++calls;
    EXPECT_LE(p.bytes_done, p.bytes_total);
  };
  absl::Status st = SynthesizeCheckpoint(o);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(calls, static_cast<int64_t>(plan->params.size()));
  for (const char* f : {"config.json", "generation_config.json", "tokenizer.json",
                        "tokenizer_config.json", "chat_template.jinja"}) {
    EXPECT_TRUE(fs::exists(fs::path(dir) / f)) << f;
  }

  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const std::vector<StoredTensor> want = plan->Tensors();
  std::vector<std::string> want_names;
  for (const StoredTensor& t : want) want_names.push_back(t.name);
  EXPECT_EQ((*ckpt)->Names(), want_names);
  for (const StoredTensor& t : want) {
    absl::StatusOr<TensorEntry> e = (*ckpt)->Describe(t.name);
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_EQ(e->dtype, t.dtype) << t.name;
    EXPECT_EQ(e->shape, t.shape) << t.name;
  }

  absl::StatusOr<ModelConfig> cfg = LoadModelConfig(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->model_type, fc.arch);
  EXPECT_EQ(cfg->num_hidden_layers, 4);
  EXPECT_EQ(cfg->vocab_size, 1024);
  EXPECT_EQ(cfg->quantization.present, fc.quant.mode != QuantMode::kNone);
  EXPECT_FALSE(cfg->eos_token_ids.empty());
  if (fc.quant.mode != QuantMode::kNone) {
    EXPECT_EQ(cfg->quantization.default_spec, fc.quant);
  }
  // The engine's reading of every module agrees with what was written.
  for (const PlannedParam& p : plan->params) {
    if (!p.param.quantizable) continue;
    const bool has_scales = (*ckpt)->Has(p.param.module() + ".scales");
    EXPECT_EQ(cfg->quantization.SpecFor(p.param.module(), has_scales), p.quant)
        << p.param.module();
  }
  if (fc.arch == "glm_moe_dsa") {
    EXPECT_EQ(cfg->indexer_full, (std::vector<bool>{true, true, false, true}));
    EXPECT_FALSE((*ckpt)->Has("model.layers.2.self_attn.indexer.wk.weight"));
    EXPECT_TRUE((*ckpt)->Has("model.layers.3.self_attn.indexer.k_norm.bias"));
  }
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(cfg->is_moe_layer(i), plan->config.is_moe_layer(i)) << i;
  }

  // Values are well scaled: dequantized projection weights have std ~ 1/sqrt(fan_in),
  // norms ~ 1.
  const std::string w = fc.arch.rfind("qwen3", 0) == 0 ? "model.layers.1.self_attn.q_proj"
                                                        : "model.layers.1.self_attn.kv_a_proj_with_mqa";
  QuantWeight qw;
  qw.name = w;
  qw.spec = cfg->quantization.SpecFor(w, (*ckpt)->Has(w + ".scales"));
  qw.weight = *(*ckpt)->Get(w + ".weight");
  if (qw.spec.mode != QuantMode::kNone) qw.scales = *(*ckpt)->Get(w + ".scales");
  if (qw.spec.mode == QuantMode::kAffine) qw.biases = *(*ckpt)->Get(w + ".biases");
  std::vector<float> vals = qw.spec.mode == QuantMode::kNone ? ToFloatVector(qw.weight)
                                                             : Dequantize(qw);
  double sq = 0;
  for (float v : vals) sq += static_cast<double>(v) * v;
  const double rms = std::sqrt(sq / vals.size());
  const double want_std = 1.0 / std::sqrt(128.0);
  EXPECT_GT(rms, 0.6 * want_std) << w;
  EXPECT_LT(rms, 1.4 * want_std) << w;
  std::vector<float> norm = ToFloatVector(*(*ckpt)->Get("model.norm.weight"));
  double mean = 0;
  for (float v : norm) mean += v;
  EXPECT_NEAR(mean / norm.size(), 1.0, 0.02);

  // And inspect finds nothing wrong.
  absl::StatusOr<InspectReport> report = InspectCheckpoint(dir);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->runnable()) << report->ToText();
  EXPECT_TRUE(report->warnings.empty()) << report->ToText();
  EXPECT_EQ(report->num_tensors, static_cast<int64_t>(want.size()));
  EXPECT_EQ(report->total_bytes, plan->total_bytes);
  EXPECT_EQ(report->layers.size(), 4u);
  EXPECT_FALSE(report->chat_template.empty());
}

std::string CaseName(const ::testing::TestParamInfo<FamilyCase>& info) {
  std::string q = info.param.quant.mode == QuantMode::kNone
                      ? "bf16"
                      : absl::StrCat(QuantModeName(info.param.quant.mode), "_b",
                                     info.param.quant.bits, "_g", info.param.quant.group_size);
  return info.param.arch + "_" + q;
}

INSTANTIATE_TEST_SUITE_P(
    Synth, SynthFamilyTest,
    ::testing::Values(
        FamilyCase{"glm_moe_dsa", kMxfp4}, FamilyCase{"glm_moe_dsa", kAffine4},
        FamilyCase{"glm_moe_dsa", kBf16}, FamilyCase{"glm_moe_dsa", {QuantMode::kNvfp4, 4, 16}},
        FamilyCase{"glm_moe_dsa", {QuantMode::kMxfp8, 8, 32}},
        FamilyCase{"deepseek_v32", kMxfp4}, FamilyCase{"deepseek_v32", {QuantMode::kAffine, 3, 32}},
        FamilyCase{"deepseek_v3", kMxfp4}, FamilyCase{"deepseek_v3", {QuantMode::kAffine, 8, 128}},
        FamilyCase{"qwen3", kAffine4}, FamilyCase{"qwen3", kBf16},
        FamilyCase{"qwen3", {QuantMode::kAffine, 5, 32}}, FamilyCase{"qwen3", {QuantMode::kAffine, 6, 64}},
        FamilyCase{"qwen3_moe", kAffine4}, FamilyCase{"qwen3_moe", kMxfp4},
        FamilyCase{"qwen3_moe", {QuantMode::kAffine, 2, 128}}),
    CaseName);

TEST(SynthWriteTest, ShardsWhenOverTheLimit) {
  const std::string dir = TempDir("sharded");
  SynthOptions o = Tiny("qwen3_moe", kAffine4, dir);
  o.max_shard_bytes = 256 << 10;
  ASSERT_TRUE(SynthesizeCheckpoint(o).ok());
  int shards = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    shards += absl::EndsWith(e.path().filename().string(), ".safetensors");
  }
  EXPECT_GT(shards, 1);
  ASSERT_TRUE(fs::exists(fs::path(dir) / "model.safetensors.index.json"));
  absl::StatusOr<SynthPlan> plan = PlanSynthCheckpoint(o);
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->Names().size(), plan->Tensors().size());
  absl::StatusOr<InspectReport> report = InspectCheckpoint(dir);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->runnable()) << report->ToText();
  EXPECT_EQ(report->num_files, shards);
}

// --- inspect ------------------------------------------------------------------------------

TEST(InspectTest, ErrorsForMissingDirAndCorruptConfig) {
  EXPECT_EQ(InspectCheckpoint("/nonexistent/dir").status().code(), absl::StatusCode::kNotFound);
  const std::string dir = TempDir("corrupt");
  ASSERT_TRUE(SynthesizeCheckpoint(Tiny("qwen3", kBf16, dir)).ok());
  WriteAll(fs::path(dir) / "config.json", "{\"model_type\": \"qwen3\", ");
  EXPECT_EQ(InspectCheckpoint(dir).status().code(), absl::StatusCode::kInvalidArgument);
  fs::remove(fs::path(dir) / "config.json");
  EXPECT_EQ(InspectCheckpoint(dir).status().code(), absl::StatusCode::kNotFound);
}

TEST(InspectTest, ListsWhatCannotRun) {
  const std::string dir = TempDir("problems");
  ASSERT_TRUE(SynthesizeCheckpoint(Tiny("glm_moe_dsa", kMxfp4, dir)).ok());
  const fs::path cfg_path = fs::path(dir) / "config.json";
  const std::string original = ReadAll(cfg_path);

  // Two more layers than the weights hold: their tensors are missing.
  Json cfg = Json::parse(original);
  cfg["num_hidden_layers"] = 6;
  cfg["indexer_types"] = {"full", "full", "shared", "full", "shared", "full"};
  WriteAll(cfg_path, cfg.dump());
  absl::StatusOr<InspectReport> r = InspectCheckpoint(dir);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->runnable());
  const std::string text = r->ToText();
  EXPECT_NE(text.find("missing tensor: model.layers.*.mlp.switch_mlp.gate_proj.weight (layers 4-5)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("runnable    NO"), std::string::npos);

  // The quantization block lies about the bits: shapes do not match.
  cfg = Json::parse(original);
  cfg["quantization"]["mode"] = "mxfp8";
  cfg["quantization"]["bits"] = 8;
  cfg["quantization_config"] = cfg["quantization"];
  WriteAll(cfg_path, cfg.dump());
  r = InspectCheckpoint(dir);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->runnable());
  EXPECT_NE(r->ToText().find("shape/dtype mismatch"), std::string::npos) << r->ToText();

  // Unknown model family: reported, not an error.
  cfg = Json::parse(original);
  cfg["model_type"] = "llama";
  WriteAll(cfg_path, cfg.dump());
  r = InspectCheckpoint(dir);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->runnable());
  EXPECT_EQ(r->model_type, "llama");
  EXPECT_GT(r->num_tensors, 0);
  Json j = Json::parse(r->ToJson());
  EXPECT_EQ(j["runnable"], false);
  EXPECT_FALSE(j["problems"].empty());

  // Restored: runnable again; text and JSON summarise per module kind.
  WriteAll(cfg_path, original);
  r = InspectCheckpoint(dir);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->runnable()) << r->ToText();
  j = Json::parse(r->ToJson());
  EXPECT_EQ(j["layers"][2]["indexer"], "shared");
  EXPECT_EQ(j["layers"][0]["mlp"], "dense");
  EXPECT_EQ(j["layers"][1]["mlp"], "moe");
  bool saw_switch = false;
  for (const Json& g : j["modules"]) {
    if (g["kind"] == "model.layers.*.mlp.switch_mlp.gate_proj") {
      saw_switch = true;
      EXPECT_EQ(g["storage"], "mxfp4/g32/b4");
      EXPECT_EQ(g["count"], 3);
      EXPECT_EQ(g["shape"], "[8,128,128]");
    }
  }
  EXPECT_TRUE(saw_switch) << j.dump(2);
}

}  // namespace
}  // namespace ring
