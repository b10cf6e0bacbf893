#include "worker/frame.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "gtest/gtest.h"

namespace ring::worker {
namespace {

using ringserve::v1::ActivationFrame;

std::vector<float> Awkward() {
  // Values whose bits must survive F32 exactly: denormal, -0, inf, NaN payload, pi.
  float nan_payload;
  const uint32_t bits = 0x7fc01234u;
  std::memcpy(&nan_payload, &bits, 4);
  return {1.0f, -0.0f, 1e-45f, std::numeric_limits<float>::infinity(), nan_payload,
          3.14159265f};
}

TEST(Frame, F32RoundTripIsBitExact) {
  const std::vector<float> v = Awkward();
  ActivationFrame f;
  ASSERT_TRUE(EncodeFloats(v, 2, ringserve::v1::DTYPE_F32, &f).ok());
  EXPECT_EQ(f.shape(0), 2);
  EXPECT_EQ(f.shape(1), 3);
  auto back = DecodeFloats(f);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), v.size());
  EXPECT_EQ(std::memcmp(back->data(), v.data(), v.size() * 4), 0);
}

TEST(Frame, Bf16RoundsToNearestEvenAndIsExactForBf16Values) {
  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even mantissa (1.0) wins.
  const std::vector<float> v = {1.0f + 1.0f / 256, 1.5f, -2.0f, 0.0f};
  ActivationFrame f;
  ASSERT_TRUE(EncodeFloats(v, 1, ringserve::v1::DTYPE_BF16, &f).ok());
  EXPECT_EQ(f.payload().size(), 8u);
  auto back = DecodeFloats(f);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ((*back)[0], 1.0f);
  EXPECT_EQ((*back)[1], 1.5f);
  EXPECT_EQ((*back)[2], -2.0f);
}

TEST(Frame, CorruptPayloadIsDataLoss) {
  ActivationFrame f;
  ASSERT_TRUE(EncodeFloats({1, 2, 3, 4}, 2, ringserve::v1::DTYPE_F32, &f).ok());
  (*f.mutable_payload())[5] ^= 0x01;
  auto back = DecodeFloats(f);
  ASSERT_FALSE(back.ok());
  EXPECT_EQ(back.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(back.status().message().find("checksum"), std::string::npos);
}

TEST(Frame, ShapeMismatchIsRejected) {
  ActivationFrame f;
  ASSERT_TRUE(EncodeFloats({1, 2, 3, 4}, 2, ringserve::v1::DTYPE_F32, &f).ok());
  f.set_shape(1, 3);
  EXPECT_EQ(DecodeFloats(f).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(EncodeFloats({1, 2, 3}, 2, ringserve::v1::DTYPE_F32, &f).ok());
}

TEST(Frame, StageInputCarriesTopkAndTokens) {
  StageInput in;
  in.hidden = {0.5f, -0.25f, 8.0f, 1e-3f};
  in.topk.source_layer = 1;
  in.topk.dense = false;
  in.topk.k = 2;
  in.topk.indices = {0, 1, 1, 0};
  ActivationFrame f;
  ASSERT_TRUE(EncodeStageInput(in, 2, ringserve::v1::DTYPE_F32, &f).ok());
  auto back = DecodeStageInput(f);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->hidden, in.hidden);
  EXPECT_EQ(back->topk.source_layer, 1);
  EXPECT_FALSE(back->topk.dense);
  EXPECT_EQ(back->topk.indices, in.topk.indices);

  StageInput first;
  first.tokens = {7, 8, 9};
  ASSERT_TRUE(EncodeStageInput(first, 3, ringserve::v1::DTYPE_F32, &f).ok());
  back = DecodeStageInput(f);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->tokens, first.tokens);
  EXPECT_TRUE(back->hidden.empty());
}

// A last stage asked for tokens only: the greedy tokens travel, the logits do not; the
// fingerprint of the hidden rows the head read still carries NaN/Inf.
TEST(Frame, TokenOnlyReplyCarriesTokensAndTheFingerprint) {
  StageInput in;
  in.hidden = {1, 2, 3, 4};
  in.argmax_only = true;
  ActivationFrame req;
  ASSERT_TRUE(EncodeStageInput(in, 1, ringserve::v1::DTYPE_F32, &req).ok());
  EXPECT_TRUE(req.token_only());
  auto in2 = DecodeStageInput(req);
  ASSERT_TRUE(in2.ok());
  EXPECT_TRUE(in2->argmax_only);

  StageOutput out;
  out.rows = 3;
  out.argmax = {42};
  out.hidden = {0.5f, NAN, 1.0f, 2.0f};  // the last row's final-normed hidden state
  ActivationFrame f;
  ASSERT_TRUE(EncodeStageOutput(out, ringserve::v1::DTYPE_BF16, false, &f).ok());
  EXPECT_EQ(f.kind(), ringserve::v1::PAYLOAD_KIND_TOKEN);
  EXPECT_TRUE(f.payload().empty());
  EXPECT_EQ(f.fingerprint().nan_count(), 1);
  EXPECT_EQ(f.shape_size(), 2);
  auto back = DecodeStageOutput(f);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->argmax, std::vector<int32_t>{42});
  EXPECT_TRUE(back->logits.empty());
  EXPECT_EQ(back->rows, 3);
  f.set_payload("x");  // a token reply has no payload: anything there was not sent
  EXPECT_TRUE(absl::IsDataLoss(DecodeStageOutput(f).status()));
}

