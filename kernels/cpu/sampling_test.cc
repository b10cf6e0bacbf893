#include "kernels/cpu/sampling.h"

#include <cmath>
#include <map>

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

}  // namespace
}  // namespace ring

namespace ring {
namespace {

// A replay resumes the random stream and the penalties: a sampler restored with the tokens
// another one generated picks the same next tokens.
TEST(SamplerRestore, ContinuesTheSameStream) {
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  p.frequency_penalty = 0.5f;
  p.seed = 42;
  std::vector<std::vector<float>> rows;
  for (int s = 0; s < 12; ++s) {
    std::vector<float> r(64);
    for (int i = 0; i < 64; ++i) r[i] = std::sin(0.37f * i * (s + 1)) * 2.0f;
    rows.push_back(r);
  }
  Sampler a(p);
  std::vector<int32_t> got;
  for (const auto& r : rows) got.push_back(a.Sample(r).id);
  for (size_t cut : {size_t{0}, size_t{1}, size_t{5}, size_t{11}}) {
    Sampler b(p);
    b.Restore(std::vector<int32_t>(got.begin(), got.begin() + cut));
    for (size_t i = cut; i < rows.size(); ++i) EXPECT_EQ(b.Sample(rows[i]).id, got[i]) << "cut " << cut << " token " << i;
  }
}

}  // namespace
}  // namespace ring
