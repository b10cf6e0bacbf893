// Engine layout changes (ringctl apply / rebalance) over a fake ring factory: which
// workers and split a re-formed ring gets, and what WaitForLayout reports; and a step a
// worker refused for its KV cache budget (a clear request error, no re-form).
#include "server/engine.h"

#include <atomic>
#include <mutex>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace ring {
namespace {

// A ring that only describes its stages: one per worker, layers from the split. With a
// `step_error`, its sequences fail every step with it (what a worker answered).
class LayoutRing final : public Ring {
 public:
  explicit LayoutRing(const RingOptions& o, absl::Status step_error = absl::OkStatus())
      : step_error_(std::move(step_error)) {
    info_.num_layers = 4;
    info_.vocab_size = 8;
    int64_t begin = 0;
    for (size_t i = 0; i < o.workers.size(); ++i) {
      const int64_t n = o.split.size() != o.workers.size() ? 4 / static_cast<int64_t>(o.workers.size()) : o.split[i];
      stages_.push_back({"stage " + std::to_string(i) + " (" + o.workers[i] + ")", {begin, begin + n}, 0});
      begin += n;
    }
  }
  const RingModelInfo& model() const override { return info_; }
  const std::vector<RingStageInfo>& stages() const override { return stages_; }
  absl::StatusOr<std::unique_ptr<RingSequence>> NewSequence(const std::string&) override {
    if (step_error_.ok()) return absl::UnimplementedError("layout only");
    class Failing final : public RingSequence {
     public:
      explicit Failing(absl::Status s) : s_(std::move(s)) {}
      absl::StatusOr<std::vector<float>> Step(const std::vector<int32_t>&) override { return s_; }
      int64_t position() const override { return 0; }

     private:
      absl::Status s_;
    };
    return std::make_unique<Failing>(step_error_);
  }
  uint64_t checksum_failures() const override { return 0; }
  std::string Diagnose() override { return "layout"; }
  std::vector<ActivationStats> activation_stats() const override { return {}; }

