#include "server/planner.h"

#include "gtest/gtest.h"

namespace ring {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

PlanModel Uniform(int layers, int64_t bytes) {
  PlanModel m;
  m.layer_bytes.assign(layers, bytes);
  return m;
}

PlanOptions NoKv() {
  PlanOptions o;
  o.headroom_fraction = 0;
  o.headroom_min_bytes = 0;
  return o;
}

TEST(PlannerTest, EqualWorkersSplitEvenly) {
  auto p = PlanRing({{"a", 100 * kGiB, 1e11}, {"b", 100 * kGiB, 1e11}}, Uniform(8, kGiB), NoKv());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->LayerCounts(), (std::vector<int64_t>{4, 4}));
  EXPECT_NEAR(p->pipelined_tokens_per_s, 1e11 / (4.0 * kGiB), 1e-6);
  EXPECT_NEAR(p->single_stream_tokens_per_s, 1e11 / (8.0 * kGiB), 1e-6);
}

TEST(PlannerTest, FasterWorkerTakesMoreLayers) {
  auto p = PlanRing({{"slow", 100 * kGiB, 1e11}, {"fast", 100 * kGiB, 3e11}}, Uniform(8, kGiB), NoKv());
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->LayerCounts(), (std::vector<int64_t>{2, 6}));
}

TEST(PlannerTest, MemoryLimitsOverrideSpeed) {
  // The fast worker can hold only 3 layers.
  auto p = PlanRing({{"slow", 100 * kGiB, 1e11}, {"fast", 3 * kGiB, 1e12}}, Uniform(8, kGiB), NoKv());
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->LayerCounts(), (std::vector<int64_t>{5, 3}));
  for (const auto& s : p->stages) EXPECT_LE(s.weight_bytes + s.kv_bytes, s.usable_bytes);
}

// The LM head is read every token; the embedding table is held (memory) but a token reads
// one row of it, so it does not make the first stage slower.
TEST(PlannerTest, HeadCountsForTimeEmbeddingOnlyForMemory) {
  PlanModel m = Uniform(4, kGiB);
  m.last_stage_extra_bytes = 2 * kGiB;
  auto p = PlanRing({{"a", 100 * kGiB, 1e11}, {"b", 100 * kGiB, 1e11}}, m, NoKv());
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->LayerCounts(), (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(p->stages[1].weight_bytes, 3 * kGiB);
  m = Uniform(4, kGiB);
  m.first_stage_extra_bytes = 2 * kGiB;
  p = PlanRing({{"a", 100 * kGiB, 1e11}, {"b", 100 * kGiB, 1e11}}, m, NoKv());
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->LayerCounts(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(p->stages[0].weight_bytes, 4 * kGiB);
  EXPECT_DOUBLE_EQ(p->stages[0].seconds_per_token, p->stages[1].seconds_per_token);
  // ... but it must fit: a worker that can hold 2 layers only without the table gets 1.
  p = PlanRing({{"a", 7 * kGiB / 2, 1e11}, {"b", 100 * kGiB, 1e11}}, m, NoKv());
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->LayerCounts(), (std::vector<int64_t>{1, 3}));
}

// With a calibration forward from every worker, times are measured layer and head step
// times, not bytes: a GPU whose layers cost launch overhead more than bytes, and whose
// head is cheap, gets its share by time; one worker without calibration means bytes for all.
TEST(PlannerTest, CalibratedTimesReplaceBytesOverBandwidth) {
  PlanModel m = Uniform(12, kGiB);
  m.last_stage_extra_bytes = 6 * kGiB;  // by bytes the head is worth 6 layers
  PlanWorker a{"a", 100 * kGiB, 1e11, /*layer_seconds=*/1e-3, /*head_seconds=*/1e-4};
  PlanWorker b{"b", 100 * kGiB, 1e11, 1e-3, 1e-4};
  auto p = PlanRing({a, b}, m, NoKv());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->calibrated);
  EXPECT_EQ(p->LayerCounts(), (std::vector<int64_t>{6, 6}));
  EXPECT_NEAR(p->stages[1].seconds_per_token, 6e-3 + 1e-4, 1e-12);
  EXPECT_NE(p->ToText().find("calibration forward"), std::string::npos);
  // A worker twice as slow per layer takes a third of the layers.
  b.layer_seconds = 2e-3;
  p = PlanRing({a, b}, m, NoKv());
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->LayerCounts(), (std::vector<int64_t>{8, 4}));
  // Without b's calibration: bytes / bandwidth for both (the head pushes layers to a).
  b.layer_seconds = 0;
  p = PlanRing({a, b}, m, NoKv());
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->calibrated);
  EXPECT_EQ(p->LayerCounts(), (std::vector<int64_t>{9, 3}));
}

TEST(PlannerTest, KvBudgetIsReserved) {
  PlanModel m = Uniform(4, kGiB);
  m.kv_bytes_per_token_per_layer = 1 << 20;  // 1 MiB per token per layer
  PlanOptions o = NoKv();
  o.context_tokens = 1024;  // 1 GiB per layer
  auto p = PlanRing({{"a", 4 * kGiB, 1e11}, {"b", 4 * kGiB, 1e11}}, m, o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->LayerCounts(), (std::vector<int64_t>{2, 2}));
  o.context_tokens = 2048;  // 2 GiB per layer: 3 GiB per layer does not fit 2 per worker
  auto q = PlanRing({{"a", 4 * kGiB, 1e11}, {"b", 4 * kGiB, 1e11}}, m, o);
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(q.status().message().find("no split"), std::string::npos) << q.status();
}

TEST(PlannerTest, ManualSplitIsCheckedNotOptimized) {
  PlanOptions o = NoKv();
  o.split = {1, 7};
  auto p = PlanRing({{"a", 100 * kGiB, 1e11}, {"b", 100 * kGiB, 1e11}}, Uniform(8, kGiB), o);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->LayerCounts(), (std::vector<int64_t>{1, 7}));
  o.split = {1, 7};
  auto q = PlanRing({{"a", 100 * kGiB, 1e11}, {"b", 6 * kGiB, 1e11}}, Uniform(8, kGiB), o);
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find("worker b cannot hold layers 1..7"), std::string::npos) << q.status();
  o.split = {3, 3};
  EXPECT_FALSE(PlanRing({{"a", 100 * kGiB, 1e11}, {"b", 100 * kGiB, 1e11}}, Uniform(8, kGiB), o).ok());
}

TEST(PlannerTest, HugeBudgetDoesNotOverflowIntoFitting) {
  PlanModel m = Uniform(4, kGiB);
  m.kv_bytes_per_token_per_layer = 1 << 20;
  PlanOptions o = NoKv();
  o.context_tokens = int64_t{1} << 50;
  o.sequences = int64_t{1} << 20;
  EXPECT_FALSE(PlanRing({{"a", 100 * kGiB, 1e11}}, m, o).ok());
}

TEST(PlannerTest, MoreWorkersThanLayersIsRefused) {
  auto p = PlanRing({{"a", kGiB, 1}, {"b", kGiB, 1}, {"c", kGiB, 1}}, Uniform(2, 1), NoKv());
  EXPECT_FALSE(p.ok());
}

}  // namespace
}  // namespace ring
