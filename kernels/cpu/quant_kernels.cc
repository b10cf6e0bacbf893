// File: kernels/cpu/quant_kernels.cc
//
// CPU kernels behind kernels/quant.h: scalar group decoders (the reference every vector
// path is tested against) and the quantized matmuls.
//
// Vector unpackers (x86 AVX2+FMA+F16C; other targets use the scalar decoders, which every
// vector path is tested against). All work on 32-byte chunks (8 uint32 words) and put
// word j of the chunk in lane j, so a lane's group is known per chunk and x is permuted
// (and pre-scaled) once per call to the order the unpacker produces:
//   affine 1/2/4/8-bit: code t of each word (t < 32/bits - 1) is isolated in place with an
//     AND and converted as q * 2^(bits*t), x carrying 2^-(bits*t); the top code is shifted
//     down. One integer op, one conversion and one FMA per 8 weights.
//   mxfp4/nvfp4: low and high nibbles index a 16-byte table of 2*E2M1 (signed bytes); a byte
//     shuffle then moves byte p of every word to the word's top byte, so the int32 is
//     2*E2M1*2^24, and 2^-25 is applied to the finished sum.
//   mxfp8: an E4M3 byte b becomes the fp16 pattern ((b & 0x80) << 8) | ((b & 0x7f) << 7),
//     whose value is exactly e4m3(b) / 256 (subnormals included), converted by F16C; the 256
//     rides on x. The NaN codes 0x7f/0xff come out as +-480 here (MLX gives NaN); mx.quantize
//     never writes them (to_fp8 saturates) and Dequantize still decodes them to NaN.
// Scaling x or the sum by powers of two is exact unless |x| < 2^-100 or |x * scale| > 2^100.
// Affine groups compute scale * sum(x * q) + bias * sum(x), sum(x) per group once per call.
// One row of x uses two accumulator chains; up to 4 rows of x share each decoded vector.
// On CPUs with AVX-512F the 4-bit formats use the kernel in quant_kernels_avx512.cc instead
// (chosen at run time, see ActiveQuantIsa); the other formats keep the AVX2 kernels.
#include "kernels/cpu/quant_kernels.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/quant_kernels_avx512.h"
#include "kernels/cpu/thread_pool.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define RING_QUANT_AVX2 1
#else
#define RING_QUANT_AVX2 0
#endif

namespace ring::cpu {
namespace {

constexpr float kFp4Lut[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

struct Tables {
  float e4m3[256];
  float e8m0[256];
  Tables() {
    for (int i = 0; i < 256; ++i) {
      e4m3[i] = E4M3ToFloat(static_cast<uint8_t>(i));
      e8m0[i] = E8M0ToFloat(static_cast<uint8_t>(i));
    }
  }
};
const Tables& GetTables() {
  static const Tables t;
  return t;
}

// The widest kernel set this build and CPU can run.
QuantIsa SupportedQuantIsa() {
  if (avx512::Supported() && RING_QUANT_AVX2) return QuantIsa::kAvx512;
  return RING_QUANT_AVX2 ? QuantIsa::kAvx2 : QuantIsa::kScalar;
}

// RING_CPU_QUANT_ISA=scalar|avx2|avx512 caps the default; other values are ignored.
QuantIsa DefaultQuantIsa() {
  const QuantIsa best = SupportedQuantIsa();
  const char* env = std::getenv("RING_CPU_QUANT_ISA");
  if (env == nullptr) return best;
  const std::string v = env;
  QuantIsa want = best;
  if (v == "scalar") want = QuantIsa::kScalar;
  if (v == "avx2") want = QuantIsa::kAvx2;
  if (v == "avx512") want = QuantIsa::kAvx512;
  return std::min(want, best);
}

std::atomic<QuantIsa>& IsaSetting() {
  static std::atomic<QuantIsa> isa{DefaultQuantIsa()};
  return isa;
}

inline float LoadFloat(const uint8_t* base, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, base + 4 * i, 4);
      return f;
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, base + 2 * i, 2);
      return Bf16ToFloat(h);
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, base + 2 * i, 2);
      return F16ToFloat(h);
    }
    default:
      return 0.0f;
  }
}

// n values of a float dtype (F32/F16/BF16) at p, widened to fp32.
void WidenFloats(const uint8_t* p, DType t, int64_t n, float* out) {
  int64_t i = 0;
  if (t == DType::kF32) {
    std::memcpy(out, p, n * 4);
    return;
  }
#if RING_QUANT_AVX2
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i));
    const __m256 f = t == DType::kBF16
                         ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                         : _mm256_cvtph_ps(h);
    _mm256_storeu_ps(out + i, f);
  }
#endif
  for (; i < n; ++i) out[i] = LoadFloat(p, t, i);
}

