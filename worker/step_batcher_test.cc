// StepBatcher: steps that arrive while a batch runs go together as the next batch, with
// the results each would get alone; a step over the row limit goes alone.
#include "worker/step_batcher.h"

#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "models/synth.h"
#include "models/temp_dir_for_test.h"

namespace ring::worker {
namespace {

// The real stage, whose first ForwardBatch waits until the test opens the gate (so that
// the other callers queue up behind it); records each batch's size.
class GatedStage final : public Stage {
 public:
  explicit GatedStage(std::unique_ptr<Stage> inner) : inner_(std::move(inner)) {}
  const ModelConfig& config() const override { return inner_->config(); }
  StageRange range() const override { return inner_->range(); }
  std::unique_ptr<Sequence> NewSequence() const override { return inner_->NewSequence(); }
  absl::StatusOr<StageOutput> Forward(Sequence& seq, const StageInput& in) const override {
    return inner_->Forward(seq, in);
  }
  std::vector<absl::StatusOr<StageOutput>> ForwardBatch(
      const std::vector<BatchedStep>& steps) const override {
    bool first;
    {
      absl::MutexLock l(&mu_);
      first = sizes_.empty();
      sizes_.push_back(static_cast<int64_t>(steps.size()));
    }
    if (first) gate_.WaitForNotificationWithTimeout(absl::Seconds(30));
    return inner_->ForwardBatch(steps);
  }
  int64_t weight_bytes() const override { return inner_->weight_bytes(); }
  void Open() { gate_.Notify(); }
  std::vector<int64_t> sizes() const {
    absl::MutexLock l(&mu_);
    return sizes_;
  }

 private:
  std::unique_ptr<Stage> inner_;
  mutable absl::Notification gate_;
  mutable absl::Mutex mu_;
  mutable std::vector<int64_t> sizes_;
};

class StepBatcherTest : public TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    SynthTiny("m", "qwen3", QuantSpec{QuantMode::kAffine, 4, 64});
  }
  std::unique_ptr<Stage> Load() {
    auto s = LoadStage((dir_ / "m").string());
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }
  // Waits (bounded) until `n` steps queue behind the running batch.
  static bool WaitQueued(const StepBatcher& b, int64_t n) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (b.queued() < n) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(1));
    }
    return true;
  }
};

// Waits (bounded) until the gated stage has started `n` batches.
bool WaitBatches(const GatedStage& g, size_t n) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (g.sizes().size() < n) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

TEST_F(StepBatcherTest, StepsThatArriveDuringABatchGoTogetherWithTheirOwnResults) {
  auto ref_stage = Load();
  ASSERT_NE(ref_stage, nullptr);
  GatedStage gated(Load());
  StepBatcher batcher(gated, 8);
  constexpr int kSeqs = 5;
  // Prompts of different lengths (run directly), then one decode step each via the batcher.
  std::vector<std::unique_ptr<Sequence>> seqs, refs;
  std::vector<StageInput> decode(kSeqs);
  std::vector<StageOutput> want(kSeqs);
  for (int j = 0; j < kSeqs; ++j) {
    seqs.push_back(gated.NewSequence());
    refs.push_back(ref_stage->NewSequence());
    StageInput prompt;
    for (int t = 0; t <= j; ++t) prompt.tokens.push_back(3 + 11 * j + t);
    ASSERT_TRUE(gated.Forward(*seqs[j], prompt).ok());
    ASSERT_TRUE(ref_stage->Forward(*refs[j], prompt).ok());
    decode[j].tokens = {7 + j};
    auto ref = ref_stage->Forward(*refs[j], decode[j]);
    ASSERT_TRUE(ref.ok()) << ref.status();
    want[j] = *std::move(ref);
  }
  std::vector<absl::StatusOr<StageOutput>> got(kSeqs, absl::InternalError("not run"));
  std::vector<std::thread> threads;
  // Sequence 0's step holds the stage (gated) while the steps of 1..4 arrive and queue.
  threads.emplace_back([&] { got[0] = batcher.Run(*seqs[0], decode[0]); });
  ASSERT_TRUE(WaitBatches(gated, 1));
  for (int j = 1; j < kSeqs; ++j) {
    threads.emplace_back([&, j] { got[j] = batcher.Run(*seqs[j], decode[j]); });
  }
  const bool queued = WaitQueued(batcher, kSeqs - 1);
  gated.Open();
  for (auto& t : threads) t.join();
  ASSERT_TRUE(queued);
  EXPECT_EQ(gated.sizes(), (std::vector<int64_t>{1, kSeqs - 1}));
  EXPECT_EQ(batcher.batches(), 2);
  EXPECT_EQ(batcher.largest_batch(), kSeqs - 1);
  for (int j = 0; j < kSeqs; ++j) {
    ASSERT_TRUE(got[j].ok()) << got[j].status();
    EXPECT_EQ(got[j]->logits, want[j].logits) << "sequence " << j;
    EXPECT_EQ(seqs[j]->position(), refs[j]->position());
  }
}

