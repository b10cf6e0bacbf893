// File: bench/cpu_gemv_bench.cc
//
// Decode-time (M = 1) quantized GEMV on the CPU against this machine's memory bandwidth.
//
//   ninja -C build cpu_gemv_bench && ./build/bench/cpu_gemv_bench [--quick]
//
// 1. Probes the read bandwidth: all pool threads (cpu::ParallelFor, the same pool the
//    kernels use) sum disjoint slices of a buffer of max(4 x LLC, 1 GiB).
// 2. Times QMatmulT(m=1) for mxfp4 and affine int4 (g64, bf16 scales) on Qwen3-8B and GLM
//    expert shapes. Each shape is replicated until the copies exceed 2 x LLC and the calls
//    cycle through the copies, so every call streams its weights from DRAM.
// 3. Prints weight bytes per call (packed words + scales + biases), GB/s, and the ratio
//    to the probed bandwidth, all measured in this one run.
// 4. A second table keeps one 1024 x 4096 matrix resident in cache and times M = 1, 2, 4, 8
//    rows of x: the kernels' compute ceiling, separate from DRAM.
// On a shared machine other processes steal cycles and bandwidth at random, so probe and
// GEMV passes are interleaved (one probe before every pass) and each reports its best; the
// ratio divides by the best probe of the whole run, which can only understate it. The
// "CPU share" column is the process CPU time over wall time x threads during the best
// pass: below 1.0 other processes held the cores part of the time.
// --quick shrinks the buffers (for smoke runs; the numbers then include cache hits).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "bench/bench_util.h"
#include "kernels/quant.h"