// Unpacks `n` (a multiple of the pack size) codes of `bits` bits starting at a pack
// boundary of the LSB-first bit stream `p`.
void UnpackCodes(const uint8_t* p, int bits, int64_t n, float* out) {
  switch (bits) {
    case 1:
    case 2:
    case 4:
    case 8: {
      const uint32_t mask = (1u << bits) - 1;
      const int per_byte = 8 / bits;
      for (int64_t i = 0; i < n / per_byte; ++i) {
        uint32_t v = p[i];
        for (int t = 0; t < per_byte; ++t) {
          out[i * per_byte + t] = static_cast<float>(v & mask);
          v >>= bits;
        }
      }
      return;
    }
    case 3:  // 8 codes per 3 bytes
      for (int64_t i = 0; i < n / 8; ++i) {
        const uint32_t v = p[3 * i] | (p[3 * i + 1] << 8) | (p[3 * i + 2] << 16);
        for (int t = 0; t < 8; ++t) out[8 * i + t] = static_cast<float>((v >> (3 * t)) & 7u);
      }
      return;
    case 5:  // 8 codes per 5 bytes
      for (int64_t i = 0; i < n / 8; ++i) {
        uint64_t v = 0;
        for (int k = 0; k < 5; ++k) v |= static_cast<uint64_t>(p[5 * i + k]) << (8 * k);
        for (int t = 0; t < 8; ++t) out[8 * i + t] = static_cast<float>((v >> (5 * t)) & 31u);
      }
      return;
    case 6:  // 4 codes per 3 bytes
      for (int64_t i = 0; i < n / 4; ++i) {
        const uint32_t v = p[3 * i] | (p[3 * i + 1] << 8) | (p[3 * i + 2] << 16);
        for (int t = 0; t < 4; ++t) out[4 * i + t] = static_cast<float>((v >> (6 * t)) & 63u);
      }
      return;
    default:
      return;
  }
}

float DotScalar(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

#if RING_QUANT_AVX2
inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
float Dot(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8)
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  return HSum(_mm256_add_ps(s0, s1)) + DotScalar(a + i, b + i, n - i);
}
// y[i] += a * x[i]
void Axpy(float a, const float* x, float* y, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += a * x[i];
}
#else
float Dot(const float* a, const float* b, int64_t n) { return DotScalar(a, b, n); }
void Axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}
#endif

// ---- kNone -------------------------------------------------------------------------

// Row r of a float weight as fp32.
void LoadDenseRow(const QSlice& s, int64_t r, float* out) {
  const uint8_t* p = s.row(r);
  switch (s.w_dtype) {
    case DType::kF32:
      std::memcpy(out, p, s.cols * 4);
      return;
    case DType::kBF16:
    case DType::kF16:
      WidenFloats(p, s.w_dtype, s.cols, out);
      return;
    default:
      return;
  }
}

void DenseMatmulT(const float* x, int64_t m, const QSlice& s, float* y) {
  ParallelFor(s.rows, 4, [&](int64_t r0, int64_t r1) {
    std::vector<float> buf(s.w_dtype == DType::kF32 ? 0 : s.cols);
    for (int64_t r = r0; r < r1; ++r) {
      const float* wr;
      if (s.w_dtype == DType::kF32) {
        wr = reinterpret_cast<const float*>(s.row(r));
      } else {
        LoadDenseRow(s, r, buf.data());
        wr = buf.data();
      }
      for (int64_t i = 0; i < m; ++i) y[i * s.rows + r] = Dot(x + i * s.cols, wr, s.cols);
    }
  });
}

// ---- quantized, transpose=true ---------------------------------------------------------

// kWordLane, kFp4, kFp8: the AVX2 kernels below; kNibble16: avx512::Nibble16Row.
enum class FastKind { kNone, kWordLane, kFp4, kFp8, kNibble16 };

struct FastPlan {
  FastKind kind = FastKind::kNone;
  int64_t chunk_elems = 0;  // logical elements per 32-byte chunk
  float post_scale = 1.0f;  // applied to the fast part of each dot product
};

FastPlan MakePlan(const QuantSpec& spec, QuantIsa isa) {
  FastPlan p;
  if (isa == QuantIsa::kScalar) return p;
  if (isa == QuantIsa::kAvx512 && spec.bits == 4 &&
      (spec.mode == QuantMode::kAffine || spec.mode == QuantMode::kMxfp4 ||
       spec.mode == QuantMode::kNvfp4)) {
    p.kind = FastKind::kNibble16;
    p.chunk_elems = avx512::kChunkElems;
    return p;
  }
#if RING_QUANT_AVX2
  switch (spec.mode) {
    case QuantMode::kAffine:
      if (spec.bits == 1 || spec.bits == 2 || spec.bits == 4 || spec.bits == 8) {
        p.kind = FastKind::kWordLane;
        p.chunk_elems = 8 * 32 / spec.bits;
      }
      break;
    case QuantMode::kMxfp4:
    case QuantMode::kNvfp4:
      p.kind = FastKind::kFp4;
      p.chunk_elems = 64;
      p.post_scale = 0x1p-25f;  // codes come out as 2 * E2M1 * 2^24
      break;
    case QuantMode::kMxfp8:
      p.kind = FastKind::kFp8;
      p.chunk_elems = 32;
      break;
    default:
      break;
  }
#endif
  return p;
}