 private:
  RingModelInfo info_;
  std::vector<RingStageInfo> stages_;
  absl::Status step_error_;
};

Engine::Layout MakeLayout(std::vector<std::string> workers, std::vector<std::pair<std::string, int64_t>> stages) {
  Engine::Layout l;
  l.workers = std::move(workers);
  int64_t begin = 0;
  for (const auto& [addr, n] : stages) {
    PlanStage s;
    s.address = addr;
    s.layer_begin = begin;
    s.layer_end = begin + n;
    begin += n;
    l.plan.stages.push_back(s);
  }
  return l;
}

class EngineLayoutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RingOptions ro;
    ro.workers = {"a:1", "b:2"};
    ro.model = "m";
    Engine::Options eo;
    eo.max_concurrent = 1;
    eo.degraded_rings = false;  // no Describe probes of the fake addresses
    eo.health_probe = absl::ZeroDuration();
    eo.reform_backoff = absl::Milliseconds(10);
    engine_ = std::make_unique<Engine>(ro, eo, &metrics_, [this](const RingOptions& o)
                                           -> absl::StatusOr<std::unique_ptr<Ring>> {
      std::lock_guard<std::mutex> l(mu_);
      formed_.push_back(o);
      if (!o.split.empty() && o.split[0] == 3) return absl::ResourceExhaustedError("stage 0 (a:1): out of memory");
      return std::make_unique<LayoutRing>(o);
    });
    engine_->Start();
    ASSERT_TRUE(engine_->WaitReady(absl::Seconds(10)).ok());
  }
  RingOptions LastFormed() {
    std::lock_guard<std::mutex> l(mu_);
    return formed_.back();
  }

  ServerMetrics metrics_;
  std::mutex mu_;
  std::vector<RingOptions> formed_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineLayoutTest, ApplyReformsWithTheSplitAndWaitsForIt) {
  const Engine::Layout layout = MakeLayout({"a:1", "b:2"}, {{"a:1", 1}, {"b:2", 3}});
  EXPECT_FALSE(engine_->IsCurrentLayout(layout));
  const uint64_t gen = engine_->ApplyLayout(layout);
  ASSERT_TRUE(engine_->WaitForLayout(gen, absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(LastFormed().split, (std::vector<int64_t>{1, 3}));
  EXPECT_TRUE(engine_->IsCurrentLayout(layout));
  ASSERT_EQ(engine_->stages().size(), 2u);
  EXPECT_EQ(engine_->stages()[1].layers.begin, 1);
}

TEST_F(EngineLayoutTest, NewWorkerOrderIsTheNewConfiguration) {
  const Engine::Layout layout = MakeLayout({"b:2", "a:1"}, {{"b:2", 2}, {"a:1", 2}});
  ASSERT_TRUE(engine_->WaitForLayout(engine_->ApplyLayout(layout), absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(LastFormed().workers, (std::vector<std::string>{"b:2", "a:1"}));
  EXPECT_EQ(engine_->membership().workers, (std::vector<std::string>{"b:2", "a:1"}));
  EXPECT_TRUE(engine_->IsCurrentLayout(layout));
}

TEST_F(EngineLayoutTest, ALayoutThatDoesNotFormIsReportedAndTheOldRingServes) {
  const Engine::Layout layout = MakeLayout({"a:1", "b:2"}, {{"a:1", 3}, {"b:2", 1}});
  const absl::Status s = engine_->WaitForLayout(engine_->ApplyLayout(layout), absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_TRUE(engine_->Ready().ok());
  EXPECT_FALSE(engine_->IsCurrentLayout(layout));
}

TEST_F(EngineLayoutTest, ASplitAppliedWhileDrainedFitsTheServingWorkers) {
  ASSERT_TRUE(engine_->Drain("b:2").ok());
  // The drained ring has one worker; a split for it is kept, not cleared.
  const Engine::Layout layout = MakeLayout({"a:1", "b:2"}, {{"a:1", 4}});
  ASSERT_TRUE(engine_->WaitForLayout(engine_->ApplyLayout(layout), absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(LastFormed().workers, (std::vector<std::string>{"a:1"}));
  EXPECT_EQ(LastFormed().split, (std::vector<int64_t>{4}));
  // Undrained, the one-worker split does not fit two workers: planned afresh (even here).
  ASSERT_TRUE(engine_->Undrain("b:2").ok());
  for (int i = 0; i < 500 && engine_->stages().size() != 2; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(LastFormed().workers.size(), 2u);
  EXPECT_TRUE(LastFormed().split.empty());
}

TEST_F(EngineLayoutTest, EveryFormationAttemptHasTheNextNumberUnderOneCoordinatorId) {
  const Engine::Layout good = MakeLayout({"a:1", "b:2"}, {{"a:1", 1}, {"b:2", 3}});
  const Engine::Layout bad = MakeLayout({"a:1", "b:2"}, {{"a:1", 3}, {"b:2", 1}});  // fails
  ASSERT_TRUE(engine_->WaitForLayout(engine_->ApplyLayout(good), absl::Now() + absl::Seconds(10)).ok());
  (void)engine_->WaitForLayout(engine_->ApplyLayout(bad), absl::Now() + absl::Seconds(10));
  std::lock_guard<std::mutex> l(mu_);
  ASSERT_GE(formed_.size(), 3u);
  for (size_t i = 0; i < formed_.size(); ++i) {
    EXPECT_EQ(formed_[i].formation, i + 1) << "failed attempts count too";
    EXPECT_EQ(formed_[i].coordinator_id, formed_[0].coordinator_id);
  }
  EXPECT_EQ(formed_[0].coordinator_id.size(), 16u);
}

TEST_F(EngineLayoutTest, WaitForLayoutHasADeadline) {
  // A generation nobody has requested never completes: the wait ends at its deadline.
  const absl::Status s = engine_->WaitForLayout(1000, absl::Now() + absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
}

TEST_F(EngineLayoutTest, JoinOfAConfiguredWorkerIsIdempotentAndDoesNotReform) {
  size_t formations;
  {
    std::lock_guard<std::mutex> l(mu_);
    formations = formed_.size();
  }
  // A worker started with --join re-registers every 30 s: nothing may move.
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(engine_->Join("b:2", Engine::MembershipSource::kWorker).ok());
  }
  EXPECT_TRUE(engine_->Join("a:1").ok());
  EXPECT_EQ(engine_->membership().workers, (std::vector<std::string>{"a:1", "b:2"}));
  {
    std::lock_guard<std::mutex> l(mu_);
    EXPECT_EQ(formed_.size(), formations);
  }
  EXPECT_TRUE(engine_->Ready().ok());
  EXPECT_EQ(engine_->Join("no-port", Engine::MembershipSource::kWorker).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(EngineLayoutTest, LeaveByTheWorkerReformsWithoutIt) {
  ASSERT_TRUE(engine_->Leave("b:2", Engine::MembershipSource::kWorker).ok());
  EXPECT_EQ(engine_->membership().workers, (std::vector<std::string>{"a:1"}));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline && LastFormed().workers.size() != 1) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(LastFormed().workers, (std::vector<std::string>{"a:1"}));
  EXPECT_EQ(engine_->Leave("b:2", Engine::MembershipSource::kWorker).code(), absl::StatusCode::kNotFound);
}

TEST(EngineKvCache, AStepRefusedByAWorkersKvBudgetFailsTheRequestWithoutReforming) {
  ServerMetrics metrics;
  RingOptions ro;
  ro.workers = {"a:1"};
  ro.model = "m";
  Engine::Options eo;
  eo.max_concurrent = 1;
  eo.degraded_rings = false;
  eo.health_probe = absl::ZeroDuration();
  eo.reform_backoff = absl::Milliseconds(10);
  std::atomic<int> formed{0};
  Engine engine(ro, eo, &metrics, [&formed](const RingOptions& o) -> absl::StatusOr<std::unique_ptr<Ring>> {
    ++formed;
    // The worker's refusal as it reaches the coordinator (worker/worker_service.cc).
    return std::make_unique<LayoutRing>(
        o, absl::ResourceExhaustedError(
               "Forward stage 0 (a:1): stage 0 (a:1) <- coordinator: KV cache budget exceeded: "
               "sequence r step 0 needs 4096 bytes (2 tokens at position 0), but 0 of the budget "
               "of 1024 bytes are held by 0 sequence(s) (1024 free)"));
  });
  engine.Start();
  ASSERT_TRUE(engine.WaitReady(absl::Seconds(10)).ok());
  GenerateRequest req;
  req.id = "r";
  req.prompt = {1, 2};
  req.max_tokens = 2;
  absl::StatusOr<GenerateResult> r = engine.Generate(req, [](const SampledToken&) { return true; }, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(IsKvCacheExhausted(r.status())) << r.status();
  const std::string msg(r.status().message());
  EXPECT_NE(msg.find("no KV cache room"), std::string::npos) << msg;
  EXPECT_NE(msg.find("stage 0 (a:1)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("needs 4096 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("budget of 1024 bytes"), std::string::npos) << msg;
  // The ring itself is fine: not broken, not re-formed, nothing replayed.
  EXPECT_TRUE(engine.Ready().ok());
  EXPECT_EQ(formed.load(), 1);
  EXPECT_EQ(metrics.requests_replayed.Value(), 0);
  EXPECT_EQ(metrics.requests_failed.Value(), 1);
  // Other RESOURCE_EXHAUSTED errors are not taken for a full KV cache.
  EXPECT_FALSE(IsKvCacheExhausted(absl::ResourceExhaustedError("regex match limit")));
}

}  // namespace
}  // namespace ring
