// File: kernels/quant.h
//
// MLX quantization formats, bit-exact with MLX (see shared spec §4), on the CPU.
//
// A QuantWeight describes one (possibly stacked) matrix exactly as an MLX checkpoint
// stores it: quantization runs along the LAST axis in groups of `group_size`; the packed
// weight is uint32 words with the last dim = logical_last_dim * bits / 32; `scales` (and,
// for affine, `biases`) have last dim = logical_last_dim / group_size. Leading dims
// (experts, heads) are "batch" dims. An unquantized matrix (mode kNone) is a float view.
//
// Logical shape of a 2-D slice is [rows, cols] where cols is the quantized (last) axis.
//   - transpose=true  (nn.Linear):  y[M, rows] = x[M, cols] @ W^T
//   - transpose=false (MultiLinear embed_q): y[M, cols] = x[M, rows] @ W
//
// Example (one token through a quantized Linear):
//
//   QuantWeight w{.spec = {QuantMode::kAffine, 4, 64}, .weight = wq, .scales = s,
//                 .biases = b, .name = "q_proj"};
//   RING_RETURN_IF_ERROR(ValidateQuantWeight(w));
//   std::vector<float> y(w.rows());
//   QMatmulT(x.data(), /*m=*/1, w, /*b=*/0, y.data());
//
// Arithmetic contract (established against mlx 0.32.4 on the CPU; tests/oracle/
// quant_fixtures.py + kernels/quant_mlx_test.cc check every line of it):
//   * Dequantize/DequantizeRows return exactly what mx.dequantize returns with its default
//     output dtype (see DequantizeDType), widened to fp32:
//       affine: T(T(scale * q) + bias), T = the scales dtype, each op rounded to T (no FMA);
//       mxfp4/mxfp8: bf16(element * 2^(s-127)), s == 0 meaning 2^-127, s == 255 meaning inf;
//       nvfp4: bf16(element * e4m3(s)); with a global scale the output is fp32 and equals
//              element * fp32(e4m3(s) * fp32(global_scale / 2688)).
//   * QMatmulT/QMatmulN use the weight values MLX's quantized_matmul uses for fp32
//     activations (affine: scale * q + bias in fp32, NOT rounded to the scales dtype; fp
//     modes: element * scale, exact), accumulate in fp32 and return fp32. They match MLX's
//     fp32 quantized_matmul to fp32 rounding (the vector kernels rescale x and partial sums
//     by powers of two, exact while |x| >= 2^-100 and |x * scale| <= 2^100; the summation
//     order differs from MLX's). MLX's CPU backend computes bf16 activations in
//     bf16 arithmetic (every product and partial sum rounded to bf16); callers that need
//     that exact behaviour must emulate it, these kernels deliberately do not.
// Thread-safety: all functions are reentrant; matmuls use cpu::ParallelFor internally.
#ifndef RINGSERVE_KERNELS_QUANT_H_
#define RINGSERVE_KERNELS_QUANT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/tensor.h"

namespace ring {

enum class QuantMode : uint8_t { kNone, kAffine, kMxfp4, kMxfp8, kNvfp4 };

const char* QuantModeName(QuantMode m);  // "none", "affine", "mxfp4", "mxfp8", "nvfp4"
absl::StatusOr<QuantMode> ParseQuantMode(absl::string_view name);

struct QuantSpec {
  QuantMode mode = QuantMode::kNone;
  int bits = 0;        // affine: 1,2,3,4,5,6,8; mxfp4/nvfp4: 4; mxfp8: 8; none: 0
  int group_size = 0;  // affine: 32,64,128; mxfp4/mxfp8: 32; nvfp4: 16; none: 0
  bool operator==(const QuantSpec&) const = default;
  std::string ToString() const;  // e.g. "mxfp4/g32/b4", "affine/g64/b4", "none"
};
// Validates a bits/group/mode combination that MLX accepts (mlx 0.32.4 also accepts
// affine bits=1). kNone requires bits == group_size == 0.
absl::Status ValidateQuantSpec(const QuantSpec& spec);
// Default (group_size, bits) of a mode as mlx_lm.convert uses them.
QuantSpec DefaultQuantSpec(QuantMode mode);

struct QuantWeight {
  QuantSpec spec;
  TensorView weight;          // kNone: float [..., rows, cols]; else U32 [..., rows, cols*bits/32]
  TensorView scales;          // [..., rows, cols/group]; affine: F16/BF16/F32; fp modes: U8
  TensorView biases;          // affine only, same shape/dtype as scales
  float global_scale = 0.0f;  // nvfp4 only; 0 means absent
  std::string name;           // for error messages

