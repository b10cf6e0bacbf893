// GPU GEMV benchmark: measures the device's read bandwidth, then our quantized GEMV at
// batch 1/2/4/8 on the GLM-5.2 and Qwen3-8B shapes, as bytes read per second and as a
// fraction of that measured bandwidth (the M2/M3 metrics of the performance anchors), plus
// cuBLAS bf16 GEMV on the same shapes for a per-weight-element speed ratio.
//
//   gpu_gemv_bench [--quick] [--no-cublas] [--iters N] [--only NAME] [--modes mxfp4,affine4] [--sweep | --many | --moe]
//                  [--sweep [--cfgs NAME,..] [--ms 1,2,4,8]] [--no-probe]
//
// Table columns: "us" = plain launches (QMatmulArgs::overlap = 0); "PDL us" = the same with
// programmatic dependent launch (overlap = 2: the next launch streams its first weights
// while the previous one drains, as in a decode step's chain of kernels).
// --many times weights that share x (q/k/v, gate/up, GLM-5.2's x projections) as separate
// launches and as one QMatmulTMany launch.
// --moe times GLM-5.2's routed-expert launches of a decode step (gate+up, down; 1, 2 and 8
// tokens; gate+up with the shared expert, also writing SwiGLU's output as ExpertsSwiGlu runs
// it) under the --sweep configurations, then one token's whole MoE block (MoeBlock).
// --sweep times the decode GEMV's configurations side by side (TEST_SetQgemvTuning) for
// M = 1, 2 and 8 (tuning aid).
// --only NAME keeps the shapes whose matrix name contains NAME (e.g. for ncu).
//
// "%read": the GEMV's bytes per second against a read-only streaming pass over the same
// packed weight bytes (kernels/cuda/bandwidth.h LaunchReadPass, the same rotating copies):
// what launch ramp and tail leave of the probe at that size (the sweep prints it per matrix).
// Timing: CUDA events around back-to-back launches; each launch reads a different copy of
// the weights (copies rotate until they span >= 4x the L2), so no iteration hits in L2.
// Median of 5 batches of N launches (after a warm-up batch).
// Bytes counted: packed weights + scales (+ biases) + activations. Weights are random bits
// with realistic scales: the kernels' speed does not depend on the values.
// cuBLAS is loaded with dlopen (bench/gpu_bench_util.cuh): where it is absent the column
// reads n/a.
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/gpu_bench_util.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/bandwidth.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/qgemv.cuh"

namespace ring::cuda {
namespace {

using namespace bench;  // NOLINT: the shared benchmark helpers

double ProbeReadBandwidth(const DeviceInfo& dev, cudaStream_t s) {
  const int64_t bytes = int64_t{2} << 30;
  // kernels/cuda/bandwidth.h: best of 3 grid sizes x 5 launches over 2 GiB, in GB/s here.
  const double best = Must(ring::cuda::ReadBandwidth(dev.ordinal, bytes, 5)) / 1e9;
  DeviceBuffer buf = Must(DeviceBuffer::Allocate(bytes));
  FillRandom<<<1024, 256, 0, s>>>(buf.as<uint32_t>(), bytes / 4, 1);
  BENCH_CHECK(CudaOk(cudaGetLastError()));
  // Device-to-device copy (read + write bytes) as a second reference point.
  DeviceBuffer dst = Must(DeviceBuffer::Allocate(bytes / 2));
  const float ms = TimeMs(s, 5, [&](int) {
    cudaMemcpyAsync(dst.data(), buf.data(), bytes / 2, cudaMemcpyDeviceToDevice, s);
  });
  std::printf("bandwidth probe: read-only %.0f GB/s (best of 15 over 2 GiB); D2D copy %.0f GB/s (read+write)\n",
              best, bytes / (ms * 1e-3) / 1e9);
  return best;
}

struct Opts {
  bool quick = false, use_cublas = true, sweep = false, probe = true, many = false, moe = false;
  int iters = 40;
  std::string only, modes = "mxfp4,affine4";
  std::string cfgs;           // --cfgs a,b: only these --sweep configurations (empty: all)
  std::vector<int> ms{1, 2, 8};  // --ms 1,2,4,8: the sweep's rows of x
};

// One QMatmulT configuration's time per launch (us).
float TimeQmm(const Weights& w, QMatmulArgs a, cudaStream_t st, int iters) {
  return MedianMs(st, iters, [&](int i) {
           BENCH_CHECK(QMatmulT(w.views[i % w.views.size()], a, st));
         }) * 1e3f;
}

// One decode-GEMV configuration of --sweep and --moe: TEST_SetQgemvTuning(variant, cap)
// and QMatmulArgs::overlap.
struct Cfg {
  const char* name;
  int variant, cap, overlap;
};

// A read-only streaming pass (kernels/cuda/bandwidth.h) over the same packed weight bytes
// as the GEMV reads, rotating through the same copies: what a pure streaming kernel achieves
// at this size, launch ramp and tail included (best of 1, 2 and 4 blocks of 512 threads per
// SM), in us per pass.
float ReadPassUs(const Weights& w, const DeviceInfo& dev, uint32_t* sink, cudaStream_t st, int iters) {
  float best = 1e30f;
  for (int per_sm : {1, 2, 4}) {
    const float us = MedianMs(st, iters, [&](int i) {
                       const DeviceBuffer& b = w.w[i % w.w.size()];
                       BENCH_CHECK(LaunchReadPass(b.data(), static_cast<int64_t>(b.size()) / 16 * 16,
                                                  sink, dev.sm_count * per_sm, st));
                     }) * 1e3f;
    best = std::min(best, us);
  }
  return best;
}

// The decode GEMV's load order without its arithmetic: warp (tile, k) of a block of 4 / wk
// tiles x wk warps reads rows g and g + 8 of its 16-row tile, 16 bytes at 16 * t + 64 * u
// (u < 4) of each 256-byte batch of its K range, as the 16-row kernels do. Against the
// sequential read pass it separates the cost of that address pattern from the kernel's.
// kHalf: the same bytes in 8-byte loads (lane t reads 8 * t and 32 + 8 * t of each 64-byte
// step: a quad's load is 32 contiguous bytes a row), what a kernel whose lanes split a chunk
// in two would read (session 29: a split of two lanes a chunk for 3..8 rows of x, not kept).
template <bool kHalf>
__global__ void PatternReadKernel(const uint8_t* w, int64_t rows, int64_t row_bytes, int wk, uint32_t* sink) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5;
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32 / wk) + warp / wk;
  const int64_t per = (row_bytes / 256 + wk - 1) / wk * 256;
  const int64_t k0 = (warp % wk) * per, k1 = min(row_bytes, k0 + per);
  const uint8_t* r0 = w + min(tile * 16 + g, rows - 1) * row_bytes + 16 * t;
  const uint8_t* r1 = w + min(tile * 16 + g + 8, rows - 1) * row_bytes + 16 * t;
  uint32_t acc = 0;
  for (int64_t k = k0; k + 256 <= k1; k += 256) {
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if constexpr (kHalf) {
        const uint8_t* q0 = r0 - 8 * t + k + 64 * u;  // r0 holds 16 * t
        const uint8_t* q1 = r1 - 8 * t + k + 64 * u;
        const uint2 a0 = __ldcs(reinterpret_cast<const uint2*>(q0));
        const uint2 b0 = __ldcs(reinterpret_cast<const uint2*>(q0 + 32));
        const uint2 a1 = __ldcs(reinterpret_cast<const uint2*>(q1));
        const uint2 b1 = __ldcs(reinterpret_cast<const uint2*>(q1 + 32));
        v[u] = make_uint4(a0.x, a0.y, b0.x, b0.y);
        v[4 + u] = make_uint4(a1.x, a1.y, b1.x, b1.y);
      } else {
        v[u] = __ldcs(reinterpret_cast<const uint4*>(r0 + k + 64 * u));
        v[4 + u] = __ldcs(reinterpret_cast<const uint4*>(r1 + k + 64 * u));
      }
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x12345678u) *sink = acc;
}

