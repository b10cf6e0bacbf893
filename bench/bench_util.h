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

#include "kernels/cpu/bandwidth.h"
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

// The probe lives with the kernels (workers report it for ring planning).
using cpu::BandwidthProbe;

}  // namespace ring::bench

#endif  // RINGSERVE_BENCH_BENCH_UTIL_H_
