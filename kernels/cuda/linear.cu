#include "kernels/cuda/linear.cuh"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/status.h"

namespace ring::cuda {
namespace {

// Elements of x a launch reads: the last problem's offset plus its m rows.
int64_t XSpan(const QMatmulArgs& a, int64_t k) {
  const int64_t ldx = a.ldx > 0 ? a.ldx : k;
  const int64_t routed = a.problems - a.alt_problems;
  int64_t last = routed > 0 ? (routed - 1) / std::max<int64_t>(a.x_problem_div, 1) : 0;
  if (a.alt_problems > 0) last = std::max(last, a.alt_x_row0 + a.alt_problems - 1);
  return last * a.x_problem_stride + (a.m - 1) * ldx + k;
}

// Elements of y a launch writes (for the f16 rounding pass): problems * stride or m rows.
int64_t YSpan(const QMatmulArgs& a, int64_t n) {
  const int64_t ldy = a.ldy > 0 ? a.ldy : n;
  return (a.problems - 1) * a.y_problem_stride + (a.m - 1) * ldy + n;
}

absl::Status Run(const DeviceQuantWeight& w, const QMatmulArgs& in, cpu::ActDType act,
                 bool transpose, cudaStream_t stream) {
  if (in.x_dtype != DType::kF32 &&
      !(in.x_dtype == DType::kBF16 && act == cpu::ActDType::kBF16)) {
    return absl::InvalidArgumentError("LinearT/N take fp32 activation storage (or bf16 in bf16 mode)");
  }
  const int64_t k = transpose ? w.cols : w.rows;
  const int64_t n = transpose ? w.rows : w.cols;
  QMatmulArgs a = in;
  a.round_bf16 = act == cpu::ActDType::kBF16;
  StreamBuffer xb;
  const bool affine_gemm = w.spec.mode == QuantMode::kAffine && a.m > 8;
  // transpose=false has tensor cores only through the GEMM (M > 8); at M <= 8 it runs
  // SIMT, which takes the fp32 x as it is, so no bf16 copy is made.
  // (x already bf16: the caller made that copy; the SIMT kernel reads either.)
  if ((transpose || a.m > 8) && act == cpu::ActDType::kBF16 && !affine_gemm) {
    if (a.x_dtype == DType::kF32) {
      const int64_t span = XSpan(a, k);
      RING_ASSIGN_OR_RETURN(xb, StreamBuffer::Allocate(span * 2, stream));
      RING_RETURN_IF_ERROR(ToBf16(static_cast<const float*>(a.x), span, xb.as<uint16_t>(), stream));
      a.x = xb.data();
      a.x_dtype = DType::kBF16;
    }
  } else {
    a.path = QmmPath::kSimt;
  }
  RING_RETURN_IF_ERROR(transpose ? QMatmulT(w, a, stream) : QMatmulN(w, a, stream));
  if (act == cpu::ActDType::kF16) {
    RING_RETURN_IF_ERROR(
        ScaleRound(DevMutArray{a.y, DType::kF32}, YSpan(a, n), 1.f, act, stream));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LinearTMany(absl::Span<const DeviceQuantWeight* const> ws,
                         absl::Span<float* const> ys, const QMatmulArgs& in, cpu::ActDType act,
                         cudaStream_t stream) {
  if (ws.empty() || ws.size() != ys.size()) {
    return absl::InvalidArgumentError("LinearTMany: weights and outputs differ in count");
  }
  bool same_cols = true;
  for (const DeviceQuantWeight* w : ws) same_cols = same_cols && w->cols == ws[0]->cols;
  if (ws.size() == 1 || !same_cols || act != cpu::ActDType::kBF16 || in.m > 8 ||
      in.x_dtype != DType::kF32) {
    for (size_t i = 0; i < ws.size(); ++i) {
      QMatmulArgs a = in;
      a.y = ys[i];
      if (i < 4) a.alt[0] = in.alt[i];
      RING_RETURN_IF_ERROR(Run(*ws[i], a, act, /*transpose=*/true, stream));
    }
    return absl::OkStatus();
  }
  // One bf16 copy of x for all of them (as Run makes for one).
  QMatmulArgs a = in;
  a.round_bf16 = true;
  const int64_t span = XSpan(a, ws[0]->cols);
  RING_ASSIGN_OR_RETURN(StreamBuffer xb, StreamBuffer::Allocate(span * 2, stream));
  RING_RETURN_IF_ERROR(ToBf16(static_cast<const float*>(a.x), span, xb.as<uint16_t>(), stream));
  a.x = xb.data();
  a.x_dtype = DType::kBF16;
  return QMatmulTMany(ws, ys, a, stream);
}

absl::Status LinearT(const DeviceQuantWeight& w, const QMatmulArgs& a, cpu::ActDType act,
                     cudaStream_t stream) {
  return Run(w, a, act, /*transpose=*/true, stream);
}

absl::Status LinearN(const DeviceQuantWeight& w, const QMatmulArgs& a, cpu::ActDType act,
                     cudaStream_t stream) {
  return Run(w, a, act, /*transpose=*/false, stream);
}

}  // namespace ring::cuda
