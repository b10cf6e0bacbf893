#include "models/layers.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/status.h"

namespace ring::internal {

absl::StatusOr<TensorView> WeightLoader::Tensor(const std::string& name,
                                                const Shape& shape) const {
  RING_ASSIGN_OR_RETURN(TensorView t, Raw(name, shape));
  RING_RETURN_IF_ERROR(backend_.AddTensor(t));
  return t;
}

absl::StatusOr<TensorView> WeightLoader::Raw(const std::string& name, const Shape& shape) const {
  RING_ASSIGN_OR_RETURN(TensorView t, ckpt_.Get(name));
  if (!shape.empty() && t.shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " in ", ckpt_.dir(),
                                                   " has shape ", ShapeToString(t.shape),
                                                   ", the config implies ",
                                                   ShapeToString(shape)));
  }
  bytes_ += t.nbytes();
  return t;
}

absl::StatusOr<QuantWeight> WeightLoader::Linear(const std::string& path, const Shape& lead,
                                                 int64_t rows, int64_t cols) const {
  QuantWeight w;
  w.name = path;
  w.spec = cfg_.quantization.SpecFor(path, ckpt_.Has(path + ".scales"));
  Shape logical = lead;
  logical.push_back(rows);
  logical.push_back(cols);
  if (w.spec.mode == QuantMode::kNone) {
    RING_ASSIGN_OR_RETURN(w.weight, Raw(path + ".weight", logical));
    if (!IsFloat(w.weight.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ".weight is ", DTypeName(w.weight.dtype),
          " but the config does not quantize this module (missing .scales or override?)"));
    }
    RING_RETURN_IF_ERROR(backend_.AddWeight(w));
    return w;
  }
  RING_ASSIGN_OR_RETURN(w.weight, Raw(path + ".weight", {}));
  RING_ASSIGN_OR_RETURN(w.scales, Raw(path + ".scales", {}));
  if (w.spec.mode == QuantMode::kAffine) {
    RING_ASSIGN_OR_RETURN(w.biases, Raw(path + ".biases", {}));
  }
  if (w.spec.mode == QuantMode::kNvfp4 && ckpt_.Has(path + ".global_scale")) {
    RING_ASSIGN_OR_RETURN(TensorView g, Raw(path + ".global_scale", {}));
    if (g.numel() != 1) return absl::InvalidArgumentError(path + ".global_scale is not a scalar");
    w.global_scale = g.at(0);
  }
  RING_RETURN_IF_ERROR(ValidateQuantWeight(w));
  Shape got = w.weight.shape;
  got.back() = w.cols();
  if (got != logical) {
    return absl::InvalidArgumentError(absl::StrCat(path, " (", w.spec.ToString(),
                                                   ") has logical shape ", ShapeToString(got),
                                                   ", the config implies ",
                                                   ShapeToString(logical)));
  }
  RING_RETURN_IF_ERROR(backend_.AddWeight(w));
  return w;
}

absl::StatusOr<Mlp> LoadMlp(const WeightLoader& w, const std::string& prefix, int64_t hidden,
                            int64_t inter) {
  Mlp m;
  RING_ASSIGN_OR_RETURN(m.gate, w.Linear(prefix + ".gate_proj", {}, inter, hidden));
  RING_ASSIGN_OR_RETURN(m.up, w.Linear(prefix + ".up_proj", {}, inter, hidden));
  RING_ASSIGN_OR_RETURN(m.down, w.Linear(prefix + ".down_proj", {}, hidden, inter));
  return m;
}

absl::Status RunMlp(Backend& b, const Mlp& mlp, const float* x, int64_t m, ActDType t,
                    float* out) {
  const int64_t inter = mlp.gate.rows();
  RING_ASSIGN_OR_RETURN(Buffer g, b.AllocF(m * inter));
  RING_ASSIGN_OR_RETURN(const bool joint, b.LinearSwiGlu(mlp.gate, mlp.up, x, m, t, g.f()));
  if (!joint) {
    RING_ASSIGN_OR_RETURN(Buffer u, b.AllocF(m * inter));
    RING_RETURN_IF_ERROR(b.LinearMany({&mlp.gate, &mlp.up}, x, m, t, {g.f(), u.f()}));
    RING_RETURN_IF_ERROR(b.SwiGlu(g.f(), u.f(), m * inter, t, g.f()));
  }
  return b.Linear(mlp.down, g.f(), m, t, out);
}

