// File: worker/coordinator_registration.h
//
// `ring-worker --join COORDINATOR`: the worker registers itself with the coordinator
// (Coordinator.Join with the address it advertises) instead of waiting for an operator's
// `ringctl join`. A background thread calls Join until it succeeds, retrying with capped
// exponential backoff (0.5 s doubling to 10 s by default), then again every 30 s: Join of
// a configured worker changes nothing, and a coordinator that restarted without this worker
// in its ring.toml learns about it again. Every call has a deadline and a failure is only
// logged: serving never waits for the coordinator. Stop() (on SIGTERM) ends the loop and
// calls Leave once with a short deadline, so the ring re-forms without this worker and the
// requests it was serving replay on the new ring.
//
//   CoordinatorRegistration reg({.coordinator = "10.0.0.1:8001", .advertise = "10.0.0.4:7001"},
//                               std::make_unique<GrpcCoordinatorTransport>(...));
//   reg.Start();
//   ... serve until SIGTERM ...
//   reg.Stop();   // Leave, best effort
//
// The coordinator and the clock are behind small interfaces (CoordinatorTransport,
// RegistrationClock) so tests drive the backoff and re-registration without real sleeps.
#ifndef RINGSERVE_WORKER_COORDINATOR_REGISTRATION_H_
#define RINGSERVE_WORKER_COORDINATOR_REGISTRATION_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ringserve/v1/worker.pb.h"

namespace ring::worker {

// Coordinator.Join / Leave of one worker address, each within `timeout`.
class CoordinatorTransport {
 public:
  virtual ~CoordinatorTransport() = default;
  virtual absl::Status Join(const std::string& address, absl::Duration timeout) = 0;
  virtual absl::Status Leave(const std::string& address, absl::Duration timeout) = 0;
  // Ends a Join in progress now (it returns an error): shutdown must not wait out its
  // deadline. Thread-safe; a no-op when no Join runs.
  virtual void CancelJoin() {}
};

// Time and waiting for the registration loop; the real one uses absl::Now and the mutex's
// own timed wait.
class RegistrationClock {
 public:
  virtual ~RegistrationClock() = default;
  virtual absl::Time Now() = 0;
  // With `mu` held: returns once `cond` holds or `timeout` has passed (mu held again).
  virtual void AwaitWithTimeout(absl::Mutex* mu, const absl::Condition& cond, absl::Duration timeout) = 0;
  static RegistrationClock* Real();
};

struct RegistrationOptions {
  std::string coordinator;  // admin address, for the status and the logs
  std::string advertise;    // HOST:PORT the coordinator dials this worker at
  // Join deadline: the coordinator probes the worker (up to 5 s) before it answers.
  absl::Duration join_timeout = absl::Seconds(10);
  // Leave runs during shutdown, which must not wait long for a coordinator that is gone.
  absl::Duration leave_timeout = absl::Seconds(2);
  absl::Duration initial_backoff = absl::Milliseconds(500);
  absl::Duration max_backoff = absl::Seconds(10);
  absl::Duration reregister_interval = absl::Seconds(30);
};

class CoordinatorRegistration {
 public:
  // `clock` null: RegistrationClock::Real(); otherwise it must outlive this object.
  CoordinatorRegistration(RegistrationOptions options, std::unique_ptr<CoordinatorTransport> transport,
                          RegistrationClock* clock = nullptr);
  // Stops the loop without Leave (Stop() is the graceful path).
  ~CoordinatorRegistration();
  CoordinatorRegistration(const CoordinatorRegistration&) = delete;
  CoordinatorRegistration& operator=(const CoordinatorRegistration&) = delete;

  // Starts the registration thread; the first Join goes out at once.
  void Start();
  // Ends the loop (waking it from its wait and cancelling a Join in progress), then calls
  // Leave once, within leave_timeout. Returns Leave's status; later calls
  // return OK without calling it again.
  absl::Status Stop();

  // One Join attempt; returns how long to wait before the next one: the re-registration
  // interval after a success, else the backoff, which doubles from initial_backoff after
  // each consecutive failure up to max_backoff. What the thread runs; public for tests.
  absl::Duration AttemptOnce();

  // For Describe: coordinator, advertised address, last success, last error.
  ringserve::v1::CoordinatorRegistration Snapshot() const;

 private:
  void Loop();

  const RegistrationOptions options_;
  const std::unique_ptr<CoordinatorTransport> transport_;
  RegistrationClock* const clock_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool left_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration backoff_ ABSL_GUARDED_BY(mu_);  // the wait after the next failure
  ringserve::v1::CoordinatorRegistration state_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace ring::worker

#endif  // RINGSERVE_WORKER_COORDINATOR_REGISTRATION_H_
