// File: kernels/cuda/launch.cuh (internal to kernels/cuda)
//
// Programmatic dependent launch (PDL, sm_90+) for the small kernels of a decode step.
// A decode step is ~100-300 kernels of a few microseconds each, and between two of them the
// GPU idles while the second is launched and its blocks are scheduled (~2 us a boundary on
// the H200, CUDA graphs included). A kernel launched by LaunchPdlRaw / RING_LAUNCH_PDL may
// become resident while the kernel before it in the stream still runs; it must call
// PdlWait() before it touches memory any earlier kernel reads or writes (and read such
// memory with LoadProduced, below). PdlWait() returns once the previous kernel has
// completed and its writes are visible, so the result is exactly the serialised one. Each
// such kernel calls PdlLaunchDependents() right after its wait, which lets the next kernel
// get resident in turn; that is always safe, since the next kernel waits too.
//
// On a plain launch (RING_CUDA_PDL=0, or a device without PDL) both calls are no-ops.
// Launches captured into CUDA graphs keep their programmatic edges.
#ifndef RINGSERVE_KERNELS_CUDA_LAUNCH_CUH_
#define RINGSERVE_KERNELS_CUDA_LAUNCH_CUH_

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_status.h"

namespace ring::cuda {

__device__ __forceinline__ void PdlWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void PdlLaunchDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// A read of memory an earlier kernel wrote (activations, expert ids, partial sums) in a
// kernel that may start under PDL: a plain coherent load, kept after PdlWait() by the wait's
// memory clobber. Never __ldg / ld.global.nc for such data: the compiler treats
// non-coherent loads as invariant for the kernel's lifetime and moves them above the wait
// (seen in the decode GEMV's SASS: its activation loads issued before ACQBULK, which read
// the previous kernel's output before it was written once that kernel let dependents start).
template <class T>
__device__ __forceinline__ T LoadProduced(const T* p) {
  return *p;
}
// The first statement of a kernel launched by LaunchPdlRaw / RING_LAUNCH_PDL.
__device__ __forceinline__ void PdlBegin() {
  PdlWait();
  PdlLaunchDependents();
}

// An A/B switch in the environment: on unless `name` is set to "0". Callers read it once
// (a function-local static), so that a process runs one configuration throughout.
inline bool EnvSwitchOn(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// RING_CUDA_PDL in the environment (read once), for measuring what PDL is worth in one run:
// "0" turns it off everywhere, "gemv" keeps it on the decode GEMVs only (the behaviour before
// the other kernels had it); unset or anything else: on.
inline const char* PdlMode() {
  static const char* mode = [] {
    const char* v = std::getenv("RING_CUDA_PDL");
    return v == nullptr ? "" : v;
  }();
  return mode;
}
// The decode GEMVs' PDL (QMatmulArgs::overlap).
inline bool PdlGemvEnabled() { return std::strcmp(PdlMode(), "0") != 0; }
// Every other kernel launched through LaunchPdlRaw.
inline bool PdlEnabled() { return PdlGemvEnabled() && std::strcmp(PdlMode(), "gemv") != 0; }

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream serialisation
// when PdlEnabled() (file comment: the kernel calls PdlWait() first). `cluster` > 0 also
// sets a thread-block cluster of that many blocks along x.
template <typename... Params, typename... Args>
cudaError_t LaunchPdlRaw(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                         cudaStream_t stream, int cluster, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (PdlEnabled()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster > 0) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = static_cast<unsigned>(cluster);
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
}

// Lets `kernel` launch with `bytes` of dynamic shared memory: raises its limit when the
// default, 48 KB, which the kernel's static shared memory counts against too, would not hold
// them (a top-k row of ~11.7k keys, 47 KB, beside the kernel's 2.4 KB of static arrays did
// not launch). Past the device's opt-in limit the launch still fails, with its error.
inline cudaError_t AllowDynamicSmem(const void* kernel, size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  cudaFuncAttributes fa{};
  if (cudaError_t e = cudaFuncGetAttributes(&fa, kernel); e != cudaSuccess) return e;
  if (bytes + fa.sharedSizeBytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(bytes));
}
template <typename... Params>
cudaError_t AllowDynamicSmem(void (*kernel)(Params...), size_t bytes) {
  return AllowDynamicSmem(reinterpret_cast<const void*>(kernel), bytes);
}

#define RING_LAUNCH_PDL(kernel, grid, block, smem, stream, ...)                               \
  RING_CUDA_RETURN_IF_ERROR(::ring::cuda::LaunchPdlRaw(kernel, dim3(grid), dim3(block), smem, \
                                                       stream, 0, __VA_ARGS__))

}  // namespace ring::cuda

#endif  // RINGSERVE_KERNELS_CUDA_LAUNCH_CUH_
