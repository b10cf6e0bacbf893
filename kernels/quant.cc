// File: kernels/quant.cc
//
// MLX quantization formats: spec/shape validation, exact dequantization, the MLX CPU
// quantizers, and dispatch to the matmul kernels in kernels/cpu/quant_kernels.cc.
//
// Where MLX rounds (mlx 0.32.4, CPU; found by experiment against mx.* and pinned by
// kernels/quant_mlx_test.cc):
//   * affine dequantize: every op in the scales dtype T: T(T(scale * q) + bias). For T=F32
//     that is two fp32 roundings, never an FMA; the product is formed in double (exact for
//     a 24-bit scale times an 8-bit q) so no compiler contraction can fuse it.
//   * affine quantize (CPU kernel): min/max, scale, edge, q0 and the codes in fp32 from the
//     T values, rint (ties to even), scale/bias rounded to T only when stored. bits=1 uses
//     plain min/max: scale = max(max - min, 1e-7), bias = min.
//   * mxfp4/mxfp8 quantize: s = T(amax / maxval) (maxval 6 or 448); the E8M0 exponent is
//     ceil(log2(s)) computed exactly (0 for s == 0) and stored as (e + 127) mod 256; the
//     elements are T(w / T(2^e)); fp4 picks the nearest E2M1 value by T-rounded distance,
//     the first (smaller magnitude, positive zero) on ties; fp8 is to_fp8 (RNE, saturate).
//   * nvfp4 quantize: scale byte = to_fp8(T(amax / 6)), or with a global scale
//     to_fp8(fp32(T(amax / 6) * fp32(2688 / gs))); elements T(w / e4m3(s)), with a global
//     scale then fp32(... * fp32(2688 / gs)) and fp32 distances; a zero scale gives code 0.
#include "kernels/quant.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/quant_kernels.h"