float PatternPassUs(const Weights& w, int wk, uint32_t* sink, cudaStream_t st, int iters, bool half = false) {
  const int64_t rows = w.views[0].rows, row_bytes = w.views[0].cols / 2;
  const int tpb = std::max(1, 4 / wk);
  const unsigned grid = static_cast<unsigned>(((rows + 15) / 16 + tpb - 1) / tpb);
  return MedianMs(st, iters, [&](int i) {
           if (half) {
             PatternReadKernel<true><<<grid, tpb * wk * 32, 0, st>>>(w.w[i % w.w.size()].as<uint8_t>(), rows,
                                                                     row_bytes, wk, sink);
           } else {
             PatternReadKernel<false><<<grid, tpb * wk * 32, 0, st>>>(w.w[i % w.w.size()].as<uint8_t>(), rows,
                                                                      row_bytes, wk, sink);
           }
         }) * 1e3f;
}

// Times the decode GEMV's configurations side by side (M = 1, 2 and 8) after a read pass over
// the same bytes: the automatic choice, forced variants, the fill rule's K split, with and
// without PDL overlap 2.
void Sweep(const std::vector<Shape>& shapes, const std::vector<QuantSpec>& specs, const DeviceInfo& dev,
           double probe, const DeviceBuffer& x, DeviceBuffer& y, cudaStream_t st, int iters,
           const std::string& only_cfgs, const std::vector<int>& ms) {
  // col-smx: the column-split mxfp4 kernel with staged x (variant 4, 32 rows a warp);
  // col1-sub / col1-smx: variants 5 and 6, 16 rows a warp (M <= 2 only, elsewhere they time
  // the automatic choice again); fill: the automatic variant with the fill rule's K split
  // (ShapeFor, TEST_SetQgemvTuning wk_cap -1); fill1: the same restricted to splits that fit
  // in one wave (wk_cap -2); wk<=N: the automatic split capped at N warps a tile.
  const Cfg all_cfgs[] = {{"auto", -1, 0, 0},     {"wr1", 0, 0, 0},         {"wr2", 1, 0, 0},
                          {"auto+pdl", -1, 0, 2}, {"col-smx", 4, 0, 0},     {"col1-sub", 5, 0, 0},
                          {"col1-smx", 6, 0, 0},  {"fill", -1, -1, 0},      {"fill+pdl", -1, -1, 2},
                          {"fill1", -1, -2, 0},   {"fill1+pdl", -1, -2, 2}, {"wk<=1", -1, 1, 0},
                          {"wk<=2", -1, 2, 0}};
  std::vector<Cfg> cfgs;
  for (const Cfg& c : all_cfgs) {
    if (only_cfgs.empty() || ("," + only_cfgs + ",").find("," + std::string(c.name) + ",") != std::string::npos) {
      cfgs.push_back(c);
    }
  }
  std::printf("\nsweep (us and %% of probe; the automatic choice is described last)\n| %-15s | %-16s | %2s |", "matrix",
              "mode", "M");
  for (const Cfg& c : cfgs) std::printf(" %15s |", c.name);
  std::printf(" auto config\n");
  for (const Shape& sh : shapes) {
    for (QuantSpec spec : specs) {
      Weights w = MakeWeights(sh, spec, dev.l2_bytes, st);
      {
        const float us = ReadPassUs(w, dev, y.as<uint32_t>(), st, iters);
        const double bytes = static_cast<double>(w.w[0].size());
        std::printf("| %-15s | %-16s | rd | read pass over the packed weights (%.1f MB): %.2f us, %.1f%% of probe;",
                    sh.name, ModeName(spec).c_str(), bytes / 1e6, us, 100.0 * bytes / (us * 1e-6) / 1e9 / probe);
        if (spec.bits == 4) {  // the 16-row kernels' load order at 1, 4 and 16 warps a tile
          for (int wk : {1, 4, 16}) {
            const float pu = PatternPassUs(w, wk, y.as<uint32_t>(), st, iters);
            std::printf(" GEMV order wk%d %.2f us (%.1f%%)", wk, pu, 100.0 * bytes / (pu * 1e-6) / 1e9 / probe);
          }
          for (int wk : {1, 4, 16}) {  // the same order in 8-byte loads
            const float pu = PatternPassUs(w, wk, y.as<uint32_t>(), st, iters, true);
            std::printf(" 8B order wk%d %.2f us (%.1f%%)", wk, pu, 100.0 * bytes / (pu * 1e-6) / 1e9 / probe);
          }
        }
        std::printf("\n");
      }
      for (int m : ms) {
        const double bytes = static_cast<double>(w.bytes) + static_cast<double>(m) * sh.cols * 2;
        std::printf("| %-15s | %-16s | %2d |", sh.name, ModeName(spec).c_str(), m);
        std::string auto_name;
        for (const Cfg& c : cfgs) {
          QMatmulArgs a;
          a.x = x.data();
          a.x_dtype = DType::kBF16;
          a.m = m;
          a.y = y.as<float>();
          a.overlap = c.overlap;
          TEST_SetQgemvTuning(c.variant, c.cap);
          if (c.variant == -1 && c.cap == 0 && c.overlap == 0) auto_name = Must(DescribeQmm(w.views[0], a));
          const float us = TimeQmm(w, a, st, iters);
          std::printf(" %7.2f %5.1f%% |", us, 100.0 * bytes / (us * 1e-6) / 1e9 / probe);
        }
        TEST_SetQgemvTuning(-1, 0);
        std::printf(" %s\n", auto_name.c_str());
        std::fflush(stdout);
      }
    }
  }
}

