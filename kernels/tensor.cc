#include "kernels/tensor.h"

#include "absl/strings/str_join.h"

namespace ring {

std::string ShapeToString(const Shape& s) { return "[" + absl::StrJoin(s, ",") + "]"; }

std::vector<float> ToFloatVector(const TensorView& t) {
  std::vector<float> out(t.numel());
  if (t.dtype == DType::kF32) {
    std::memcpy(out.data(), t.data, out.size() * 4);
    return out;
  }
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = t.at(i);
  return out;
}

}  // namespace ring
