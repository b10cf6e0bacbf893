// File: bench/gpu_bench_util.cuh
//
// What the GPU benchmarks share (gpu_gemv_bench.cu, gpu_gemm_bench.cu): status checks that
// exit, random fills, the timing method (CUDA events around back-to-back launches, median of
// 5 batches after a warm-up batch), cuBLAS loaded through dlopen (so binaries have no
// link-time dependency on it and run where it is absent), and benchmark weights in the
// checkpoint layout. Header-only: each benchmark is one translation unit.
#ifndef RINGSERVE_BENCH_GPU_BENCH_UTIL_CUH_
#define RINGSERVE_BENCH_GPU_BENCH_UTIL_CUH_

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/qgemv.cuh"

namespace ring::cuda::bench {

#define BENCH_CHECK(expr)                                                        \
  do {                                                                           \
    const absl::Status bench_s_ = (expr);                                        \
    if (!bench_s_.ok()) {                                                        \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, bench_s_.ToString().c_str()); \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)

inline absl::Status CudaOk(cudaError_t e) {
  RING_CUDA_RETURN_IF_ERROR(e);
  return absl::OkStatus();
}

template <typename T>
T Must(absl::StatusOr<T> v) {
  BENCH_CHECK(v.status());
  return *std::move(v);
}

__device__ __forceinline__ uint32_t Hash(uint64_t i, uint32_t seed) {
  uint64_t x = i * 0x9e3779b97f4a7c15ull + seed;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  return static_cast<uint32_t>(x >> 16);
}
__global__ void FillRandom(uint32_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    p[i] = Hash(i, seed);
  }
}
// E8M0 bytes around 2^-7..2^0, the range of real weight groups.
__global__ void FillE8M0(uint8_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    p[i] = static_cast<uint8_t>(120 + Hash(i, seed) % 8);
  }
}
// bf16 values base * (1 + u/2), u in [0,1); with `signed_values`, a random sign too
// (matrix-rate measurements: all-positive data draws less power than real data).
__global__ void FillBf16(uint16_t* p, int64_t n, uint32_t seed, float base,
                         bool signed_values = false) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint32_t h = Hash(i, seed);
    const float v = (signed_values && (h & 0x10000u) ? -base : base) *
                    (1.f + 0.5f * (h & 0xffff) / 65536.f);
    p[i] = static_cast<uint16_t>(__float_as_uint(v) >> 16);
  }
}

inline float TimeMs(cudaStream_t s, int iters, const std::function<void(int)>& launch) {
  cudaEvent_t a, b;
  BENCH_CHECK(CudaOk(cudaEventCreate(&a)));
  BENCH_CHECK(CudaOk(cudaEventCreate(&b)));
  launch(0);  // warm-up
  BENCH_CHECK(CudaOk(cudaStreamSynchronize(s)));
  BENCH_CHECK(CudaOk(cudaEventRecord(a, s)));
  for (int i = 0; i < iters; ++i) launch(i);
  BENCH_CHECK(CudaOk(cudaEventRecord(b, s)));
  BENCH_CHECK(CudaOk(cudaEventSynchronize(b)));
  float ms = 0;
  BENCH_CHECK(CudaOk(cudaEventElapsedTime(&ms, a, b)));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / iters;
}

// Median of 5 timed batches of `iters` launches, after one warm-up batch.
inline float MedianMs(cudaStream_t s, int iters, const std::function<void(int)>& launch) {
  std::vector<float> v;
  int base = 0;
  TimeMs(s, iters, [&](int i) { launch(base + i); });
  for (int r = 0; r < 5; ++r) {
    base += iters;
    v.push_back(TimeMs(s, iters, [&](int i) { launch(base + i); }));
  }
  std::sort(v.begin(), v.end());
  return v[2];
}

// Device 0, after printing its machine line; nullopt (after saying why) when no CUDA device
// is visible, so a benchmark exits 0 on machines without one.
inline std::optional<DeviceInfo> FirstDevice() {
  absl::StatusOr<int> n = DeviceCount();
  if (!n.ok() || *n == 0) {
    std::printf("no CUDA device: %s\n", n.ok() ? "none visible" : n.status().ToString().c_str());
    return std::nullopt;
  }
  DeviceInfo dev = Must(QueryDevice(0));
  std::printf("%s\n", dev.ToString().c_str());
  return dev;
}