// Weights that share x (GLM-5.2's x projections, q/k/v, gate/up): one launch per matrix in
// a row, as a decode step issued them (PDL overlap 2 where each matrix is <= 64 MB, as the
// CUDA backend does), against one QMatmulTMany launch for all of them (PDL where the total is
// <= 64 MB, as the backend does since session 30).
void Many(const std::vector<QuantSpec>& specs, const DeviceInfo& dev, double probe,
          const DeviceBuffer& x, DeviceBuffer& y, cudaStream_t st, int iters) {
  struct Group {
    const char* model;
    const char* name;
    int64_t cols;
    std::vector<int64_t> rows;
  };
  const Group groups[] = {
      {"GLM-5.2", "q_a+kv_a+wk+wproj", 6144, {2048, 576, 128, 32}},
      {"GLM-5.2", "q_b+indexer wq_b", 2048, {16384, 4096}},
      {"GLM-5.2", "dense gate+up", 6144, {12288, 12288}},
      {"Qwen3-8B", "q+k+v", 4096, {4096, 1024, 1024}},
      {"Qwen3-8B", "gate+up", 4096, {12288, 12288}},
      {"Qwen3-0.6B", "q+k+v", 1024, {2048, 1024, 1024}},
      {"Qwen3-0.6B", "gate+up", 1024, {3072, 3072}},
  };
  constexpr int64_t kPdlMax = int64_t{64} << 20;  // the CUDA backend's OverlapMaxBytes()
  std::printf("\nweights sharing x: separate launches vs one QMatmulTMany launch (us, %% of probe)\n"
              "| %-10s | %-18s | %-16s | %2s | %9s | %9s | %7s | %s\n",
              "model", "matrices", "mode", "M", "separate", "one", "speedup", "kernel");
  for (const Group& g : groups) {
    for (QuantSpec spec : specs) {
      std::vector<Weights> ws;
      double bytes = 0;
      for (int64_t r : g.rows) {
        ws.push_back(MakeWeights(Shape{g.model, g.name, r, g.cols}, spec, dev.l2_bytes, st));
        bytes += static_cast<double>(ws.back().bytes);
      }
      for (int m : {1, 2, 8}) {
        QMatmulArgs a;
        a.x = x.data();
        a.x_dtype = DType::kBF16;
        a.m = m;
        a.round_bf16 = true;
        const float sep = MedianMs(st, iters, [&](int i) {
          int64_t off = 0;
          for (const Weights& w : ws) {
            QMatmulArgs ai = a;
            ai.y = y.as<float>() + off;
            ai.overlap = w.bytes <= kPdlMax ? 2 : 0;
            BENCH_CHECK(QMatmulT(w.views[i % w.views.size()], ai, st));
            off += m * w.views[0].rows;
          }
        }) * 1e3f;
        std::vector<const DeviceQuantWeight*> parts(ws.size());
        std::vector<float*> ys(ws.size());
        QMatmulArgs am = a;
        am.overlap = bytes <= kPdlMax ? 2 : 0;
        const float one = MedianMs(st, iters, [&](int i) {
          int64_t off = 0;
          for (size_t j = 0; j < ws.size(); ++j) {
            parts[j] = &ws[j].views[i % ws[j].views.size()];
            ys[j] = y.as<float>() + off;
            off += m * ws[j].views[0].rows;
          }
          BENCH_CHECK(QMatmulTMany(parts, ys, am, st));
        }) * 1e3f;
        for (size_t j = 0; j < ws.size(); ++j) parts[j] = &ws[j].views[0];
        const std::string kernel = Must(DescribeQmmMany(parts, am));
        const double xb = static_cast<double>(m) * g.cols * 2;
        auto pct = [&](float us) { return 100.0 * (bytes + xb) / (us * 1e-6) / 1e9 / probe; };
        std::printf("| %-10s | %-18s | %-16s | %2d | %5.1f %2.0f%% | %5.1f %2.0f%% | %6.2fx | %s\n",
                    g.model, g.name, ModeName(spec).c_str(), m, sep, pct(sep), one, pct(one),
                    sep / one, kernel.c_str());
        std::fflush(stdout);
      }
    }
  }
}

