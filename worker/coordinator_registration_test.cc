#include "worker/coordinator_registration.h"

#include <deque>
#include <vector>

#include <gtest/gtest.h>

#include "absl/synchronization/mutex.h"

namespace ring::worker {
namespace {

// Answers Join from a script (then with `otherwise`) and records every call.
class FakeTransport final : public CoordinatorTransport {
 public:
  struct Calls {
    absl::Mutex mu;
    std::deque<absl::Status> script ABSL_GUARDED_BY(mu);
    absl::Status otherwise ABSL_GUARDED_BY(mu);
    absl::Status leave_result ABSL_GUARDED_BY(mu);
    std::vector<std::string> joins ABSL_GUARDED_BY(mu);
    std::vector<absl::Duration> join_timeouts ABSL_GUARDED_BY(mu);
    std::vector<std::string> leaves ABSL_GUARDED_BY(mu);
    std::vector<absl::Duration> leave_timeouts ABSL_GUARDED_BY(mu);
    // A coordinator that never answers: Join blocks (up to its timeout) until CancelJoin.
    bool hang = false ABSL_GUARDED_BY(mu);
    bool cancelled = false ABSL_GUARDED_BY(mu);
  };
  explicit FakeTransport(Calls* calls) : calls_(calls) {}

  absl::Status Join(const std::string& address, absl::Duration timeout) override {
    absl::MutexLock l(&calls_->mu);
    calls_->joins.push_back(address);
    calls_->join_timeouts.push_back(timeout);
    if (calls_->hang) {
      auto cancelled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(calls_->mu) { return calls_->cancelled; };
      calls_->mu.AwaitWithTimeout(absl::Condition(&cancelled), timeout);
      return absl::CancelledError("join cancelled");
    }
    if (calls_->script.empty()) return calls_->otherwise;
    absl::Status s = calls_->script.front();
    calls_->script.pop_front();
    return s;
  }
  void CancelJoin() override {
    absl::MutexLock l(&calls_->mu);
    calls_->cancelled = true;
  }
  absl::Status Leave(const std::string& address, absl::Duration timeout) override {
    absl::MutexLock l(&calls_->mu);
    calls_->leaves.push_back(address);
    calls_->leave_timeouts.push_back(timeout);
    return calls_->leave_result;
  }

 private:
  Calls* calls_;
};

// Time moves only when the loop waits: each wait is recorded and returns at once, until
// `block_after` waits; from then on a wait blocks until its condition holds (Stop), as a
// real one would for a long interval.
class FakeClock final : public RegistrationClock {
 public:
  explicit FakeClock(size_t block_after = SIZE_MAX) : block_after_(block_after) {}
  absl::Time Now() override {
    absl::MutexLock l(&mu_);
    return now_;
  }
  void AwaitWithTimeout(absl::Mutex* mu, const absl::Condition& cond, absl::Duration timeout) override {
    bool block;
    {
      absl::MutexLock l(&mu_);
      waits_.push_back(timeout);
      now_ += timeout;
      block = waits_.size() >= block_after_;
    }
    if (block) mu->Await(cond);
  }
  std::vector<absl::Duration> waits() {
    absl::MutexLock l(&mu_);
    return waits_;
  }
  // Bounded: the test fails instead of hanging when the loop never gets there.
  bool WaitForWaits(size_t n) {
    absl::MutexLock l(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return waits_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(60));
  }

