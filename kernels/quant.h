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
// Arithmetic contract: dequantized values are what mx.dequantize returns (bit-exact);
// matmuls accumulate in fp32 and return fp32 (callers round to bf16 where MLX would).
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
  int bits = 0;        // affine: 2,3,4,5,6,8; mxfp4/nvfp4: 4; mxfp8: 8
  int group_size = 0;  // affine: 32,64,128; mxfp4/mxfp8: 32; nvfp4: 16
  bool operator==(const QuantSpec&) const = default;
  std::string ToString() const;  // e.g. "mxfp4/g32/b4", "affine/g64/b4", "none"
};
// Validates a bits/group/mode combination that MLX accepts.
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
absl::Status ValidateQuantWeight(const QuantWeight& w);

// Logical rows [row_begin, row_end) of batch slice `b`, dequantized to fp32 exactly as
// mx.dequantize computes them (values representable in the MLX output dtype).
void DequantizeRows(const QuantWeight& w, int64_t b, int64_t row_begin, int64_t row_end,
                    float* out);
// The whole tensor, fp32, shape batch x rows x cols.
std::vector<float> Dequantize(const QuantWeight& w);

// y[M, rows] = x[M, cols] @ W_b^T   (transpose=true). fp32 accumulation.
void QMatmulT(const float* x, int64_t m, const QuantWeight& w, int64_t b, float* y);
// y[M, cols] = x[M, rows] @ W_b     (transpose=false). fp32 accumulation.
void QMatmulN(const float* x, int64_t m, const QuantWeight& w, int64_t b, float* y);

// Encoders, following MLX's reference quantizers (ops.cpp), so `ringctl synth` writes
// exactly what mx.quantize would. Input w is fp32 [rows, cols] (already rounded to the
// model dtype by the caller). scale_dtype applies to affine scales/biases.
struct QuantizedBuffers {
  std::vector<uint32_t> weight;  // [rows, cols*bits/32]
  std::vector<uint8_t> scales;   // raw bytes: rows*(cols/group) elements of scale dtype
  std::vector<uint8_t> biases;   // affine only
  DType scale_dtype = DType::kU8;
};
absl::StatusOr<QuantizedBuffers> Quantize(const float* w, int64_t rows, int64_t cols,
                                          const QuantSpec& spec, DType scale_dtype);

}  // namespace ring

#endif  // RINGSERVE_KERNELS_QUANT_H_