TEST_F(StepBatcherTest, AStepOverTheRowLimitGoesAloneAndFailuresStayWithTheirStep) {
  GatedStage gated(Load());
  StepBatcher batcher(gated, 4);
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (int j = 0; j < 4; ++j) seqs.push_back(gated.NewSequence());
  StageInput one, six, bad;
  one.tokens = {5};
  six.tokens = {1, 2, 3, 4, 5, 6};
  bad.tokens = {static_cast<int32_t>(gated.config().vocab_size)};
  std::vector<absl::StatusOr<StageOutput>> got(4, absl::InternalError("not run"));
  std::vector<std::thread> threads;
  threads.emplace_back([&] { got[0] = batcher.Run(*seqs[0], one); });
  ASSERT_TRUE(WaitBatches(gated, 1));
  // Queue: six rows, then two one-row steps (one of them bad), in this order.
  threads.emplace_back([&] { got[1] = batcher.Run(*seqs[1], six); });
  bool queued = WaitQueued(batcher, 1);
  threads.emplace_back([&] { got[2] = batcher.Run(*seqs[2], bad); });
  queued = queued && WaitQueued(batcher, 2);
  threads.emplace_back([&] { got[3] = batcher.Run(*seqs[3], one); });
  queued = queued && WaitQueued(batcher, 3);
  gated.Open();
  for (auto& t : threads) t.join();
  ASSERT_TRUE(queued);
  EXPECT_EQ(gated.sizes(), (std::vector<int64_t>{1, 1, 2}));
  EXPECT_TRUE(got[0].ok() && got[1].ok() && got[3].ok());
  ASSERT_FALSE(got[2].ok());
  EXPECT_EQ(got[2].status().code(), absl::StatusCode::kInvalidArgument) << got[2].status();
  EXPECT_EQ(seqs[2]->position(), 0);
  EXPECT_EQ(seqs[1]->position(), 6);
}

// A step that says its previous stage's batch had three steps waits for the other two
// (arriving later, on other threads) and they run as one batch; when they never come it
// runs alone once `gather` has passed.
TEST_F(StepBatcherTest, AStepWaitsForTheRestOfItsPreviousStagesBatch) {
  GatedStage stage(Load());
  stage.Open();
  StepBatcher batcher(stage, 8, absl::Seconds(20));
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (int j = 0; j < 3; ++j) seqs.push_back(stage.NewSequence());
  StageInput in;
  in.tokens = {9};
  std::vector<int64_t> held(3, 0);
  std::vector<std::thread> threads;
  threads.emplace_back([&] { ASSERT_TRUE(batcher.Run(*seqs[0], in, 3, &held[0]).ok()); });
  // The first waits for its siblings (the stage has not run anything yet).
  const bool waiting = WaitQueued(batcher, 1);
  absl::SleepFor(absl::Milliseconds(50));
  const bool still_waiting = stage.sizes().empty();
  for (int j = 1; j < 3; ++j) {
    threads.emplace_back([&, j] { ASSERT_TRUE(batcher.Run(*seqs[j], in, 3, &held[j]).ok()); });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(waiting && still_waiting);
  EXPECT_EQ(stage.sizes(), (std::vector<int64_t>{3}));
  EXPECT_EQ(held, (std::vector<int64_t>{3, 3, 3}));

  StepBatcher short_wait(stage, 8, absl::Milliseconds(30));
  const absl::Time t0 = absl::Now();
  int64_t alone = 0;
  ASSERT_TRUE(short_wait.Run(*seqs[0], in, 4, &alone).ok());
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(30));
  EXPECT_EQ(alone, 1);
}


// A sequence is alone once no other has stepped within the window; one that starts after
// the previous went quiet is alone at once, one that interleaves with another is not.
TEST(LoneSequenceTest, AloneOnceNoOtherSequenceSteppedWithinTheWindow) {
  LoneSequence lone(absl::Milliseconds(10));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_TRUE(lone.Note("a", t0));  // nothing stepped here before
  EXPECT_TRUE(lone.Note("a", t0 + absl::Milliseconds(1)));
  // b interleaves with a: neither is alone until the other has been quiet for the window.
  EXPECT_FALSE(lone.Note("b", t0 + absl::Milliseconds(2)));
  EXPECT_FALSE(lone.Note("a", t0 + absl::Milliseconds(3)));
  EXPECT_FALSE(lone.Note("a", t0 + absl::Milliseconds(12)));
  EXPECT_TRUE(lone.Note("a", t0 + absl::Milliseconds(13)));
  // a finished; c starts 20 ms after a's last step: alone at once.
  EXPECT_TRUE(lone.Note("c", t0 + absl::Milliseconds(33)));
  // d starts 5 ms after c's last step: not alone yet, then alone 10 ms after taking over.
  EXPECT_FALSE(lone.Note("d", t0 + absl::Milliseconds(38)));
  EXPECT_FALSE(lone.Note("d", t0 + absl::Milliseconds(47)));
  EXPECT_TRUE(lone.Note("d", t0 + absl::Milliseconds(48)));
}

}  // namespace
}  // namespace ring::worker