namespace ring {
namespace {

static_assert(std::endian::native == std::endian::little,
              "MLX packs codes little-endian; a big-endian host needs byte swaps");

constexpr float kFp4Lut[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// Rounds an fp32 value to `t` (F32, F16 or BF16) and back, as MLX's casts do.
inline float RoundTo(float v, DType t) {
  switch (t) {
    case DType::kBF16:
      return RoundBf16(v);
    case DType::kF16:
      return RoundF16(v);
    default:
      return v;
  }
}

void StoreAs(float v, DType t, uint8_t* dst) {
  switch (t) {
    case DType::kBF16: {
      const uint16_t h = FloatToBf16(v);
      std::memcpy(dst, &h, 2);
      return;
    }
    case DType::kF16: {
      const uint16_t h = FloatToF16(v);
      std::memcpy(dst, &h, 2);
      return;
    }
    default:
      std::memcpy(dst, &v, 4);
      return;
  }
}

bool IsScaleFloat(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

// Writes `bits`-bit code q at element index i of an LSB-first bit stream.
inline void PutBits(uint8_t* stream, int64_t i, int bits, uint32_t q) {
  const int64_t bit = i * bits;
  for (int k = 0; k < bits; ++k) {
    if ((q >> k) & 1u) stream[(bit + k) >> 3] |= static_cast<uint8_t>(1u << ((bit + k) & 7));
  }
}

// Exact ceil(log2(s)) for finite s > 0 (frexp gives s = m * 2^e with m in [0.5, 1)).
inline int CeilLog2(float s) {
  int e;
  const float m = std::frexp(s, &e);
  return m == 0.5f ? e - 1 : e;
}

// Index of the E2M1 value nearest to v, distances rounded to `t`; first index on ties.
// NaN distances never win, so a NaN or infinite v gives index 0 like MLX's argmin.
inline uint32_t NearestFp4(float v, DType t) {
  uint32_t best = 0;
  float best_d = std::fabs(RoundTo(v - kFp4Lut[0], t));
  for (uint32_t i = 1; i < 16; ++i) {
    const float d = std::fabs(RoundTo(v - kFp4Lut[i], t));
    if (d < best_d) {
      best_d = d;
      best = i;
    }
  }
  return best;
}

void QuantizeAffineGroup(const float* w, int gs, int bits, DType t, uint8_t* stream, int64_t first,
                         uint8_t* scale_out, uint8_t* bias_out) {
  const float n_bins = static_cast<float>((1 << bits) - 1);
  const float eps = 1e-7f;
  // std::max/std::min with the running value first: NaN inputs are skipped as in MLX.
  float w_max = -std::numeric_limits<float>::infinity();
  float w_min = std::numeric_limits<float>::infinity();
  for (int j = 0; j < gs; ++j) {
    w_max = std::max(w_max, w[j]);
    w_min = std::min(w_min, w[j]);
  }
  float scale, bias;
  if (bits == 1) {
    scale = std::max((w_max - w_min) / n_bins, eps);
    bias = w_min;
  } else {
    const bool mask = std::fabs(w_min) > std::fabs(w_max);
    scale = std::max((w_max - w_min) / n_bins, eps);
    scale = mask ? scale : -scale;
    const float edge = mask ? w_min : w_max;
    const float q0 = std::rint(edge / scale);
    bias = 0.0f;
    if (q0 != 0.0f) {
      scale = edge / q0;
      bias = edge;
    }
  }
  for (int j = 0; j < gs; ++j) {
    float q = std::rint((w[j] - bias) / scale);
    q = std::min(std::max(q, 0.0f), n_bins);
    if (!(q >= 0.0f)) q = 0.0f;  // NaN: MLX's uint64 cast of NaN packs as 0 here
    PutBits(stream, first + j, bits, static_cast<uint32_t>(q));
  }
  StoreAs(scale, t, scale_out);
  StoreAs(bias, t, bias_out);
}

// mxfp4 / mxfp8 group; returns the E8M0 byte.
uint8_t QuantizeMxGroup(const float* w, int gs, int bits, DType t, uint8_t* stream, int64_t first) {
  const float maxval = bits == 4 ? 6.0f : 448.0f;
  float amax = 0.0f;
  bool finite = true;
  for (int j = 0; j < gs; ++j) {
    const float a = std::fabs(w[j]);
    if (!std::isfinite(a)) finite = false;
    amax = std::max(amax, a);
  }
  const float s = RoundTo(amax / maxval, t);
  uint8_t byte;
  float div;
  if (!finite || !std::isfinite(s)) {
    // Not finite: MLX writes exponent 1 and its division yields inf/NaN elements; dividing
    // by zero reproduces that (fp4 code 0, fp8 saturated).
    byte = 128;
    div = 0.0f;
  } else {
    const int e = s == 0.0f ? 0 : CeilLog2(s);
    byte = static_cast<uint8_t>((e + 127) & 0xff);
    div = RoundTo(std::ldexp(1.0f, e), t);
  }
  for (int j = 0; j < gs; ++j) {
    const float v = RoundTo(w[j] / div, t);
    if (bits == 4) {
      PutBits(stream, first + j, 4, NearestFp4(v, t));
    } else {
      stream[first + j] = FloatToE4M3(v);
    }
  }
  return byte;
}

uint8_t QuantizeNvfp4Group(const float* w, DType t, float global_scale, uint8_t* stream,
                           int64_t first) {
  constexpr int kGroup = 16;
  float amax = 0.0f;
  bool nan = false;
  for (int j = 0; j < kGroup; ++j) {
    nan |= std::isnan(w[j]);
    amax = std::max(amax, std::fabs(w[j]));
  }
  if (nan) amax = std::numeric_limits<float>::quiet_NaN();  // MLX's max propagates NaN
  const bool global = global_scale != 0.0f;
  const float inv_global = global ? 2688.0f / global_scale : 1.0f;
  float s = RoundTo(amax / 6.0f, t);
  if (global) s = s * inv_global;
  const uint8_t byte = FloatToE4M3(s);
  const float sdec = E4M3ToFloat(byte);  // exact in F16/BF16/F32
  for (int j = 0; j < kGroup; ++j) {
    float v = RoundTo(w[j] / sdec, t);
    uint32_t code;
    if (global) {
      v = v * inv_global;
      code = NearestFp4(v, DType::kF32);
    } else {
      code = NearestFp4(v, t);
    }
    PutBits(stream, first + j, 4, code);
  }
  return byte;
}

}  // namespace

const char* QuantModeName(QuantMode m) {
  switch (m) {
    case QuantMode::kNone:
      return "none";
    case QuantMode::kAffine:
      return "affine";
    case QuantMode::kMxfp4:
      return "mxfp4";
    case QuantMode::kMxfp8:
      return "mxfp8";
    case QuantMode::kNvfp4:
      return "nvfp4";
  }
  return "?";
}

absl::StatusOr<QuantMode> ParseQuantMode(absl::string_view name) {
  for (QuantMode m : {QuantMode::kNone, QuantMode::kAffine, QuantMode::kMxfp4, QuantMode::kMxfp8,
                      QuantMode::kNvfp4}) {
    if (name == QuantModeName(m)) return m;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown quantization mode '", name, "'"));
}

std::string QuantSpec::ToString() const {
  if (mode == QuantMode::kNone) return "none";
  return absl::StrCat(QuantModeName(mode), "/g", group_size, "/b", bits);
}

absl::Status ValidateQuantSpec(const QuantSpec& spec) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("quantization ", QuantModeName(spec.mode),
                                                   " with group_size=", spec.group_size,
                                                   " bits=", spec.bits, ": ", why));
  };
  switch (spec.mode) {
    case QuantMode::kNone:
      if (spec.bits != 0 || spec.group_size != 0) return bad("mode none takes no bits/group_size");
      return absl::OkStatus();
    case QuantMode::kAffine:
      if (spec.group_size != 32 && spec.group_size != 64 && spec.group_size != 128) {
        return bad("affine group size must be 32, 64 or 128");
      }
      if (spec.bits < 1 || spec.bits > 8 || spec.bits == 7) {
        return bad("affine bits must be 1, 2, 3, 4, 5, 6 or 8");
      }
      return absl::OkStatus();
    case QuantMode::kMxfp4:
      if (spec.group_size != 32 || spec.bits != 4)
        return bad("mxfp4 requires group size 32, 4 bits");
      return absl::OkStatus();
    case QuantMode::kMxfp8:
      if (spec.group_size != 32 || spec.bits != 8)
        return bad("mxfp8 requires group size 32, 8 bits");
      return absl::OkStatus();
    case QuantMode::kNvfp4:
      if (spec.group_size != 16 || spec.bits != 4)
        return bad("nvfp4 requires group size 16, 4 bits");
      return absl::OkStatus();
  }
  return bad("unknown mode");
}

QuantSpec DefaultQuantSpec(QuantMode mode) {
  switch (mode) {
    case QuantMode::kAffine:
      return {mode, 4, 64};
    case QuantMode::kMxfp4:
      return {mode, 4, 32};
    case QuantMode::kMxfp8:
      return {mode, 8, 32};
    case QuantMode::kNvfp4:
      return {mode, 4, 16};
    case QuantMode::kNone:
      break;
  }
  return {QuantMode::kNone, 0, 0};
}

int64_t QuantWeight::rows() const { return weight.rank() >= 2 ? weight.dim(-2) : 0; }

int64_t QuantWeight::cols() const {
  if (weight.rank() < 1) return 0;
  if (spec.mode == QuantMode::kNone || spec.bits <= 0) return weight.dim(-1);
  return weight.dim(-1) * 32 / spec.bits;
}

int64_t QuantWeight::batch() const {
  int64_t b = 1;
  for (int i = 0; i + 2 < weight.rank(); ++i) b *= weight.shape[i];
  return b;
}

absl::Status ValidateQuantWeight(const QuantWeight& w) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("quantized weight '", w.name, "' (", w.spec.ToString(), "): ", why));
  };
  if (absl::Status st = ValidateQuantSpec(w.spec); !st.ok()) return bad(st.message());
  if (!w.weight.present()) return bad("weight data missing");
  if (w.weight.rank() < 2)
    return bad(absl::StrCat("weight must be at least 2-D, got ", ShapeToString(w.weight.shape)));
  for (int64_t d : w.weight.shape) {
    if (d < 0) return bad(absl::StrCat("negative dim in ", ShapeToString(w.weight.shape)));
  }
  if (w.spec.mode == QuantMode::kNone) {
    if (!IsScaleFloat(w.weight.dtype)) {
      return bad(
          absl::StrCat("unquantized weight must be F32/F16/BF16, got ", DTypeName(w.weight.dtype)));
    }
    if (w.scales.present() || w.biases.present())
      return bad("unquantized weight has scales/biases");
    if (w.global_scale != 0.0f) return bad("global_scale set on an unquantized weight");
    return absl::OkStatus();
  }
  if (w.weight.dtype != DType::kU32) {
    return bad(absl::StrCat("packed weight must be U32, got ", DTypeName(w.weight.dtype)));
  }
  const int bits = w.spec.bits;
  const int64_t words = w.weight.dim(-1);
  if ((words * 32) % bits != 0) {
    return bad(absl::StrCat("last dim ", words, " words does not hold whole ", bits, "-bit codes"));
  }
  const int64_t cols = words * 32 / bits;
  if (cols == 0 || cols % w.spec.group_size != 0) {
    return bad(absl::StrCat("logical row length ", cols,
                            " is not a positive multiple of group size ", w.spec.group_size));
  }
  if (!w.scales.present()) return bad("scales missing");
  Shape want = w.weight.shape;
  want.back() = cols / w.spec.group_size;
  if (w.scales.shape != want) {
    return bad(absl::StrCat("scales shape ", ShapeToString(w.scales.shape), " != expected ",
                            ShapeToString(want), " for weight ", ShapeToString(w.weight.shape)));
  }
  if (w.spec.mode == QuantMode::kAffine) {
    if (!IsScaleFloat(w.scales.dtype)) {
      return bad(
          absl::StrCat("affine scales must be F32/F16/BF16, got ", DTypeName(w.scales.dtype)));
    }
    if (!w.biases.present()) return bad("affine biases missing");
    if (w.biases.dtype != w.scales.dtype) {
      return bad(absl::StrCat("biases dtype ", DTypeName(w.biases.dtype), " != scales dtype ",
                              DTypeName(w.scales.dtype)));
    }
    if (w.biases.shape != want) {
      return bad(absl::StrCat("biases shape ", ShapeToString(w.biases.shape), " != expected ",
                              ShapeToString(want)));
    }
    if (w.global_scale != 0.0f) return bad("global_scale is only defined for nvfp4");
    return absl::OkStatus();
  }
  const bool u8 = w.scales.dtype == DType::kU8 ||
                  (w.spec.mode == QuantMode::kNvfp4 && w.scales.dtype == DType::kF8E4M3);
  if (!u8) return bad(absl::StrCat("scales must be U8, got ", DTypeName(w.scales.dtype)));
  if (w.biases.present()) return bad(absl::StrCat(QuantModeName(w.spec.mode), " has no biases"));
  if (w.global_scale != 0.0f) {
    if (w.spec.mode != QuantMode::kNvfp4) return bad("global_scale is only defined for nvfp4");
    if (!std::isfinite(w.global_scale)) return bad("global_scale is not finite");
  }
  return absl::OkStatus();
}

