// File: kernels/cpu/thread_pool.h
//
// One process-wide pool of worker threads for the CPU backend (one per CPU this process may
// run on by default -- its affinity mask, so `taskset` or a container's cpuset sizes it --,
// RING_CPU_THREADS overrides). ParallelFor splits [0, n) into contiguous chunks of at
// least `grain` items and blocks until all chunks ran; the calling thread takes part.
// Nested ParallelFor calls from inside a chunk run serially (no deadlock, no oversubscription).
#ifndef RINGSERVE_KERNELS_CPU_THREAD_POOL_H_
#define RINGSERVE_KERNELS_CPU_THREAD_POOL_H_

#include <cstdint>
#include <functional>

namespace ring::cpu {

// Number of threads ParallelFor uses (>= 1).
int NumThreads();
// The CPUs the calling thread may run on (its affinity mask on Linux; the machine's count
// elsewhere or when that cannot be read), >= 1.
int AvailableCpus();
// The pool size for a RING_CPU_THREADS value: the number when it is one (1..4096), else
// AvailableCpus() (unset or empty; anything else also warns on stderr).
int PoolThreadsFor(const char* env);
// Moves the pool's threads and the calling thread to the idle scheduling class (Linux
// SCHED_IDLE: they run only on otherwise idle cores). For a process whose hot path is not
// the CPU pool (a GPU worker), so CPU reference work (shadow checks) cannot slow it down.
// Irreversible; a no-op where the OS refuses.
void SetIdlePriority();
// fn(begin, end) is called for disjoint chunks covering [0, n).
void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace ring::cpu

#endif  // RINGSERVE_KERNELS_CPU_THREAD_POOL_H_