absl::StatusOr<Experts> LoadExperts(const WeightLoader& w, const std::string& prefix,
                                    int64_t num, int64_t hidden, int64_t inter) {
  Experts e;
  e.num = num;
  RING_ASSIGN_OR_RETURN(e.gate, w.Linear(prefix + ".gate_proj", {num}, inter, hidden));
  RING_ASSIGN_OR_RETURN(e.up, w.Linear(prefix + ".up_proj", {num}, inter, hidden));
  RING_ASSIGN_OR_RETURN(e.down, w.Linear(prefix + ".down_proj", {num}, hidden, inter));
  return e;
}

absl::StatusOr<RopeTable> MakeRope(const RopeConfig& cfg, int64_t dims, bool traditional) {
  RopeTable r;
  r.dims = dims;
  r.traditional = traditional;
  const int64_t half = dims / 2;
  r.inv_freq.resize(half);
  const double base = cfg.theta;
  if (cfg.type == "default" || cfg.type == "linear") {
    const double scale = cfg.type == "linear" ? 1.0 / cfg.factor : 1.0;
    // mx.fast.rope: inv_freq_i = base^(-2i/dims), positions scaled by `scale`.
    for (int64_t i = 0; i < half; ++i) {
      const float inv = std::exp(-static_cast<float>(i) * (std::log(static_cast<float>(base)) /
                                                           static_cast<float>(half)));
      r.inv_freq[i] = inv * static_cast<float>(scale);
    }
    return r;
  }
  if (cfg.type == "yarn") {
    auto correction_dim = [&](double rot) {
      return (dims * std::log(cfg.original_max_position_embeddings / (rot * 2 * M_PI))) /
             (2 * std::log(base));
    };
    double low = std::max(std::floor(correction_dim(cfg.beta_fast)), 0.0);
    double high = std::min(std::ceil(correction_dim(cfg.beta_slow)), double(dims - 1));
    if (low == high) high += 0.001;
    auto get_mscale = [](double s, double m) { return s <= 1 ? 1.0 : 0.1 * m * std::log(s) + 1.0; };
    r.pre_scale = static_cast<float>(get_mscale(cfg.factor, cfg.mscale) /
                                     get_mscale(cfg.factor, cfg.mscale_all_dim));
    for (int64_t i = 0; i < half; ++i) {
      const float extra = std::pow(static_cast<float>(base), static_cast<float>(2 * i) / dims);
      const float inter = static_cast<float>(cfg.factor) * extra;
      float ramp = static_cast<float>((i - low) / (high - low));
      ramp = std::min(1.f, std::max(0.f, ramp));
      const float mask = 1.f - ramp;
      const float freq = (inter * extra) / (inter * mask + extra * (1 - mask));
      r.inv_freq[i] = 1.f / freq;
    }
    return r;
  }
  return absl::UnimplementedError("rope type '" + cfg.type + "' is not supported");
}

absl::Status CacheRows::Reserve(Backend& b, int64_t used, int64_t rows, int64_t max_rows,
                               const std::string& what) {
  if (rows <= capacity) return absl::OkStatus();
  int64_t want = std::max<int64_t>({rows, 2 * capacity, 16});
  if (max_rows > 0) want = std::max(rows, std::min(want, max_rows));
  absl::StatusOr<Buffer> grown = b.AllocF(want * width);
  if (!grown.ok() && want > rows) {
    want = rows;  // no headroom: try the exact size
    grown = b.AllocF(want * width);
  }
  if (!grown.ok()) {
    const int64_t free = b.FreeBytes();
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " needs ", want * width * 4, " bytes for ", want, " positions on ", b.name(),
        free >= 0 ? absl::StrCat(" (", free, " bytes free)") : std::string(), ": ",
        grown.status().message()));
  }
  if (used > 0) RING_RETURN_IF_ERROR(b.Copy2D(buf.f(), width, grown->f(), width, used, width));
  buf = *std::move(grown);
  capacity = want;
  return absl::OkStatus();
}

ActDType ActDTypeFromConfig(const ModelConfig& cfg) {
  if (cfg.torch_dtype == "bfloat16") return ActDType::kBF16;
  if (cfg.torch_dtype == "float16") return ActDType::kF16;
  return ActDType::kF32;
}

}  // namespace ring::internal
