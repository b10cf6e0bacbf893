// File: worker/mutex_mode.h
//
// How the product binaries (ring-worker, ring-server, ringctl) run absl::Mutex. Debian's
// Abseil is built without NDEBUG, so by default every Mutex acquisition also updates a
// process-wide lock-order graph and aborts the process on a potential deadlock cycle: a few
// tens of nanoseconds a lock (gRPC's locks are absl::Mutex too; a closed-ring step takes
// dozens) and a crash where a server should keep serving. The binaries turn the graph off;
// tests keep it on by setting RING_MUTEX_DEADLOCK_CHECK=1 (tests/run_all.sh), so every lock
// order the test suite exercises, in-process and in the processes it starts, is still
// checked.
//
//   int main(int argc, char** argv) {
//     ring::worker::UseServingMutexMode();
//     ...
#ifndef RINGSERVE_WORKER_MUTEX_MODE_H_
#define RINGSERVE_WORKER_MUTEX_MODE_H_

namespace ring::worker {

// Call first thing in main, before any thread starts. RING_MUTEX_DEADLOCK_CHECK=1 keeps
// Abseil's deadlock detection (abort on a cycle); unset or anything else turns it off.
void UseServingMutexMode();

}  // namespace ring::worker

#endif  // RINGSERVE_WORKER_MUTEX_MODE_H_