// GLM-5.2's routed experts in a decode step, as ExpertsSwiGlu launches them: gate and up of
// the chosen experts in one QMatmulTMany launch (problems = tokens x 8, x shared by a token's
// 8 slots), then down (one x row per slot), over 256 stacked experts of 2048 x 6144 /
// 6144 x 2048. Each timed launch takes the next of 64 random routings (8 distinct experts a
// token), so the experts change from one launch to the next as in a decode chain; bytes =
// the distinct experts' weights + x. Configurations as --sweep's (variant / K split).
void Moe(const DeviceInfo& dev, double probe, const DeviceBuffer& x, DeviceBuffer& y,
         cudaStream_t st, int iters) {
  constexpr int64_t kE = 256, kK = 8, kInter = 2048, kHidden = 6144, kSets = 64;
  const QuantSpec spec{QuantMode::kMxfp4, 4, 32};
  Weights gate = MakeWeights(Shape{"GLM-5.2", "expert gate", kInter, kHidden}, spec, 0, st, kE);
  Weights up = MakeWeights(Shape{"GLM-5.2", "expert up", kInter, kHidden}, spec, 0, st, kE);
  Weights down = MakeWeights(Shape{"GLM-5.2", "expert down", kHidden, kInter}, spec, 0, st, kE);
  // The shared expert's gate and up, as the joint launch's last problems (one a token).
  Weights sg = MakeWeights(Shape{"GLM-5.2", "shared gate", kInter, kHidden}, spec, dev.l2_bytes, st);
  Weights su = MakeWeights(Shape{"GLM-5.2", "shared up", kInter, kHidden}, spec, dev.l2_bytes, st);
  const double per_expert = static_cast<double>(gate.bytes + up.bytes) / kE;
  const double per_expert_down = static_cast<double>(down.bytes) / kE;
  const Cfg cfgs[] = {{"auto", -1, 0, 0},       {"wr2", 1, 0, 0},          {"col1-sub", 5, 0, 0},
                      {"col1-smx", 6, 0, 0},    {"fill", -1, -1, 0},       {"auto+pdl", -1, 0, 1},
                      {"fill+pdl", -1, -1, 1},  {"col1-sub+pdl", 5, 0, 1}, {"wk1", -1, 1, 0},
                      {"wk1+pdl", -1, 1, 1},    {"wk2", -1, 102, 0},       {"wk2+pdl", -1, 102, 1},
                      {"wk4", -1, 104, 0},      {"wk4+pdl", -1, 104, 1},   {"col-smx", 4, 0, 0},
                      {"col-smx+pdl", 4, 0, 1}, {"col-smx-wk2", 4, 102, 0}};
  std::printf("\nrouted experts of one decode step (GLM-5.2, mxfp4, 256 experts, 8 a token): us and %% of probe\n"
              "| %-7s | %2s |", "launch", "T");
  for (const Cfg& c : cfgs) std::printf(" %14s |", c.name);
  std::printf(" auto config\n");
  DeviceBuffer gy = Must(DeviceBuffer::Allocate(72 * kInter * 4));  // 8 tokens x (8 + shared)
  DeviceBuffer uy = Must(DeviceBuffer::Allocate(72 * kInter * 4));
  DeviceBuffer xd = Must(DeviceBuffer::Allocate(64 * kInter * 2));
  FillBf16<<<64, 256, 0, st>>>(xd.as<uint16_t>(), 64 * kInter, 9, 0.5f);
  for (int64_t T : {1, 2, 8}) {
    const int64_t np = T * kK;
    std::vector<int32_t> ids(kSets * np);
    double uniq = 0;
    uint32_t rng = 12345;
    for (int64_t s = 0; s < kSets; ++s) {
      std::vector<bool> any(kE, false);
      for (int64_t t = 0; t < T; ++t) {
        std::vector<bool> used(kE, false);
        for (int64_t k = 0; k < kK; ++k) {
          int32_t e;
          do {
            rng = rng * 1664525u + 1013904223u;
            e = static_cast<int32_t>((rng >> 8) % kE);
          } while (used[e]);
          used[e] = any[e] = true;
          ids[(s * T + t) * kK + k] = e;
        }
      }
      uniq += static_cast<double>(std::count(any.begin(), any.end(), true)) / kSets;
    }
    DeviceBuffer dids = Must(DeviceBuffer::Allocate(ids.size() * 4));
    BENCH_CHECK(dids.CopyFromHost(ids.data(), ids.size() * 4));
    // which 2: gate+up with the shared expert (alt problems); 3: the same launch writing
    // SwiGLU's output (QMatmulTSwiGlu), as ExpertsSwiGlu runs it ("n/a" where a configuration
    // leaves the column split, which alone has that output).
    DeviceBuffer sb = Must(DeviceBuffer::Allocate(72 * kInter * 2));
    for (int which = 0; which < 4; ++which) {
      const char* names[] = {"gate+up", "down", "+shared", "+sh+swi"};
      std::printf("| %-7s | %2ld |", names[which], static_cast<long>(T));
      std::string auto_name;
      const double bytes = which == 0   ? uniq * per_expert + T * kHidden * 2.0
                           : which == 1 ? uniq * per_expert_down + np * kInter * 2.0
                                        : uniq * per_expert + static_cast<double>(sg.bytes + su.bytes) +
                                              T * kHidden * 2.0;
      for (const Cfg& c : cfgs) {
        TEST_SetQgemvTuning(c.variant, c.cap);
        QMatmulArgs a;
        a.x_dtype = DType::kBF16;
        a.m = 1;
        a.problems = np;
        a.overlap = c.overlap;
        a.round_bf16 = true;
        if (which != 1) {
          a.x = x.data();
          a.x_problem_stride = kHidden;
          a.x_problem_div = kK;
          a.y_problem_stride = kInter;
          if (which >= 2) {
            a.problems = np + T;
            a.alt_problems = T;
            a.alt[0] = &sg.views[0];
            a.alt[1] = &su.views[0];
            a.alt_x_row0 = 0;
          }
        } else {
          a.x = xd.data();
          a.x_problem_stride = kInter;
          a.x_problem_div = 1;
          a.y_problem_stride = kHidden;
          a.y = y.as<float>();
        }
        const DeviceQuantWeight* gu[] = {&gate.views[0], &up.views[0]};
        float* gu_out[] = {gy.as<float>(), uy.as<float>()};
        a.expert_ids = dids.as<int32_t>();
        if (which == 3) {
          a.y = gy.as<float>();
          a.y_bf16 = sb.as<uint16_t>();
          if (!DescribeQmmSwiGlu(gate.views[0], up.views[0], a).ok()) {
            std::printf(" %14s |", "n/a");
            continue;
          }
        }
        if (c.variant == -1 && c.cap == 0 && c.overlap == 0) {
          auto_name = which == 3   ? Must(DescribeQmmSwiGlu(gate.views[0], up.views[0], a))
                      : which != 1 ? Must(DescribeQmmMany(gu, a))
                                   : Must(DescribeQmm(down.views[0], a));
        }
        const float us = MedianMs(st, iters, [&](int i) {
          a.expert_ids = dids.as<int32_t>() + (i % kSets) * np;
          if (which == 3) {
            BENCH_CHECK(QMatmulTSwiGlu(gate.views[0], up.views[0], a, st));
          } else if (which != 1) {
            BENCH_CHECK(QMatmulTMany(gu, gu_out, a, st));
          } else {
            BENCH_CHECK(QMatmulT(down.views[0], a, st));
          }
        }) * 1e3f;
        std::printf(" %6.2f %5.1f%% |", us, 100.0 * bytes / (us * 1e-6) / 1e9 / probe);
      }
      TEST_SetQgemvTuning(-1, 0);
      std::printf(" %s\n", auto_name.c_str());
      std::fflush(stdout);
    }
  }
}

