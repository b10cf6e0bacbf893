// Test-only fault injection (models/backend.h, NewFaultBackend): a backend decorator that
// makes one kernel wrong in a way real kernel bugs are wrong, so tests can show that
// `ringctl verify` names the op and the shadow checker notices. It works on any backend:
// a wrong quantization scale is injected by handing the inner backend a private copy of the
// weight with that scale doubled (the inner backend's own matmul kernel then reads it), and
// a bf16 reduction by rescaling each RMSNorm row as a bf16-accumulated sum of squares would.
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kernels/dtype.h"
#include "kernels/status.h"
#include "models/backend_decorator.h"

namespace ring::internal {
namespace {

// A weight with one scale group doubled; owns the bytes the QuantWeight points to.
struct FaultyWeight {
  std::vector<uint8_t> weight, scales;
  QuantWeight w;
};

void DoubleValue(DType d, void* data, int64_t i) {
  switch (d) {
    case DType::kF32: static_cast<float*>(data)[i] *= 2.f; break;
    case DType::kBF16: {
      uint16_t& v = static_cast<uint16_t*>(data)[i];
      v = FloatToBf16(Bf16ToFloat(v) * 2.f);
      break;
    }
    case DType::kF16: {
      uint16_t& v = static_cast<uint16_t*>(data)[i];
      v = FloatToF16(F16ToFloat(v) * 2.f);
      break;
    }
    default: break;
  }
}

absl::StatusOr<std::unique_ptr<FaultyWeight>> MakeFaulty(const QuantWeight& w, int64_t group) {
  auto f = std::make_unique<FaultyWeight>();
  f->w = w;
  const auto* wb = static_cast<const uint8_t*>(w.weight.data);
  f->weight.assign(wb, wb + w.weight.nbytes());
  f->w.weight.data = f->weight.data();  // a distinct address: backends key copies by it
  const int64_t lines = w.batch() * w.rows();
  if (w.spec.mode == QuantMode::kNone) {
    const int64_t g = 32, cols = w.cols();
    if ((group + 1) * g > cols) {
      return absl::InvalidArgumentError(absl::StrCat("fault: ", w.name, " has no column group ", group));
    }
    for (int64_t r = 0; r < lines; ++r) {
      for (int64_t c = group * g; c < (group + 1) * g; ++c) {
        DoubleValue(w.weight.dtype, f->weight.data(), r * cols + c);
      }
    }
    return f;
  }
  const int64_t groups = w.scales.dim(-1);
  if (group >= groups) {
    return absl::InvalidArgumentError(absl::StrCat("fault: ", w.name, " has ", groups,
                                                   " scale groups per row, not ", group + 1));
  }
  const auto* sb = static_cast<const uint8_t*>(w.scales.data);
  f->scales.assign(sb, sb + w.scales.nbytes());
  f->w.scales.data = f->scales.data();
  for (int64_t r = 0; r < lines; ++r) {
    const int64_t i = r * groups + group;
    switch (w.spec.mode) {
      case QuantMode::kMxfp4:
      case QuantMode::kMxfp8:
        // E8M0: the byte is the exponent; +1 doubles the scale.
        if (f->scales[i] < 254) ++f->scales[i];
        break;
      case QuantMode::kNvfp4:
        // E4M3 (sign, 4 exponent bits, 3 mantissa bits): +8 adds one to the exponent.
        if ((f->scales[i] & 0x78) < 0x70) f->scales[i] += 8;
        break;
      default:
        DoubleValue(w.scales.dtype, f->scales.data(), i);
        break;
    }
  }
  return f;
}

class FaultBackend final : public ForwardingBackend {
 public:
  FaultBackend(std::shared_ptr<Backend> inner, std::string weight_match, int64_t group,
               bool bf16_rms)
      : ForwardingBackend(std::move(inner)), match_(std::move(weight_match)), group_(group),
        bf16_rms_(bf16_rms) {}

  absl::Status AddWeight(const QuantWeight& w) override {
    RING_RETURN_IF_ERROR(inner().AddWeight(w));
    if (match_.empty() || w.name.find(match_) == std::string::npos) return absl::OkStatus();
    std::lock_guard<std::mutex> l(mu_);
    if (faulty_.count(w.weight.data)) return absl::OkStatus();
    RING_ASSIGN_OR_RETURN(std::unique_ptr<FaultyWeight> f, MakeFaulty(w, group_));
    RING_RETURN_IF_ERROR(inner().AddWeight(f->w));
    faulty_.emplace(w.weight.data, std::move(f));
    return absl::OkStatus();
  }