// Permutes (and pre-scales) x[0, n), n a multiple of chunk_elems, into the lane order of
// the plan; see the file comment.
void PermuteX(const FastPlan& p, int bits, const float* x, int64_t n, float* xp) {
  if (p.kind == FastKind::kNibble16) return avx512::PermuteNibble16(x, n, xp);
  for (int64_t c = 0; c < n; c += p.chunk_elems) {
    const float* xc = x + c;
    float* o = xp + c;
    switch (p.kind) {
      case FastKind::kWordLane: {
        const int epw = 32 / bits;
        for (int t = 0; t < epw; ++t) {
          // Codes t < epw - 1 are converted in place (value q * 2^(bits*t)).
          const float f = t < epw - 1 ? std::ldexp(1.0f, -bits * t) : 1.0f;
          for (int j = 0; j < 8; ++j) o[8 * t + j] = xc[epw * j + t] * f;
        }
        break;
      }
      case FastKind::kFp4:
        for (int u = 0; u < 8; ++u)
          for (int j = 0; j < 8; ++j) o[8 * u + j] = xc[8 * j + 2 * (u / 2) + (u % 2)];
        break;
      case FastKind::kFp8:
        for (int k = 0; k < 4; ++k)
          for (int j = 0; j < 8; ++j)
            o[8 * k + j] = 256.0f * xc[k < 2 ? 16 * k + 2 * j : 16 * (k - 2) + 2 * j + 1];
        break;
      case FastKind::kNone:
      case FastKind::kNibble16:
        break;
    }
  }
}

#if RING_QUANT_AVX2

// Streaming from DRAM on a VM, hardware prefetch alone left ~1/3 of the bandwidth idle;
// a software prefetch kPrefetchBytes ahead of the current chunk measured ~1.5x on the
// bench machine. Prefetches never fault.
inline void PrefetchAhead(const uint8_t* row, int64_t c, int64_t c1, int chunk_bytes,
                          const uint8_t* next) {
  _mm_prefetch(reinterpret_cast<const char*>(PrefetchTarget(row, c, c1, chunk_bytes, next)),
               _MM_HINT_T0);
}

// Scale of every lane of chunk c (lane j = word j): one broadcast when a group spans the
// whole chunk, else a gather of the chunk's groups by lane.
struct LaneScales {
  int shift;  // log2(words per group); groups hold a power-of-two number of words
  bool broadcast;
  __m256i lane_group;
  explicit LaneScales(int words_per_group) {
    shift = 0;
    while ((1 << (shift + 1)) <= words_per_group) ++shift;
    broadcast = words_per_group >= 8;
    const int d = std::max(words_per_group, 1);
    lane_group = _mm256_setr_epi32(0, 1 / d, 2 / d, 3 / d, 4 / d, 5 / d, 6 / d, 7 / d);
  }
  __m256 Get(const float* sc, int64_t c) const {
    const float* p = sc + ((8 * c) >> shift);
    if (broadcast) return _mm256_set1_ps(*p);
    return _mm256_permutevar8x32_ps(_mm256_loadu_ps(p), lane_group);
  }
};

// kBits-bit affine codes, word-lane: code t < epw-1 is isolated in place by a mask and
// converted as q * 2^(bits*t) (x carries the 2^-(bits*t)); the top code is shifted down.
// MB rows of x at once; with one row, even and odd codes use two accumulators.
template <int kBits, int MB>
__attribute__((noinline)) void WordLaneRow(const uint32_t* w, int64_t c0, int64_t c1,
                                           const float* const* xp, const float* sc,
                                           const LaneScales& ls, const uint8_t* next,
                                           float* out) {
  constexpr int kEpw = 32 / kBits;
  // Two chains whatever MB is: a row's sum must not depend on how many rows share the
  // call (Stage::ForwardBatch gives a sequence the same result alone and in a batch).
  constexpr int kChains = 2;
  constexpr uint32_t kMask = (1u << kBits) - 1;
  __m256 y[MB][kChains];
#pragma GCC unroll 4
  for (int i = 0; i < MB; ++i)
    for (int h = 0; h < kChains; ++h) y[i][h] = _mm256_setzero_ps();
  for (int64_t c = c0; c < c1; ++c) {
    PrefetchAhead(reinterpret_cast<const uint8_t*>(w), c, c1, 32, next);
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 8 * c));
    __m256 acc[MB][kChains];
