// GPU sampling benchmark: the next token of one row of logits that is on the device, (a) by
// cuda::SampleRow (only the token comes back), (b) as a stage did before it: copy the row to
// pinned host memory and run cpu::SampleToken there. Per parameter set, microseconds per
// token (wall clock: both end synchronized on the host), median of 5 batches of N tokens,
// and the ratio. Logits are bf16-rounded normals (sigma 3 ~ a peaked LM distribution, sigma 1
// a flat one whose top-p set overflows the on-chip candidate list: the full-sort path).
// Then cuda::ArgMaxRows (the greedy step after lm_head) over 1 and 8 rows of the same width:
// wall clock of one call plus a stream synchronize, and device time per call from events
// around `iters` back-to-back calls.
//
//   gpu_sampling_bench [--iters N] [--vocab V]     (default 50 tokens, GLM-5's 154880)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/sampling.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/sampling.cuh"
#include "kernels/dtype.h"

namespace ring::cuda {
namespace {

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

// Median over 5 batches of `iters` calls of fn(i), in microseconds per call.
template <typename Fn>
double MedianUs(int iters, Fn fn) {
  std::vector<double> us;
  for (int b = 0; b < 6; ++b) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) fn(i);
    const double dt = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (b > 0) us.push_back(dt / iters);  // batch 0 warms up
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

int Main(int argc, char** argv) {
  int iters = 50;
  int64_t vocab = 154880;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--iters") == 0) iters = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--vocab") == 0) vocab = std::atoll(argv[i + 1]);
  }
  struct Case {
    const char* name;
    float sigma, temperature, top_p, min_p;
    int32_t top_k;
    bool logprobs;
  };
  const Case cases[] = {
      {"greedy", 3, 0, 1, 0, 0, false},
      {"greedy logprobs top20", 3, 0, 1, 0, 0, true},
      {"T1", 3, 1, 1, 0, 0, false},
      {"T0.7 top-k 50", 3, 0.7f, 1, 0, 50, false},
      {"T1 top-p 0.9", 3, 1, 0.9f, 0, 0, false},
      {"T1 top-k 40 top-p 0.95 min-p 0.05", 3, 1, 0.95f, 0.05f, 40, false},
      {"T1 top-p 0.9 flat (full sort)", 1, 1, 0.9f, 0, 0, false},
  };
  float* pinned = nullptr;
  if (const cudaError_t e = cudaMallocHost(&pinned, vocab * sizeof(float)); e != cudaSuccess) {
    std::fprintf(stderr, "no usable CUDA device: %s\n", cudaGetErrorString(e));
    return 1;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // one line per case, even if a later one is slow
  std::printf("vocab %lld, %d tokens per batch\n", static_cast<long long>(vocab), iters);
  std::printf("| %-36s | %9s | %12s | %7s |\n", "params", "GPU us", "D2H+CPU us", "speedup");
  for (const Case& c : cases) {
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.f, c.sigma);
    std::vector<float> x(vocab);
    for (float& v : x) v = RoundBf16(nd(rng));
    absl::StatusOr<DeviceBuffer> dx = DeviceBuffer::FromVector(x);
    Check(dx.status(), "upload");
    SampleRequest req;
    req.params.temperature = c.temperature;
    req.params.top_p = c.top_p;
    req.params.min_p = c.min_p;
    req.params.top_k = c.top_k;
    req.params.logprobs = c.logprobs;
    req.params.top_logprobs = c.logprobs ? 20 : 0;
    req.counts = {{1, 2}, {100, 1}, {1000, 3}};
    req.params.frequency_penalty = 0.2f;
    auto uniform = [](int i) { return (i * 0.6180339887) - static_cast<int>(i * 0.6180339887); };
    SampledToken t;
    const double gpu = MedianUs(iters, [&](int i) {
      req.uniform = uniform(i);
      Check(SampleRow(dx->as<float>(), vocab, req, &t, nullptr), "SampleRow");
    });
    const double cpu = MedianUs(iters, [&](int i) {
      req.uniform = uniform(i);
      if (cudaMemcpy(pinned, dx->data(), vocab * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) {
        std::exit(1);
      }
      t = cpu::SampleToken(absl::MakeConstSpan(pinned, vocab), req);
    });
    std::printf("| %-36s | %9.1f | %12.1f | %6.1fx |\n", c.name, gpu, cpu, cpu / gpu);
  }
  std::printf("| %-36s | %9s | %12s |\n", "ArgMaxRows", "wall us", "device us");
  for (int64_t rows : {int64_t{1}, int64_t{8}}) {
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.f, 3.f);
    std::vector<float> x(rows * vocab);
    for (float& v : x) v = RoundBf16(nd(rng));
    absl::StatusOr<DeviceBuffer> dx = DeviceBuffer::FromVector(x);
    Check(dx.status(), "upload");
    absl::StatusOr<DeviceBuffer> dout = DeviceBuffer::Allocate(rows * sizeof(int32_t));
    Check(dout.status(), "alloc");
    auto argmax = [&] { Check(ArgMaxRows(dx->as<float>(), rows, vocab, dout->as<int32_t>(), nullptr), "ArgMaxRows"); };
    const double wall = MedianUs(iters, [&](int) {
      argmax();
      if (cudaStreamSynchronize(nullptr) != cudaSuccess) std::exit(1);
    });
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<double> dev;
    for (int b = 0; b < 6; ++b) {
      cudaEventRecord(e0, nullptr);
      for (int i = 0; i < iters; ++i) argmax();
      cudaEventRecord(e1, nullptr);
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      if (b > 0) dev.push_back(1000.0 * ms / iters);
    }
    std::sort(dev.begin(), dev.end());
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    const std::string name = "rows " + std::to_string(rows);
    std::printf("| %-36s | %9.1f | %12.1f |\n", name.c_str(), wall, dev[dev.size() / 2]);
  }
  cudaFreeHost(pinned);
  return 0;
}

}  // namespace
}  // namespace ring::cuda

int main(int argc, char** argv) { return ring::cuda::Main(argc, argv); }