// One GLM-5.2 MoE block of a decode token as the layer program (models/deepseek.cc
// MlaStage::Moe) runs it: the router (bf16 256 x 6144), sigmoid routing (k = 8 of 256), the
// routed experts (ExpertsSwiGlu on the router's bf16 copy of x), the shared expert, the
// combine, on one stream with the backend's PDL settings; x changes every launch (64 rows)
// so the experts do. The shared expert either in launches of its own (gate and up in one
// launch, SwiGLU, down: the backend without ExpertsSwiGluShared) or as one more problem of
// the routed launches. Bytes = router + shared expert + 8 routed experts.
void MoeBlock(const DeviceInfo& dev, double probe, cudaStream_t st, int iters) {
  constexpr int64_t kE = 256, kK = 8, kInter = 2048, kHidden = 6144, kRows = 64;
  const QuantSpec spec{QuantMode::kMxfp4, 4, 32};
  Weights gate = MakeWeights(Shape{"GLM-5.2", "expert gate", kInter, kHidden}, spec, 0, st, kE);
  Weights up = MakeWeights(Shape{"GLM-5.2", "expert up", kInter, kHidden}, spec, 0, st, kE);
  Weights down = MakeWeights(Shape{"GLM-5.2", "expert down", kHidden, kInter}, spec, 0, st, kE);
  Weights sg = MakeWeights(Shape{"GLM-5.2", "shared gate", kInter, kHidden}, spec, dev.l2_bytes, st);
  Weights su = MakeWeights(Shape{"GLM-5.2", "shared up", kInter, kHidden}, spec, dev.l2_bytes, st);
  Weights sd = MakeWeights(Shape{"GLM-5.2", "shared down", kHidden, kInter}, spec, dev.l2_bytes, st);
  Weights router = MakeWeights(Shape{"GLM-5.2", "router", kE, kHidden}, QuantSpec{QuantMode::kNone, 0, 0},
                               dev.l2_bytes, st);
  std::vector<float> xh(kRows * kHidden), bias(kE);
  uint32_t rng = 777;
  for (float& v : xh) {
    rng = rng * 1664525u + 1013904223u;
    v = static_cast<float>(static_cast<int32_t>(rng >> 8) - (1 << 23)) / static_cast<float>(1 << 23);
  }
  for (int64_t e = 0; e < kE; ++e) bias[e] = 0.001f * static_cast<float>(e % 7);
  DeviceBuffer x32 = Must(DeviceBuffer::Allocate(xh.size() * 4));
  BENCH_CHECK(x32.CopyFromHost(xh.data(), xh.size() * 4));
  DeviceBuffer xb = Must(DeviceBuffer::Allocate(xh.size() * 2));
  BENCH_CHECK(ToBf16(x32.as<float>(), kRows * kHidden, xb.as<uint16_t>(), st));
  DeviceBuffer dbias = Must(DeviceBuffer::Allocate(kE * 4));
  BENCH_CHECK(dbias.CopyFromHost(bias.data(), kE * 4));
  DeviceBuffer logits = Must(DeviceBuffer::Allocate(kE * 4)), ids = Must(DeviceBuffer::Allocate(kK * 4)),
               wts = Must(DeviceBuffer::Allocate(kK * 4)), g = Must(DeviceBuffer::Allocate(kInter * 4)),
               u = Must(DeviceBuffer::Allocate(kInter * 4)), gb = Must(DeviceBuffer::Allocate(kInter * 2)),
               y = Must(DeviceBuffer::Allocate((kK + 1) * kHidden * 4)), out = Must(DeviceBuffer::Allocate(kHidden * 4));
  cpu::SigmoidRouting r;
  r.E = kE;
  r.k = kK;
  r.routed_scaling_factor = 2.5f;
  const auto bf16 = cpu::ActDType::kBF16;
  // The whole block as the CUDA backend runs it by default: MoeBlock, the shared expert on a
  // side stream beside the router and the routing.
  SideStream side;
  BENCH_CHECK(CudaOk(cudaStreamCreateWithFlags(&side.stream, cudaStreamNonBlocking)));
  BENCH_CHECK(CudaOk(cudaEventCreateWithFlags(&side.fork, cudaEventDisableTiming)));
  BENCH_CHECK(CudaOk(cudaEventCreateWithFlags(&side.join, cudaEventDisableTiming)));
  auto block_args = [&](int i) {
    const int64_t row = i % kRows;
    MoeBlockArgs mb;
    mb.router = &router.views[i % router.views.size()];
    mb.bias = dbias.as<float>();
    mb.routing = r;
    mb.gate = &gate.views[0];
    mb.up = &up.views[0];
    mb.down = &down.views[0];
    mb.shared = SharedExpertWeights{&sg.views[i % sg.views.size()], &su.views[i % su.views.size()],
                                    &sd.views[i % sd.views.size()]};
    mb.x = x32.as<float>() + row * kHidden;
    mb.x_bf16 = xb.as<uint16_t>() + row * kHidden;
    mb.T = 1;
    mb.router_overlap = 2;  // the backend's setting for matrices <= 64 MB
    mb.out = out.as<float>();
    return mb;
  };
  DeviceBuffer block_scratch = Must(DeviceBuffer::Allocate(MoeBlockScratchBytes(block_args(0))));
  DeviceBuffer ticket = Must(DeviceBuffer::Allocate(4));
  BENCH_CHECK(CudaOk(cudaMemset(ticket.data(), 0, 4)));
  // fused: the router and the routing in one launch (RouterRoute), as the backend runs it.
  auto beside = [&](int i, bool fused) {
    MoeBlockArgs mb = block_args(i);
    if (fused) mb.router_ticket = ticket.as<unsigned>();
    BENCH_CHECK(MoeBlock(mb, block_scratch.data(), st, &side));
  };
  // The shared expert in launches of its own, after the routed experts (the layer program
  // without ExpertsSwiGluShared), or as one more problem of the routed launches.
  // scratch: the experts' gate/up rows in a buffer of the caller (as the CUDA backend passes
  // them) rather than stream-ordered allocations (graph nodes that cost the gate/up GEMV its
  // PDL start under the routing).
  DeviceBuffer scratch = Must(DeviceBuffer::Allocate(
      ExpertsScratchBytes(gate.views[0], up.views[0], down.views[0], 1, kK, bf16, ExpertsPath::kAuto, true)));
  auto block = [&](int i, bool joint, bool with_scratch = false) {
    const int64_t row = i % kRows;
    QMatmulArgs a;
    a.x = xb.as<uint16_t>() + row * kHidden;
    a.x_dtype = DType::kBF16;
    a.m = 1;
    a.overlap = 2;  // the backend's setting for matrices <= 32 MB
    a.y = logits.as<float>();
    BENCH_CHECK(QMatmulT(router.views[i % router.views.size()], a, st));
    BENCH_CHECK(RouteSigmoid(logits.as<float>(), dbias.as<float>(), 1, r, ids.as<int32_t>(), wts.as<float>(), st));
    const SharedExpertWeights sh{&sg.views[i % sg.views.size()], &su.views[i % su.views.size()],
                                 &sd.views[i % sd.views.size()]};
    BENCH_CHECK(ExpertsSwiGlu(gate.views[0], up.views[0], down.views[0], x32.as<float>() + row * kHidden, 1,
                              ids.as<int32_t>(), kK, bf16, y.as<float>(), st, ExpertsPath::kAuto,
                              xb.as<uint16_t>() + row * kHidden, joint ? &sh : nullptr,
                              with_scratch ? scratch.data() : nullptr));
    float* sh_out = y.as<float>() + kK * kHidden;
    if (!joint) {
    const DeviceQuantWeight* gu[] = {&sg.views[i % sg.views.size()], &su.views[i % su.views.size()]};
    float* gu_out[] = {g.as<float>(), u.as<float>()};
    a.round_bf16 = true;
    BENCH_CHECK(QMatmulTMany(gu, gu_out, a, st));
    BENCH_CHECK(SwiGlu(DevArray{g.data(), DType::kF32}, DevArray{u.data(), DType::kF32}, kInter, bf16,
                       DevMutArray{g.data(), DType::kF32}, st, gb.as<uint16_t>()));
    a.x = gb.as<uint16_t>();
    a.y = sh_out;
    BENCH_CHECK(QMatmulT(sd.views[i % sd.views.size()], a, st));
    }
    BENCH_CHECK(MoeCombine(y.as<float>(), wts.as<float>(), sh_out, 1, kK, kHidden,
                           cpu::CombineMode::kFp32Sum, bf16, out.as<float>(), st));
  };
  const double bytes = static_cast<double>(router.bytes + sg.bytes + su.bytes + sd.bytes) +
                       kK * static_cast<double>(gate.bytes + up.bytes + down.bytes) / kE;
  std::printf("\nMoE block of one decode token (GLM-5.2: router + routing + 8 of 256 routed experts + shared "
              "expert + combine; %.1f MB, roofline %.1f us):\n", bytes / 1e6, bytes / probe / 1e3);
  {  // the router alone (RING_QGEMV_CLUSTER_K=0 for its launch without the cluster K split)
    QMatmulArgs a;
    a.x_dtype = DType::kBF16;
    a.m = 1;
    a.overlap = 2;
    a.y = logits.as<float>();
    const std::string how = Must(DescribeQmm(router.views[0], a));
    const float ms = MedianMs(st, iters, [&](int i) {
      a.x = xb.as<uint16_t>() + (i % kRows) * kHidden;
      BENCH_CHECK(QMatmulT(router.views[i % router.views.size()], a, st));
    });
    std::printf("  %-44s %.2f us = %.1f%% of the probe (%s)\n", "router GEMV alone (bf16 256 x 6144):",
                ms * 1e3, 100.0 * router.bytes / (ms * 1e-3) / 1e9 / probe, how.c_str());
    const float ms2 = MedianMs(st, iters, [&](int i) {
      BENCH_CHECK(QMatmulT(router.views[i % router.views.size()], a, st));
      BENCH_CHECK(RouteSigmoid(logits.as<float>(), dbias.as<float>(), 1, r, ids.as<int32_t>(), wts.as<float>(), st));
    });
    const float ms3 = MedianMs(st, iters, [&](int i) {
      BENCH_CHECK(RouterRoute(router.views[i % router.views.size()], xb.as<uint16_t>() + (i % kRows) * kHidden, 1,
                              dbias.as<float>(), r, logits.as<float>(), ids.as<int32_t>(), wts.as<float>(),
                              ticket.as<unsigned>(), st));
    });
    std::printf("  %-44s %.2f us\n  %-44s %.2f us\n", "router GEMV, then the routing:", ms2 * 1e3,
                "router + routing in one launch (RouterRoute):", ms3 * 1e3);
  }
  for (int rep = 0; rep < 2; ++rep) {
    for (int how : {0, 1, 2, 3}) {
      const float ms = MedianMs(st, iters, [&](int i) {
        if (how >= 2) {
          beside(i, how == 3);
        } else {
          block(i, how == 1);
        }
      });
      const char* name = how == 0   ? "shared expert in launches of its own:"
                         : how == 1 ? "shared expert with the routed launches:"
                         : how == 2 ? "shared expert beside the routing (MoeBlock):"
                                    : "the same, router + routing fused:";
      std::printf("  %-44s %.1f us = %.1f%% of the probe\n", name, ms * 1e3,
                  100.0 * bytes / (ms * 1e-3) / 1e9 / probe);
    }
  }
  // The same blocks replayed from CUDA graphs, as the backend runs a decode step: the lines
  // above launch each block's kernels from the host (a dozen calls, some with PDL or cluster
  // attributes), whose cost could hide behind them or not. kGraphs captures of different
  // activation rows and weight copies, replayed in turn. Forms: the shared expert in
  // launches of its own; with the routed launches; the same with the experts' scratch passed
  // in (no allocation nodes before the gate/up GEMV); beside the routing (MoeBlock, the
  // backend's default).
  {
    constexpr int kGraphs = 16, kForms = 5;
    std::vector<cudaGraphExec_t> graphs[kForms];
    for (int how = 0; how < kForms; ++how) {
      for (int g = 0; g < kGraphs; ++g) {
        cudaGraph_t graph = nullptr;
        BENCH_CHECK(CudaOk(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal)));
        if (how >= 3) {
          beside(g, how == 4);
        } else {
          block(g, how >= 1, how == 2);
        }
        BENCH_CHECK(CudaOk(cudaStreamEndCapture(st, &graph)));
        cudaGraphExec_t exec = nullptr;
        BENCH_CHECK(CudaOk(cudaGraphInstantiate(&exec, graph, 0)));
        cudaGraphDestroy(graph);
        graphs[how].push_back(exec);
      }
    }
    static const char* const kNames[kForms] = {
        "graph: shared expert in launches of its own:", "graph: shared expert with the routed launches:",
        "graph: the same, experts' scratch passed in:", "graph: shared expert beside the routing:",
        "graph: the same, router + routing fused:"};
    for (int rep = 0; rep < 2; ++rep) {
      for (int how = 0; how < kForms; ++how) {
        const float ms = MedianMs(st, iters, [&](int i) {
          BENCH_CHECK(CudaOk(cudaGraphLaunch(graphs[how][i % kGraphs], st)));
        });
        std::printf("  %-44s %.1f us = %.1f%% of the probe\n", kNames[how], ms * 1e3,
                    100.0 * bytes / (ms * 1e-3) / 1e9 / probe);
      }
    }
    for (auto& v : graphs) {
      for (cudaGraphExec_t e : v) cudaGraphExecDestroy(e);
    }
  }
  // The K split of every GEMV of the block capped at 1, automatic, exactly 2 or 4, and the
  // experts on 32-row tiles (variant 4; TEST_SetQgemvTuning): 9 problems of 256 row tiles
  // (gate+up with the shared expert) are 2304 warps at one a tile, past one wave.
  struct BlockCfg {
    int variant, cap;
  };
  for (int rep = 0; rep < 2; ++rep) {
    for (const BlockCfg bc : {BlockCfg{-1, 1}, BlockCfg{-1, 0}, BlockCfg{-1, 102}, BlockCfg{-1, 104},
                              BlockCfg{4, 0}, BlockCfg{4, 102}}) {
      TEST_SetQgemvTuning(bc.variant, bc.cap);
      const float ms = MedianMs(st, iters, [&](int i) { block(i, true); });
      TEST_SetQgemvTuning(-1, 0);
      const std::string split = bc.cap == 1 ? "1" : (bc.cap == 0 ? "auto" : std::to_string(bc.cap - 100));
      std::printf("  %-44s %.1f us = %.1f%% of the probe\n",
                  absl::StrFormat("with the routed launches, %sK split %s:", bc.variant == 4 ? "32-row tiles, " : "",
                                  split)
                      .c_str(),
                  ms * 1e3, 100.0 * bytes / (ms * 1e-3) / 1e9 / probe);
    }
  }
}