  int64_t rows() const;   // logical second-to-last dim
  int64_t cols() const;   // logical last dim (the quantized axis)
  int64_t batch() const;  // product of leading dims (1 for a plain matrix)
};

// Checks dtypes and shapes of weight/scales/biases against the spec, naming `name`.
// InvalidArgument on any mismatch; OK means every other function below may be called.
absl::Status ValidateQuantWeight(const QuantWeight& w);

// The dtype mx.dequantize returns by default for `w` (affine: the scales dtype; mxfp4,
// mxfp8, nvfp4: BF16; nvfp4 with a global scale: F32; kNone: the weight dtype).
DType DequantizeDType(const QuantWeight& w);

// Logical rows [row_begin, row_end) of batch slice `b`, dequantized to fp32 exactly as
// mx.dequantize computes them (values representable in DequantizeDType(w)).
// `out` holds (row_end - row_begin) * cols floats. Requires a valid `w`.
void DequantizeRows(const QuantWeight& w, int64_t b, int64_t row_begin, int64_t row_end,
                    float* out);
// The whole tensor, fp32, shape batch x rows x cols.
std::vector<float> Dequantize(const QuantWeight& w);

// y[M, rows] = x[M, cols] @ W_b^T   (transpose=true). fp32 accumulation.
// Works on the packed weights (no full dequantization); fastest for M <= 8.
void QMatmulT(const float* x, int64_t m, const QuantWeight& w, int64_t b, float* y);
// y[M, cols] = x[M, rows] @ W_b     (transpose=false). fp32 accumulation.
void QMatmulN(const float* x, int64_t m, const QuantWeight& w, int64_t b, float* y);

// Encoders, following MLX's CPU quantizers, so `ringctl synth` writes exactly what
// mx.quantize would. Input w is fp32 [rows, cols] holding values of `scale_dtype`
// (F32/F16/BF16: the dtype of the array one would hand to mx.quantize). For affine the
// scales/biases are stored in that dtype; the fp modes always store U8 scales, but do
// their intermediate rounding in that dtype exactly as MLX does (U8 is accepted for the fp
// modes and means F32). Output bytes equal mx.quantize's for every finite input; inputs
// with NaN/inf give MLX's observed result for affine, and a best-effort imitation (scale
// byte 128, elements as MLX's division by zero gives them) for the fp modes.
struct QuantizedBuffers {
  std::vector<uint32_t> weight;  // [rows, cols*bits/32]
  std::vector<uint8_t> scales;   // raw bytes: rows*(cols/group) elements of scale dtype
  std::vector<uint8_t> biases;   // affine only
  DType scale_dtype = DType::kU8;
};
absl::StatusOr<QuantizedBuffers> Quantize(const float* w, int64_t rows, int64_t cols,
                                          const QuantSpec& spec, DType scale_dtype);
// nvfp4 with mx.quantize(..., global_scale=gs): scale byte = e4m3(T(amax/6) * (2688/gs)).
// global_scale == 0 is the same as the overload above. Other modes reject a non-zero one.
absl::StatusOr<QuantizedBuffers> Quantize(const float* w, int64_t rows, int64_t cols,
                                          const QuantSpec& spec, DType scale_dtype,
                                          float global_scale);

}  // namespace ring

#endif  // RINGSERVE_KERNELS_QUANT_H_