TEST(Frame, StageOutputLogitsAreF32EvenOnABf16Ring) {
  StageOutput out;
  out.rows = 2;
  out.logits = {0.1f, 0.2f, 0.3f, 0.4f};
  ActivationFrame f;
  ASSERT_TRUE(EncodeStageOutput(out, ringserve::v1::DTYPE_BF16, true, &f).ok());
  EXPECT_EQ(f.dtype(), ringserve::v1::DTYPE_F32);
  auto back = DecodeStageOutput(f);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->logits, out.logits);
  EXPECT_EQ(back->rows, 2);
}

}  // namespace
}  // namespace ring::worker

namespace ring::worker {
namespace {

TEST(FingerprintTest, CountsAndNorms) {
  const std::vector<float> v = {3.0f, -4.0f, std::numeric_limits<float>::quiet_NaN(),
                                std::numeric_limits<float>::infinity(), 0.0f};
  const auto f = ComputeFingerprint(v);
  EXPECT_DOUBLE_EQ(f.l2(), 5.0);
  EXPECT_FLOAT_EQ(f.absmax(), 4.0f);
  EXPECT_EQ(f.nan_count(), 1);
  EXPECT_EQ(f.inf_count(), 1);
  EXPECT_EQ(f.samples_size(), 5);
}

TEST(FingerprintTest, EncodeFloatsAttachesIt) {
  ringserve::v1::ActivationFrame frame;
  ASSERT_TRUE(EncodeFloats({1.0f, 2.0f, 2.0f, 4.0f}, 2, ringserve::v1::DTYPE_BF16, &frame).ok());
  EXPECT_DOUBLE_EQ(frame.fingerprint().l2(), 5.0);
  EXPECT_FLOAT_EQ(frame.fingerprint().absmax(), 4.0f);
  EXPECT_EQ(frame.fingerprint().nan_count(), 0);
}

// The vectorized codec paths must agree bit for bit with the scalar definition, across
// lane boundaries and the scalar tail (37 values: two 16-lane blocks + 5).
TEST(Frame, Bf16WireBitsMatchTheScalarDefinitionOnEveryLane) {
  auto reference = [](float v) -> uint16_t {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<uint16_t>(bits >> 16);
  };
  std::vector<float> v;
  for (int i = 0; i < 37; ++i) v.push_back(std::ldexp(1.0f + static_cast<float>(i) / 128.0f, i % 40 - 20) * (i % 3 ? 1 : -1));
  v[3] = 1.0f + 1.0f / 256;   // tie -> even
  v[4] = 1.0f + 3.0f / 256;   // tie -> odd rounds up
  v[9] = std::numeric_limits<float>::infinity();
  v[17] = -std::numeric_limits<float>::infinity();
  v[20] = std::numeric_limits<float>::max();  // rounds to inf
  float snan;
  const uint32_t snan_bits = 0xff800001u;
  std::memcpy(&snan, &snan_bits, 4);
  v[30] = snan;
  v[35] = 1e-45f;
  ActivationFrame f;
  ASSERT_TRUE(EncodeFloats(v, 1, ringserve::v1::DTYPE_BF16, &f).ok());
  ASSERT_EQ(f.payload().size(), 2 * v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    uint16_t got;
    std::memcpy(&got, f.payload().data() + 2 * i, 2);
    EXPECT_EQ(got, reference(v[i])) << "element " << i;
  }
  auto back = DecodeFloats(f);
  ASSERT_TRUE(back.ok());
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &(*back)[i], 4);
    EXPECT_EQ(bits, static_cast<uint32_t>(reference(v[i])) << 16) << "element " << i;
  }
}

TEST(FingerprintTest, CountsNonFiniteValuesInsideVectorBlocks) {
  std::vector<float> v(29, 1.0f);  // 3 blocks of 8 + a tail of 5
  v[2] = std::numeric_limits<float>::quiet_NaN();
  v[11] = -std::numeric_limits<float>::infinity();
  v[27] = std::numeric_limits<float>::quiet_NaN();
  v[13] = -7.0f;
  const auto f = ComputeFingerprint(v);
  EXPECT_EQ(f.nan_count(), 2);
  EXPECT_EQ(f.inf_count(), 1);
  EXPECT_FLOAT_EQ(f.absmax(), 7.0f);
  EXPECT_DOUBLE_EQ(f.l2(), std::sqrt(25.0 + 49.0));  // 25 ones + 49
}