  absl::Status Linear(const QuantWeight& w, const float* x, int64_t m, ActDType t,
                      float* y) override {
    return inner().Linear(Sub(w), x, m, t, y);
  }
  absl::Status LinearMany(absl::Span<const QuantWeight* const> ws, const float* x, int64_t m,
                          ActDType t, absl::Span<float* const> ys) override {
    std::vector<const QuantWeight*> sub;
    for (const QuantWeight* w : ws) sub.push_back(&Sub(*w));
    return inner().LinearMany(sub, x, m, t, ys);
  }
  absl::StatusOr<bool> LinearSwiGlu(const QuantWeight& gate, const QuantWeight& up, const float* x,
                                    int64_t m, ActDType t, float* out) override {
    return inner().LinearSwiGlu(Sub(gate), Sub(up), x, m, t, out);
  }
  absl::Status Embed(const QuantWeight& w, const int32_t* host_ids, int64_t n, ActDType t,
                     float* out) override {
    return inner().Embed(Sub(w), host_ids, n, t, out);
  }
  absl::Status MlaAttention(const cpu::MlaAttentionArgs& a, const QuantWeight& embed_q,
                            const QuantWeight& unembed_out, ActDType t, float* out) override {
    return inner().MlaAttention(a, Sub(embed_q), Sub(unembed_out), t, out);
  }
  absl::Status ExpertsSwiGlu(const QuantWeight& gate, const QuantWeight& up,
                             const QuantWeight& down, const float* x, int64_t T,
                             const int32_t* ids, int64_t k, ActDType t, float* y) override {
    return inner().ExpertsSwiGlu(Sub(gate), Sub(up), Sub(down), x, T, ids, k, t, y);
  }
  // Separately (IndexerTopK, then MlaAttention above), so that a weight's fault applies.
  absl::StatusOr<bool> IndexedMlaAttention(const cpu::IndexerArgs&, int32_t*, const cpu::MlaAttentionArgs&,
                                           const QuantWeight&, const QuantWeight&, ActDType,
                                           float*) override {
    return false;
  }
  // Separately (the router's Linear, ExpertsSwiGlu, ...), so that a weight's fault applies.
  absl::StatusOr<bool> MoeBlock(const MoeBlockWeights&, const cpu::SigmoidRouting&, const float*,
                                int64_t, ActDType, float*) override {
    return false;
  }
  // Separately (ExpertsSwiGlu and the MLP's ops), so that a weight's fault applies.
  absl::StatusOr<bool> ExpertsSwiGluShared(const QuantWeight&, const QuantWeight&,
                                           const QuantWeight&, const QuantWeight&,
                                           const QuantWeight&, const QuantWeight&, const float*,
                                           int64_t, const int32_t*, int64_t, ActDType,
                                           float*) override {
    return false;
  }

  // The two ops separately, so that RmsNorm's fault applies.
  absl::Status AddRmsNorm(const float* a, const float* b, int64_t rows, int64_t dim,
                          const TensorView& w, float eps, ActDType t, float* sum,
                          float* out) override {
    if (!bf16_rms_) return inner().AddRmsNorm(a, b, rows, dim, w, eps, t, sum, out);
    return Backend::AddRmsNorm(a, b, rows, dim, w, eps, t, sum, out);
  }
  absl::Status RmsNorm(const float* x, int64_t rows, int64_t dim, const TensorView& w,
                       float eps, ActDType t, float* out) override {
    RING_RETURN_IF_ERROR(inner().RmsNorm(x, rows, dim, w, eps, t, out));
    if (!bf16_rms_) return absl::OkStatus();
    std::vector<float> hx(rows * dim), hy(rows * dim);
    RING_RETURN_IF_ERROR(inner().Download(x, rows * dim * 4, hx.data()));
    RING_RETURN_IF_ERROR(inner().Download(out, rows * dim * 4, hy.data()));
    for (int64_t r = 0; r < rows; ++r) {
      float exact = 0.f, bf = 0.f;
      for (int64_t i = 0; i < dim; ++i) {
        const float sq = hx[r * dim + i] * hx[r * dim + i];
        exact += sq;
        bf = RoundBf16(bf + RoundBf16(sq));
      }
      const float fix = std::sqrt((exact / dim + eps) / (bf / dim + eps));
      for (int64_t i = 0; i < dim; ++i) hy[r * dim + i] = cpu::RoundAct(hy[r * dim + i] * fix, t);
    }
    return inner().Upload(hy.data(), rows * dim * 4, out);
  }

 private:
  const QuantWeight& Sub(const QuantWeight& w) const {
    std::lock_guard<std::mutex> l(mu_);
    auto it = faulty_.find(w.weight.data);
    return it == faulty_.end() ? w : it->second->w;
  }

  const std::string match_;
  const int64_t group_;
  const bool bf16_rms_;
  mutable std::mutex mu_;
  std::map<const void*, std::unique_ptr<FaultyWeight>> faulty_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<Backend>> NewFaultBackend(std::shared_ptr<Backend> inner,
                                                         const std::string& spec) {
  const std::vector<std::string> parts = absl::StrSplit(spec, ':');
  if (parts.size() >= 2 && parts.size() <= 3 && parts[0] == "scale" && !parts[1].empty()) {
    int64_t group = 0;
    if (parts.size() == 3 && (!absl::SimpleAtoi(parts[2], &group) || group < 0)) {
      return absl::InvalidArgumentError(absl::StrCat("fault '", spec, "': bad group '", parts[2], "'"));
    }
    return std::make_shared<FaultBackend>(std::move(inner), parts[1], group, false);
  }
  if (spec == "bf16-accum:rms_norm") {
    return std::make_shared<FaultBackend>(std::move(inner), "", 0, true);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "fault '", spec, "': expected scale:WEIGHT_NAME[:GROUP] or bf16-accum:rms_norm"));
}

}  // namespace ring::internal
