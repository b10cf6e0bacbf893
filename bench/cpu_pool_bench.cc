// The CPU pool's cost per parallel region (kernels/cpu/thread_pool.h): regions of a fixed
// amount of single-thread work split into 64 chunks, back to back, timed with the pool
// threads polling for the next region (the default, RING_CPU_SPIN_US=50) and sleeping at
// once (RING_CPU_SPIN_US=0, the pool before polling), each setting in a child process of
// its own (the budget is read once per process), alternating over rounds. Prints each
// setting's time per region against the ideal (work / threads) and polling's speed-up.
//
//   RING_CPU_THREADS=2 build/bench/cpu_pool_bench [--rounds 3] [--regions 3000]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/cpu/thread_pool.h"

namespace {

// Busy work of about `us` microseconds on one core, chunked like a GEMV's rows.
double TimeRegions(int us, int regions) {
  std::vector<float> a(1 << 16, 1.f);
  volatile float sink = 0;
  auto work = [&](int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; ++i) s += a[i & 65535] * 1.0001f;
    sink = sink + s;
  };
  const auto c0 = std::chrono::steady_clock::now();
  work(20000000);
  const double per_us =
      2e7 / std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - c0).count();
  const int64_t total = static_cast<int64_t>(per_us * us);
  ring::cpu::ParallelFor(64, 1, [&](int64_t, int64_t) {});  // the pool's threads exist
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < regions; ++r) {
    ring::cpu::ParallelFor(64, 1, [&](int64_t b, int64_t e) { work(total * (e - b) / 64); });
  }
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / regions;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 3, regions = 3000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--child") {  // one measurement: work per region in us
      std::printf("%.3f %d\n", TimeRegions(std::atoi(v.c_str()), regions), ring::cpu::NumThreads());
      return 0;
    }
    if (k == "--rounds") rounds = std::max(1, std::atoi(v.c_str()));
    else if (k == "--regions") regions = std::max(10, std::atoi(v.c_str()));
    else {
      std::fprintf(stderr, "cpu_pool_bench: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) {
    std::fprintf(stderr, "cpu_pool_bench: cannot find its own binary\n");
    return 1;
  }
  self[len] = '\0';
  // Children for every region size under both settings, the settings alternating.
  auto child = [&](const char* spin, int us, int* threads) -> double {
    const std::string cmd = std::string("RING_CPU_SPIN_US=") + spin + " '" + self + "' --regions " +
                            std::to_string(regions) + " --child " + std::to_string(us);
    FILE* p = popen(cmd.c_str(), "r");
    double t = -1;
    if (p != nullptr) {
      if (std::fscanf(p, "%lf %d", &t, threads) != 2) t = -1;
      if (pclose(p) != 0) t = -1;
    }
    return t;
  };
  const int sizes[] = {20, 100, 400};
  std::printf("| single-thread work per region (us) | threads | sleeping pool: us/region (x ideal) | "
              "polling pool: us/region (x ideal) | polling speed-up |\n|---:|---:|---:|---:|---:|\n");
  int rc = 0;
  for (int us : sizes) {
    std::vector<double> sleep_t, poll_t;
    int threads = 0;
    for (int r = 0; r < rounds; ++r) {
      sleep_t.push_back(child("0", us, &threads));
      poll_t.push_back(child("50", us, &threads));
    }
    const double s = Median(sleep_t), p = Median(poll_t);
    if (s <= 0 || p <= 0) {
      std::fprintf(stderr, "cpu_pool_bench: a child run failed\n");
      rc = 1;
      continue;
    }
    const double ideal = static_cast<double>(us) / std::max(1, threads);
    std::printf("| %d | %d | %.1f (%.2f) | %.1f (%.2f) | %.2f |\n", us, threads, s, s / ideal, p, p / ideal,
                s / p);
  }
  std::printf("(medians of %d rounds of %d regions; RING_CPU_THREADS sets the threads)\n", rounds, regions);
  return rc;
}
