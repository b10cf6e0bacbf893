// GPU prefill GEMM benchmark: measures the device's bf16 tensor-core rate (cuBLAS bf16 GEMM,
// 8192^3, best of several), then our quantized prefill GEMM (QMatmulT with bf16 x, M > 8,
// the path the model's prefill takes) at M = 512 and 2048 on the GLM-5.2 linear shapes, in
// TFLOP/s, as a fraction of that measured rate and of the nominal H200 dense bf16 figure,
// and against cuBLAS bf16 on the same shapes (weights as bf16: 4x the bytes of ours).
// Then the MoE prefill: 256 stacked experts, 64 tokens each (2048 tokens x top-8, balanced
// routing) in one launch through expert ids, against cuBLAS strided-batched bf16.
//
//   gpu_gemm_bench [--no-cublas] [--only NAME] [--modes mxfp4,affine4] [--ms 512,2048]
//                  [--tile N] [--peak-only]
//
// --peak-only prints the cuBLAS peak probe alone (exit 1 without cuBLAS), the figure
// bench/gpu/glm_trace_report.py --peak-tflops reads the slice's prefill against.
// --tile N forces GEMM tile configuration N (TEST_SetGemmTile; tuning aid).
// Timing (bench/gpu_bench_util.cuh): CUDA events around back-to-back launches, median of 5
// batches after a warm-up batch; each batch runs about 25 ms of work (iterations sized from
// one probe launch). Weight copies rotate as in gpu_gemv_bench, so small weights are not
// timed out of L2 (at these M the GEMM is bound by arithmetic, not bytes, anyway).
// FLOPs counted: 2 * M * rows * cols per matrix (per expert problem for MoE).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/gpu_bench_util.cuh"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/qgemv.cuh"

