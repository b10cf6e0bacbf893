// File: kernels/cuda/linear.cuh
//
// Quantized matmuls on activation buffers: the bridge between the engine's activation
// storage (fp32 arrays holding values already rounded to the activation dtype, as the CPU
// reference keeps them) and QMatmulT/QMatmulN (qgemv.cuh). It makes the one decision the
// model needs about which matmul kernel family runs:
//   * act bf16: x is converted to bf16 (exact: the values are bf16) so the tensor-core
//     decode GEMV (M <= 8) and prefill GEMM (M > 8; transpose=false through a transposed
//     bf16 copy of the weight slices, qgemv.cuh) apply; affine weights at M > 8 keep the
//     exact SIMT kernel, because the GEMM rounds affine weights to bf16 (qgemv.cuh) and the
//     CPU reference does not;
//   * act f32/f16: x stays fp32 (SIMT, exact dequantization);
// and rounds y to the activation dtype (bf16 inside the kernel, f16 by a second pass).
// Arguments are QMatmulArgs with x as fp32 (x_dtype F32, path kAuto), or in bf16 mode x as
// the bf16 bits of those values (x_dtype BF16: the copy above, made by the caller); every
// other field (problems, expert ids, strides) is passed through.
#ifndef RINGSERVE_KERNELS_CUDA_LINEAR_CUH_
#define RINGSERVE_KERNELS_CUDA_LINEAR_CUH_

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/qgemv.cuh"

namespace ring::cuda {

// y[p][m, rows] = round(x[p][m, cols] @ W_b(p)^T).
absl::Status LinearT(const DeviceQuantWeight& w, const QMatmulArgs& a, cpu::ActDType act,
                     cudaStream_t stream);
// LinearT for weights that share x (`a` as for LinearT, y ignored: ys[i] is weight i's),
// with one bf16 copy of x and one QMatmulTMany launch where the decode GEMV takes them all.
absl::Status LinearTMany(absl::Span<const DeviceQuantWeight* const> ws,
                         absl::Span<float* const> ys, const QMatmulArgs& a, cpu::ActDType act,
                         cudaStream_t stream);
// y[p][m, cols] = round(x[p][m, rows] @ W_b(p)) (transpose=false).
absl::Status LinearN(const DeviceQuantWeight& w, const QMatmulArgs& a, cpu::ActDType act,
                     cudaStream_t stream);

}  // namespace ring::cuda

#endif  // RINGSERVE_KERNELS_CUDA_LINEAR_CUH_