#pragma GCC unroll 32
    for (int t = 0; t < kEpw; ++t) {
      const __m256i qi =
          t < kEpw - 1
              ? _mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(kMask << (kBits * t))))
              : _mm256_srli_epi32(v, 32 - kBits);
      const __m256 qf = _mm256_cvtepi32_ps(qi);
      const int h = t % kChains;
#pragma GCC unroll 4
      for (int i = 0; i < MB; ++i) {
        const __m256 xv = _mm256_loadu_ps(xp[i] + c * 8 * kEpw + 8 * t);
        acc[i][h] = t < kChains ? _mm256_mul_ps(xv, qf) : _mm256_fmadd_ps(xv, qf, acc[i][h]);
      }
    }
    const __m256 sv = ls.Get(sc, c);
#pragma GCC unroll 4
    for (int i = 0; i < MB; ++i)
      for (int h = 0; h < kChains; ++h) y[i][h] = _mm256_fmadd_ps(sv, acc[i][h], y[i][h]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < MB; ++i) {
    __m256 s = y[i][0];
    for (int h = 1; h < kChains; ++h) s = _mm256_add_ps(s, y[i][h]);
    out[i] = HSum(s);
  }
}

// E2M1 codes (mxfp4, nvfp4), word-lane: low and high nibbles go through a byte table of
// 2 * E2M1 (signed), then a byte shuffle moves byte p of every word to its top byte and
// zeroes the rest, so the int32 is 2 * E2M1 * 2^24 (undone by the plan's post_scale).
template <int MB>
__attribute__((noinline)) void Fp4Row(const uint8_t* w, int64_t c0, int64_t c1,
                                      const float* const* xp, const float* sc, const LaneScales& ls,
                                      const uint8_t* next, float* out) {
  // Two chains whatever MB is: a row's sum must not depend on how many rows share the
  // call (Stage::ForwardBatch gives a sequence the same result alone and in a batch).
  constexpr int kChains = 2;
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  // to_top[p]: byte p of every dword to byte 3, the other bytes zeroed (index 0x80).
  __m256i to_top[4];
  for (int p = 0; p < 4; ++p) {
    const int z = static_cast<int>(0x00808080u | (static_cast<uint32_t>(p) << 24));
    to_top[p] = _mm256_add_epi32(
        _mm256_set1_epi32(z),
        _mm256_setr_epi32(0, 4 << 24, 8 << 24, 12 << 24, 0, 4 << 24, 8 << 24, 12 << 24));
  }
  const __m256i table = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12, 0,
                                         1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  __m256 y[MB][kChains];
#pragma GCC unroll 4
  for (int i = 0; i < MB; ++i)
    for (int h = 0; h < kChains; ++h) y[i][h] = _mm256_setzero_ps();
  for (int64_t c = c0; c < c1; ++c) {
    PrefetchAhead(w, c, c1, 32, next);
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * c));
    const __m256i lo = _mm256_shuffle_epi8(table, _mm256_and_si256(v, low4));
    const __m256i hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(v, 4), low4));
    __m256 acc[MB][kChains];
#pragma GCC unroll 8
    for (int u = 0; u < 8; ++u) {
      const int p = u / 2;
      const __m256i src = u % 2 ? hi : lo;
      const __m256i b = _mm256_shuffle_epi8(src, to_top[p]);
      const __m256 e = _mm256_cvtepi32_ps(b);
      const int h = u % kChains;
#pragma GCC unroll 4
      for (int i = 0; i < MB; ++i) {
        const __m256 xv = _mm256_loadu_ps(xp[i] + 64 * c + 8 * u);
        acc[i][h] = u < kChains ? _mm256_mul_ps(xv, e) : _mm256_fmadd_ps(xv, e, acc[i][h]);
      }
    }
    const __m256 sv = ls.Get(sc, c);
#pragma GCC unroll 4
    for (int i = 0; i < MB; ++i)
      for (int h = 0; h < kChains; ++h) y[i][h] = _mm256_fmadd_ps(sv, acc[i][h], y[i][h]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < MB; ++i) {
    __m256 s = y[i][0];
    for (int h = 1; h < kChains; ++h) s = _mm256_add_ps(s, y[i][h]);
    out[i] = HSum(s);
  }
}

