#include "kernels/cpu/sampling.h"

#include <cmath>
#include <map>
#include <random>

#include "gtest/gtest.h"

namespace ring {
namespace {

std::vector<float> Logits() { return {1.0f, 3.0f, 2.0f, 3.0f, -1.0f}; }

TEST(SamplerTest, GreedyTakesLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  EXPECT_EQ(s.Sample(Logits()).id, 1);
}

TEST(SamplerTest, SameSeedSameTokens) {
  SamplingParams p;
  p.seed = 1234;
  Sampler a(p), b(p);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.Sample(Logits()).id, b.Sample(Logits()).id);
}

TEST(SamplerTest, DifferentSeedsDiffer) {
  SamplingParams p;
  std::vector<int32_t> x, y;
  p.seed = 1;
  Sampler a(p);
  p.seed = 2;
  Sampler b(p);
  for (int i = 0; i < 50; ++i) {
    x.push_back(a.Sample(Logits()).id);
    y.push_back(b.Sample(Logits()).id);
  }
  EXPECT_NE(x, y);
}

TEST(SamplerTest, TopKOneIsGreedy) {
  SamplingParams p;
  p.top_k = 1;
  p.seed = 9;
  Sampler s(p);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.Sample(Logits()).id, 1);
}

TEST(SamplerTest, TopKTwoKeepsOnlyTheTiedBest) {
  SamplingParams p;
  p.top_k = 2;
  p.seed = 3;
  Sampler s(p);
  std::map<int32_t, int> seen;
  for (int i = 0; i < 400; ++i) ++seen[s.Sample(Logits()).id];
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[1], 100);
  EXPECT_GT(seen[3], 100);
}

TEST(SamplerTest, TopPSmallKeepsTheHead) {
  SamplingParams p;
  p.top_p = 0.05f;
  p.seed = 5;
  Sampler s(p);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(s.Sample(Logits()).id, 1);
}

TEST(SamplerTest, MinPDropsTheTail) {
  SamplingParams p;
  p.min_p = 0.5f;  // p(2)/p(1) = e^-1 < 0.5: only ids 1 and 3 survive
  p.seed = 11;
  Sampler s(p);
  for (int i = 0; i < 200; ++i) {
    const int32_t id = s.Sample(Logits()).id;
    EXPECT_TRUE(id == 1 || id == 3) << id;
  }
}

TEST(SamplerTest, DistributionFollowsSoftmax) {
  SamplingParams p;
  p.seed = 17;
  Sampler s(p);
  const std::vector<float> l = {0.0f, std::log(3.0f)};  // p = 1/4, 3/4
  int ones = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ones += s.Sample(l).id == 1;
  EXPECT_NEAR(ones / static_cast<double>(n), 0.75, 0.02);
}

TEST(SamplerTest, FrequencyPenaltyDiscouragesRepeats) {
  SamplingParams p;
  p.temperature = 0;
  p.frequency_penalty = 2.0f;
  Sampler s(p);
  const std::vector<float> l = {0.0f, 1.0f};
  EXPECT_EQ(s.Sample(l).id, 1);
  EXPECT_EQ(s.Sample(l).id, 0);  // 1 - 2*1 < 0
}

TEST(SamplerTest, LogprobsAreOfTheRawDistribution) {
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = true;
  p.top_logprobs = 2;
  Sampler s(p);
  const std::vector<float> l = {0.0f, std::log(3.0f)};
  SampledToken t = s.Sample(l);
  EXPECT_EQ(t.id, 1);
  EXPECT_NEAR(t.logprob, std::log(0.75), 1e-6);
  ASSERT_EQ(t.top_logprobs.size(), 2u);
  EXPECT_EQ(t.top_logprobs[0].first, 1);
  EXPECT_NEAR(t.top_logprobs[1].second, std::log(0.25), 1e-6);
}

TEST(SamplerTest, ValidateNamesTheParameter) {
  SamplingParams p;
  p.top_p = 0;
  EXPECT_NE(p.Validate().message().find("top_p"), std::string::npos);
  p = {};
  p.temperature = 3;
  EXPECT_NE(p.Validate().message().find("temperature"), std::string::npos);
  EXPECT_TRUE(SamplingParams{}.Validate().ok());
}


// The uniform moved out of Draw: u * total must be exactly the draw the sampler made with
// std::uniform_real_distribution<double>(0, total) from the same engine state.
TEST(SamplerTest, CanonicalTimesTotalIsTheLegacyDraw) {
  std::mt19937_64 a(77), b(77);
  for (double total : {1.0, 0.3, 1234.5678, 1e-30, 7.0 / 3.0}) {
    for (int i = 0; i < 100; ++i) {
      const double legacy = std::uniform_real_distribution<double>(0.0, total)(a);
      const double canonical = std::generate_canonical<double, 53>(b);
      EXPECT_EQ(legacy, canonical * total);
    }
  }
}

