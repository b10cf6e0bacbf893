// File: kernels/cuda/qgemv.cuh
//
// Quantized matmuls on MLX-layout weights with fused dequantization (weights are never
// materialised in float): decode GEMV (M = 1..8 activation rows), prefill GEMM (M large),
// stacked weights (batch index), MoE gather (per-problem expert ids), transpose=false, and
// the embedding-row gather. Every MLX mode: mxfp4, nvfp4 (+ global scale), mxfp8, affine
// bits {2,3,4,5,6,8} x group {32,64,128} with bf16/fp16/fp32 scales, unquantized
// bf16/fp16/fp32.
//
// Kernel families, chosen by ResolveQmmPath (through SelectArchVariant, device.h):
//   kTensorCore  bf16 mma.sync (sm_80+), x in bf16. Two kernels:
//     decode GEMV (M <= 8, qgemv_gemv.cu): memory-bound, every weight byte read once
//       whatever M is. Formats: mxfp4, nvfp4 without global scale, mxfp8, bf16 (values
//       exact in bf16: products exact) and 4-bit affine with bf16 scales (any group) or
//       fp16 scales (group 64), computed exactly (integer codes on the tensor cores, scale
//       and bias per group in fp32). Matches the CPU reference up to fp32 summation order.
//     prefill GEMM (M > 8, qgemv.cu): block tiles of up to 256 weight rows x 128 tokens,
//       packed weights and bf16 x staged through shared memory by a cp.async pipeline and
//       decoded in registers right before the mma (never materialised in global memory).
//       Formats whose dequantized values are exact bf16 (fp modes, bf16 weights, and affine
//       with bf16 scales, whose weights T(T(s*q)+b) are rounded to bf16 first as
//       mx.dequantize / MLX's CUDA kernels do: not the CPU reference's fp32 s*q+b, a
//       relative difference <= 2^-8 per weight). Tiles are chosen to fit the device's
//       shared memory a block (16-bit weights on ~100 KB-per-block GPUs: a two-stage small
//       tile); where none fits (below 96 KB), SIMT runs instead.
//   kSimt        fp32 CUDA-core FMA, exact dequantization for every format and x in fp32
//                or bf16: the portable path and the reference-accurate one. Taken for
//                fp32 x and for formats neither tensor-core kernel handles at that M.
//
// Shapes and layout: W is [batch, rows, cols] (logical; packed per kernels/quant.h), the
// quantized axis is `cols`, which must be a multiple of 32. x and y are row-major.
//   QMatmulT (transpose=true, nn.Linear): y[p][m, rows] = x[p][m, cols] @ W_b(p)^T
//   QMatmulN (transpose=false):           y[p][m, cols] = x[p][m, rows] @ W_b(p)
//     At M > 8 with bf16 x on a format the prefill GEMM takes, QMatmulN decodes the weight
//     slices it uses into a transposed bf16 scratch (exact: the values are bf16) and runs
//     the prefill GEMM on it: the contraction runs along W's rows, across the quantized
//     axis, which the GEMM's decoders (pairs along the quantized axis) cannot feed directly.
// Accumulation is fp32; y is fp32, optionally rounded to bf16 values (cpu::RoundAct).
// Alignment: x must be 16-byte aligned with ldx a multiple of 8 elements (bf16) or 4 (fp32).
// All functions are asynchronous on `stream` and return a Status for invalid arguments or
// launch failures; kernel-side faults surface at the next synchronising call.
#ifndef RINGSERVE_KERNELS_CUDA_QGEMV_CUH_
#define RINGSERVE_KERNELS_CUDA_QGEMV_CUH_

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/dtype.h"
#include "kernels/quant.h"

