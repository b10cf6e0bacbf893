#include "worker/coordinator_registration.h"

#include <algorithm>
#include <iostream>

#include "absl/time/clock.h"

namespace ring::worker {
namespace {

class RealClock final : public RegistrationClock {
 public:
  absl::Time Now() override { return absl::Now(); }
  void AwaitWithTimeout(absl::Mutex* mu, const absl::Condition& cond, absl::Duration timeout) override {
    mu->AwaitWithTimeout(cond, timeout);
  }
};

}  // namespace

RegistrationClock* RegistrationClock::Real() {
  static RealClock* const clock = new RealClock();
  return clock;
}

CoordinatorRegistration::CoordinatorRegistration(RegistrationOptions options,
                                                 std::unique_ptr<CoordinatorTransport> transport,
                                                 RegistrationClock* clock)
    : options_(std::move(options)),
      transport_(std::move(transport)),
      clock_(clock != nullptr ? clock : RegistrationClock::Real()),
      backoff_(options_.initial_backoff) {
  state_.set_coordinator(options_.coordinator);
  state_.set_advertise(options_.advertise);
}

CoordinatorRegistration::~CoordinatorRegistration() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  transport_->CancelJoin();
  if (thread_.joinable()) thread_.join();
}

void CoordinatorRegistration::Start() {
  thread_ = std::thread([this] { Loop(); });
}

absl::Duration CoordinatorRegistration::AttemptOnce() {
  // Outside mu_: the call may take up to its deadline, and Snapshot must not wait for it.
  const absl::Status s = transport_->Join(options_.advertise, options_.join_timeout);
  const absl::Time now = clock_->Now();
  absl::MutexLock l(&mu_);
  if (s.ok()) {
    if (state_.last_success_unix_seconds() == 0 || state_.consecutive_failures() > 0) {
      std::cerr << "ring-worker: registered with coordinator " << options_.coordinator << " as "
                << options_.advertise << " (re-registering every "
                << absl::FormatDuration(options_.reregister_interval) << ")" << std::endl;
    }
    state_.set_last_success_unix_seconds(absl::ToUnixSeconds(now));
    state_.clear_last_error();
    state_.set_consecutive_failures(0);
    backoff_ = options_.initial_backoff;
    return options_.reregister_interval;
  }
  const absl::Duration wait = backoff_;
  backoff_ = std::min(backoff_ * 2, options_.max_backoff);
  state_.set_last_error(std::string(s.message()));
  state_.set_last_error_unix_seconds(absl::ToUnixSeconds(now));
  state_.set_consecutive_failures(state_.consecutive_failures() + 1);
  std::cerr << "ring-worker: registering with coordinator " << options_.coordinator << " as "
            << options_.advertise << " failed (attempt " << state_.consecutive_failures() << "): " << s
            << "; retrying in " << absl::FormatDuration(wait) << std::endl;
  return wait;
}

void CoordinatorRegistration::Loop() {
  while (true) {
    {
      absl::MutexLock l(&mu_);
      if (stopping_) return;
    }
    const absl::Duration wait = AttemptOnce();
    absl::MutexLock l(&mu_);
    clock_->AwaitWithTimeout(&mu_, absl::Condition(&stopping_), wait);
    if (stopping_) return;
  }
}

absl::Status CoordinatorRegistration::Stop() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
    if (left_) return absl::OkStatus();
    left_ = true;
  }
  // A Join may be waiting on a slow or gone coordinator: a SIGTERM should not wait for it.
  transport_->CancelJoin();
  if (thread_.joinable()) thread_.join();
  const absl::Status s = transport_->Leave(options_.advertise, options_.leave_timeout);
  if (s.ok()) {
    std::cerr << "ring-worker: left the ring of coordinator " << options_.coordinator << std::endl;
  } else {
    std::cerr << "ring-worker: Leave at coordinator " << options_.coordinator << " failed (shutting down anyway): "
              << s << std::endl;
  }
  return s;
}

ringserve::v1::CoordinatorRegistration CoordinatorRegistration::Snapshot() const {
  absl::MutexLock l(&mu_);
  return state_;
}

}  // namespace ring::worker