// A hidden row's L2 (6144 values: whole blocks and a tail) within 1e-6 of the sum in
// double; finite values whose squares overflow float still give a finite L2.
TEST(FingerprintTest, L2OfLongRowsAndHugeValues) {
  std::vector<float> v(6144 + 13);
  double want = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = std::sin(0.37f * static_cast<float>(i)) * (1.0f + static_cast<float>(i % 97));
    want += static_cast<double>(v[i]) * v[i];
  }
  const auto f = ComputeFingerprint(v);
  EXPECT_NEAR(f.l2(), std::sqrt(want), 1e-6 * std::sqrt(want));
  std::vector<float> big(300, 1.0f);
  big[5] = 3e30f;
  big[290] = -4e30f;  // in the tail
  big[100] = 1e25f;
  const auto g = ComputeFingerprint(big);
  double want_big = 0;
  for (float x : big) want_big += static_cast<double>(x) * x;
  want_big = std::sqrt(want_big);
  EXPECT_TRUE(std::isfinite(g.l2()));
  EXPECT_NEAR(g.l2(), want_big, 1e-9 * want_big);
  EXPECT_FLOAT_EQ(g.absmax(), 4e30f);
}

// Closed ring: the token crosses from the last stage to stage 0 inside the checksummed
// payload; token 0 without log-probabilities serializes to nothing and is still a token,
// not the ack of a prefill chunk.
TEST(SampledFrameTest, TokenZeroIsATokenAndAnAckIsNot) {
  const std::vector<float> rows(2 * 4, 0.5f);
  for (int32_t id : {0, 7}) {
    ActivationFrame f;
    SampledToken t;
    t.id = id;
    ASSERT_TRUE(EncodeSampled(t, rows, 2, &f).ok());
    auto back = DecodeSampled(f);
    ASSERT_TRUE(back.ok()) << back.status();
    ASSERT_TRUE(back->has_value()) << "token " << id << " read as an ack";
    EXPECT_EQ((*back)->id, id);
    EXPECT_EQ(f.shape(0), 2);
    EXPECT_EQ(f.shape(1), 4);
  }
  ActivationFrame ack;
  ASSERT_TRUE(EncodeSampled(std::nullopt, rows, 2, &ack).ok());
  auto back = DecodeSampled(ack);
  ASSERT_TRUE(back.ok());
  EXPECT_FALSE(back->has_value());
}

TEST(SampledFrameTest, LogprobsTravelAndADamagedTokenIsRefused) {
  ActivationFrame f;
  SampledToken t;
  t.id = 42;
  t.logprob = -1.25f;
  t.top_logprobs = {{42, -1.25f}, {3, -2.5f}};
  ASSERT_TRUE(EncodeSampled(t, std::vector<float>(4, 1.0f), 1, &f).ok());
  auto back = DecodeSampled(f);
  ASSERT_TRUE(back.ok() && back->has_value());
  EXPECT_EQ((*back)->logprob, -1.25f);
  EXPECT_EQ((*back)->top_logprobs, t.top_logprobs);
  (*f.mutable_payload())[0] ^= 0x01;
  EXPECT_EQ(DecodeSampled(f).status().code(), absl::StatusCode::kDataLoss);
}

TEST(SampledFrameTest, NonFiniteRowsShowInTheFingerprint) {
  std::vector<float> rows(6, 1.0f);
  rows[4] = std::numeric_limits<float>::quiet_NaN();
  ActivationFrame f;
  ASSERT_TRUE(EncodeSampled(SampledToken{}, rows, 2, &f).ok());
  EXPECT_EQ(f.fingerprint().nan_count(), 1);
  EXPECT_FALSE(EncodeSampled(SampledToken{}, rows, 4, &f).ok()) << "6 values are not 4 rows";
}

TEST(StepErrorFrameTest, CarriesCodeAndMessage) {
  ActivationFrame f;
  f.set_sender("stage 1 (x)");
  EncodeStepError(absl::ResourceExhaustedError("stage 1 (x): KV budget"), &f);
  absl::Status s = DecodeStepError(f);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(), "stage 1 (x): KV budget");
  (*f.mutable_payload())[1] ^= 0x10;
  EXPECT_EQ(DecodeStepError(f).code(), absl::StatusCode::kDataLoss);
}

TEST(SamplingSpecTest, RoundTrips) {
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_p = 0.9f;
  p.top_k = 40;
  p.min_p = 0.05f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = -0.25f;
  p.seed = 1234567890123ull;
  p.top_logprobs = 3;
  p.logprobs = true;
  const SamplingParams q = FromSamplingSpec(ToSamplingSpec(p));
  EXPECT_EQ(q.temperature, p.temperature);
  EXPECT_EQ(q.top_p, p.top_p);
  EXPECT_EQ(q.top_k, p.top_k);
  EXPECT_EQ(q.min_p, p.min_p);
  EXPECT_EQ(q.presence_penalty, p.presence_penalty);
  EXPECT_EQ(q.frequency_penalty, p.frequency_penalty);
  EXPECT_EQ(q.seed, p.seed);
  EXPECT_EQ(q.top_logprobs, p.top_logprobs);
  EXPECT_EQ(q.logprobs, p.logprobs);
}

}  // namespace
}  // namespace ring::worker
