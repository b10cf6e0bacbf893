#include "worker/frame.h"

#include <algorithm>
#include <cmath>
#include <cstring>

// The checksum runs over every payload twice a hop: XXH3 inlined here is compiled with this
// build's vector flags (AVX2 on x86-64), where the shared library's build is generic.
#define XXH_INLINE_ALL
#include <xxhash.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define RING_FRAME_AVX2 1
#endif

#include "absl/strings/str_cat.h"
#include "kernels/status.h"

namespace ring::worker {
namespace {

using ringserve::v1::ActivationFrame;
using ringserve::v1::DType;

uint16_t ToBf16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

float FromBf16(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

// The codec runs on every hop, twice per stage step, and its per-element loops were most of
// the hop's CPU time (bench/hop_bench): the AVX2 paths below do the same arithmetic eight
// lanes at a time, bit for bit (bf16 rounding) or up to summation order (the L2 norm).

// dst[i] = ToBf16(src[i]); dst may be unaligned (a protobuf string).
void FloatsToBf16(const float* src, int64_t n, char* dst) {
  int64_t i = 0;
#ifdef RING_FRAME_AVX2
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i inf = _mm256_set1_epi32(0x7f800000);
  const __m256i bias = _mm256_set1_epi32(0x7fff);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i quiet = _mm256_set1_epi32(0x40);
  auto round8 = [&](const float* p) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i hi = _mm256_srli_epi32(b, 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, abs_mask), inf);
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(bias, _mm256_and_si256(hi, one))), 16);
    return _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, quiet), nan);
  };
  for (; i + 16 <= n; i += 16) {
    // Every lane is <= 0xffff, so unsigned saturation is exact; packus interleaves the
    // 128-bit halves, the permute puts them back in order.
    const __m256i packed = _mm256_packus_epi32(round8(src + i), round8(src + i + 8));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 2 * i),
                        _mm256_permute4x64_epi64(packed, 0xD8));
  }
#endif
  for (; i < n; ++i) {
    const uint16_t h = ToBf16(src[i]);
    std::memcpy(dst + 2 * i, &h, 2);
  }
}

// dst[i] = FromBf16(src[i]); src may be unaligned.
void Bf16ToFloats(const char* src, int64_t n, float* dst) {
  int64_t i = 0;
#ifdef RING_FRAME_AVX2
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
#endif
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = FromBf16(h);
  }
}

void EncodeTopk(const TopkCarry& t, ringserve::v1::TopkCarry* p) {
  p->set_source_layer(t.source_layer);
  p->set_dense(t.dense);
  p->set_k(t.k);
  p->mutable_indices()->Assign(t.indices.begin(), t.indices.end());
}

TopkCarry DecodeTopk(const ringserve::v1::TopkCarry& p) {
  TopkCarry t;
  t.source_layer = p.source_layer();
  t.dense = p.dense();
  t.k = p.k();
  t.indices.assign(p.indices().begin(), p.indices().end());
  return t;
}

}  // namespace

uint64_t PayloadChecksum(absl::string_view bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

ringserve::v1::Fingerprint ComputeFingerprint(const std::vector<float>& values) {
  ringserve::v1::Fingerprint f;
  double sum_sq = 0;
  float absmax = 0;
  int64_t nans = 0, infs = 0;
  const int64_t n_values = static_cast<int64_t>(values.size());
  const float* p = values.data();
  int64_t i = 0;
#ifdef RING_FRAME_AVX2
  {
    // Non-finite lanes count as 0 here; they are counted (rarely) below.
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i exp_mask = _mm256_set1_epi32(0x7f800000);
    // Squares are summed in float over blocks of kBlock values (four independent chains, so
    // that no add waits for the previous one's latency), and each block's sums in double:
    // the L2 (a diagnostic) stays within ~1e-6 of the exact sum, at a third of the cost of
    // converting every square to double.
    constexpr int kChains = 4;
    constexpr int64_t kBlock = 8 * kChains * 8;
    __m256 sq[kChains], vmax[kChains];
    for (int c = 0; c < kChains; ++c) sq[c] = vmax[c] = _mm256_setzero_ps();
    __m256d acc = _mm256_setzero_pd();
    __m256i non_finite = _mm256_setzero_si256();
    auto step = [&](int c, const float* q) {
      const __m256 v = _mm256_loadu_ps(q);
      const __m256i bad = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(v), exp_mask), exp_mask);
      non_finite = _mm256_or_si256(non_finite, bad);
      const __m256 a = _mm256_andnot_ps(_mm256_castsi256_ps(bad), _mm256_and_ps(v, abs_mask));
      vmax[c] = _mm256_max_ps(vmax[c], a);
      sq[c] = _mm256_fmadd_ps(a, a, sq[c]);
    };
    auto flush = [&] {
      __m256 t = _mm256_add_ps(_mm256_add_ps(sq[0], sq[1]), _mm256_add_ps(sq[2], sq[3]));
      acc = _mm256_add_pd(acc, _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(t)),
                                             _mm256_cvtps_pd(_mm256_extractf128_ps(t, 1))));
      for (int c = 0; c < kChains; ++c) sq[c] = _mm256_setzero_ps();
    };
    for (; i + kBlock <= n_values; i += kBlock) {
      for (int64_t j = 0; j < kBlock; j += 8 * kChains) {
        for (int c = 0; c < kChains; ++c) step(c, p + i + j + 8 * c);
      }
      flush();
    }
    for (; i + 8 <= n_values; i += 8) step(0, p + i);
    flush();
    __m256 vmax_all = vmax[0];
    for (int c = 1; c < kChains; ++c) vmax_all = _mm256_max_ps(vmax_all, vmax[c]);
    alignas(32) double accs[4];
    _mm256_store_pd(accs, acc);
    sum_sq = (accs[0] + accs[1]) + (accs[2] + accs[3]);
    if (std::isinf(sum_sq)) {  // a square or a block's sum beyond float's range: redo in double
      sum_sq = 0;
      for (int64_t j = 0; j < i; ++j) {
        if (std::isfinite(p[j])) sum_sq += static_cast<double>(p[j]) * p[j];
      }
    }
    alignas(32) float mx[8];
    _mm256_store_ps(mx, vmax_all);
    for (float m : mx) absmax = std::max(absmax, m);
    if (!_mm256_testz_si256(non_finite, non_finite)) {
      for (int64_t j = 0; j < i; ++j) {
        nans += std::isnan(p[j]) ? 1 : 0;
        infs += std::isinf(p[j]) ? 1 : 0;
      }
    }
  }
