#include "kernels/cpu/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels/cpu/cpu_relax.h"

namespace ring::cpu {
namespace {

thread_local bool tls_inside_pool = false;

// A decode step is hundreds of short parallel regions back to back; waking a sleeping
// thread for each costs a futex call and a scheduler wake-up (tens of microseconds on a VM,
// more than many regions take). So a pool thread that ran out of work, and a caller waiting
// for the last chunks, first poll for this long, then sleep. Between steps of a ring stage
// (milliseconds while other stages compute) they sleep as before. RING_CPU_SPIN_US
// overrides it (0: sleep at once).
std::chrono::nanoseconds SpinBudget() {
  static const std::chrono::nanoseconds budget = [] {
    long us = 50;
    if (const char* env = std::getenv("RING_CPU_SPIN_US")) us = std::max(0L, std::atol(env));
    return std::chrono::nanoseconds(std::chrono::microseconds(us));
  }();
  return budget;
}

// Polls `ready` for up to SpinBudget(); true as soon as it holds.
template <typename Ready>
bool SpinUntil(Ready ready) {
  const std::chrono::nanoseconds budget = SpinBudget();
  if (budget.count() == 0) return ready();
  const auto end = std::chrono::steady_clock::now() + budget;
  for (uint32_t i = 1;; ++i) {
    if (ready()) return true;
    CpuRelax();
    if ((i & 63) == 0 && std::chrono::steady_clock::now() >= end) return ready();
  }
}

void MakeThisThreadIdle() {
#ifdef SCHED_IDLE
  sched_param p{};
  p.sched_priority = 0;
  (void)pthread_setschedparam(pthread_self(), SCHED_IDLE, &p);
#endif
}

class Pool {
 public:
  explicit Pool(int n) : n_(n) {
    for (int i = 1; i < n_; ++i) threads_.emplace_back([this] { Loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  int size() const { return n_; }

  // Wakes every pool thread without work so each moves itself to SCHED_IDLE.
  void SetIdle() {
    std::lock_guard<std::mutex> run_lock(run_mu_);  // not while a region runs
    {
      std::lock_guard<std::mutex> l(mu_);
      idle_ = true;
      body_ = nullptr;
      generation_.fetch_add(1);
    }
    cv_.notify_all();
  }

  void Run(int64_t chunks, const std::function<void(int64_t)>& body) {
    std::lock_guard<std::mutex> run_lock(run_mu_);  // one parallel region at a time
    uint32_t region;
    {
      std::lock_guard<std::mutex> l(mu_);
      region = ++region_;
      body_ = &body;
      chunks_ = chunks;
      cursor_.store(static_cast<uint64_t>(region) << 32);
      done_.store(0);
      generation_.fetch_add(1);
    }
    // A sleeper counts itself under mu_ before it checks generation_ (Loop), so either it
    // sees the new region or it is counted here.
    if (sleepers_.load() > 0) cv_.notify_all();
    Work(region, &body, chunks);
    if (!SpinUntil([&] { return done_.load(std::memory_order_acquire) == chunks; })) {
      std::unique_lock<std::mutex> l(mu_);
      done_cv_.wait(l, [&] { return done_.load() == chunks; });
    }
    std::lock_guard<std::mutex> l(mu_);
    body_ = nullptr;
  }

 private:
  // Runs chunks of region `region` until none is left. A chunk is claimed by advancing
  // cursor_ = (region << 32 | next index) only while it still names this region: a pool
  // thread that woke for an earlier region and runs late can neither take a chunk of the
  // next one (it would be counted against the wrong total) nor run one twice. (It could
  // with a bare index counter reset per region: the waiting caller then never saw
  // done_ == chunks_ and the process hung in ParallelFor.)
  void Work(uint32_t region, const std::function<void(int64_t)>* body, int64_t chunks) {
    tls_inside_pool = true;
    int64_t finished = 0;
    for (;;) {
      uint64_t c = cursor_.load();
      bool claimed = false;
      while ((c >> 32) == region && static_cast<int64_t>(c & 0xffffffffu) < chunks) {
        if (cursor_.compare_exchange_weak(c, c + 1)) {
          claimed = true;
          break;
        }
      }
      if (!claimed) break;
      (*body)(static_cast<int64_t>(c & 0xffffffffu));
      ++finished;
    }
    tls_inside_pool = false;
    if (finished > 0 && done_.fetch_add(finished) + finished == chunks) {
      // Under mu_: the caller checks done_ under it before it sleeps on done_cv_.
      std::lock_guard<std::mutex> l(mu_);
      done_cv_.notify_all();
    }
  }
  void Loop() {
    uint64_t seen = 0;
    bool idle = false;
    for (;;) {
      uint32_t region;
      const std::function<void(int64_t)>* body;
      int64_t chunks;
      // SCHED_IDLE threads (a GPU worker's reference pool) do not poll: they exist to take
      // no time from anything else.
      if (!idle) SpinUntil([&] { return generation_.load(std::memory_order_acquire) != seen; });
      {
        std::unique_lock<std::mutex> l(mu_);
        if (!stop_ && generation_.load() == seen) {
          ++sleepers_;
          cv_.wait(l, [&] { return stop_ || generation_.load() != seen; });
          --sleepers_;
        }
        if (stop_) return;
        seen = generation_.load();
        if (idle_ && !idle) {
          idle = true;
          MakeThisThreadIdle();
        }
        if (body_ == nullptr) continue;
        region = region_;
        body = body_;
        chunks = chunks_;
      }
      Work(region, body, chunks);
    }
  }

  const int n_;
  std::vector<std::thread> threads_;
  std::mutex run_mu_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t)>* body_ = nullptr;
  int64_t chunks_ = 0;
  uint32_t region_ = 0;  // numbers the parallel regions (wraps harmlessly)
  std::atomic<uint64_t> cursor_{0};
  std::atomic<int64_t> done_{0};        // chunks of the current region finished
  std::atomic<uint64_t> generation_{0};  // written under mu_; polled without it
  std::atomic<int> sleepers_{0};         // pool threads in cv_.wait (changed under mu_)
  bool stop_ = false;
  bool idle_ = false;
};

Pool& GetPool() {
  static Pool* pool = new Pool(PoolThreadsFor(std::getenv("RING_CPU_THREADS")));
  return *pool;
}

}  // namespace

int AvailableCpus() {
#ifdef __linux__
  // hardware_concurrency() counts the machine's CPUs even when this process may run on a
  // few of them (taskset, a container's cpuset): a worker pinned to 4 of 16 cores would
  // start 16 threads on 4.
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
#endif
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

int PoolThreadsFor(const char* env) {
  if (env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    if (*end == '\0' && n >= 1 && n <= 4096) return static_cast<int>(n);
    std::cerr << "ring: RING_CPU_THREADS='" << env << "' is not a thread count (1..4096); using "
              << AvailableCpus() << ", the CPUs this process may run on\n";
  }
  return AvailableCpus();
}

int NumThreads() { return GetPool().size(); }

void SetIdlePriority() {
  GetPool().SetIdle();
  MakeThisThreadIdle();
}

void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  Pool& pool = GetPool();
  const int64_t max_chunks = (n + grain - 1) / grain;
  const int64_t chunks = std::min<int64_t>(max_chunks, pool.size() * 4);
  if (chunks <= 1 || pool.size() == 1 || tls_inside_pool) {
    fn(0, n);
    return;
  }
  const int64_t per = (n + chunks - 1) / chunks;
  pool.Run(chunks, [&](int64_t c) {
    const int64_t b = c * per;
    const int64_t e = std::min(n, b + per);
    if (b < e) fn(b, e);
  });
}

}  // namespace ring::cpu