// ---- cuBLAS through dlopen -----------------------------------------------------------------
struct Cublas {
  void* lib = nullptr;
  cublasHandle_t h = nullptr;
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  // The C entry point (cublas_api.h also declares a C++ overload with the legacy signature).
  using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                      int, int, const void*, const void*, cudaDataType, int,
                                      const void*, cudaDataType, int, const void*, void*,
                                      cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  GemmExFn gemm_ex = nullptr;
  using GemmStridedBatchedExFn = cublasStatus_t (*)(
      cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
      const void*, cudaDataType, int, long long, const void*, cudaDataType, int, long long,
      const void*, void*, cudaDataType, int, long long, int, cublasComputeType_t,
      cublasGemmAlgo_t);
  GemmStridedBatchedExFn gemm_strided_batched_ex = nullptr;
  bool ok() const { return h != nullptr; }
  void Load(cudaStream_t s) {
    for (const char* name : {"libcublas.so.13", "libcublas.so"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib) break;
    }
    if (!lib) {
      std::printf("cuBLAS: not found (%s); comparison skipped\n", dlerror());
      return;
    }
    create = reinterpret_cast<decltype(create)>(dlsym(lib, "cublasCreate_v2"));
    set_stream = reinterpret_cast<decltype(set_stream)>(dlsym(lib, "cublasSetStream_v2"));
    gemm_ex = reinterpret_cast<decltype(gemm_ex)>(dlsym(lib, "cublasGemmEx"));
    gemm_strided_batched_ex = reinterpret_cast<decltype(gemm_strided_batched_ex)>(
        dlsym(lib, "cublasGemmStridedBatchedEx"));
    if (!create || !set_stream || !gemm_ex || !gemm_strided_batched_ex || create(&h) != CUBLAS_STATUS_SUCCESS) {
      std::printf("cuBLAS: symbols or handle unavailable; comparison skipped\n");
      h = nullptr;
      return;
    }
    set_stream(h, s);
  }
};

struct Shape {
  const char* model;
  const char* name;
  int64_t rows, cols;
};

struct Weights {
  std::vector<DeviceBuffer> w, s, b;
  std::vector<DeviceQuantWeight> views;
  int64_t bytes = 0;  // per copy: weights + scales + biases
};

// Weights of `batch` stacked slices (MoE experts), in as many copies as span >= 4x the L2
// (at most 64) so that rotating through them never hits in L2.
inline Weights MakeWeights(const Shape& sh, QuantSpec spec, int64_t l2_bytes, cudaStream_t st,
                           int64_t batch = 1) {
  Weights r;
  const int64_t elems = batch * sh.rows * sh.cols;
  const int64_t wbytes = spec.mode == QuantMode::kNone ? elems * 2 : elems * spec.bits / 8;
  const int64_t groups = spec.mode == QuantMode::kNone ? 0 : elems / spec.group_size;
  const int64_t sbytes = spec.mode == QuantMode::kAffine ? groups * 2 : groups;
  const int64_t bbytes = spec.mode == QuantMode::kAffine ? groups * 2 : 0;
  r.bytes = wbytes + sbytes + bbytes;
  const int copies = static_cast<int>(std::clamp<int64_t>((4 * l2_bytes + r.bytes - 1) / r.bytes, 1, 64));
  for (int c = 0; c < copies; ++c) {
    DeviceQuantWeight v;
    v.spec = spec;
    v.dtype = spec.mode == QuantMode::kNone ? DType::kBF16 : DType::kU32;
    v.scale_dtype = spec.mode == QuantMode::kAffine ? DType::kBF16 : DType::kU8;
    v.batch = batch;
    v.rows = sh.rows;
    v.cols = sh.cols;
    r.w.push_back(Must(DeviceBuffer::Allocate(wbytes)));
    if (spec.mode == QuantMode::kNone) {
      FillBf16<<<1024, 256, 0, st>>>(r.w.back().as<uint16_t>(), wbytes / 2, c, 0.01f);
    } else {
      FillRandom<<<1024, 256, 0, st>>>(r.w.back().as<uint32_t>(), wbytes / 4, 100 + c);
    }
    v.weight = r.w.back().data();
    if (sbytes > 0) {
      r.s.push_back(Must(DeviceBuffer::Allocate(sbytes)));
      if (spec.mode == QuantMode::kAffine) {
        FillBf16<<<1024, 256, 0, st>>>(r.s.back().as<uint16_t>(), groups, 200 + c, 0.002f);
      } else {
        FillE8M0<<<1024, 256, 0, st>>>(r.s.back().as<uint8_t>(), groups, 200 + c);
      }
      v.scales = r.s.back().data();
    }
    if (bbytes > 0) {
      r.b.push_back(Must(DeviceBuffer::Allocate(bbytes)));
      FillBf16<<<1024, 256, 0, st>>>(r.b.back().as<uint16_t>(), groups, 300 + c, -0.016f);
      v.biases = r.b.back().data();
    }
    r.views.push_back(v);
  }
  BENCH_CHECK(CudaOk(cudaGetLastError()));
  BENCH_CHECK(CudaOk(cudaStreamSynchronize(st)));
  return r;
}

inline std::string ModeName(QuantSpec s) {
  switch (s.mode) {
    case QuantMode::kMxfp4: return "mxfp4";
    case QuantMode::kAffine: return "affine4 g64 bf16";
    default: return "bf16";
  }
}

}  // namespace ring::cuda::bench

#endif  // RINGSERVE_BENCH_GPU_BENCH_UTIL_CUH_
