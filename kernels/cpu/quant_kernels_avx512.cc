// File: kernels/cpu/quant_kernels_avx512.cc
//
// AVX-512 kernel for 4-bit codes; see quant_kernels_avx512.h for the lane layout.
//
// Why this shape: with AVX2 the E2M1 decode cost a table shuffle, a byte move and an
// int->float conversion per 8 codes, so one core decoded ~6 GB/s and two cores could not
// keep up with DRAM. Here vpermps turns a lane's low nibble straight into its fp32 value
// (the table: E2M1 values, or 0..15 for affine codes), so 16 codes cost one shift, one
// permute and one FMA; the scale is applied once per chunk per lane (each lane sits in one
// group), as in the AVX2 kernels.
//
// Only function-level target attributes, no global -mavx512 flags: everything here is
// called after Supported(), and no inline function shared with other TUs is compiled with
// AVX-512 enabled (the linker could otherwise keep the AVX-512 copy for every caller).
#include "kernels/cpu/quant_kernels_avx512.h"

#include "kernels/cpu/quant_kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// GCC 12's _mm512_undefined_* self-initialise on purpose and trip -Wuninitialized where
// they inline (GCC PR 105593, fixed in 13).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#define RING_HAVE_AVX512_KERNELS 1
#define RING_AVX512 __attribute__((target("avx512f")))
#else
#define RING_HAVE_AVX512_KERNELS 0
#endif

namespace ring::cpu::avx512 {

#if RING_HAVE_AVX512_KERNELS

namespace {

template <int MB>
RING_AVX512 __attribute__((noinline)) void Nibble16RowT(const uint32_t* w, int64_t c0, int64_t c1,
                                                         const float* const* xp, const float* sc,
                                                         int log2_wpg, const float* table,
                                                         const uint8_t* next, float* out) {
  // Two accumulator chains keep the FMA latency hidden with one row of x; kept at two for
  // any MB because a row's sum must not depend on how many rows share the call
  // (Stage::ForwardBatch gives a sequence the same result alone and in a batch).
  constexpr int kChains = 2;
  const __m512 lut = _mm512_loadu_ps(table);
  const bool broadcast = log2_wpg >= 4;  // one group spans the whole chunk
  const __m512i lane_group = _mm512_srlv_epi32(
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
      _mm512_set1_epi32(broadcast ? 0 : log2_wpg));
  __m512 y[MB][kChains];
  for (int i = 0; i < MB; ++i)
    for (int h = 0; h < kChains; ++h) y[i][h] = _mm512_setzero_ps();
  for (int64_t c = c0; c < c1; ++c) {
    const uint32_t* wc = w + kChunkWords * c;
    // One prefetch per 64-byte chunk (one cache line); see PrefetchTarget.
    _mm_prefetch(reinterpret_cast<const char*>(
                     PrefetchTarget(reinterpret_cast<const uint8_t*>(w), c, c1, 4 * kChunkWords, next)),
                 _MM_HINT_T0);
    const __m512i v = _mm512_loadu_si512(wc);
    __m512 acc[MB][kChains];
#pragma GCC unroll 8
    for (int t = 0; t < 8; ++t) {
      const __m512i idx = t == 0 ? v : _mm512_srli_epi32(v, 4 * t);
      const __m512 e = _mm512_permutexvar_ps(idx, lut);
      const int h = t % kChains;
#pragma GCC unroll 4
      for (int i = 0; i < MB; ++i) {
        const __m512 xv = _mm512_loadu_ps(xp[i] + kChunkElems * c + 16 * t);
        acc[i][h] = t < kChains ? _mm512_mul_ps(xv, e) : _mm512_fmadd_ps(xv, e, acc[i][h]);
      }
    }
    const float* sp = sc + ((kChunkWords * c) >> log2_wpg);
    const __m512 sv = broadcast ? _mm512_set1_ps(*sp)
                                : _mm512_permutexvar_ps(lane_group, _mm512_loadu_ps(sp));
#pragma GCC unroll 4
    for (int i = 0; i < MB; ++i)
      for (int h = 0; h < kChains; ++h) y[i][h] = _mm512_fmadd_ps(sv, acc[i][h], y[i][h]);
  }
  for (int i = 0; i < MB; ++i) {
    __m512 s = y[i][0];
    for (int h = 1; h < kChains; ++h) s = _mm512_add_ps(s, y[i][h]);
    out[i] = _mm512_reduce_add_ps(s);
  }
}

}  // namespace

bool Supported() {
  // libgcc's cpuid check also requires the OS to save the zmm state (XCR0).
  static const bool ok = __builtin_cpu_supports("avx512f");
  return ok;
}

void PermuteNibble16(const float* x, int64_t n, float* xp) {
  for (int64_t c = 0; c < n; c += kChunkElems)
    for (int t = 0; t < 8; ++t)
      for (int j = 0; j < 16; ++j) xp[c + 16 * t + j] = x[c + 8 * j + t];
}

void Nibble16Row(const uint32_t* w, int64_t c0, int64_t c1, int mb, const float* const* xp,
                 const float* sc, int log2_wpg, const float* table, const uint8_t* next,
                 float* out) {
  WithRowsOfX(mb, [&](auto rows) {
    Nibble16RowT<rows()>(w, c0, c1, xp, sc, log2_wpg, table, next, out);
  });
}

#else  // !RING_HAVE_AVX512_KERNELS

bool Supported() { return false; }
void PermuteNibble16(const float*, int64_t, float*) {}
void Nibble16Row(const uint32_t*, int64_t, int64_t, int mb, const float* const*, const float*, int,
                 const float*, const uint8_t*, float* out) {
  for (int i = 0; i < mb; ++i) out[i] = 0.0f;
}

#endif

}  // namespace ring::cpu::avx512
