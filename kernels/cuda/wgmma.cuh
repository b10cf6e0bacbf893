// File: kernels/cuda/wgmma.cuh (internal to kernels/cuda)
//
// Hopper warpgroup MMA (wgmma.mma_async, sm_90a only) with the A operand in registers and B
// in shared memory, for the prefill GEMM (qgemv.cu). Compiled only where nvcc targets
// sm_90a (__CUDA_ARCH_FEAT_SM90_ALL); elsewhere the bodies are empty, and the host never
// selects a kernel that uses them (DeviceInfo::wgmma: arch_probe.cu runs a kernel that reports whether its image has them).
//
// Layouts (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply"):
//   A (registers), m64 x k16 per warpgroup: warp w of the group holds rows 16w..16w+15 in
//     the mma.m16n8k16 A-fragment layout (a[0] = row g, k 2t..2t+1; a[1] = row g + 8;
//     a[2] = row g, k 2t+8..2t+9; a[3] = row g + 8, k 2t+8..; lane = 4g + t).
//   B (shared memory), k16 x N, K-major (token rows of 16 k), no swizzle: 8 x 8 "core
//     matrices" of 8 token rows x 16 bytes, each 128 contiguous bytes; the two core
//     matrices of a row group (k 0..7, 8..15) are LBO bytes apart and consecutive groups of
//     8 tokens SBO bytes apart.
//   D (registers), m64 x N fp32: as N/8 mma.m16n8k16 C fragments side by side,
//     d[4j + i] = rows g (i < 2) / g + 8, column 8j + 2t + (i & 1).
// Ordering: registers written before a wgmma need WgmmaFence(); a wgmma's A registers and
// accumulators may be touched again only after a WgmmaWait that covers its group; shared
// memory written by ordinary stores must be published to the async proxy (FenceProxyAsync)
// before the barrier that precedes the wgmma reading it.
#ifndef RINGSERVE_KERNELS_CUDA_WGMMA_CUH_
#define RINGSERVE_KERNELS_CUDA_WGMMA_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/async_copy.cuh"

namespace ring::cuda::internal {

// Shared-memory matrix descriptor: no swizzle, base offset 0; addresses and offsets are
// encoded in 16-byte units (14 bits each).
__device__ __forceinline__ uint64_t WgmmaDesc(const void* smem, uint32_t lbo_bytes,
                                              uint32_t sbo_bytes) {
  const uint64_t addr = (SmemAddr(smem) & 0x3ffffu) >> 4;
  return addr | (static_cast<uint64_t>((lbo_bytes >> 4) & 0x3fffu) << 16) |
         (static_cast<uint64_t>((sbo_bytes >> 4) & 0x3fffu) << 32);
}

__device__ __forceinline__ void WgmmaFence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void WgmmaCommit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}
// Orders this thread's earlier shared-memory stores before later async-proxy reads (wgmma
// operands), once a barrier has joined the threads.
__device__ __forceinline__ void FenceProxyAsync() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Keeps the compiler from moving accesses of `r` across the asynchronous wgmma around it.
__device__ __forceinline__ void WgmmaFenceOperand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void WgmmaFenceOperand(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }

// d (m64 x kN fp32) += A (registers, bf16) * B (shared memory, bf16, K-major, b_desc).
template <int kN>
__device__ __forceinline__ void WgmmaBf16RS(float (&d)[kN / 2], const uint32_t (&a)[4],
                                            uint64_t b_desc);

template <>
__device__ __forceinline__ void WgmmaBf16RS<128>(float (&d)[64], const uint32_t (&a)[4], uint64_t b_desc) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
      "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "
      "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),
          "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),
          "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),
          "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
          "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
          "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),
          "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]),
          "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1));
#endif
}

template <>
__device__ __forceinline__ void WgmmaBf16RS<64>(float (&d)[32], const uint32_t (&a)[4], uint64_t b_desc) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),
          "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),
          "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),
          "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1));
#endif
}

}  // namespace ring::cuda::internal

#endif  // RINGSERVE_KERNELS_CUDA_WGMMA_CUH_