#endif
  for (; i < n_values; ++i) {
    const float v = p[i];
    if (std::isnan(v)) {
      ++nans;
    } else if (std::isinf(v)) {
      ++infs;
    } else {
      sum_sq += static_cast<double>(v) * v;
      absmax = std::max(absmax, std::fabs(v));
    }
  }
  f.set_l2(std::sqrt(sum_sq));
  f.set_absmax(absmax);
  f.set_nan_count(nans);
  f.set_inf_count(infs);
  const size_t n = values.size();
  const size_t samples = std::min<size_t>(8, n);
  for (size_t i = 0; i < samples; ++i) f.add_samples(values[i * n / samples]);
  return f;
}

absl::Status EncodeFloats(const std::vector<float>& values, int64_t rows, DType dtype,
                          ActivationFrame* frame) {
  const int64_t n = static_cast<int64_t>(values.size());
  if (rows <= 0 || n % rows != 0) {
    return absl::InvalidArgumentError(absl::StrCat("frame: ", n, " values do not split into ",
                                                   rows, " rows"));
  }
  std::string* payload = frame->mutable_payload();
  switch (dtype) {
    case ringserve::v1::DTYPE_F32:
      payload->assign(reinterpret_cast<const char*>(values.data()), n * sizeof(float));
      break;
    case ringserve::v1::DTYPE_BF16: {
      payload->resize(n * sizeof(uint16_t));
      FloatsToBf16(values.data(), n, payload->data());
      break;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat("frame: unsupported dtype ", dtype));
  }
  frame->set_dtype(dtype);
  frame->clear_shape();
  frame->add_shape(rows);
  frame->add_shape(n / rows);
  frame->set_rows(rows);
  frame->set_checksum(PayloadChecksum(*payload));
  *frame->mutable_fingerprint() = ComputeFingerprint(values);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> DecodeFloats(const ActivationFrame& frame) {
  const std::string& payload = frame.payload();
  const uint64_t got = PayloadChecksum(payload);
  if (got != frame.checksum()) {
    return absl::DataLossError(absl::StrCat(
        "payload checksum mismatch (sequence ", frame.sequence_id(), " step ", frame.step(),
        ": computed ", absl::Hex(got), ", frame says ", absl::Hex(frame.checksum()), ")"));
  }
  int64_t n = 1;
  for (int64_t d : frame.shape()) {
    if (d < 0) return absl::InvalidArgumentError("frame: negative dimension");
    n *= d;
  }
  size_t elem;
  switch (frame.dtype()) {
    case ringserve::v1::DTYPE_F32: elem = 4; break;
    case ringserve::v1::DTYPE_BF16: elem = 2; break;
    default: return absl::InvalidArgumentError(absl::StrCat("frame: unsupported dtype ", frame.dtype()));
  }
  if (frame.shape_size() != 2 || payload.size() != n * elem) {
    return absl::InvalidArgumentError(absl::StrCat("frame: payload of ", payload.size(),
                                                   " bytes does not match its shape"));
  }
  std::vector<float> out(n);
  if (elem == 4) {
    std::memcpy(out.data(), payload.data(), payload.size());
  } else {
    Bf16ToFloats(payload.data(), n, out.data());
  }
  return out;
}

absl::Status EncodeStageInput(const StageInput& in, int64_t rows, DType dtype,
                              ActivationFrame* frame) {
  frame->mutable_token_ids()->Assign(in.tokens.begin(), in.tokens.end());
  EncodeTopk(in.topk, frame->mutable_topk());
  frame->set_token_only(in.argmax_only);
  if (in.hidden.empty()) {
    frame->set_kind(ringserve::v1::PAYLOAD_KIND_NONE);
    frame->set_rows(rows);
    frame->clear_payload();
    frame->clear_shape();
    frame->set_checksum(PayloadChecksum(""));
    return absl::OkStatus();
  }
  frame->set_kind(ringserve::v1::PAYLOAD_KIND_HIDDEN);
  return EncodeFloats(in.hidden, rows, dtype, frame);
}

absl::StatusOr<StageInput> DecodeStageInput(const ActivationFrame& frame) {
  StageInput in;
  in.tokens.assign(frame.token_ids().begin(), frame.token_ids().end());
  in.topk = DecodeTopk(frame.topk());
  in.argmax_only = frame.token_only();
  if (frame.kind() == ringserve::v1::PAYLOAD_KIND_HIDDEN) {
    RING_ASSIGN_OR_RETURN(in.hidden, DecodeFloats(frame));
  } else if (frame.kind() == ringserve::v1::PAYLOAD_KIND_NONE) {
    if (PayloadChecksum(frame.payload()) != frame.checksum()) {
      return absl::DataLossError("payload checksum mismatch on a token-only frame");
    }
  } else {
    return absl::InvalidArgumentError("frame: a stage input carries no logits");
  }
  return in;
}

absl::Status EncodeStageOutput(const StageOutput& out, DType dtype, bool all_logits,
                               ActivationFrame* frame) {
  EncodeTopk(out.topk, frame->mutable_topk());
  if (!out.logits.empty()) {
    frame->set_kind(ringserve::v1::PAYLOAD_KIND_LOGITS);
    RING_RETURN_IF_ERROR(EncodeFloats(out.logits, all_logits ? out.rows : 1,
                                      ringserve::v1::DTYPE_F32, frame));
    frame->set_rows(out.rows);
    return absl::OkStatus();
  }
  if (!out.argmax.empty()) {  // the last stage, asked for tokens only (argmax_only)
    const int64_t n = static_cast<int64_t>(out.argmax.size());
    if (out.hidden.empty() || out.hidden.size() % n != 0) {
      return absl::InvalidArgumentError("frame: token-only output without its hidden rows");
    }
    frame->set_kind(ringserve::v1::PAYLOAD_KIND_TOKEN);
    frame->mutable_token_ids()->Assign(out.argmax.begin(), out.argmax.end());
    frame->set_rows(out.rows);
    frame->clear_payload();
    frame->clear_shape();
    frame->add_shape(n);
    frame->add_shape(static_cast<int64_t>(out.hidden.size()) / n);
    frame->set_dtype(ringserve::v1::DTYPE_F32);
    frame->set_checksum(PayloadChecksum(""));
    *frame->mutable_fingerprint() = ComputeFingerprint(out.hidden);
    return absl::OkStatus();
  }
  frame->set_kind(ringserve::v1::PAYLOAD_KIND_HIDDEN);
  RING_RETURN_IF_ERROR(EncodeFloats(out.hidden, out.rows, dtype, frame));
  return absl::OkStatus();
}

absl::StatusOr<StageOutput> DecodeStageOutput(const ActivationFrame& frame) {
  StageOutput out;
  out.rows = frame.rows();
  out.topk = DecodeTopk(frame.topk());
  if (frame.kind() == ringserve::v1::PAYLOAD_KIND_TOKEN) {
    if (PayloadChecksum(frame.payload()) != frame.checksum() || !frame.payload().empty()) {
      return absl::DataLossError("payload checksum mismatch on a token reply");
    }
    if (frame.token_ids().empty()) return absl::InvalidArgumentError("frame: token reply without tokens");
    out.argmax.assign(frame.token_ids().begin(), frame.token_ids().end());
    return out;
  }
  RING_ASSIGN_OR_RETURN(std::vector<float> v, DecodeFloats(frame));
  if (frame.kind() == ringserve::v1::PAYLOAD_KIND_LOGITS) {
    out.logits = std::move(v);
  } else if (frame.kind() == ringserve::v1::PAYLOAD_KIND_HIDDEN) {
    out.hidden = std::move(v);
  } else {
    return absl::InvalidArgumentError("frame: a stage output carries a payload");
  }
  return out;
}

absl::Status EncodeSampled(const std::optional<SampledToken>& token,
                           const std::vector<float>& checked, int64_t rows,
                           ActivationFrame* frame) {
  ringserve::v1::TokenChoice choice;
  if (token) {
    choice.set_id(token->id);
    choice.set_logprob(token->logprob);
    for (const auto& [id, lp] : token->top_logprobs) {
      choice.add_top_ids(id);
      choice.add_top_logprobs(lp);
    }
  }
  if (rows < 1 || checked.size() % rows != 0) {
    return absl::InvalidArgumentError("frame: sampled output with ragged checked rows");
  }
  frame->set_kind(ringserve::v1::PAYLOAD_KIND_SAMPLED);
  // The action says which: token 0 with no log-probabilities serializes to nothing.
  frame->set_relay(token ? ringserve::v1::RELAY_ACTION_SAMPLE : ringserve::v1::RELAY_ACTION_ACK);
  frame->set_payload(token ? choice.SerializeAsString() : std::string());
  frame->set_checksum(PayloadChecksum(frame->payload()));
  frame->clear_token_ids();
  frame->clear_shape();
  frame->add_shape(rows);
  frame->add_shape(static_cast<int64_t>(checked.size()) / rows);
  frame->set_dtype(ringserve::v1::DTYPE_F32);
  *frame->mutable_fingerprint() = ComputeFingerprint(checked);
  return absl::OkStatus();
}

absl::StatusOr<std::optional<SampledToken>> DecodeSampled(const ActivationFrame& frame) {
  if (frame.kind() != ringserve::v1::PAYLOAD_KIND_SAMPLED) {
    return absl::InvalidArgumentError("frame: expected a sampled token");
  }
  if (PayloadChecksum(frame.payload()) != frame.checksum()) {
    return absl::DataLossError(absl::StrCat("payload checksum mismatch on the sampled token of sequence ",
                                            frame.sequence_id(), " step ", frame.step()));
  }
  if (frame.relay() == ringserve::v1::RELAY_ACTION_ACK) return std::optional<SampledToken>();
  ringserve::v1::TokenChoice choice;
  if (!choice.ParseFromString(frame.payload()) || choice.top_ids_size() != choice.top_logprobs_size()) {
    return absl::DataLossError("frame: unreadable sampled token");
  }
  SampledToken t;
  t.id = choice.id();
  t.logprob = choice.logprob();
  for (int i = 0; i < choice.top_ids_size(); ++i) t.top_logprobs.emplace_back(choice.top_ids(i), choice.top_logprobs(i));
  return std::optional<SampledToken>(std::move(t));
}

void EncodeStepError(const absl::Status& error, ActivationFrame* frame) {
  ringserve::v1::StepError e;
  e.set_code(static_cast<int32_t>(error.code()));
  e.set_message(std::string(error.message()));
  frame->set_kind(ringserve::v1::PAYLOAD_KIND_ERROR);
  frame->set_payload(e.SerializeAsString());
  frame->set_checksum(PayloadChecksum(frame->payload()));
  frame->clear_shape();
  frame->clear_token_ids();
  frame->clear_fingerprint();
}

absl::Status DecodeStepError(const ActivationFrame& frame) {
  ringserve::v1::StepError e;
  if (PayloadChecksum(frame.payload()) != frame.checksum() || !e.ParseFromString(frame.payload())) {
    return absl::DataLossError(absl::StrCat("payload checksum mismatch on the error frame of sequence ",
                                            frame.sequence_id(), " from ", frame.sender()));
  }
  if (e.code() == 0) return absl::InternalError(absl::StrCat(frame.sender(), ": error frame without an error"));
  return absl::Status(static_cast<absl::StatusCode>(e.code()), e.message());
}

ringserve::v1::SamplingSpec ToSamplingSpec(const SamplingParams& p) {
  ringserve::v1::SamplingSpec s;
  s.set_temperature(p.temperature);
  s.set_top_p(p.top_p);
  s.set_top_k(p.top_k);
  s.set_min_p(p.min_p);
  s.set_presence_penalty(p.presence_penalty);
  s.set_frequency_penalty(p.frequency_penalty);
  s.set_seed(p.seed);
  s.set_top_logprobs(p.top_logprobs);
  s.set_logprobs(p.logprobs);
  return s;
}

SamplingParams FromSamplingSpec(const ringserve::v1::SamplingSpec& s) {
  SamplingParams p;
  p.temperature = s.temperature();
  p.top_p = s.top_p();
  p.top_k = s.top_k();
  p.min_p = s.min_p();
  p.presence_penalty = s.presence_penalty();
  p.frequency_penalty = s.frequency_penalty();
  p.seed = s.seed();
  p.top_logprobs = s.top_logprobs();
  p.logprobs = s.logprobs();
  return p;
}

}  // namespace ring::worker
