// File: bench/bench_util.h
//
// What every CPU benchmark needs: a wall clock, the size of the last-level cache, and a
// multi-threaded memory read-bandwidth probe on the same thread pool the kernels use, so
// kernel throughput can be printed as a fraction of what this machine can actually read.
#ifndef RINGSERVE_BENCH_BENCH_UTIL_H_
#define RINGSERVE_BENCH_BENCH_UTIL_H_

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/cpu/thread_pool.h"

namespace ring::bench {

using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

inline int64_t LastLevelCacheBytes() {
  long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (v > 0) return v;
  for (const char* idx : {"index3", "index2"}) {
    std::ifstream f(std::string("/sys/devices/system/cpu/cpu0/cache/") + idx + "/size");
    std::string s;
    if (f >> s && !s.empty()) {
      int64_t n = std::stoll(s);
      if (s.back() == 'K') n <<= 10;
      if (s.back() == 'M') n <<= 20;
      return n;
    }
  }
  return 32 << 20;
}

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
      const auto t0 = Clock::now();
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
      best = std::max(best, static_cast<double>(n * 8) / Seconds(t0, Clock::now()));
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

}  // namespace ring::bench

#endif  // RINGSERVE_BENCH_BENCH_UTIL_H_
