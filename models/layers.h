// File: models/layers.h  (internal to models/)
//
// Building blocks shared by the layer programs: loading a module's weights from a
// checkpoint with shape checks, and the blocks every family uses (linear, SwiGLU MLP,
// stacked experts, RoPE frequencies). Activations are fp32 buffers rounded to the
// model's activation dtype as MLX would store them.
#ifndef RINGSERVE_MODELS_LAYERS_H_
#define RINGSERVE_MODELS_LAYERS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/ops.h"
#include "kernels/quant.h"
#include "models/config.h"
#include "models/safetensors.h"

namespace ring::internal {

using cpu::ActDType;

class WeightLoader {
 public:
  WeightLoader(const Checkpoint& ckpt, const ModelConfig& cfg) : ckpt_(ckpt), cfg_(cfg) {}
  // A plain tensor with an exact expected shape (empty shape: any).
  absl::StatusOr<TensorView> Tensor(const std::string& name, const Shape& shape) const;
  bool Has(const std::string& name) const { return ckpt_.Has(name); }
  // The module at `path` (".weight", ".scales", ".biases"), quantized per the config's
  // quantization block; `lead` are the leading (stacked) dims, then [rows, cols] logical.
  absl::StatusOr<QuantWeight> Linear(const std::string& path, const Shape& lead, int64_t rows,
                                     int64_t cols) const;
  int64_t bytes() const { return bytes_; }

 private:
  const Checkpoint& ckpt_;
  const ModelConfig& cfg_;
  mutable int64_t bytes_ = 0;
};

// y[m, rows] = round(x[m, cols] @ W^T).
void Linear(const QuantWeight& w, const float* x, int64_t m, ActDType t, float* y);

struct Mlp {
  QuantWeight gate, up, down;
};
absl::StatusOr<Mlp> LoadMlp(const WeightLoader& w, const std::string& prefix, int64_t hidden,
                            int64_t inter);
// out[m, hidden] = down(silu(gate(x)) * up(x)).
void RunMlp(const Mlp& mlp, const float* x, int64_t m, ActDType t, float* out);

// Experts stacked along axis 0 (mlp.switch_mlp.{gate,up,down}_proj).
struct Experts {
  QuantWeight gate, up, down;
  int64_t num = 0;
};
absl::StatusOr<Experts> LoadExperts(const WeightLoader& w, const std::string& prefix,
                                    int64_t num, int64_t hidden, int64_t inter);
// out[k, hidden] = expert_e(x) for each of the k selected experts of one token.
void RunExperts(const Experts& ex, const float* x, const int32_t* ids, int64_t k, ActDType t,
                float* out);

// Inverse frequencies of a RoPE over `dims` features and the factor the rotated slice is
// multiplied by first (YaRN's mscale ratio; 1 otherwise), as mlx-lm's initialize_rope.
struct RopeTable {
  std::vector<float> inv_freq;
  float pre_scale = 1.f;
  int64_t dims = 0;
  bool traditional = false;
};
absl::StatusOr<RopeTable> MakeRope(const RopeConfig& cfg, int64_t dims, bool traditional);
// Applies the table to [tokens, heads, head_dim] rows (stride floats per token).
void ApplyRope(const RopeTable& r, float* x, int64_t tokens, int64_t heads, int64_t head_dim,
               int64_t stride, int64_t offset, ActDType t);

ActDType ActDTypeFromConfig(const ModelConfig& cfg);

}  // namespace ring::internal

#endif  // RINGSERVE_MODELS_LAYERS_H_
