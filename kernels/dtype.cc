#include "kernels/dtype.h"

#include <cmath>

namespace ring {
namespace {
struct DTypeInfo {
  DType type;
  const char* name;
  int size;
  bool is_float;
};
constexpr DTypeInfo kInfos[] = {
    {DType::kBool, "BOOL", 1, false},   {DType::kU8, "U8", 1, false},
    {DType::kI8, "I8", 1, false},       {DType::kU16, "U16", 2, false},
    {DType::kI16, "I16", 2, false},     {DType::kU32, "U32", 4, false},
    {DType::kI32, "I32", 4, false},     {DType::kU64, "U64", 8, false},
    {DType::kI64, "I64", 8, false},     {DType::kF8E4M3, "F8_E4M3", 1, true},
    {DType::kF8E5M2, "F8_E5M2", 1, true}, {DType::kF16, "F16", 2, true},
    {DType::kBF16, "BF16", 2, true},    {DType::kF32, "F32", 4, true},
    {DType::kF64, "F64", 8, true},
};
const DTypeInfo& Info(DType t) { return kInfos[static_cast<int>(t)]; }
}  // namespace

int DTypeSize(DType t) { return Info(t).size; }
const char* DTypeName(DType t) { return Info(t).name; }
bool IsFloat(DType t) { return Info(t).is_float; }

std::optional<DType> ParseDType(absl::string_view name) {
  for (const auto& i : kInfos) {
    if (name == i.name) return i.type;
  }
  return std::nullopt;
}

float F16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      u = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t FloatToF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to inf
  if (abs < 0x38800000u) {                        // subnormal or zero in half
    // Value = abs_float; half subnormal unit = 2^-24.
    float a;
    std::memcpy(&a, &abs, 4);
    const float scaled = a * 16777216.0f;  // / 2^-24
    const float r = std::nearbyint(scaled);  // ties-to-even in default rounding mode
    return sign | static_cast<uint16_t>(r);
  }
  uint32_t mant = abs & 0x7fffffu;
  uint32_t exp = (abs >> 23) - 127 + 15;
  uint32_t half = (exp << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
  return sign | static_cast<uint16_t>(half);
}

float E4M3ToFloat(uint8_t v) {
  const float sign = (v & 0x80) ? -1.f : 1.f;
  const int exp = (v >> 3) & 0xf;
  const int mant = v & 0x7;
  if (exp == 0xf && mant == 0x7) return std::nanf("");
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -9);  // 2^-6 * m/8
  return sign * std::ldexp(1.f + mant / 8.f, exp - 7);
}

uint8_t FloatToE4M3(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const float a = std::fabs(f);
  if (!(a <= 448.0f)) return sign | 0x7e;  // NaN, inf and overflow saturate
  if (a < 0.015625f) {                      // below 2^-6: subnormal, unit 2^-9
    // a * 512 is exact; ties go to even. 8 units is the smallest normal (0x08).
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  uint32_t ua;
  std::memcpy(&ua, &a, 4);
  const int exp = static_cast<int>((ua >> 23) & 0xffu) - 127;  // -6..8
  const uint32_t mant = ua & 0x7fffffu;
  uint32_t code = (static_cast<uint32_t>(exp + 7) << 3) | (mant >> 20);
  const uint32_t rem = mant & 0xfffffu;
  if (rem > 0x80000u || (rem == 0x80000u && (code & 1u))) ++code;  // carry is fine
  return sign | static_cast<uint8_t>(code);
}

float E8M0ToFloat(uint8_t v) {
  if (v == 255) return INFINITY;
  return std::ldexp(1.f, static_cast<int>(v) - 127);
}

}  // namespace ring