namespace {

using ring::bench::Clock;
using ring::bench::Seconds;

// CPU seconds (user + system) this process has used so far.
double ProcessCpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

uint64_t g_rng = 0x9e3779b97f4a7c15ull;
uint64_t Next() {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return g_rng;
}

struct Format {
  const char* name;
  ring::QuantSpec spec;
  ring::DType scale_dtype;
};

struct Copy {
  std::vector<uint32_t> w;
  std::vector<uint16_t> s16;  // affine bf16 scales / biases
  std::vector<uint16_t> b16;
  std::vector<uint8_t> s8;  // mxfp4 E8M0 scales
  ring::QuantWeight qw;
};

// Random packed weights with plausible scales (the kernels' speed does not depend on values).
void MakeCopy(const Format& f, int64_t rows, int64_t cols, Copy* c) {
  const int64_t words = rows * cols * f.spec.bits / 32;
  const int64_t groups = rows * cols / f.spec.group_size;
  c->w.resize(words);
  for (auto& v : c->w) v = static_cast<uint32_t>(Next());
  c->qw.spec = f.spec;
  c->qw.weight = {ring::DType::kU32, {rows, cols * f.spec.bits / 32}, c->w.data()};
  if (f.spec.mode == ring::QuantMode::kAffine) {
    c->s16.resize(groups);
    c->b16.resize(groups);
    for (int64_t i = 0; i < groups; ++i) {
      c->s16[i] = ring::FloatToBf16(1e-3f * (1 + Next() % 8));
      c->b16[i] = ring::FloatToBf16(-8e-3f);
    }
    c->qw.scales = {ring::DType::kBF16, {rows, cols / f.spec.group_size}, c->s16.data()};
    c->qw.biases = {ring::DType::kBF16, {rows, cols / f.spec.group_size}, c->b16.data()};
  } else {
    c->s8.resize(groups);
    for (auto& v : c->s8) v = static_cast<uint8_t>(118 + Next() % 6);
    c->qw.scales = {ring::DType::kU8, {rows, cols / f.spec.group_size}, c->s8.data()};
  }
  c->qw.name = f.name;
}

int64_t WeightBytes(const ring::QuantWeight& w) {
  return w.weight.nbytes() + w.scales.nbytes() + (w.biases.present() ? w.biases.nbytes() : 0);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int64_t llc = ring::bench::LastLevelCacheBytes();
  const int threads = ring::cpu::NumThreads();
  const int64_t probe_bytes = quick ? (64 << 20) : std::max<int64_t>(4 * llc, int64_t{1} << 30);
  const int64_t stream_bytes = quick ? (32 << 20) : 2 * llc;
  std::printf("threads %d, LLC %.0f MiB, probe buffer %.0f MiB\n", threads, llc / 1048576.0,
              probe_bytes / 1048576.0);
  ring::bench::BandwidthProbe probe_buf(probe_bytes);
  double bw = probe_buf.Measure(5);
  std::printf("memory read bandwidth, best of 5 before the GEMVs: %.2f GB/s\n", bw / 1e9);

  const Format formats[] = {
      {"mxfp4", {ring::QuantMode::kMxfp4, 4, 32}, ring::DType::kU8},
      {"affine4 g64 bf16", {ring::QuantMode::kAffine, 4, 64}, ring::DType::kBF16},
  };
  struct ShapeRow {
    int64_t rows, cols;
    const char* what;
  };
  const ShapeRow shapes[] = {{4096, 4096, "Qwen3-8B q/o_proj"},
                             {12288, 4096, "Qwen3-8B gate/up"},
                             {4096, 12288, "Qwen3-8B down"},
                             {2048, 6144, "GLM expert gate/up"},
                             {6144, 2048, "GLM expert down"}};

  struct Result {
    std::string shape, what, format;
    double mib, us, gbs, cpu_share;
  };
  std::vector<Result> results;
  for (const ShapeRow& sh : shapes) {
    for (const Format& f : formats) {
      Copy probe;
      MakeCopy(f, sh.rows, sh.cols, &probe);
      const int64_t bytes = WeightBytes(probe.qw);
      const int64_t ncopies = std::max<int64_t>(2, (stream_bytes + bytes - 1) / bytes);
      std::vector<Copy> copies(ncopies);
      copies[0] = std::move(probe);
      copies[0].qw.weight.data = copies[0].w.data();
      for (int64_t i = 1; i < ncopies; ++i) MakeCopy(f, sh.rows, sh.cols, &copies[i]);
      // MakeCopy pointed the views at its own vectors; re-point after the moves above.
      for (auto& c : copies) {
        c.qw.weight.data = c.w.data();
        c.qw.scales.data = f.spec.mode == ring::QuantMode::kAffine
                               ? static_cast<const void*>(c.s16.data())
                               : static_cast<const void*>(c.s8.data());
        if (f.spec.mode == ring::QuantMode::kAffine) c.qw.biases.data = c.b16.data();
      }
      std::vector<float> x(sh.cols), y(sh.rows);
      for (auto& v : x) v = static_cast<float>(static_cast<int64_t>(Next() % 2001) - 1000) * 1e-3f;
      for (auto& c : copies) ring::QMatmulT(x.data(), 1, c.qw, 0, y.data());  // warm up
      const int passes = quick ? 3 : 16;
      double best = 1e30, best_share = 0;
      for (int p = 0; p < passes; ++p) {
        bw = std::max(bw, probe_buf.Measure(1));
        const double cpu0 = ProcessCpuSeconds();
        const auto t0 = Clock::now();
        for (auto& c : copies) ring::QMatmulT(x.data(), 1, c.qw, 0, y.data());
        const double wall = Seconds(t0, Clock::now());
        if (wall / ncopies < best) {
          best = wall / ncopies;
          best_share = (ProcessCpuSeconds() - cpu0) / (wall * threads);
        }
      }
      results.push_back({std::to_string(sh.rows) + " x " + std::to_string(sh.cols), sh.what, f.name,
                         bytes / 1048576.0, best * 1e6, bytes / best / 1e9, best_share});
      std::fprintf(stderr, "  %s %s done\n", results.back().shape.c_str(), f.name);
    }
  }
  std::printf("best memory read bandwidth over the run (ratios use it): %.2f GB/s\n\n", bw / 1e9);
  std::printf(
      "| shape (N x K) | model use | format | weight MiB/call | us/call | GB/s | / bandwidth | "
      "CPU share |\n");
  std::printf("|---|---|---|---:|---:|---:|---:|---:|\n");
  for (const Result& r : results) {
    std::printf("| %s | %s | %s | %.2f | %.1f | %.2f | %.2f | %.2f |\n", r.shape.c_str(),
                r.what.c_str(), r.format.c_str(), r.mib, r.us, r.gbs, r.gbs * 1e9 / bw,
                r.cpu_share);
  }

  // Compute ceiling: one matrix resident in cache (1 MiB per thread), M = 1..8.
  std::printf("\nweights resident in cache (1024 x 4096, %d threads):\n\n", threads);
  std::printf("| format | M | us/call | weight GB/s | GFLOP/s | CPU share |\n");
  std::printf("|---|---:|---:|---:|---:|---:|\n");
  for (const Format& f : formats) {
    Copy c;
    MakeCopy(f, 1024, 4096, &c);
    const int64_t bytes = WeightBytes(c.qw);
    for (int m : {1, 2, 4, 8}) {
      std::vector<float> x(m * 4096), y(m * 1024);
      for (auto& v : x) v = static_cast<float>(static_cast<int64_t>(Next() % 2001) - 1000) * 1e-3f;
      const int reps = 20;
      double best = 1e30, best_share = 0;
      for (int p = 0; p < (quick ? 3 : 10); ++p) {
        const double cpu0 = ProcessCpuSeconds();
        const auto t0 = Clock::now();
        for (int r = 0; r < reps; ++r) ring::QMatmulT(x.data(), m, c.qw, 0, y.data());
        const double wall = Seconds(t0, Clock::now());
        if (wall / reps < best) {
          best = wall / reps;
          best_share = (ProcessCpuSeconds() - cpu0) / (wall * threads);
        }
      }
      std::printf("| %s | %d | %.1f | %.2f | %.1f | %.2f |\n", f.name, m, best * 1e6,
                  bytes / best / 1e9, 2.0 * m * 1024 * 4096 / best / 1e9, best_share);
    }
  }
  return 0;
}
