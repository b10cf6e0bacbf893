// File: worker/core_warmer.h
//
// Keeps CPU cores awake while a ring is passing frames. A decode hop is short (a few
// microseconds of gRPC and codec work), but between hops the stage computes for a
// millisecond or more and the cores that will receive the next frame go idle; waking an
// idle core (a halted vCPU on a VM, a deep C-state on bare metal) then costs most of the
// hop: on two H200 hosts 0.2-0.35 ms per hop idle against ~0.1 ms with every core busy
// (docs/benchmarks.md, "Where a hop's time goes"). PM QoS did not help there.
//
// CoreWarmer runs `threads` spinners at SCHED_IDLE (the kernel preempts them at once when a
// real thread wakes on their core, and counts their cores as idle when it places a waking
// thread), spinning on a pause instruction only for `linger` after the last Touch(), and
// parked on a condition variable otherwise: an idle worker burns nothing. It trades CPU
// power for hop latency, so ring-worker enables it only when asked (--warm-cores).
//
//   CoreWarmer warmer({.threads = CoreWarmer::AllCores(), .linger = absl::Milliseconds(50)});
//   warmer.Touch();  // on every frame and step
#ifndef RINGSERVE_WORKER_CORE_WARMER_H_
#define RINGSERVE_WORKER_CORE_WARMER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"

namespace ring::worker {

struct CoreWarmerOptions {
  int threads = 0;  // 0: none (Touch does nothing)
  absl::Duration linger = absl::Milliseconds(50);
};

class CoreWarmer {
 public:
  explicit CoreWarmer(CoreWarmerOptions options);
  ~CoreWarmer();  // stops and joins the spinners
  CoreWarmer(const CoreWarmer&) = delete;
  CoreWarmer& operator=(const CoreWarmer&) = delete;

  // The CPUs this process may run on (its affinity mask), at least 1.
  static int AllCores();

  // Work is flowing: spinners run until `linger` after the latest call. Cheap when they
  // already spin (one clock read and two atomics).
  void Touch();

  int threads() const { return static_cast<int>(threads_.size()); }
  // Spinners not parked right now.
  int spinning() const { return threads() - parked_.load(); }
  // How the spinners were demoted ("SCHED_IDLE", or "nice 19" where SCHED_IDLE was refused).
  std::string policy() const;

 private:
  void Loop();

  const int64_t linger_ns_;
  std::atomic<int64_t> until_ns_{0};  // steady-clock ns until which the spinners spin
  std::atomic<int> parked_{0};
  std::atomic<int> sched_idle_failures_{0};
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;  // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace ring::worker

#endif  // RINGSERVE_WORKER_CORE_WARMER_H_