namespace ring::cuda {
namespace {

using namespace bench;  // NOLINT: the shared benchmark helpers

// NVIDIA's H100/H200 SXM datasheet: dense bf16 tensor-core rate (TFLOP/s).
constexpr double kNominalBf16Tflops = 989.0;

struct Opts {
  bool use_cublas = true, peak_only = false;
  std::string only, modes = "mxfp4,affine4";
  std::vector<int> ms = {512, 2048};
};

// Median time per launch (ms), with a batch size that makes each timed batch ~25 ms.
float TimeLaunchMs(cudaStream_t st, const std::function<void(int)>& launch) {
  const float probe = TimeMs(st, 1, launch);
  const int iters = static_cast<int>(std::clamp(25.f / std::max(probe, 1e-3f), 2.f, 200.f));
  return MedianMs(st, iters, launch);
}

double Tflops(double flops, float ms) { return flops / (ms * 1e-3) / 1e12; }

// cuBLAS bf16 GEMM on column-major operands: C[n x m] = A^T[n x k] B[k x m], fp32 accumulate.
// `out` is the output dtype (fp32 as our kernel writes, or bf16 for the peak probe).
void CublasGemm(const Cublas& c, int n, int m, int k, const void* a, const void* b, void* out,
                cudaDataType out_type) {
  const float alpha = 1.f, beta = 0.f;
  c.gemm_ex(c.h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, a, CUDA_R_16BF, k, b, CUDA_R_16BF, k,
            &beta, out, out_type, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

// The device's bf16 matrix rate: cuBLAS bf16 GEMM 8192^3 on signed random data, the best
// median of 3 rounds (TFLOP/s).
double ProbePeak(const Cublas& c, cudaStream_t st) {
  constexpr int64_t kN = 8192;
  DeviceBuffer a = Must(DeviceBuffer::Allocate(kN * kN * 2));
  DeviceBuffer b = Must(DeviceBuffer::Allocate(kN * kN * 2));
  DeviceBuffer out = Must(DeviceBuffer::Allocate(kN * kN * 2));
  FillBf16<<<1024, 256, 0, st>>>(a.as<uint16_t>(), kN * kN, 11, 0.05f, true);
  FillBf16<<<1024, 256, 0, st>>>(b.as<uint16_t>(), kN * kN, 12, 0.05f, true);
  BENCH_CHECK(CudaOk(cudaGetLastError()));
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    const float ms = TimeLaunchMs(st, [&](int) {
      CublasGemm(c, kN, kN, kN, a.data(), b.data(), out.data(), CUDA_R_16BF);
    });
    best = std::max(best, Tflops(2.0 * kN * kN * kN, ms));
  }
  BENCH_CHECK(CudaOk(cudaGetLastError()));
  std::printf("tensor-core peak probe: cuBLAS bf16 GEMM 8192^3 (bf16 out, fp32 accumulate) "
              "%.0f TFLOP/s (best of 3 medians); nominal H200 dense bf16 %.0f TFLOP/s\n",
              best, kNominalBf16Tflops);
  return best;
}

void PrintHeader() {
  std::printf("\n| %-15s | %-13s | %4s | %-16s | %9s | %7s | %7s | %7s | %11s | %8s | %s\n", "matrix",
              "rows x cols", "M", "mode", "ms", "TFLOP/s", "%peak", "%989", "cuBLAS bf16",
              "ours/cuB", "kernel");
}

void PrintRow(const char* name, int64_t rows, int64_t cols, int64_t m, const std::string& mode,
              float ms, double flops, double peak, float cublas_ms, const std::string& kernel) {
  const double tf = Tflops(flops, ms);
  char cub[32] = "n/a", ratio[32] = "n/a";
  if (cublas_ms > 0) {
    std::snprintf(cub, sizeof(cub), "%.0f TF/s", Tflops(flops, cublas_ms));
    std::snprintf(ratio, sizeof(ratio), "%.2f", cublas_ms / ms);
  }
  std::printf("| %-15s | %6ldx%-6ld | %4ld | %-16s | %9.3f | %7.1f | %6.1f%% | %6.1f%% | %11s | %8s | %s\n",
              name, static_cast<long>(rows), static_cast<long>(cols), static_cast<long>(m),
              mode.c_str(), ms, tf, 100.0 * tf / peak, 100.0 * tf / kNominalBf16Tflops, cub, ratio,
              kernel.c_str());
  std::fflush(stdout);
}

std::vector<QuantSpec> SpecsOf(const Opts& o) {
  std::vector<QuantSpec> specs;
  if (o.modes.find("mxfp4") != std::string::npos) specs.push_back({QuantMode::kMxfp4, 4, 32});
  if (o.modes.find("affine4") != std::string::npos) specs.push_back({QuantMode::kAffine, 4, 64});
  return specs;
}

// Dense linear layers: one launch per matrix.
void RunDense(const Opts& o, const DeviceInfo& dev, const Cublas& cublas, double peak,
              cudaStream_t st) {
  std::vector<Shape> shapes = {
      {"GLM-5.2", "q_a_proj", 2048, 6144},       {"GLM-5.2", "q_b_proj", 16384, 2048},
      {"GLM-5.2", "kv_a_proj", 576, 6144},       {"GLM-5.2", "o_proj", 6144, 16384},
      {"GLM-5.2", "dense gate_up", 24576, 6144}, {"GLM-5.2", "dense down", 6144, 12288},
      {"GLM-5.2", "lm_head", 154880, 6144},
  };
  if (!o.only.empty()) {
    std::vector<Shape> kept;
    for (const Shape& sh : shapes) {
      if (std::string(sh.name).find(o.only) != std::string::npos) kept.push_back(sh);
    }
    shapes = kept;
  }
  const int max_m = *std::max_element(o.ms.begin(), o.ms.end());
  const int64_t max_cols = 16384, max_rows = 154880;
  DeviceBuffer x = Must(DeviceBuffer::Allocate(int64_t{max_m} * max_cols * 2));
  FillBf16<<<1024, 256, 0, st>>>(x.as<uint16_t>(), int64_t{max_m} * max_cols, 7, 0.5f, true);
  DeviceBuffer y = Must(DeviceBuffer::Allocate(int64_t{max_m} * max_rows * 4));
  BENCH_CHECK(CudaOk(cudaGetLastError()));
  PrintHeader();
  for (const Shape& sh : shapes) {
    std::vector<float> cublas_ms(o.ms.size(), 0.f);
    if (cublas.ok()) {
      Weights wb = MakeWeights(sh, QuantSpec{QuantMode::kNone, 0, 0}, dev.l2_bytes, st);
      for (size_t i = 0; i < o.ms.size(); ++i) {
        cublas_ms[i] = TimeLaunchMs(st, [&](int it) {
          CublasGemm(cublas, static_cast<int>(sh.rows), o.ms[i], static_cast<int>(sh.cols),
                     wb.views[it % wb.views.size()].weight, x.data(), y.data(), CUDA_R_32F);
        });
      }
    }
    for (QuantSpec spec : SpecsOf(o)) {
      Weights w = MakeWeights(sh, spec, dev.l2_bytes, st);
      for (size_t i = 0; i < o.ms.size(); ++i) {
        QMatmulArgs a;
        a.x = x.data();
        a.x_dtype = DType::kBF16;
        a.m = o.ms[i];
        a.y = y.as<float>();
        const std::string kernel = Must(DescribeQmm(w.views[0], a));
        const float ms = TimeLaunchMs(st, [&](int it) {
          BENCH_CHECK(QMatmulT(w.views[it % w.views.size()], a, st));
        });
        PrintRow(sh.name, sh.rows, sh.cols, o.ms[i], ModeName(spec), ms,
                 2.0 * o.ms[i] * sh.rows * sh.cols, peak, cublas_ms[i], kernel);
      }
    }
  }
}

// MoE prefill: 2048 tokens x top-8 = 16384 slots over 256 experts, balanced (64 each), as
// 256 problems of M = 64 with shuffled expert ids in one launch.
void RunMoe(const Opts& o, const DeviceInfo& dev, const Cublas& cublas, double peak,
            cudaStream_t st) {
  constexpr int64_t kExperts = 256, kPerExpert = 64;
  const Shape shapes[] = {{"GLM-5.2", "expert gate/up", 2048, 6144},
                          {"GLM-5.2", "expert down", 6144, 2048}};
  std::vector<int32_t> ids(kExperts);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(5));
  DeviceBuffer dids = Must(DeviceBuffer::FromVector(ids));
  const int64_t slots = kExperts * kPerExpert;
  DeviceBuffer x = Must(DeviceBuffer::Allocate(slots * 6144 * 2));
  FillBf16<<<1024, 256, 0, st>>>(x.as<uint16_t>(), slots * 6144, 8, 0.5f, true);
  DeviceBuffer y = Must(DeviceBuffer::Allocate(slots * 6144 * 4));
  BENCH_CHECK(CudaOk(cudaGetLastError()));
  std::printf("\nMoE prefill: %ld experts x M=%ld tokens (2048 tokens x top-8, balanced), one launch\n",
              static_cast<long>(kExperts), static_cast<long>(kPerExpert));
  PrintHeader();
  for (const Shape& sh : shapes) {
    if (!o.only.empty() && std::string(sh.name).find(o.only) == std::string::npos) continue;
    const double flops = 2.0 * slots * sh.rows * sh.cols;
    float cublas_ms = 0;
    if (cublas.ok()) {
      Weights wb = MakeWeights(sh, QuantSpec{QuantMode::kNone, 0, 0}, dev.l2_bytes, st, kExperts);
      const float alpha = 1.f, beta = 0.f;
      cublas_ms = TimeLaunchMs(st, [&](int) {
        cublas.gemm_strided_batched_ex(
            cublas.h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(sh.rows), kPerExpert,
            static_cast<int>(sh.cols), &alpha, wb.views[0].weight, CUDA_R_16BF,
            static_cast<int>(sh.cols), sh.rows * sh.cols, x.data(), CUDA_R_16BF,
            static_cast<int>(sh.cols), kPerExpert * sh.cols, &beta, y.data(), CUDA_R_32F,
            static_cast<int>(sh.rows), kPerExpert * sh.rows, static_cast<int>(kExperts),
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      });
    }
    for (QuantSpec spec : SpecsOf(o)) {
      Weights w = MakeWeights(sh, spec, dev.l2_bytes, st, kExperts);
      QMatmulArgs a;
      a.x = x.data();
      a.x_dtype = DType::kBF16;
      a.m = kPerExpert;
      a.y = y.as<float>();
      a.problems = kExperts;
      a.expert_ids = dids.as<int32_t>();
      a.x_problem_stride = kPerExpert * sh.cols;
      a.y_problem_stride = kPerExpert * sh.rows;
      const std::string kernel = Must(DescribeQmm(w.views[0], a));
      const float ms = TimeLaunchMs(st, [&](int it) {
        BENCH_CHECK(QMatmulT(w.views[it % w.views.size()], a, st));
      });
      PrintRow(sh.name, sh.rows, sh.cols, slots, ModeName(spec), ms, flops, peak, cublas_ms,
               kernel);
    }
  }
}

int Main(int argc, char** argv) {
  Opts o;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--no-cublas")) {
      o.use_cublas = false;
    } else if (!std::strcmp(argv[i], "--peak-only")) {
      o.peak_only = true;
    } else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) {
      o.only = argv[++i];
    } else if (!std::strcmp(argv[i], "--tile") && i + 1 < argc) {
      TEST_SetGemmTile(std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--modes") && i + 1 < argc) {
      o.modes = argv[++i];
    } else if (!std::strcmp(argv[i], "--ms") && i + 1 < argc) {
      o.ms.clear();
      for (const char* p = argv[++i]; *p != '\0';) {
        char* end = nullptr;
        o.ms.push_back(static_cast<int>(std::strtol(p, &end, 10)));
        p = *end == ',' ? end + 1 : end;
      }
    }
  }
  const std::optional<DeviceInfo> found = FirstDevice();
  if (!found) return 0;
  const DeviceInfo& dev = *found;
  cudaStream_t st;
  BENCH_CHECK(CudaOk(cudaStreamCreate(&st)));
  Cublas cublas;
  if (o.use_cublas) cublas.Load(st);
  double peak = kNominalBf16Tflops;
  if (cublas.ok()) {
    peak = ProbePeak(cublas, st);
  } else {
    std::printf("no cuBLAS: %%peak uses the nominal %.0f TFLOP/s\n", kNominalBf16Tflops);
  }
  if (o.peak_only) return cublas.ok() ? 0 : 1;
  RunDense(o, dev, cublas, peak, st);
  RunMoe(o, dev, cublas, peak, st);
  BENCH_CHECK(CudaOk(cudaDeviceSynchronize()));
  std::printf("\nTarget (issue #3): linear-layer throughput >= 0.4 of the measured bf16 peak "
              "(%.0f TFLOP/s) at M = 2048.\n", peak);
  return 0;
}

}  // namespace
}  // namespace ring::cuda

int main(int argc, char** argv) { return ring::cuda::Main(argc, argv); }
