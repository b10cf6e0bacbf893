// File: kernels/cuda/warp_scan.cuh (internal to kernels/cuda)
//
// Warp-level pieces of the radix selections and bucket scans (DSA top-k, GPU sampling, MoE
// grouping, the grouped GEMM's tile schedule): an order-preserving integer image of a float,
// an inclusive warp sum, a histogram add with one atomic per distinct bin, and the search
// for the digit where a descending count reaches a rank; and a warp's float sum. Each is called by a whole warp
// (all 32 lanes, converged) unless its comment says otherwise.
#ifndef RINGSERVE_KERNELS_CUDA_WARP_SCAN_CUH_
#define RINGSERVE_KERNELS_CUDA_WARP_SCAN_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace ring::cuda::internal {

// Larger float, larger key; -0.0 maps with +0.0. Any thread.
__device__ __forceinline__ uint32_t OrderKey(float v) {
  uint32_t b = __float_as_uint(v);
  if (b == 0x80000000u) b = 0;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The sum of v over lanes 0..lane.
template <class T>
__device__ __forceinline__ T WarpInclusiveSum(T v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const T y = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += y;
  }
  return v;
}

// The sum of v over the warp, in every lane (butterfly: a fixed order, so a run repeats bit
// for bit).
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// hist[bin] += 1 for every lane with `hit`: lanes with the same bin add together, once (the
// keys of one row share their leading bytes, so one bin can take most of a warp's adds).
template <class T>
__device__ __forceinline__ void WarpHistogramAdd(T* hist, uint32_t bin, bool hit) {
  const unsigned same = __match_any_sync(0xffffffffu, hit ? bin : 0xffffffffu);
  if (hit && (threadIdx.x & 31) == __ffs(same) - 1) atomicAdd(&hist[bin], static_cast<T>(__popc(same)));
}

// Over 256 bins (lane l reads bins 255 - 8 l .. 248 - 8 l, largest digit first): the digit
// where the count from the top first reaches `rank` (1 <= rank <= the bins' total). The lane
// that owns it returns true with the digit, the rank left inside its bin and its count; the
// others return false.
struct DigitPick {
  int digit = 0;
  int64_t rank = 0;
  int count = 0;
};
template <class T>
__device__ __forceinline__ bool PickDigitFromTop(const T* bins, int64_t rank, DigitPick* pick) {
  const int lane = threadIdx.x & 31;
  int c[8], sum = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    c[i] = static_cast<int>(bins[255 - 8 * lane - i]);
    sum += c[i];
  }
  int64_t above = WarpInclusiveSum(sum) - sum;
  if (!(above < rank && rank <= above + sum)) return false;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    if (above + c[i] >= rank) {
      pick->digit = 255 - 8 * lane - i;
      pick->rank = rank - above;
      pick->count = c[i];
      return true;
    }
    above += c[i];
  }
  return false;  // not reached: the lane's bins hold the crossing
}

}  // namespace ring::cuda::internal

#endif  // RINGSERVE_KERNELS_CUDA_WARP_SCAN_CUH_