// mxfp8 kernel: 32 E4M3 bytes per chunk, one group (32) per chunk.
template <int MB>
__attribute__((noinline)) void Fp8Row(const uint8_t* w, int64_t c0, int64_t c1,
                                      const float* const* xp, const float* sc,
                                      const uint8_t* next, float* out) {
  const __m256i sign = _mm256_set1_epi16(static_cast<int16_t>(0x8000));
  const __m256i mag = _mm256_set1_epi16(0x3f80);
  // Two chains whatever MB is: a row's sum must not depend on how many rows share the
  // call (Stage::ForwardBatch gives a sequence the same result alone and in a batch).
  constexpr int kChains = 2;
  __m256 y[MB][kChains];
#pragma GCC unroll 4
  for (int i = 0; i < MB; ++i)
    for (int h = 0; h < kChains; ++h) y[i][h] = _mm256_setzero_ps();
  for (int64_t c = c0; c < c1; ++c) {
    PrefetchAhead(w, c, c1, 32, next);
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * c));
    const __m256i lo = _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi16(v, 8), sign),
                                       _mm256_and_si256(_mm256_slli_epi16(v, 7), mag));
    const __m256i hi =
        _mm256_or_si256(_mm256_and_si256(v, sign), _mm256_and_si256(_mm256_srli_epi16(v, 1), mag));
    const __m256 e[4] = {_mm256_cvtph_ps(_mm256_castsi256_si128(lo)),
                         _mm256_cvtph_ps(_mm256_extracti128_si256(lo, 1)),
                         _mm256_cvtph_ps(_mm256_castsi256_si128(hi)),
                         _mm256_cvtph_ps(_mm256_extracti128_si256(hi, 1))};
    const __m256 sv = _mm256_set1_ps(sc[c]);
#pragma GCC unroll 4
    for (int i = 0; i < MB; ++i) {
      const float* xc = xp[i] + 32 * c;
      __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(xc), e[0]);
      __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(xc + 8), e[1]);
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(xc + 16), e[2], a0);
      a1 = _mm256_fmadd_ps(_mm256_loadu_ps(xc + 24), e[3], a1);
      if (kChains == 2) {
        y[i][0] = _mm256_fmadd_ps(sv, a0, y[i][0]);
        y[i][kChains - 1] = _mm256_fmadd_ps(sv, a1, y[i][kChains - 1]);
      } else {
        y[i][0] = _mm256_fmadd_ps(sv, _mm256_add_ps(a0, a1), y[i][0]);
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MB; ++i) {
    __m256 s = y[i][0];
    for (int h = 1; h < kChains; ++h) s = _mm256_add_ps(s, y[i][h]);
    out[i] = HSum(s);
  }
}

template <int MB>
void FastRowMB(const FastPlan& p, const QSlice& s, int64_t r, int64_t c0, int64_t c1,
               const float* const* xp, const float* sc, const uint8_t* next, float* out) {
  const uint8_t* w = s.row(r);
  const LaneScales ls(s.spec.group_size * s.spec.bits / 32);
  switch (p.kind) {
    case FastKind::kWordLane: {
      const uint32_t* wu = reinterpret_cast<const uint32_t*>(w);
      switch (s.spec.bits) {
        case 1:
          return WordLaneRow<1, MB>(wu, c0, c1, xp, sc, ls, next, out);
        case 2:
          return WordLaneRow<2, MB>(wu, c0, c1, xp, sc, ls, next, out);
        case 4:
          return WordLaneRow<4, MB>(wu, c0, c1, xp, sc, ls, next, out);
        default:
          return WordLaneRow<8, MB>(wu, c0, c1, xp, sc, ls, next, out);
      }
    }
    case FastKind::kFp4:
      return Fp4Row<MB>(w, c0, c1, xp, sc, ls, next, out);
    case FastKind::kFp8:
      return Fp8Row<MB>(w, c0, c1, xp, sc, next, out);
    case FastKind::kNone:
    case FastKind::kNibble16:
      break;
  }
  for (int i = 0; i < MB; ++i) out[i] = 0.0f;
}

void Avx2FastRow(const FastPlan& p, const QSlice& s, int64_t r, int64_t c0, int64_t c1, int mb,
                 const float* const* xp, const float* sc, const uint8_t* next, float* out) {
  WithRowsOfX(mb, [&](auto rows) { FastRowMB<rows()>(p, s, r, c0, c1, xp, sc, next, out); });
}
#else
void Avx2FastRow(const FastPlan&, const QSlice&, int64_t, int64_t, int64_t, int mb,
                 const float* const*, const float*, const uint8_t*, float* out) {
  for (int i = 0; i < mb; ++i) out[i] = 0.0f;
}
#endif

