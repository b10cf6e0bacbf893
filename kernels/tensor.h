// File: kernels/tensor.h
//
// TensorView: a typed, shaped, read-only window on bytes someone else owns (most often a
// memory-mapped checkpoint). It never copies. Activations in the CPU engine are plain
// fp32 buffers (std::vector<float>) with shapes carried by the layer programs.
#ifndef RINGSERVE_KERNELS_TENSOR_H_
#define RINGSERVE_KERNELS_TENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/dtype.h"

namespace ring {

using Shape = std::vector<int64_t>;

inline int64_t NumElements(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}
std::string ShapeToString(const Shape& s);

struct TensorView {
  DType dtype = DType::kF32;
  Shape shape;
  const void* data = nullptr;  // nullptr means "absent"

  bool present() const { return data != nullptr; }
  int64_t numel() const { return NumElements(shape); }
  int64_t nbytes() const { return numel() * DTypeSize(dtype); }
  int rank() const { return static_cast<int>(shape.size()); }
  // Dimension i, negative counts from the back (dim(-1) is the last).
  int64_t dim(int i) const { return shape[i < 0 ? shape.size() + i : i]; }
  template <typename T>
  const T* as() const { return static_cast<const T*>(data); }
  // Element i (flat) as fp32; only for float dtypes and U8.
  float at(int64_t i) const { return LoadAsFloat(data, dtype, i); }
};

// Copies a float-typed view (F32/F16/BF16/F64) into fp32.
std::vector<float> ToFloatVector(const TensorView& t);

}  // namespace ring

#endif  // RINGSERVE_KERNELS_TENSOR_H_