 private:
  const size_t block_after_;
  absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::FromUnixSeconds(1'700'000'000);
  std::vector<absl::Duration> waits_ ABSL_GUARDED_BY(mu_);
};

RegistrationOptions Options() {
  RegistrationOptions o;
  o.coordinator = "10.0.0.1:8001";
  o.advertise = "10.0.0.4:7001";
  return o;
}

TEST(CoordinatorRegistrationTest, BackoffDoublesToItsCapAndResetsAfterASuccess) {
  FakeTransport::Calls calls;
  {
    absl::MutexLock l(&calls.mu);
    for (int i = 0; i < 7; ++i) calls.script.push_back(absl::UnavailableError("connection refused"));
    calls.script.push_back(absl::OkStatus());
    calls.script.push_back(absl::UnavailableError("coordinator restarting"));
  }
  FakeClock clock;
  CoordinatorRegistration reg(Options(), std::make_unique<FakeTransport>(&calls), &clock);
  std::vector<absl::Duration> got;
  for (int i = 0; i < 7; ++i) got.push_back(reg.AttemptOnce());
  const std::vector<absl::Duration> want = {absl::Milliseconds(500), absl::Seconds(1), absl::Seconds(2),
                                            absl::Seconds(4),        absl::Seconds(8), absl::Seconds(10),
                                            absl::Seconds(10)};
  EXPECT_EQ(got, want);
  ringserve::v1::CoordinatorRegistration st = reg.Snapshot();
  EXPECT_EQ(st.consecutive_failures(), 7);
  EXPECT_EQ(st.last_error(), "connection refused");
  EXPECT_EQ(st.last_success_unix_seconds(), 0);

  EXPECT_EQ(reg.AttemptOnce(), absl::Seconds(30));  // registered: re-register later
  st = reg.Snapshot();
  EXPECT_EQ(st.consecutive_failures(), 0);
  EXPECT_EQ(st.last_error(), "");
  EXPECT_EQ(st.last_success_unix_seconds(), 1'700'000'000);
  EXPECT_EQ(st.coordinator(), "10.0.0.1:8001");
  EXPECT_EQ(st.advertise(), "10.0.0.4:7001");

  EXPECT_EQ(reg.AttemptOnce(), absl::Milliseconds(500));  // backoff starts over
  EXPECT_EQ(reg.Snapshot().last_error(), "coordinator restarting");

  absl::MutexLock l(&calls.mu);
  EXPECT_EQ(calls.joins, std::vector<std::string>(9, "10.0.0.4:7001"));
  EXPECT_EQ(calls.join_timeouts, std::vector<absl::Duration>(9, absl::Seconds(10)));  // every call has a deadline
  EXPECT_TRUE(calls.leaves.empty());
}

TEST(CoordinatorRegistrationTest, LoopRetriesThenReregistersPeriodically) {
  FakeTransport::Calls calls;
  {
    absl::MutexLock l(&calls.mu);
    calls.script = {absl::UnavailableError("down"), absl::UnavailableError("down")};
  }
  FakeClock clock(/*block_after=*/5);
  CoordinatorRegistration reg(Options(), std::make_unique<FakeTransport>(&calls), &clock);
  reg.Start();
  ASSERT_TRUE(clock.WaitForWaits(5));
  EXPECT_EQ(clock.waits(), (std::vector<absl::Duration>{absl::Milliseconds(500), absl::Seconds(1), absl::Seconds(30),
                                                        absl::Seconds(30), absl::Seconds(30)}));
  EXPECT_TRUE(reg.Stop().ok());  // wakes the blocked wait
  absl::MutexLock l(&calls.mu);
  EXPECT_EQ(calls.joins.size(), 5u);
  EXPECT_EQ(calls.leaves, std::vector<std::string>{"10.0.0.4:7001"});
  EXPECT_EQ(calls.leave_timeouts, std::vector<absl::Duration>{absl::Seconds(2)});
}

TEST(CoordinatorRegistrationTest, StopWakesALongWaitLeavesOnceAndReportsLeaveErrors) {
  FakeTransport::Calls calls;
  {
    absl::MutexLock l(&calls.mu);
    calls.leave_result = absl::UnavailableError("coordinator gone");
  }
  RegistrationOptions o = Options();
  o.reregister_interval = absl::Hours(1);
  // The real clock: Stop must interrupt a real hour-long wait (a hang fails the test by
  // its timeout, not by a timing assert).
  CoordinatorRegistration reg(o, std::make_unique<FakeTransport>(&calls));
  reg.Start();
  {
    absl::MutexLock l(&calls.mu);
    auto joined = [&calls]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(calls.mu) { return !calls.joins.empty(); };
    ASSERT_TRUE(calls.mu.AwaitWithTimeout(absl::Condition(&joined), absl::Seconds(60)));
  }
  const absl::Status s = reg.Stop();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "coordinator gone");
  EXPECT_TRUE(reg.Stop().ok());  // idempotent: no second Leave
  EXPECT_GT(reg.Snapshot().last_success_unix_seconds(), 0);
  absl::MutexLock l(&calls.mu);
  EXPECT_EQ(calls.joins.size(), 1u);
  EXPECT_EQ(calls.leaves.size(), 1u);
}

// SIGTERM while a Join waits on a coordinator that does not answer: Stop cancels the Join
// instead of waiting out its deadline (an hour here: a hang fails by the test's timeout),
// then still leaves.
TEST(CoordinatorRegistrationTest, StopCancelsAJoinInProgress) {
  FakeTransport::Calls calls;
  {
    absl::MutexLock l(&calls.mu);
    calls.hang = true;
  }
  RegistrationOptions o = Options();
  o.join_timeout = absl::Hours(1);
  CoordinatorRegistration reg(o, std::make_unique<FakeTransport>(&calls));
  reg.Start();
  {
    absl::MutexLock l(&calls.mu);
    auto joining = [&calls]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(calls.mu) { return !calls.joins.empty(); };
    ASSERT_TRUE(calls.mu.AwaitWithTimeout(absl::Condition(&joining), absl::Seconds(60)));
  }
  EXPECT_TRUE(reg.Stop().ok());
  absl::MutexLock l(&calls.mu);
  EXPECT_TRUE(calls.cancelled);
  EXPECT_EQ(calls.leaves.size(), 1u);
}

TEST(CoordinatorRegistrationTest, DestructorStopsTheLoopWithoutLeave) {
  FakeTransport::Calls calls;
  {
    absl::MutexLock l(&calls.mu);
    calls.otherwise = absl::UnavailableError("down");
  }
  FakeClock clock(/*block_after=*/2);
  {
    CoordinatorRegistration reg(Options(), std::make_unique<FakeTransport>(&calls), &clock);
    reg.Start();
    ASSERT_TRUE(clock.WaitForWaits(2));
  }
  absl::MutexLock l(&calls.mu);
  EXPECT_EQ(calls.joins.size(), 2u);
  EXPECT_TRUE(calls.leaves.empty());
}

}  // namespace
}  // namespace ring::worker