namespace ring::cuda {

// A weight resident on the device, laid out as the checkpoint stores it, except that mxfp4
// words hold their nibbles in the GPU order (quant_decode.cuh, qdec::Mxfp4::Repack): same
// bytes, same scales, each 32-bit word's bits permuted so the decode needs fewer
// instructions. UploadQuantWeight converts them; a view built by hand over MLX-order bytes
// decodes wrong.
struct DeviceQuantWeight {
  QuantSpec spec;                  // mode kNone: a plain float matrix
  DType dtype = DType::kU32;       // kNone: F32/F16/BF16 elements; quantized: U32 words
  DType scale_dtype = DType::kU8;  // affine: F16/BF16/F32 (biases too); fp modes: U8
  const void* weight = nullptr;
  const void* scales = nullptr;
  const void* biases = nullptr;
  float global_scale = 0.f;        // nvfp4 only; 0 = absent
  int64_t batch = 1, rows = 0, cols = 0;
};

// A device copy of a host QuantWeight that owns its buffers (tests, bench, loaders).
struct OwnedDeviceWeight {
  DeviceQuantWeight view;
  DeviceBuffer weight, scales, biases;
};
absl::StatusOr<OwnedDeviceWeight> UploadQuantWeight(const QuantWeight& w);

enum class QmmPath : uint8_t { kAuto, kSimt, kTensorCore };
const char* QmmPathName(QmmPath p);

struct QMatmulArgs {
  const void* x = nullptr;
  DType x_dtype = DType::kF32;  // F32 or BF16
  int64_t m = 1;                // activation rows per problem
  int64_t ldx = 0;              // elements between x rows; 0 = dense
  float* y = nullptr;
  int64_t ldy = 0;              // elements between y rows; 0 = dense
  // `problems` independent matmuls in one launch. Problem p multiplies by slice
  //   b(p) = expert_ids ? expert_ids[p] : (batch == 1 ? 0 : batch_begin + p),
  // reads x at x + (p / x_problem_div) * x_problem_stride and writes y at
  // y + p * y_problem_stride (strides in elements). MoE decode: problems = tokens*k,
  // expert_ids = the router's choices, x_problem_div = k (gate/up share the token's row)
  // or 1 (down: one row per slot). An id outside [0, batch) yields NaN rows, never a read
  // out of bounds.
  int64_t problems = 1;
  const int32_t* expert_ids = nullptr;  // device memory, [problems]
  int64_t batch_begin = 0;
  int64_t x_problem_stride = 0;
  int64_t x_problem_div = 1;
  int64_t y_problem_stride = 0;
  // Grouped rows (MoE prefill: the slots routed to each expert, counts known only on the
  // device). When set, problem p (weight slice b(p) = p, expert_ids null) owns rows
  // [row_offsets[p], row_offsets[p+1]) of x and of y (x_problem_* and y_problem_stride are
  // unused), `m` is the total row count (row_offsets[problems] <= m: it sizes the grid) and
  // y_rows, when non-null, scatters: the result of row r goes to y row y_rows[r]. Tiles cover
  // each problem's own rows, so a problem with no rows costs no math. Prefill GEMM only
  // (bf16 x, a format with exact bf16 values): other arguments fail with InvalidArgument.
  const int32_t* row_offsets = nullptr;  // device memory, [problems + 1]
  const int32_t* y_rows = nullptr;       // device memory, [m]
  bool round_bf16 = false;
  // With round_bf16 on the decode GEMV: also write each output's bf16 bits at the same
  // element offset from y_bf16 as from y (the input of a next matmul, which then needs no
  // conversion launch). One weight a launch; elsewhere InvalidArgument.
  uint16_t* y_bf16 = nullptr;
  QmmPath path = QmmPath::kAuto;  // force a family (tests, bench)
  // Programmatic dependent launch for the decode GEMV (sm_90+; ignored elsewhere). 0: off.
  // 1: the kernel may become resident while the previous kernel in the stream still runs
  //    and waits for it (griddepcontrol.wait) before touching any memory.
  // 2: as 1, but it streams its first weights before that wait (expert ids, x and y still
  //    after it): only valid when no kernel that may still be running writes the weight.
  int overlap = 0;
  // MoE decode: the last `alt_problems` problems multiply by alt[i] for weight i of the
  // launch (a single batch-1 matrix with the layout of one slice of that weight: MoE's
  // shared expert) instead of an expert slice; problem p of them reads x row
  // alt_x_row0 + (p - (problems - alt_problems)), at x + row * x_problem_stride, and writes
  // y as any problem. Decode GEMV only (m <= 8, bf16 x on the tensor-core path); elsewhere
  // InvalidArgument. Expert ids are read for the other problems only.
  int64_t alt_problems = 0;
  const DeviceQuantWeight* alt[4] = {};
  int64_t alt_x_row0 = 0;
};

absl::Status QMatmulT(const DeviceQuantWeight& w, const QMatmulArgs& a, cudaStream_t stream);
absl::Status QMatmulN(const DeviceQuantWeight& w, const QMatmulArgs& a, cudaStream_t stream);

// y_i = x @ W_i^T for weights that share x (q/k/v, gate/up, MLA's q_a/kv_a): where the
// decode GEMV runs them (m <= 8, bf16 x) and they share format, group size, scale dtype,
// cols and batch (MoE: the gate and up stacks of the same experts), up to 4 at a time in one
// launch, so a decode step pays one kernel's ramp and tail instead of several; otherwise one
// QMatmulT each. `a` as for QMatmulT (no grouped rows); its y and ldy are ignored: ys[i] is
// part i's output, dense [m, rows_i], and problem p of every part writes at
// ys[i] + p * a.y_problem_stride.
// Each output equals QMatmulT's up to fp32 summation order (the launch may split K
// differently).
absl::Status QMatmulTMany(absl::Span<const DeviceQuantWeight* const> ws,
                          absl::Span<float* const> ys, const QMatmulArgs& a,
                          cudaStream_t stream);
// The kernel line QMatmulTMany would launch for 1..4 weights ("separate: N launches" when it
// would not combine them); bench and tests.
absl::StatusOr<std::string> DescribeQmmMany(absl::Span<const DeviceQuantWeight* const> ws,
                                            const QMatmulArgs& a);

// SwiGLU of two weights on one x in one decode-GEMV launch: y = cpu::SwiGlu(x @ gate^T,
// x @ up^T) with bf16 roundings, the two products rounded to bf16 first (a.round_bf16 is
// required), written where `a` says (y dense [m, rows] per problem at y_problem_stride; with
// a.y_bf16 also its bf16 bits), so that no gate/up outputs and no SwiGLU launch exist. The
// rows' sums are QMatmulTMany's, bit for bit. Expert ids and alt problems as for
// QMatmulTMany (alt[0] gate's, alt[1] up's). Only where the launch takes the column split
// (gate and up alike with the same rows, m <= 2, bf16 x; mxfp4 on a device whose MMA keeps
// subnormals, or 4-bit affine with its x staged): elsewhere FailedPrecondition and nothing is
// launched, and the caller runs QMatmulTMany and SwiGlu instead.
absl::Status QMatmulTSwiGlu(const DeviceQuantWeight& gate, const DeviceQuantWeight& up, const QMatmulArgs& a,
                            cudaStream_t stream);
// RING_FUSED_SWIGLU (read once): "0" has QMatmulTSwiGlu's callers (the routed experts, the
// CUDA backend's dense MLP) run QMatmulTMany and SwiGlu instead, for A/B runs (session 29
// called it RING_MOE_FUSED_SWIGLU, the experts' alone).
bool FusedSwiGluEnabled();
// Its launch line, or the FailedPrecondition it would return (bench, tests, callers' choice).
absl::StatusOr<std::string> DescribeQmmSwiGlu(const DeviceQuantWeight& gate, const DeviceQuantWeight& up,
                                              const QMatmulArgs& a);

// The family QMatmulT will run for these arguments on the current device (InvalidArgument
// when a forced kTensorCore is not applicable).
absl::StatusOr<QmmPath> ResolveQmmPath(const DeviceQuantWeight& w, const QMatmulArgs& a);

// One line naming the kernel and launch configuration QMatmulT would use (bench, logs).
absl::StatusOr<std::string> DescribeQmm(const DeviceQuantWeight& w, const QMatmulArgs& a);

// Whether `single` (batch 1) has the format, scale layout and shape of one slice of
// `stacked`: what QMatmulArgs::alt needs.
bool SameSliceLayout(const DeviceQuantWeight& stacked, const DeviceQuantWeight& single);

// Embedding lookup: out[t, :] = dequant(W[ids[t], :]) for t < n, W a 2-D weight
// [vocab, hidden]; out is F32 or BF16 [n, hidden]. Out-of-range ids give NaN rows.
// `round`: each value first rounded to that activation dtype (cpu::RoundAct), as the CPU
// engine's embedding is (one launch instead of a rounding pass after it).
absl::Status EmbedRows(const DeviceQuantWeight& w, const int32_t* ids, int64_t n, void* out,
                       DType out_dtype, cudaStream_t stream,
                       cpu::ActDType round = cpu::ActDType::kF32);

// Test hook: decodes every chunk of batch slice 0 through the tensor-core fast path and the
// exact path on the device and returns how many packed bf16 pairs differ (0 expected).
// Applies to formats with exact bf16 values; others return 0.
absl::StatusOr<int64_t> TEST_CountFastDecodeMismatches(const DeviceQuantWeight& w);

// Bench/test hook for the decode GEMV: variant < 0 = automatic, 0 = 16 rows per warp,
// 1 = 32 rows per warp (half the steps per batch; the affine kernel always uses 16),
// 2 / 3 / 4 = column-split mxfp4 kernels at m <= 2 (group scale applied in
// fp32 on the accumulators; 2 feeds the mma subnormal-encoded E2M1 values, 3 exact ones, 4
// is 2 with the activations staged in shared memory; 5 / 6 = 2 / 4 with 16 rows per warp;
// see qgemv_gemv.cu; other formats and m > 2 fall back to the automatic choice);
// wk_cap = most warps splitting K in a block (0 = automatic, -1 = the fill rule, -2 the fill
// rule restricted to splits that fit in one wave, 100 + n = exactly n).
void TEST_SetQgemvTuning(int variant, int wk_cap);

// Test hook for the prefill GEMM: -1 = automatic tile choice, 0 = 256 rows x 128 tokens,
// 1 = 128 x 128, 2 = 128 x 64. A forced tile that does not fit the device runs SIMT.
// wgmma = false keeps the GEMM on mma.sync on a device that has wgmma (DeviceInfo::wgmma).
void TEST_SetGemmTile(int tile, bool wgmma = true);
// The same tile choice for grouped-row launches (MoE experts in prefill) only: -1 = as
// TEST_SetGemmTile says (automatic: each problem's whole 128-token tiles on the large tile,
// rests of at most 64 tokens on the small one, two launches), 3 = that split even when
// TEST_SetGemmTile forces a tile.
void TEST_SetGroupedGemmTile(int tile);

}  // namespace ring::cuda

#endif  // RINGSERVE_KERNELS_CUDA_QGEMV_CUH_