DType DequantizeDType(const QuantWeight& w) {
  switch (w.spec.mode) {
    case QuantMode::kNone:
      return w.weight.dtype;
    case QuantMode::kAffine:
      return w.scales.dtype;
    case QuantMode::kNvfp4:
      return w.global_scale != 0.0f ? DType::kF32 : DType::kBF16;
    default:
      return DType::kBF16;
  }
}

void DequantizeRows(const QuantWeight& w, int64_t b, int64_t row_begin, int64_t row_end,
                    float* out) {
  const cpu::QSlice s = cpu::MakeQSlice(w, b);
  const int64_t C = s.cols;
  if (s.spec.mode == QuantMode::kNone) {
    for (int64_t r = row_begin; r < row_end; ++r) {
      const uint8_t* p = s.row(r);
      float* o = out + (r - row_begin) * C;
      for (int64_t i = 0; i < C; ++i) o[i] = LoadAsFloat(p, s.w_dtype, i);
    }
    return;
  }
  const int gs = s.spec.group_size;
  std::vector<float> codes(gs);
  for (int64_t r = row_begin; r < row_end; ++r) {
    float* o = out + (r - row_begin) * C;
    for (int64_t g = 0; g < s.groups; ++g) {
      cpu::DecodeGroup(s, r, g, codes.data());
      const int64_t gi = r * s.groups + g;
      float* og = o + g * gs;
      switch (s.spec.mode) {
        case QuantMode::kAffine: {
          const DType t = s.s_dtype;
          const float scale = LoadAsFloat(s.scales, t, gi);
          const float bias = LoadAsFloat(s.biases, t, gi);
          for (int j = 0; j < gs; ++j) {
            // Product in double: exact, then one rounding to fp32 (and to T), no FMA.
            const float prod = static_cast<float>(static_cast<double>(scale) * codes[j]);
            og[j] = RoundTo(RoundTo(prod, t) + bias, t);
          }
          break;
        }
        case QuantMode::kMxfp4:
        case QuantMode::kMxfp8: {
          const float scale = E8M0ToFloat(s.scales[gi]);
          for (int j = 0; j < gs; ++j) og[j] = RoundBf16(codes[j] * scale);
          break;
        }
        case QuantMode::kNvfp4: {
          const float scale = E4M3ToFloat(s.scales[gi]);
          if (s.global_mult != 0.0f) {
            const float eff = scale * s.global_mult;
            for (int j = 0; j < gs; ++j) og[j] = codes[j] * eff;
          } else {
            for (int j = 0; j < gs; ++j) og[j] = RoundBf16(codes[j] * scale);
          }
          break;
        }
        case QuantMode::kNone:
          break;
      }
    }
  }
}

