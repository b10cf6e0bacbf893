// File: kernels/cpu/bandwidth.h
//
// Multi-threaded memory read bandwidth on the thread pool the CPU kernels use: what a
// bandwidth-bound decode step can at best read per second on this machine. Benchmarks
// print kernel throughput as a fraction of it; ring workers report it so the coordinator
// can split layers by speed.
//
//   cpu::BandwidthProbe probe(256 << 20);   // buffer well above the last-level cache
//   double bytes_per_s = probe.Measure(3);  // best of 3 passes
#ifndef RINGSERVE_KERNELS_CPU_BANDWIDTH_H_
#define RINGSERVE_KERNELS_CPU_BANDWIDTH_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "kernels/cpu/thread_pool.h"

namespace ring::cpu {

// Multi-threaded read bandwidth (bytes/s) over a buffer of `bytes` (>> LLC), best of reps.
class BandwidthProbe {
 public:
  explicit BandwidthProbe(int64_t bytes) : buf_(bytes / 8) {
    const int64_t n = static_cast<int64_t>(buf_.size());
    cpu::ParallelFor(n, 1 << 16, [&](int64_t b, int64_t e) {  // first touch from the pool
      for (int64_t i = b; i < e; ++i) buf_[i] = i;
    });
  }
  double Measure(int reps) {
    const int64_t n = static_cast<int64_t>(buf_.size());
    const int64_t chunks = cpu::NumThreads();
    std::vector<uint64_t> sums(chunks);
    double best = 0;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      cpu::ParallelFor(chunks, 1, [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
          const int64_t b = n * c / chunks, e = n * (c + 1) / chunks;
          uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
          for (int64_t i = b; i + 4 <= e; i += 4) {
            s0 += buf_[i];
            s1 += buf_[i + 1];
            s2 += buf_[i + 2];
            s3 += buf_[i + 3];
          }
          sums[c] = s0 + s1 + s2 + s3;
        }
      });
      best = std::max(best, static_cast<double>(n * 8) / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    uint64_t all = 0;
    for (uint64_t s : sums) all += s;
    sink_ += all;  // keeps the sums alive
    return best;
  }

 private:
  std::vector<uint64_t> buf_;
  uint64_t sink_ = 0;
};

}  // namespace ring::cpu

#endif  // RINGSERVE_KERNELS_CPU_BANDWIDTH_H_