// Table of the AVX-512 kernel for affine 4-bit codes (E2M1 codes use kFp4Lut).
constexpr float kNibbleValues[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

// Partial dot products of row r over chunks [c0, c1) with mb (1..4) rows of permuted x;
// the plan's post_scale is not applied yet. `next`: the packed data the following call
// starts on, where prefetching continues past c1.
void FastRow(const FastPlan& p, const QSlice& s, int64_t r, int64_t c0, int64_t c1, int mb,
             const float* const* xp, const float* sc, const uint8_t* next, float* out) {
  if (p.kind == FastKind::kNibble16) {
    const int words_per_group = s.spec.group_size * s.spec.bits / 32;
    const int log2_wpg = std::bit_width(static_cast<unsigned>(words_per_group)) - 1;
    return avx512::Nibble16Row(reinterpret_cast<const uint32_t*>(s.row(r)), c0, c1, mb, xp, sc,
                               log2_wpg,
                               s.spec.mode == QuantMode::kAffine ? kNibbleValues : kFp4Lut, next,
                               out);
  }
  Avx2FastRow(p, s, r, c0, c1, mb, xp, sc, next, out);
}

constexpr int kMaxMB = 4;

}  // namespace

QuantIsa ActiveQuantIsa() { return IsaSetting().load(std::memory_order_relaxed); }

bool TEST_SetQuantIsa(QuantIsa isa) {
  if (isa > SupportedQuantIsa()) return false;
  IsaSetting().store(isa, std::memory_order_relaxed);
  return true;
}

QSlice MakeQSlice(const QuantWeight& w, int64_t b) {
  QSlice s;
  s.spec = w.spec;
  s.rows = w.rows();
  s.cols = w.cols();
  s.w_dtype = w.weight.dtype;
  if (w.spec.mode == QuantMode::kNone) {
    s.w_row_bytes = s.cols * DTypeSize(w.weight.dtype);
    s.w = static_cast<const uint8_t*>(w.weight.data) + b * s.rows * s.w_row_bytes;
    return s;
  }
  s.groups = s.cols / w.spec.group_size;
  s.w_row_bytes = w.weight.dim(-1) * 4;
  s.w = static_cast<const uint8_t*>(w.weight.data) + b * s.rows * s.w_row_bytes;
  s.s_dtype = w.scales.dtype;
  const int64_t s_slice_bytes = s.rows * s.groups * DTypeSize(s.s_dtype);
  s.scales = static_cast<const uint8_t*>(w.scales.data) + b * s_slice_bytes;
  if (w.spec.mode == QuantMode::kAffine) {
    s.biases = static_cast<const uint8_t*>(w.biases.data) + b * s_slice_bytes;
  }
  if (w.spec.mode == QuantMode::kNvfp4 && w.global_scale != 0.0f) {
    s.global_mult = w.global_scale / 2688.0f;  // 448 * 6, as MLX divides in fp32
  }
  return s;
}

void LoadRowScales(const QSlice& s, int64_t r, int64_t g0, int64_t g1, float* scale, float* bias) {
  const int64_t n = g1 - g0;
  const int64_t off = r * s.groups + g0;
  switch (s.spec.mode) {
    case QuantMode::kAffine: {
      const int es = DTypeSize(s.s_dtype);
      WidenFloats(s.scales + off * es, s.s_dtype, n, scale);
      WidenFloats(s.biases + off * es, s.s_dtype, n, bias);
      return;
    }
    case QuantMode::kMxfp4:
    case QuantMode::kMxfp8: {
      const uint8_t* b = s.scales + off;
      int64_t g = 0;
#if RING_QUANT_AVX2
      // E8M0 byte e is the fp32 pattern e << 23, except 0, which MLX reads as 2^-127.
      const __m256i zero = _mm256_setzero_si256();
      const __m256i sub = _mm256_set1_epi32(0x00400000);
      for (; g + 8 <= n; g += 8) {
        const __m256i e =
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + g)));
        const __m256i f =
            _mm256_blendv_epi8(_mm256_slli_epi32(e, 23), sub, _mm256_cmpeq_epi32(e, zero));
        _mm256_storeu_ps(scale + g, _mm256_castsi256_ps(f));
      }
#endif
      const float* t = GetTables().e8m0;
      for (; g < n; ++g) scale[g] = t[b[g]];
      return;
    }
    case QuantMode::kNvfp4: {
      const uint8_t* b = s.scales + off;
      const float mult = s.global_mult != 0.0f ? s.global_mult : 1.0f;
      int64_t g = 0;
#if RING_QUANT_AVX2
      // The fp16 pattern ((b & 0x80) << 8) | ((b & 0x7f) << 7) is e4m3(b) / 256 (the NaN
      // codes excepted, which take the scalar path). fp32(e4m3 * 256 / 256 * mult) is exact
      // up to the one rounding of e4m3 * mult, as in the scalar expression.
      const __m128i sign = _mm_set1_epi16(static_cast<int16_t>(0x8000));
      const __m128i mag = _mm_set1_epi16(0x3f80);
      const __m128i nan = _mm_set1_epi16(0x7f);
      for (; g + 8 <= n; g += 8) {
        const __m128i v =
            _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + g)));
        if (_mm_movemask_epi8(_mm_cmpeq_epi16(_mm_and_si128(v, nan), nan)) != 0) break;
        const __m128i h = _mm_or_si128(_mm_and_si128(_mm_slli_epi16(v, 8), sign),
                                       _mm_and_si128(_mm_slli_epi16(v, 7), mag));
        const __m256 e = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
        _mm256_storeu_ps(scale + g,
                         s.global_mult != 0.0f ? _mm256_mul_ps(e, _mm256_set1_ps(mult)) : e);
      }
