// File: kernels/cuda/async_copy.cuh (internal to kernels/cuda)
//
// Shared-memory staging for the tensor-core kernels (prefill GEMM, prefill attention, the
// decode kernels that stage K/V rows): cp.async global -> shared copies (sm_80+) and ldmatrix
// fragment loads. On older architectures the bodies compile to nothing; no kernel that uses
// them is launched there.
#ifndef RINGSERVE_KERNELS_CUDA_ASYNC_COPY_CUH_
#define RINGSERVE_KERNELS_CUDA_ASYNC_COPY_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace ring::cuda::internal {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// Asynchronous global -> shared copies; `valid` false writes zeros and reads nothing.
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
#endif
}
__device__ __forceinline__ void CpAsync4(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(SmemAddr(dst)), "l"(src),
               "r"(valid ? 4 : 0));
#endif
}
__device__ __forceinline__ void CpAsyncCommit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Waits until at most kPending committed groups of this thread are in flight. Other threads'
// copies are visible only after a barrier that follows every thread's wait.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
#endif
}
__device__ __forceinline__ void CpAsyncWaitAll() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

// Four 8x8 bf16 matrices from shared memory: lanes 8q..8q+7 give the 16-byte rows of matrix
// q; r[q] is this lane's fragment of matrix q (row g, columns 2t, 2t + 1, for lane 4g + t),
// or with Trans of its transpose (rows 2t, 2t + 1, column g): the mma.m16n8k16 A and B
// fragment layouts.
template <bool Trans>
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const uint16_t* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (Trans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(SmemAddr(row)));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(SmemAddr(row)));
  }
#endif
}

}  // namespace ring::cuda::internal

#endif  // RINGSERVE_KERNELS_CUDA_ASYNC_COPY_CUH_
