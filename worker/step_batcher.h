// File: worker/step_batcher.h
//
// Continuous batching inside a stage. Every thread that has a step to run (a Generate at
// stage 0, a Relay frame, a Forward stream) calls Run; while one batch is on the stage, the
// steps that arrive queue up, and when it finishes one of their callers takes the queue
// (first come first served, up to max_rows rows) to the stage as the next batch
// (Stage::ForwardBatch: the weights are read once for all its rows). A step alone on an
// idle stage runs at once on its caller's thread: batching adds no wait.
//
//   StepBatcher batcher(stage, /*max_rows=*/8);
//   absl::StatusOr<StageOutput> out = batcher.Run(*seq, input);  // from any thread
//
// Results are those of Stage::Forward (ForwardBatch's contract). A step larger than
// max_rows (a prefill chunk) runs in a batch of its own. Thread-safe; one step per
// Sequence at a time (as Stage::Forward).
//
// In a pipeline the steps of one batch reach the next stage one after another (each its
// own frame), and the first would otherwise start a batch of one while its siblings are
// still on the wire, splitting every batch in two at every hop. So a step may say how many
// steps of its previous stage's batch are coming (`expect`, carried by the frame); a batch
// led by such a step waits for them, up to `gather` after it arrived.
#ifndef RINGSERVE_WORKER_STEP_BATCHER_H_
#define RINGSERVE_WORKER_STEP_BATCHER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "models/model.h"

namespace ring::worker {

class StepBatcher {
 public:
  // Called after each batch with its steps and rows (for metrics). May be empty.
  using BatchObserver = std::function<void(int64_t steps, int64_t rows)>;
  // `stage` must outlive the batcher. max_rows < 1 is taken as 1 (no batching).
  StepBatcher(const Stage& stage, int64_t max_rows, absl::Duration gather = absl::Milliseconds(1),
              BatchObserver observer = nullptr);
  // `expect`: steps arriving together with this one (itself included; <= 1: none).
  // *batch_steps (if given): how many steps the batch that ran this one held.
  absl::StatusOr<StageOutput> Run(Sequence& seq, const StageInput& in, int64_t expect = 1,
                                  int64_t* batch_steps = nullptr);

  // Batches run so far, the most steps one of them held, and steps waiting now.
  int64_t batches() const;
  int64_t largest_batch() const;
  int64_t queued() const;
  // No batch running and none waiting.
  bool idle() const;

 private:
  struct Pending {
    BatchedStep step;
    int64_t rows = 0;
    int64_t expect = 1;
    absl::Time arrived;
    bool done = false;
    int64_t batch_steps = 0;
    absl::StatusOr<StageOutput> result;
  };

  const Stage& stage_;
  const int64_t max_rows_;
  const absl::Duration gather_;
  const BatchObserver observer_;
  mutable absl::Mutex mu_;
  std::deque<Pending*> queue_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  int64_t batches_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t largest_ ABSL_GUARDED_BY(mu_) = 0;
};

// Whether the steps reaching a stage are one sequence's alone, so that its frames may be
// computed on the thread that read them (no hand-over to a batching thread, whose wake-up
// costs tens of microseconds a hop): true once no other sequence has stepped here within
// `window`. A sequence that starts after the previous one went quiet is alone at once.
// Thread-safe; the caller passes the time (tests use their own).
class LoneSequence {
 public:
  explicit LoneSequence(absl::Duration window = absl::Milliseconds(10)) : window_(window) {}
  // Records a step of `sequence_id` at `now`; whether it has been alone for `window`.
  bool Note(const std::string& sequence_id, absl::Time now);

 private:
  const absl::Duration window_;
  absl::Mutex mu_;
  std::string current_ ABSL_GUARDED_BY(mu_);                         // of the latest step
  absl::Time since_ ABSL_GUARDED_BY(mu_);                             // alone since
  absl::Time last_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();      // the latest step
};

}  // namespace ring::worker

#endif  // RINGSERVE_WORKER_STEP_BATCHER_H_