#endif
      const float* t = GetTables().e4m3;
      for (; g < n; ++g) scale[g] = s.global_mult != 0.0f ? t[b[g]] * s.global_mult : t[b[g]];
      return;
    }
    case QuantMode::kNone:
      return;
  }
}

void DecodeGroup(const QSlice& s, int64_t r, int64_t g, float* out) {
  const int gs = s.spec.group_size;
  const uint8_t* p = s.row(r) + g * gs * s.spec.bits / 8;
  switch (s.spec.mode) {
    case QuantMode::kAffine:
      UnpackCodes(p, s.spec.bits, gs, out);
      return;
    case QuantMode::kMxfp4:
    case QuantMode::kNvfp4:
      for (int i = 0; i < gs / 2; ++i) {
        out[2 * i] = kFp4Lut[p[i] & 0xf];
        out[2 * i + 1] = kFp4Lut[p[i] >> 4];
      }
      return;
    case QuantMode::kMxfp8: {
      const float* t = GetTables().e4m3;
      for (int i = 0; i < gs; ++i) out[i] = t[p[i]];
      return;
    }
    case QuantMode::kNone:
      return;
  }
}

void MatmulT(const float* x, int64_t m, const QSlice& s, float* y) {
  if (m <= 0 || s.rows <= 0) return;
  if (s.spec.mode == QuantMode::kNone) return DenseMatmulT(x, m, s, y);
  const int64_t K = s.cols;
  const int64_t N = s.rows;
  const int gs = s.spec.group_size;
  const bool affine = s.spec.mode == QuantMode::kAffine;

  const FastPlan plan = MakePlan(s.spec, ActiveQuantIsa());
  // The vector kernels cover whole chunks; what remains is always whole groups.
  const int64_t nchunks = plan.kind == FastKind::kNone ? 0 : K / plan.chunk_elems;
  const int64_t fast_elems = nchunks * plan.chunk_elems;
  const int64_t fast_groups = fast_elems / gs;

  // Per call: x permuted into lane order, and sum(x) per group for the affine bias term.
  std::vector<float> xp_store(m * fast_elems);
  float* xp = xp_store.data();
  for (int64_t i = 0; i < m; ++i)
    PermuteX(plan, s.spec.bits, x + i * K, fast_elems, xp + i * fast_elems);
  std::vector<float> xsum(affine ? m * s.groups : 0);
  if (affine) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t g = 0; g < s.groups; ++g) {
        float acc = 0.0f;
        for (int j = 0; j < gs; ++j) acc += x[i * K + g * gs + j];
        xsum[i * s.groups + g] = acc;
      }
  }

  // x tiles must stay in L1 while they are reused: rows of W are processed in blocks of
  // kRowBlock, one K-tile of ~24 KiB of permuted x (for kMaxMB rows) at a time, when
  // kMaxMB permuted rows of x exceed 32 KiB (K > 2048; streaming x from L2 for every row
  // cost ~20% at K = 12288). The tiling depends on K only, so every output's summation
  // order is the same for any thread count and any m: a row of x gives the same result
  // alone and in a batch (Stage::ForwardBatch relies on it).
  int64_t tile_chunks = nchunks;
  const int64_t per_chunk = kMaxMB * plan.chunk_elems * 4;
  if (nchunks > 0 && nchunks * per_chunk > (32 << 10))
    tile_chunks = std::max<int64_t>(1, (24 << 10) / per_chunk);
  constexpr int64_t kRowBlock = 8;
  const int64_t chunk_bytes = plan.chunk_elems * s.spec.bits / 8;

  ParallelFor(N, 4, [&](int64_t r0, int64_t r1) {
    // Scales of the block's rows are contiguous in the checkpoint; one load per block,
    // padded for the kernels' 16-wide loads.
    std::vector<float> sc(kRowBlock * s.groups + 16, 0.0f),
        bi(affine ? kRowBlock * s.groups + 16 : 0), dec(gs);
    std::vector<float> acc(kRowBlock * m);
    for (int64_t rb = r0; rb < r1; rb += kRowBlock) {
      const int64_t re = std::min(r1, rb + kRowBlock);
      LoadRowScales(s, rb, 0, (re - rb) * s.groups, sc.data(), bi.data());
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t c0 = 0; c0 < nchunks; c0 += tile_chunks) {
        const int64_t c1 = std::min(nchunks, c0 + tile_chunks);
        for (int64_t r = rb; r < re; ++r) {
          // What the next FastRow call reads: the next row of this tile, else the block's
          // first row in the next tile, else the next block.
          const uint8_t* next = r + 1 < re    ? s.row(r + 1) + c0 * chunk_bytes
                                : c1 < nchunks ? s.row(rb) + c1 * chunk_bytes
                                               : s.row(re);
          for (int64_t i0 = 0; i0 < m; i0 += kMaxMB) {
            const int mb = static_cast<int>(std::min<int64_t>(kMaxMB, m - i0));
            const float* xps[kMaxMB];
            for (int i = 0; i < mb; ++i) xps[i] = xp + (i0 + i) * fast_elems;
            float part[kMaxMB];
            FastRow(plan, s, r, c0, c1, mb, xps, sc.data() + (r - rb) * s.groups, next, part);
            for (int i = 0; i < mb; ++i) acc[(r - rb) * m + i0 + i] += part[i];
          }
        }
      }
      for (int64_t r = rb; r < re; ++r) {
        float* a = acc.data() + (r - rb) * m;
        const float* scr = sc.data() + (r - rb) * s.groups;
        for (int64_t i = 0; i < m; ++i) a[i] *= plan.post_scale;
        for (int64_t g = fast_groups; g < s.groups; ++g) {
          DecodeGroup(s, r, g, dec.data());
          for (int64_t i = 0; i < m; ++i) a[i] += scr[g] * Dot(dec.data(), x + i * K + g * gs, gs);
        }
        for (int64_t i = 0; i < m; ++i) {
          if (affine)
            a[i] += Dot(bi.data() + (r - rb) * s.groups, xsum.data() + i * s.groups, s.groups);
          y[i * N + r] = a[i];
        }
      }
    }
  });
}

