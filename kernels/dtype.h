// File: kernels/dtype.h
//
// Element types as they appear in safetensors files and MLX checkpoints, and the scalar
// conversions every backend must agree on bit for bit (bf16/fp16 rounding, the FP4/FP8
// codes and scale formats of MLX's mxfp4/mxfp8/nvfp4 modes).
#ifndef RINGSERVE_KERNELS_DTYPE_H_
#define RINGSERVE_KERNELS_DTYPE_H_

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace ring {

enum class DType : uint8_t {
  kBool, kU8, kI8, kU16, kI16, kU32, kI32, kU64, kI64,
  kF8E4M3, kF8E5M2, kF16, kBF16, kF32, kF64,
};

// Bytes per element.
int DTypeSize(DType t);
// Safetensors spelling ("BF16", "U32", "F8_E4M3", ...).
const char* DTypeName(DType t);
// Parses the safetensors spelling; nullopt for anything unknown.
std::optional<DType> ParseDType(absl::string_view name);
bool IsFloat(DType t);

// bf16 <-> fp32. FloatToBf16 rounds to nearest even and keeps NaN a NaN, as MLX does.
inline float Bf16ToFloat(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
// Rounds an fp32 value to the nearest bf16 and back: how a bf16 activation is stored.
inline float RoundBf16(float f) { return Bf16ToFloat(FloatToBf16(f)); }

// IEEE half <-> fp32 (round to nearest even, subnormals and inf/NaN handled).
float F16ToFloat(uint16_t h);
uint16_t FloatToF16(float f);
inline float RoundF16(float f) { return F16ToFloat(FloatToF16(f)); }

// FP8 E4M3 (OCP "fn": no inf, 0x7f/0xff NaN, max 448) -> fp32.
float E4M3ToFloat(uint8_t v);
// fp32 -> FP8 E4M3 as MLX's to_fp8 does it: round to nearest even, saturating to +-448;
// inf and NaN also saturate (NaN keeps its sign bit), so 0x7f/0xff are never produced.
uint8_t FloatToE4M3(float f);
// E8M0 scale byte (mxfp4/mxfp8): 2^(v-127). v == 0 gives 2^-127 (MLX's bf16 subnormal);
// v == 255 gives +inf as on MLX's CPU backend.
float E8M0ToFloat(uint8_t v);

// Reads element i of a float-typed buffer (F32/F16/BF16/F64) as fp32.
inline float LoadAsFloat(const void* data, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(data)[i];
    case DType::kBF16: return Bf16ToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kF16: return F16ToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kF64: return static_cast<float>(static_cast<const double*>(data)[i]);
    case DType::kU8: return static_cast<float>(static_cast<const uint8_t*>(data)[i]);
    default: return 0.f;
  }
}

}  // namespace ring

#endif  // RINGSERVE_KERNELS_DTYPE_H_
