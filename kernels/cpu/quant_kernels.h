// File: kernels/cpu/quant_kernels.h
//
// Internal to kernels/quant.cc: one batch slice of a QuantWeight resolved to raw pointers,
// the per-group decoders shared by dequantization and the matmuls, and the CPU matmul
// kernels. Callers outside kernels/ use kernels/quant.h.
//
// Matmul design (kernels/cpu/quant_kernels.cc): the weights are never dequantized as a
// whole. Per output row the kernels walk 32-byte chunks of packed words, turn them into
// eight fp32 lanes at a time in registers, and FMA them against a copy of x that was
// permuted once per call so that the lane order produced by the cheapest unpacking matches
// (no shuffles per weight). Per group: y += scale * sum(x * code) (+ bias * sum(x), with
// sum(x) per group also computed once per call). With AVX-512 the 4-bit formats use
// 64-byte chunks and sixteen lanes instead (quant_kernels_avx512.h). Formats without a
// vector unpacker (3, 5, 6-bit affine) and row tails shorter than a chunk use the scalar
// group decoder.
#ifndef RINGSERVE_KERNELS_CPU_QUANT_KERNELS_H_
#define RINGSERVE_KERNELS_CPU_QUANT_KERNELS_H_

#include <cstdint>
#include <type_traits>

#include "kernels/quant.h"

namespace ring::cpu {

struct QSlice {
  QuantSpec spec;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t groups = 0;  // per row; 0 for kNone
  const uint8_t* w = nullptr;
  int64_t w_row_bytes = 0;
  DType w_dtype = DType::kU32;  // kNone: F32/F16/BF16
  const uint8_t* scales = nullptr;
  const uint8_t* biases = nullptr;
  DType s_dtype = DType::kU8;
  float global_mult = 0.0f;  // nvfp4 with a global scale: fp32(global_scale / 2688); else 0

  const uint8_t* row(int64_t r) const { return w + r * w_row_bytes; }
};
// The vector kernels MatmulT uses (MatmulN and the decoders do not depend on it). The
// default is the widest one this build and CPU support: AVX-512 (4-bit formats only; the
// others stay on AVX2) when cpuid reports AVX-512F, else AVX2 on x86 builds, else scalar.
// RING_CPU_QUANT_ISA=scalar|avx2|avx512 in the environment caps the default, e.g. to
// reproduce an AVX2 host's results bit for bit. Results differ between ISAs by fp32
// rounding only (summation order), never with the thread count.
enum class QuantIsa : uint8_t { kScalar, kAvx2, kAvx512 };
QuantIsa ActiveQuantIsa();
// Test hook: MatmulT uses `isa` from now on, process-wide. Returns false (and changes
// nothing) when this build or CPU cannot run it.
bool TEST_SetQuantIsa(QuantIsa isa);

// Requires ValidateQuantWeight(w).ok() and 0 <= b < w.batch().
QSlice MakeQSlice(const QuantWeight& w, int64_t b);

// Scales (and affine biases) of groups [g0, g1) of row r as fp32 with matmul semantics:
// affine scales and biases widened from their dtype; mxfp4/mxfp8: 2^(s-127); nvfp4:
// e4m3(s), times global_mult when present. scale[g - g0] (bias: affine only). Rows are
// contiguous, so g1 may run past `groups` into the following rows (a block of rows at once).
void LoadRowScales(const QSlice& s, int64_t r, int64_t g0, int64_t g1, float* scale, float* bias);

// The codes of group g of row r in natural order, as fp32: affine: q in [0, 2^bits);
// mxfp4/nvfp4: the E2M1 value; mxfp8: the E4M3 value. `out` holds group_size floats.
void DecodeGroup(const QSlice& s, int64_t r, int64_t g, float* out);

// The matmul kernels walk chunks [c0, c1) of one row's packed codes per call and prefetch
// 2 KiB ahead of the chunk they read: inside the range, then on into `next`, the data
// the following call starts on (the next row, or the next K-tile of the row block), which
// is not contiguous when K is tiled. Prefetches never fault, so `next` may point anywhere.
inline const uint8_t* PrefetchTarget(const uint8_t* row, int64_t c, int64_t c1,
                                     int64_t chunk_bytes, const uint8_t* next) {
  constexpr int64_t kPrefetchBytes = 2048;
  const int64_t past_end = (c - c1) * chunk_bytes + kPrefetchBytes;
  return past_end < 0 ? row + c1 * chunk_bytes + past_end : next + past_end;
}

// The kernels are templates on the number of rows of x that share each decoded vector
// (1..4); this calls f(std::integral_constant<int, MB>{}) with MB = mb, 4 for mb > 4.
template <typename F>
decltype(auto) WithRowsOfX(int mb, F&& f) {
  switch (mb) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    default:
      return f(std::integral_constant<int, 4>{});
  }
}

// y[m, rows] = x[m, cols] @ W^T and y[m, cols] = x[m, rows] @ W for one slice.
void MatmulT(const float* x, int64_t m, const QSlice& s, float* y);
void MatmulN(const float* x, int64_t m, const QSlice& s, float* y);

}  // namespace ring::cpu

#endif  // RINGSERVE_KERNELS_CPU_QUANT_KERNELS_H_
