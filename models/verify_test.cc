#include "models/verify.h"

#include <algorithm>
#include <string>

#include "gtest/gtest.h"
#include "models/synth.h"
#include "models/temp_dir_for_test.h"

namespace ring {
namespace {

class VerifyTest : public TempDirTest {
 protected:
  std::string Synth(const std::string& arch, QuantSpec quant = {QuantMode::kMxfp4, 4, 32}) {
    SynthOptions o;
    o.arch = arch;
    o.preset = "tiny";
    o.layers = 4;
    o.quant = quant;
    o.seed = 7;
    o.out_dir = (dir_ / arch).string();
    const absl::Status s = SynthesizeCheckpoint(o);
    EXPECT_TRUE(s.ok()) << s;
    return o.out_dir;
  }
  VerifyOptions Opts(const std::string& dir, StageRange layers) {
    VerifyOptions o;
    o.model_dir = dir;
    o.layers = layers;
    o.prompt_len = 20;  // > the tiny GLM's index_topk (16): the DSA sparse path runs
    o.decode_steps = 2;
    return o;
  }
};

TEST_F(VerifyTest, CleanDeviceMatchesAndCoversEveryStepAndLayer) {
  const std::string dir = Synth("glm_moe_dsa");
  absl::StatusOr<VerifyReport> r = Verify(Opts(dir, {0, 4}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok) << r->diagnosis;
  EXPECT_EQ(r->culprit_op, -1);
  ASSERT_EQ(r->steps.size(), 3u);
  EXPECT_EQ(r->steps[0].kind, "prefill");
  EXPECT_TRUE(r->steps[0].sparse);
  EXPECT_EQ(r->layers.size(), 12u);  // 3 steps x 4 layers
  for (const LayerCheck& l : r->layers) EXPECT_EQ(l.diff.rel, 0) << l.layer;
  bool saw_head = false, saw_mla = false, saw_indexer = false;
  for (const OpCheck& o : r->ops) {
    EXPECT_TRUE(o.isolated_ok) << o.op << " " << o.detail;
    saw_head |= o.layer == 4 && o.op == "Linear";
    saw_mla |= o.op == "MlaAttention";
    saw_indexer |= o.op == "IndexerTopK";
  }
  EXPECT_TRUE(saw_head && saw_mla && saw_indexer);
  EXPECT_NE(FormatVerifyReport(*r, false).find("PASS"), std::string::npos);
}

TEST_F(VerifyTest, WrongScaleOnOneGroupIsNamed) {
  const std::string dir = Synth("glm_moe_dsa");
  VerifyOptions o = Opts(dir, {0, 4});
  o.TEST_fault = "scale:layers.2.self_attn.q_b_proj";
  absl::StatusOr<VerifyReport> r = Verify(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->ok);
  ASSERT_GE(r->first_bad_layer, 0);
  EXPECT_EQ(r->layers[r->first_bad_layer].layer, 2);
  ASSERT_GE(r->culprit_op, 0);
  const OpCheck& c = r->ops[r->culprit_op];
  EXPECT_EQ(c.op, "Linear");
  EXPECT_EQ(c.detail, "model.layers.2.self_attn.q_b_proj");
  EXPECT_EQ(c.layer, 2);
  EXPECT_GT(c.isolated.nmse, c.tolerance);
  EXPECT_NE(r->diagnosis.find("q_b_proj"), std::string::npos) << r->diagnosis;
  // Layers before the fault are untouched.
  for (const LayerCheck& l : r->layers) {
    if (l.step == 0 && l.layer < 2) {
      EXPECT_EQ(l.diff.rel, 0);
    }
  }
}

TEST_F(VerifyTest, FaultInStackedExpertsIsNamed) {
  const std::string dir = Synth("glm_moe_dsa");
  VerifyOptions o = Opts(dir, {1, 4});
  o.TEST_fault = "scale:layers.3.mlp.switch_mlp.down_proj";
  absl::StatusOr<VerifyReport> r = Verify(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->ok);
  ASSERT_GE(r->culprit_op, 0);
  EXPECT_EQ(r->ops[r->culprit_op].op, "ExpertsSwiGlu");
  EXPECT_EQ(r->ops[r->culprit_op].layer, 3);
}

TEST_F(VerifyTest, Bf16ReductionInRmsNormIsNamed) {
  const std::string dir = Synth("qwen3");
  VerifyOptions o = Opts(dir, {0, 2});
  o.TEST_fault = "bf16-accum:rms_norm";
  absl::StatusOr<VerifyReport> r = Verify(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->ok);
  ASSERT_GE(r->culprit_op, 0);
  EXPECT_EQ(r->ops[r->culprit_op].op, "RmsNorm") << r->diagnosis;
}

TEST_F(VerifyTest, StageStartingAtASharedIndexerLayer) {
  // Layer 2 of the tiny GLM-5.2 is "shared": it needs the top-k carry of layer 1, which
  // the verifier takes from the CPU reference's prefix, as a ring would ship it.
  const std::string dir = Synth("glm_moe_dsa");
  absl::StatusOr<VerifyReport> r = Verify(Opts(dir, {2, 3}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok) << r->diagnosis;
  ASSERT_EQ(r->layers.size(), 3u);
  EXPECT_EQ(r->layers[0].layer, 2);
}

TEST_F(VerifyTest, EveryFamilyAndF32Activations) {
  for (const std::string arch : {"deepseek_v3", "deepseek_v32", "qwen3", "qwen3_moe"}) {
    const std::string dir = Synth(arch, {QuantMode::kAffine, 4, 64});
    VerifyOptions o = Opts(dir, {0, 4});
    o.act_dtype = cpu::ActDType::kF32;
    absl::StatusOr<VerifyReport> r = Verify(o);
    ASSERT_TRUE(r.ok()) << arch << ": " << r.status();
    EXPECT_TRUE(r->ok) << arch << ": " << r->diagnosis;
    o.TEST_fault = "scale:layers.1.mlp";
    r = Verify(o);
    ASSERT_TRUE(r.ok()) << arch << ": " << r.status();
    EXPECT_FALSE(r->ok) << arch;
    ASSERT_GE(r->culprit_op, 0) << arch;
    EXPECT_NE(r->ops[r->culprit_op].detail.find("layers.1.mlp"), std::string::npos)
        << arch << ": " << r->diagnosis;
  }
}

TEST_F(VerifyTest, NoiseFloorIsMeasuredAndDoesNotHideAFault) {
  const std::string dir = Synth("glm_moe_dsa");
  VerifyOptions o = Opts(dir, {0, 4});
  o.noise_floor = true;
  absl::StatusOr<VerifyReport> r = Verify(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok) << r->diagnosis;
  double max_floor = 0;
  for (const LayerCheck& l : r->layers) {
    EXPECT_GE(l.floor_rel, 0);
    max_floor = std::max(max_floor, l.floor_rel);
  }
  EXPECT_GT(max_floor, 0);  // the jitter does move the reference
  o.TEST_fault = "scale:layers.1.self_attn.o_proj";
  r = Verify(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->ok);
  ASSERT_GE(r->culprit_op, 0);
  EXPECT_EQ(r->ops[r->culprit_op].detail, "model.layers.1.self_attn.o_proj");
}

TEST_F(VerifyTest, BadInputsAreClearErrors) {
  const std::string dir = Synth("glm_moe_dsa");
  VerifyOptions o = Opts(dir, {2, 9});
  EXPECT_EQ(Verify(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Opts(dir, {0, 1});
  o.tokens = {5, 99999};
  absl::Status s = Verify(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("99999"), std::string::npos);
  o = Opts(dir, {0, 1});
  o.TEST_fault = "explode";
  EXPECT_EQ(Verify(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Opts((dir_ / "missing").string(), {0, 1});
  EXPECT_FALSE(Verify(o).ok());
}

TEST(VerifyOpToleranceTest, WrittenTolerances) {
  EXPECT_EQ(VerifyOpTolerance("Add", cpu::ActDType::kBF16), 0);
  EXPECT_EQ(VerifyOpTolerance("Linear", cpu::ActDType::kBF16), 1e-4);
  EXPECT_EQ(VerifyOpTolerance("RmsNorm", cpu::ActDType::kBF16), 1e-5);
  EXPECT_EQ(VerifyOpTolerance("IndexerTopK", cpu::ActDType::kF32), 0.01);
  EXPECT_LT(VerifyOpTolerance("Linear", cpu::ActDType::kF32), 1e-6);
}

}  // namespace
}  // namespace ring
