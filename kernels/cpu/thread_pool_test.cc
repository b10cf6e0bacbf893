#include "kernels/cpu/thread_pool.h"

#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace ring::cpu {
namespace {

// The default pool size follows the CPUs a process may run on, not the machine's: a thread
// pinned to one CPU sees 1 (sched_setaffinity(0) changes the calling thread's mask only).
TEST(ThreadPool, DefaultSizeFollowsTheAffinityMask) {
  int seen_all = 0, seen_one = 0;
  std::thread t([&] {
    seen_all = AvailableCpus();
#ifdef __linux__
    cpu_set_t set;
    CPU_ZERO(&set);
    ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
    int first = 0;
    while (first < CPU_SETSIZE - 1 && !CPU_ISSET(first, &set)) ++first;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
    seen_one = AvailableCpus();
#else
    seen_one = 1;
#endif
  });
  t.join();
  EXPECT_GE(seen_all, 1);
  EXPECT_EQ(seen_one, 1);
  EXPECT_EQ(PoolThreadsFor(nullptr), AvailableCpus());
  EXPECT_EQ(PoolThreadsFor(""), AvailableCpus());
  EXPECT_EQ(PoolThreadsFor("3"), 3);
  // Not a count: the default, not 1 (atoi's 0 clamped) and not a huge pool.
  EXPECT_EQ(PoolThreadsFor("four"), AvailableCpus());
  EXPECT_EQ(PoolThreadsFor("4x"), AvailableCpus());
  EXPECT_EQ(PoolThreadsFor("0"), AvailableCpus());
  EXPECT_EQ(PoolThreadsFor("100000"), AvailableCpus());
}

TEST(ThreadPool, CoversRangeOnceWithNesting) {
  std::vector<int> hits(10007, 0);
  ParallelFor(hits.size(), 3, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      ParallelFor(2, 1, [&](int64_t b2, int64_t e2) { hits[i] += static_cast<int>(e2 - b2); });
    }
  });
  for (int h : hits) ASSERT_EQ(h, 2);
}

// Several threads (sequences of a CPU worker) run short parallel regions back to back, so
// pool threads often wake for a region that has already ended while the next one starts.
// Every index of every region must run exactly once and every call must return: a late
// pool thread that took a chunk of the next region against the old one's count made the
// waiting caller hang forever (seen as a worker frozen mid-step under re-forms).
TEST(ThreadPool, BackToBackRegionsFromManyThreadsRunEveryChunkOnce) {
  setenv("RING_CPU_THREADS", "6", /*overwrite=*/0);  // when this test creates the pool
  constexpr int kCallers = 4, kRegions = 3000;
  std::atomic<int64_t> wrong{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < kCallers; ++t) {
    callers.emplace_back([&, t] {
      std::mt19937 rng(t + 1);
      std::vector<std::atomic<int>> hits(97);
      for (int r = 0; r < kRegions; ++r) {
        const int64_t n = 1 + static_cast<int64_t>(rng() % hits.size());
        for (int64_t i = 0; i < n; ++i) hits[i].store(0);
        ParallelFor(n, 1, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
        });
        for (int64_t i = 0; i < n; ++i) wrong += hits[i].load() != 1;
      }
    });
  }
  for (auto& c : callers) c.join();
  EXPECT_EQ(wrong.load(), 0);
}

// Pool threads poll for the next region for a short while (RING_CPU_SPIN_US), then sleep:
// regions that come while they poll, just after they fell asleep, and long after must all
// run every chunk once and return (a wake-up lost between the poll and the sleep would
// leave the caller doing every chunk itself at best, or waiting forever for one a pool
// thread claimed).
TEST(ThreadPool, RegionsFindPoolThreadsPollingOrAsleep) {
  setenv("RING_CPU_THREADS", "4", /*overwrite=*/0);
  std::mt19937 rng(7);
  std::vector<std::atomic<int>> hits(64);
  int64_t wrong = 0, shared = 0;
  const std::thread::id caller = std::this_thread::get_id();
  for (int r = 0; r < 300; ++r) {
    // 0 to ~200 us between regions: across the default 50 us poll.
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
    for (auto& h : hits) h.store(0);
    std::atomic<bool> helped{false};
    ParallelFor(static_cast<int64_t>(hits.size()), 1, [&](int64_t b, int64_t e) {
      if (std::this_thread::get_id() != caller) helped = true;
      // ~10 us a chunk, so that a woken pool thread finds work left.
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(10);
      while (std::chrono::steady_clock::now() < until) {
      }
      for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
    });
    for (auto& h : hits) wrong += h.load() != 1;
    shared += helped.load();
  }
  EXPECT_EQ(wrong, 0);
  // Pool threads that fell asleep are woken for later regions: without that the caller ran
  // every chunk of them alone.
  if (NumThreads() > 1) EXPECT_GT(shared, 30) << "of 300 regions";
}

}  // namespace
}  // namespace ring::cpu
