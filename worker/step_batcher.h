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
#ifndef RINGSERVE_WORKER_STEP_BATCHER_H_
#define RINGSERVE_WORKER_STEP_BATCHER_H_

#include <cstdint>
#include <deque>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "models/model.h"

namespace ring::worker {

class StepBatcher {
 public:
  // Called after each batch with its steps and rows (for metrics). May be empty.
  using BatchObserver = std::function<void(int64_t steps, int64_t rows)>;
  // `stage` must outlive the batcher. max_rows < 1 is taken as 1 (no batching).
  StepBatcher(const Stage& stage, int64_t max_rows, BatchObserver observer = nullptr);
  absl::StatusOr<StageOutput> Run(Sequence& seq, const StageInput& in);

  // Batches run so far, the most steps one of them held, and steps waiting now.
  int64_t batches() const;
  int64_t largest_batch() const;
  int64_t queued() const;

 private:
  struct Pending {
    BatchedStep step;
    int64_t rows = 0;
    bool done = false;
    absl::StatusOr<StageOutput> result;
  };

  const Stage& stage_;
  const int64_t max_rows_;
  const BatchObserver observer_;
  mutable absl::Mutex mu_;
  std::deque<Pending*> queue_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  int64_t batches_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t largest_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ring::worker

#endif  // RINGSERVE_WORKER_STEP_BATCHER_H_
