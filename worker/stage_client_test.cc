// Persistent Forward streams (worker/stage_client.h) against scripted Worker services on
// loopback: one stream serves many steps, a stalled worker fails the step within its
// deadline, and a refused frame ends the stream with the worker's error naming the stage.
#include "worker/stage_client.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/serve_for_test.h"

namespace ring::worker {
namespace {

namespace pb = ringserve::v1;

// Echoes every frame; counts calls and frames. `refuse_step` >= 0: ends the stream with
// FAILED_PRECONDITION on that step. `stall_step` >= 0: never answers that step (until the
// call is cancelled or the test releases it).
class ScriptedWorker final : public pb::Worker::Service {
 public:
  grpc::Status Forward(grpc::ServerContext* ctx,
                       grpc::ServerReaderWriter<pb::ActivationFrame, pb::ActivationFrame>* s) override {
    calls_.fetch_add(1);
    pb::ActivationFrame f;
    while (s->Read(&f)) {
      frames_.fetch_add(1);
      if (static_cast<int64_t>(f.step()) == refuse_step) {
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                            absl::StrCat("scripted refusal of step ", f.step()));
      }
      if (static_cast<int64_t>(f.step()) == stall_step) {
        while (!ctx->IsCancelled() && !release_.WaitForNotificationWithTimeout(absl::Milliseconds(10))) {
        }
        return grpc::Status(grpc::StatusCode::CANCELLED, "stalled call cancelled");
      }
      if (!s->Write(f)) break;
    }
    return grpc::Status::OK;
  }

  std::atomic<int> calls_{0};
  std::atomic<int> frames_{0};
  int64_t refuse_step = -1;
  int64_t stall_step = -1;
  absl::Notification release_;
};

class StageClientTest : public ::testing::Test {
 protected:
  void StartServer() {
    server_ = ServeOnLoopbackForTest(&service_, &address_);
    ASSERT_NE(server_, nullptr);
    client_ = std::make_unique<StageClient>(address_, 3, StageClientOptions{});
  }
  void TearDown() override {
    service_.release_.Notify();
    if (server_) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  }
  static pb::ActivationFrame Frame(uint64_t step) {
    pb::ActivationFrame f;
    f.set_sequence_id("s");
    f.set_step(step);
    f.set_payload(std::string(64, 'x'));
    return f;
  }

  ScriptedWorker service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<StageClient> client_;
};

TEST_F(StageClientTest, OneStreamServesEveryStep) {
  StartServer();
  auto stream = client_->OpenForward();
  for (uint64_t step = 0; step < 5; ++step) {
    auto reply = stream->Step(Frame(step), absl::Seconds(10));
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->step(), step);
  }
  EXPECT_TRUE(stream->Close(absl::Seconds(5)).ok());
  EXPECT_EQ(service_.calls_.load(), 1);
  EXPECT_EQ(service_.frames_.load(), 5);
}

TEST_F(StageClientTest, StalledWorkerFailsTheStepWithinItsDeadlineNamingTheStage) {
  service_.stall_step = 2;
  StartServer();
  auto stream = client_->OpenForward();
  ASSERT_TRUE(stream->Step(Frame(0), absl::Seconds(10)).ok());
  ASSERT_TRUE(stream->Step(Frame(1), absl::Seconds(10)).ok());
  const absl::Time t0 = absl::Now();
  auto reply = stream->Step(Frame(2), absl::Milliseconds(300));
  const absl::Duration took = absl::Now() - t0;
  ASSERT_FALSE(reply.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(reply.status())) << reply.status();
  EXPECT_NE(reply.status().message().find(absl::StrCat("stage 3 (", address_, ")")), std::string::npos)
      << reply.status();
  EXPECT_GE(took, absl::Milliseconds(300));
  EXPECT_LT(took, absl::Seconds(3));
  // The stream is torn down: later steps fail at once with the same error.
  auto again = stream->Step(Frame(3), absl::Seconds(10));
  EXPECT_EQ(again.status(), reply.status());
}

TEST_F(StageClientTest, RefusedFrameEndsTheStreamWithTheWorkersError) {
  service_.refuse_step = 1;
  StartServer();
  auto stream = client_->OpenForward();
  ASSERT_TRUE(stream->Step(Frame(0), absl::Seconds(10)).ok());
  auto reply = stream->Step(Frame(1), absl::Seconds(10));
  ASSERT_FALSE(reply.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(reply.status())) << reply.status();
  EXPECT_NE(reply.status().message().find("scripted refusal of step 1"), std::string::npos);
  EXPECT_NE(reply.status().message().find(absl::StrCat("Forward stage 3 (", address_, ")")),
            std::string::npos)
      << reply.status();
  EXPECT_TRUE(stream->broken());
}

TEST_F(StageClientTest, UnreachableWorkerFailsFast) {
  // Nothing listens here: the first step fails (Unavailable) rather than waiting.
  StageClient c("127.0.0.1:1", 0, {});
  auto stream = c.OpenForward();
  const absl::Time t0 = absl::Now();
  auto reply = stream->Step(Frame(0), absl::Seconds(20));
  ASSERT_FALSE(reply.ok());
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10));
  EXPECT_NE(reply.status().message().find("stage 0 (127.0.0.1:1)"), std::string::npos) << reply.status();
}

TEST(CallWatchdogTest, DisarmedAlarmNeverFires) {
  grpc::ClientContext ctx;
  CallWatchdog& w = CallWatchdog::Get();
  const uint64_t id = w.Arm(&ctx, absl::Now() + absl::Seconds(60));
  EXPECT_FALSE(w.Disarm(id));
  const uint64_t fired = w.Arm(&ctx, absl::Now() + absl::Milliseconds(20));
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_TRUE(w.Disarm(fired));
}

}  // namespace
}  // namespace ring::worker
