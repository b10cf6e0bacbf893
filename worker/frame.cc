#include "worker/frame.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <xxhash.h>

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
  for (float v : values) {
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
      char* dst = payload->data();
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = ToBf16(values[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
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
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, payload.data() + 2 * i, 2);
      out[i] = FromBf16(h);
    }
  }
  return out;
}

absl::Status EncodeStageInput(const StageInput& in, int64_t rows, DType dtype,
                              ActivationFrame* frame) {
  frame->mutable_token_ids()->Assign(in.tokens.begin(), in.tokens.end());
  EncodeTopk(in.topk, frame->mutable_topk());
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
  frame->set_kind(ringserve::v1::PAYLOAD_KIND_HIDDEN);
  RING_RETURN_IF_ERROR(EncodeFloats(out.hidden, out.rows, dtype, frame));
  return absl::OkStatus();
}

absl::StatusOr<StageOutput> DecodeStageOutput(const ActivationFrame& frame) {
  StageOutput out;
  out.rows = frame.rows();
  out.topk = DecodeTopk(frame.topk());
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

}  // namespace ring::worker
