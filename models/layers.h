// File: models/layers.h  (internal to models/)
//
// Building blocks shared by the layer programs: loading a module's weights from a
// checkpoint with shape checks (registering each with the stage's backend), and the blocks
// every family uses (SwiGLU MLP, stacked experts, RoPE frequencies, per-sequence caches).
// Activations are fp32 buffers in backend memory, rounded to the model's activation dtype as
// MLX would store them.
#ifndef RINGSERVE_MODELS_LAYERS_H_
#define RINGSERVE_MODELS_LAYERS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/ops.h"
#include "kernels/quant.h"
#include "models/backend.h"
#include "models/config.h"
#include "models/safetensors.h"

namespace ring::internal {

using cpu::ActDType;

class WeightLoader {
 public:
  WeightLoader(const Checkpoint& ckpt, const ModelConfig& cfg, Backend& backend)
      : ckpt_(ckpt), cfg_(cfg), backend_(backend) {}
  // A plain tensor with an exact expected shape (empty shape: any), registered with the
  // backend (norm weights, biases).
  absl::StatusOr<TensorView> Tensor(const std::string& name, const Shape& shape) const;
  bool Has(const std::string& name) const { return ckpt_.Has(name); }
  // The module at `path` (".weight", ".scales", ".biases"), quantized per the config's
  // quantization block; `lead` are the leading (stacked) dims, then [rows, cols] logical.
  absl::StatusOr<QuantWeight> Linear(const std::string& path, const Shape& lead, int64_t rows,
                                     int64_t cols) const;
  int64_t bytes() const { return bytes_; }

 private:
  // The checkpoint tensor without registering it (parts of a quantized Linear).
  absl::StatusOr<TensorView> Raw(const std::string& name, const Shape& shape) const;
  const Checkpoint& ckpt_;
  const ModelConfig& cfg_;
  Backend& backend_;
  mutable int64_t bytes_ = 0;
};

struct Mlp {
  QuantWeight gate, up, down;
};
absl::StatusOr<Mlp> LoadMlp(const WeightLoader& w, const std::string& prefix, int64_t hidden,
                            int64_t inter);
// out[m, hidden] = down(silu(gate(x)) * up(x)).
absl::Status RunMlp(Backend& b, const Mlp& mlp, const float* x, int64_t m, ActDType t,
                    float* out);

// Experts stacked along axis 0 (mlp.switch_mlp.{gate,up,down}_proj).
struct Experts {
  QuantWeight gate, up, down;
  int64_t num = 0;
};
absl::StatusOr<Experts> LoadExperts(const WeightLoader& w, const std::string& prefix,
                                    int64_t num, int64_t hidden, int64_t inter);
// RoPE table of the config (RopeTable in backend.h).
absl::StatusOr<RopeTable> MakeRope(const RopeConfig& cfg, int64_t dims, bool traditional);

// One per-layer cache of a sequence: `width` floats per position in backend memory. Rows
// [0, position) are valid; a step writes rows [position, position + T) after Reserve, so a
// step that fails leaves the valid rows untouched and can be retried.
struct CacheRows {
  int64_t width = 0;
  int64_t capacity = 0;  // rows allocated
  Buffer buf;
  float* row(int64_t r) const { return buf.f() + r * width; }
  // Makes room for `rows` positions (keeping the valid `used` rows), growing geometrically
  // up to `max_rows` (<= 0: unbounded). ResourceExhausted names `what` and the sizes.
  absl::Status Reserve(Backend& b, int64_t used, int64_t rows, int64_t max_rows,
                       const std::string& what);
};

ActDType ActDTypeFromConfig(const ModelConfig& cfg);

}  // namespace ring::internal

#endif  // RINGSERVE_MODELS_LAYERS_H_
