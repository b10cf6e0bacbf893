#include "worker/core_warmer.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>

namespace ring::worker {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#else
  std::this_thread::yield();
#endif
}

// Below every normal thread, so a spinner never delays the ring's own threads.
bool DemoteThisThread() {
  sched_param p{};
  p.sched_priority = 0;
  if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &p) == 0) return true;
  // Where SCHED_IDLE is refused (some containers), the lowest nice value is the next best.
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
  return false;
}

}  // namespace

CoreWarmer::CoreWarmer(CoreWarmerOptions options)
    : linger_ns_(absl::ToInt64Nanoseconds(options.linger)) {
  for (int i = 0; i < options.threads; ++i) threads_.emplace_back([this] { Loop(); });
}

CoreWarmer::~CoreWarmer() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  until_ns_.store(0);
  wake_.notify_all();
  for (std::thread& t : threads_) t.join();
}

int CoreWarmer::AllCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

std::string CoreWarmer::policy() const {
  return sched_idle_failures_.load() == 0 ? "SCHED_IDLE" : "nice 19 (SCHED_IDLE refused)";
}

void CoreWarmer::Touch() {
  if (threads_.empty()) return;
  const int64_t until = NowNs() + linger_ns_;
  // Only forward: concurrent touches must not shorten each other's window.
  int64_t seen = until_ns_.load();
  while (seen < until && !until_ns_.compare_exchange_weak(seen, until)) {
  }
  // Ordering (all seq_cst): a spinner increments parked_ before it re-reads until_ns_ under
  // mu_, so either it sees this window or this load sees it parked and wakes it.
  if (parked_.load() > 0) {
    std::lock_guard<std::mutex> l(mu_);
    wake_.notify_all();
  }
}

void CoreWarmer::Loop() {
  if (!DemoteThisThread()) sched_idle_failures_.fetch_add(1);
  while (true) {
    // Spin while the window is open; the clock is read once per 64 pauses (~1-5 us).
    while (NowNs() < until_ns_.load(std::memory_order_relaxed)) {
      for (int i = 0; i < 64; ++i) CpuRelax();
    }
    std::unique_lock<std::mutex> l(mu_);
    parked_.fetch_add(1);
    wake_.wait(l, [this] { return stop_ || NowNs() < until_ns_.load(); });
    parked_.fetch_sub(1);
    if (stop_) return;
  }
}

}  // namespace ring::worker