TEST(SamplerTest, SampleIsSampleTokenOfNextRequest) {
  SamplingParams p;
  p.seed = 21;
  p.top_k = 3;
  p.frequency_penalty = 0.5f;
  p.logprobs = true;
  Sampler a(p), b(p);
  for (int i = 0; i < 30; ++i) {
    const SampledToken ta = a.Sample(Logits());
    const SampleRequest r = b.NextRequest();
    ASSERT_TRUE(r.Validate(5).ok());
    const SampledToken tb = cpu::SampleToken(Logits(), r);
    EXPECT_EQ(cpu::SampleToken(Logits(), r).id, tb.id);  // pure
    b.Accept(tb.id);
    EXPECT_EQ(ta.id, tb.id);
    EXPECT_EQ(ta.logprob, tb.logprob);
  }
}

TEST(SamplerTest, GreedyRequestsDrawNothing) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  EXPECT_EQ(s.NextRequest().uniform, 0.0);
  EXPECT_EQ(s.NextRequest().uniform, 0.0);
}

// weights of {1, 3, 2, 3, -1} at T = 1, relative to e^3: ids 1 and 3 weigh 1 each, id 2
// e^-1, id 0 e^-2, id 4 e^-4. Sorted order: 1, 3, 2, 0, 4.
TEST(SampleTokenTest, UniformPicksByCumulativeWeight) {
  SampleRequest r;
  r.params.seed = 0;
  const double e1 = std::exp(-1.0), e2 = std::exp(-2.0), e4 = std::exp(-4.0);
  const double total = 2 + e1 + e2 + e4;
  // No truncation: id order 0, 1, 2, 3, 4.
  auto id_at = [&](double u) {
    r.uniform = u;
    return cpu::SampleToken(Logits(), r).id;
  };
  EXPECT_EQ(id_at(0.0), 0);
  EXPECT_EQ(id_at((e2 + 0.5) / total), 1);
  EXPECT_EQ(id_at((e2 + 1 + 0.5 * e1) / total), 2);
  EXPECT_EQ(id_at((e2 + 1 + e1 + 0.5) / total), 3);
  EXPECT_EQ(id_at(0.999999), 4);
  // top-k 3: sorted 1, 3, 2 with mass 2 + e^-1.
  r.params.top_k = 3;
  EXPECT_EQ(id_at(0.0), 1);
  EXPECT_EQ(id_at(1.5 / (2 + e1)), 3);
  EXPECT_EQ(id_at(0.999), 2);
  // top-p 0.5 of the top 3: 1 alone reaches 1/(2+e^-1) = 0.42 < 0.5, so 1 and 3 are kept.
  r.params.top_p = 0.5f;
  EXPECT_EQ(id_at(0.49), 1);
  EXPECT_EQ(id_at(0.51), 3);
  EXPECT_EQ(id_at(0.999), 3);
  // min-p 0.2 without top-k: e^-1 = 0.37 stays, e^-2 = 0.135 goes.
  r.params.top_k = 0;
  r.params.top_p = 1;
  r.params.min_p = 0.2f;
  EXPECT_EQ(id_at(0.999), 2);
  // Penalties: id 1 twice with frequency 1 drops it to 1 below id 3.
  r.params.min_p = 0;
  r.params.temperature = 0;
  r.params.frequency_penalty = 1;
  r.counts = {{1, 2}};
  EXPECT_EQ(id_at(0.0), 3);
}

TEST(SampleTokenTest, ValidateRejectsBadRequests) {
  SampleRequest r;
  EXPECT_TRUE(r.Validate(5).ok());
  r.uniform = 1.0;
  EXPECT_FALSE(r.Validate(5).ok());
  r.uniform = 0.5;
  r.counts = {{5, 1}};
  EXPECT_FALSE(r.Validate(5).ok());
  r.counts = {{1, 1}, {1, 2}};
  EXPECT_FALSE(r.Validate(5).ok());
  r.counts = {{1, 0}};
  EXPECT_FALSE(r.Validate(5).ok());
  r.counts = {{4, 1}, {1, 2}};
  EXPECT_TRUE(r.Validate(5).ok());
}

// A replayed request continues exactly where the original would have.
TEST(SamplerTest, RestoreContinuesTheSequence) {
  for (float temperature : {0.0f, 0.8f}) {
    SamplingParams p;
    p.seed = 4242;
    p.temperature = temperature;
    p.presence_penalty = 0.7f;
    p.frequency_penalty = 0.3f;
    p.top_p = 0.9f;
    const std::vector<float> l = {0.5f, 0.4f, 0.45f, 0.1f, 0.3f, 0.2f};
    Sampler original(p);
    std::vector<int32_t> generated;
    for (int i = 0; i < 25; ++i) generated.push_back(original.Sample(l).id);
    Sampler replay(p);
    ASSERT_TRUE(replay.Restore(generated).ok());
    for (int i = 0; i < 25; ++i) {
      const SampleRequest a = original.NextRequest(), b = replay.NextRequest();
      EXPECT_EQ(a.uniform, b.uniform);
      using Counts = std::map<int32_t, int32_t>;
      EXPECT_EQ(Counts(a.counts.begin(), a.counts.end()), Counts(b.counts.begin(), b.counts.end()));
      const int32_t id = cpu::SampleToken(l, a).id;
      EXPECT_EQ(cpu::SampleToken(l, b).id, id);
      original.Accept(id);
      replay.Accept(id);
    }
    EXPECT_EQ(replay.Restore({1}).code(), absl::StatusCode::kFailedPrecondition);
  }
}

}  // namespace
}  // namespace ring