int Main(int argc, char** argv) {
  Opts o;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) o.quick = true;
    else if (!std::strcmp(argv[i], "--no-cublas")) o.use_cublas = false;
    else if (!std::strcmp(argv[i], "--sweep")) o.sweep = true;
    else if (!std::strcmp(argv[i], "--many")) o.many = true;
    else if (!std::strcmp(argv[i], "--moe")) o.moe = true;
    else if (!std::strcmp(argv[i], "--no-probe")) o.probe = false;
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) o.iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) o.only = argv[++i];
    else if (!std::strcmp(argv[i], "--modes") && i + 1 < argc) o.modes = argv[++i];
    else if (!std::strcmp(argv[i], "--cfgs") && i + 1 < argc) o.cfgs = argv[++i];
    else if (!std::strcmp(argv[i], "--ms") && i + 1 < argc) {
      o.ms.clear();
      for (const char* q = argv[++i]; *q != '\0';) {
        char* end = nullptr;
        const long v = std::strtol(q, &end, 10);
        if (end == q) break;
        if (v >= 1 && v <= 8) o.ms.push_back(static_cast<int>(v));
        q = *end == ',' ? end + 1 : end;
      }
      if (o.ms.empty()) o.ms = {1, 2, 8};
    }
  }
  const std::optional<DeviceInfo> found = FirstDevice();
  if (!found) return 0;
  const DeviceInfo& dev = *found;
  cudaStream_t st;
  BENCH_CHECK(CudaOk(cudaStreamCreate(&st)));
  const double probe = o.probe ? ProbeReadBandwidth(dev, st) : 4466.0;
  if (!o.probe) std::printf("bandwidth probe skipped; percentages use 4466 GB/s\n");
  Cublas cublas;
  if (o.use_cublas && !o.sweep && !o.many && !o.moe) cublas.Load(st);

  std::vector<Shape> shapes = {
      {"GLM-5.2", "q_a_proj", 2048, 6144},      {"GLM-5.2", "q_b_proj", 16384, 2048},
      {"GLM-5.2", "kv_a_proj", 576, 6144},      {"GLM-5.2", "o_proj", 6144, 16384},
      {"GLM-5.2", "expert gate/up", 2048, 6144}, {"GLM-5.2", "expert down", 6144, 2048},
      {"GLM-5.2", "dense gate_up", 24576, 6144}, {"GLM-5.2", "dense down", 6144, 12288},
      {"GLM-5.2", "lm_head", 154880, 6144},
      {"Qwen3-8B", "q/o_proj", 4096, 4096},     {"Qwen3-8B", "gate/up", 12288, 4096},
      {"Qwen3-8B", "down", 4096, 12288},
  };
  if (o.quick) shapes = {shapes[1], shapes[3], shapes[10]};
  if (!o.only.empty()) {
    std::vector<Shape> kept;
    for (const Shape& sh : shapes) {
      if (std::string(sh.name).find(o.only) != std::string::npos) kept.push_back(sh);
    }
    shapes = kept;
  }
  std::vector<QuantSpec> specs;
  if (o.modes.find("mxfp4") != std::string::npos) specs.push_back({QuantMode::kMxfp4, 4, 32});
  if (o.modes.find("affine4") != std::string::npos) specs.push_back({QuantMode::kAffine, 4, 64});

  DeviceBuffer x = Must(DeviceBuffer::Allocate(8 * 16384 * 4 + 16));
  FillBf16<<<64, 256, 0, st>>>(x.as<uint16_t>(), 8 * 16384 * 2, 7, 0.5f);
  DeviceBuffer y = Must(DeviceBuffer::Allocate(8 * 154880 * 4));

  if (o.moe) {
    Moe(dev, probe, x, y, st, o.iters);
    MoeBlock(dev, probe, st, o.iters);
    BENCH_CHECK(CudaOk(cudaDeviceSynchronize()));
    return 0;
  }
  if (o.many) {
    Many(specs, dev, probe, x, y, st, o.iters);
    BENCH_CHECK(CudaOk(cudaDeviceSynchronize()));
    return 0;
  }
  if (o.sweep) {
    Sweep(shapes, specs, dev, probe, x, y, st, o.iters, o.cfgs, o.ms);
    BENCH_CHECK(CudaOk(cudaDeviceSynchronize()));
    return 0;
  }

  std::printf("\n%%read = bytes per second against a read-only streaming pass over the same packed bytes "
              "(same rotating copies, best of 3 grids)\n");
  std::printf("\n| %-8s | %-15s | %-13s | %-16s | %-4s | %-2s | %8s | %7s | %6s | %6s | %6s | %6s | %8s | %11s | %8s | %s\n",
              "model", "matrix", "rows x cols", "mode", "path", "M", "us", "GB/s", "%probe", "%read", "t/t(1)",
              "PDL us", "PDL %", "cuBLAS bf16", "speed/elt", "kernel");
  for (const Shape& sh : shapes) {
    // cuBLAS bf16 reference time per M (weights bf16: 2 bytes per element).
    std::vector<float> cublas_us(9, 0.f);
    if (cublas.ok()) {
      Weights wb = MakeWeights(sh, QuantSpec{QuantMode::kNone, 0, 0}, dev.l2_bytes, st);
      for (int m : {1, 2, 4, 8}) {
        const float alpha = 1.f, beta = 0.f;
        const float ms = MedianMs(st, o.iters, [&](int i) {
          const DeviceQuantWeight& v = wb.views[i % wb.views.size()];
          // Column-major view: W is K x N (lda = K); y (N x M) = W^T x.
          cublas.gemm_ex(cublas.h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(sh.rows), m,
                         static_cast<int>(sh.cols), &alpha, v.weight, CUDA_R_16BF,
                         static_cast<int>(sh.cols), x.data(), CUDA_R_16BF,
                         static_cast<int>(sh.cols), &beta, y.data(), CUDA_R_32F,
                         static_cast<int>(sh.rows), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        });
        cublas_us[m] = ms * 1e3f;
      }
    }
    for (QuantSpec spec : specs) {
      Weights w = MakeWeights(sh, spec, dev.l2_bytes, st);
      const double read_gbs = static_cast<double>(w.w[0].size()) /
                              (ReadPassUs(w, dev, y.as<uint32_t>(), st, o.iters) * 1e-6) / 1e9;
      struct Run {
        QmmPath path;
        DType xd;
        std::vector<int> ms;
      };
      const Run runs[] = {{QmmPath::kAuto, DType::kBF16, {1, 2, 4, 8}},
                          {QmmPath::kSimt, DType::kF32, {1, 8}}};
      for (const Run& run : runs) {
        float t1 = 0;
        for (int m : run.ms) {
          QMatmulArgs a;
          a.x = x.data();
          a.x_dtype = run.xd;
          a.m = m;
          a.y = y.as<float>();
          a.path = run.path;
          const QmmPath used = Must(ResolveQmmPath(w.views[0], a));
          const std::string kernel = Must(DescribeQmm(w.views[0], a));
          const float us = TimeQmm(w, a, st, o.iters);
          float pdl_us = 0;
          if (used == QmmPath::kTensorCore) {
            a.overlap = 2;
            pdl_us = TimeQmm(w, a, st, o.iters);
          }
          if (m == 1) t1 = us;
          const double bytes = static_cast<double>(w.bytes) + static_cast<double>(m) * sh.cols * (run.xd == DType::kBF16 ? 2 : 4);
          const double gbs = bytes / (us * 1e-6) / 1e9;
          char cub[32] = "n/a", ratio[32] = "n/a", pdl[32] = "n/a", pdlp[32] = "n/a";
          if (cublas.ok() && run.xd == DType::kBF16) {
            std::snprintf(cub, sizeof(cub), "%.1f us", cublas_us[m]);
            // Same element count on both sides, so time per weight element compares directly.
            std::snprintf(ratio, sizeof(ratio), "%.2fx", cublas_us[m] / us);
          }
          if (pdl_us > 0) {
            std::snprintf(pdl, sizeof(pdl), "%.1f", pdl_us);
            std::snprintf(pdlp, sizeof(pdlp), "%.1f%%", 100.0 * bytes / (pdl_us * 1e-6) / 1e9 / probe);
          }
          std::printf("| %-8s | %-15s | %6ldx%-6ld | %-16s | %-4s | %2d | %8.1f | %7.0f | %5.1f%% | %5.1f%% | %6.2f | %6s | %8s | %11s | %8s | %s\n",
                      sh.model, sh.name, static_cast<long>(sh.rows), static_cast<long>(sh.cols),
                      ModeName(spec).c_str(), QmmPathName(used), m, us, gbs, 100.0 * gbs / probe,
                      100.0 * gbs / read_gbs, us / t1, pdl, pdlp, cub, ratio, kernel.c_str());
          std::fflush(stdout);
        }
      }
    }
  }
  BENCH_CHECK(CudaOk(cudaDeviceSynchronize()));
  std::printf("\nTargets (performance anchors M2/M3): >= 80%% of the probe on matrices >= 16 MB at M=1; "
              "t(8)/t(1) <= 1.3.\n");
  return 0;
}

}  // namespace
}  // namespace ring::cuda

int main(int argc, char** argv) { return ring::cuda::Main(argc, argv); }