void MatmulN(const float* x, int64_t m, const QSlice& s, float* y) {
  if (m <= 0 || s.cols <= 0) return;
  const int64_t R = s.rows;  // reduction length
  const int64_t C = s.cols;
  if (s.spec.mode == QuantMode::kNone) {
    // Column blocks in parallel; every thread streams all rows of its block.
    ParallelFor((C + 63) / 64, 1, [&](int64_t b0, int64_t b1) {
      const int64_t c0 = b0 * 64, c1 = std::min(C, b1 * 64);
      std::vector<float> row(C);
      for (int64_t i = 0; i < m; ++i) std::fill(y + i * C + c0, y + i * C + c1, 0.0f);
      for (int64_t r = 0; r < R; ++r) {
        LoadDenseRow(s, r, row.data());
        for (int64_t i = 0; i < m; ++i)
          Axpy(x[i * R + r], row.data() + c0, y + i * C + c0, c1 - c0);
      }
    });
    return;
  }
  const int gs = s.spec.group_size;
  const bool affine = s.spec.mode == QuantMode::kAffine;
  // Blocks of whole groups; each thread owns y[:, block] and sum_r x[:, r] * bias[r, g].
  const int64_t groups_per_block = std::max<int64_t>(1, 256 / gs);
  const int64_t nblocks = (s.groups + groups_per_block - 1) / groups_per_block;
  ParallelFor(nblocks, 1, [&](int64_t b0, int64_t b1) {
    const int64_t g0 = b0 * groups_per_block, g1 = std::min(s.groups, b1 * groups_per_block);
    const int64_t c0 = g0 * gs, c1 = g1 * gs;
    std::vector<float> sc(g1 - g0), bi(affine ? g1 - g0 : 0), dec(gs);
    std::vector<float> bsum(affine ? m * (g1 - g0) : 0, 0.0f);
    for (int64_t i = 0; i < m; ++i) std::fill(y + i * C + c0, y + i * C + c1, 0.0f);
    for (int64_t r = 0; r < R; ++r) {
      LoadRowScales(s, r, g0, g1, sc.data(), bi.data());
      for (int64_t g = g0; g < g1; ++g) {
        DecodeGroup(s, r, g, dec.data());
        for (int64_t i = 0; i < m; ++i) {
          const float xr = x[i * R + r];
          Axpy(xr * sc[g - g0], dec.data(), y + i * C + g * gs, gs);
          if (affine) bsum[i * (g1 - g0) + (g - g0)] += xr * bi[g - g0];
        }
      }
    }
    if (affine) {
      for (int64_t i = 0; i < m; ++i)
        for (int64_t g = g0; g < g1; ++g) {
          const float b = bsum[i * (g1 - g0) + (g - g0)];
          float* yg = y + i * C + g * gs;
          for (int j = 0; j < gs; ++j) yg[j] += b;
        }
    }
  });
}

}  // namespace ring::cpu