std::vector<float> Dequantize(const QuantWeight& w) {
  const int64_t rows = w.rows(), cols = w.cols(), batch = w.batch();
  std::vector<float> out(batch * rows * cols);
  for (int64_t b = 0; b < batch; ++b) DequantizeRows(w, b, 0, rows, out.data() + b * rows * cols);
  return out;
}

void QMatmulT(const float* x, int64_t m, const QuantWeight& w, int64_t b, float* y) {
  cpu::MatmulT(x, m, cpu::MakeQSlice(w, b), y);
}

void QMatmulN(const float* x, int64_t m, const QuantWeight& w, int64_t b, float* y) {
  cpu::MatmulN(x, m, cpu::MakeQSlice(w, b), y);
}

absl::StatusOr<QuantizedBuffers> Quantize(const float* w, int64_t rows, int64_t cols,
                                          const QuantSpec& spec, DType scale_dtype) {
  return Quantize(w, rows, cols, spec, scale_dtype, 0.0f);
}

absl::StatusOr<QuantizedBuffers> Quantize(const float* w, int64_t rows, int64_t cols,
                                          const QuantSpec& spec, DType scale_dtype,
                                          float global_scale) {
  if (absl::Status st = ValidateQuantSpec(spec); !st.ok()) return st;
  if (spec.mode == QuantMode::kNone) return absl::InvalidArgumentError("Quantize: mode none");
  if (rows < 0 || cols <= 0 || cols % spec.group_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("Quantize: shape [", rows, ",", cols,
                                                   "] is not a multiple of group size ",
                                                   spec.group_size));
  }
  const bool affine = spec.mode == QuantMode::kAffine;
  DType t = scale_dtype;
  if (!affine && t == DType::kU8) t = DType::kF32;
  if (!IsScaleFloat(t)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Quantize: dtype must be F32/F16/BF16, got ", DTypeName(scale_dtype)));
  }
  if (global_scale != 0.0f && (spec.mode != QuantMode::kNvfp4 || !std::isfinite(global_scale))) {
    return absl::InvalidArgumentError("Quantize: global_scale needs nvfp4 and a finite value");
  }
  const int gs = spec.group_size;
  const int64_t groups = cols / gs;
  const int64_t row_bytes = cols * spec.bits / 8;
  QuantizedBuffers out;
  out.scale_dtype = affine ? t : DType::kU8;
  out.weight.assign(static_cast<size_t>(rows * row_bytes / 4), 0u);
  const int ssize = DTypeSize(out.scale_dtype);
  out.scales.assign(static_cast<size_t>(rows * groups * ssize), 0);
  if (affine) out.biases.assign(out.scales.size(), 0);
  uint8_t* stream = reinterpret_cast<uint8_t*>(out.weight.data());
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row_stream = stream + r * row_bytes;
    for (int64_t g = 0; g < groups; ++g) {
      const float* wg = w + r * cols + g * gs;
      const int64_t gi = r * groups + g;
      switch (spec.mode) {
        case QuantMode::kAffine:
          QuantizeAffineGroup(wg, gs, spec.bits, t, row_stream, g * gs, &out.scales[gi * ssize],
                              &out.biases[gi * ssize]);
          break;
        case QuantMode::kMxfp4:
        case QuantMode::kMxfp8:
          out.scales[gi] = QuantizeMxGroup(wg, gs, spec.bits, t, row_stream, g * gs);
          break;
        case QuantMode::kNvfp4:
          out.scales[gi] = QuantizeNvfp4Group(wg, t, global_scale, row_stream, g * gs);
          break;
        case QuantMode::kNone:
          break;
      }
    }
  }
  return out;
}

}  // namespace ring
