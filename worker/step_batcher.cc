#include "worker/step_batcher.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace ring::worker {
namespace {

// Rows a step puts through the stage: tokens at stage 0, hidden rows later.
int64_t StepRows(const Stage& stage, const StageInput& in) {
  if (stage.is_first()) return static_cast<int64_t>(in.tokens.size());
  const int64_t hidden = stage.config().hidden_size;
  return hidden > 0 ? static_cast<int64_t>(in.hidden.size()) / hidden : 0;
}

}  // namespace

StepBatcher::StepBatcher(const Stage& stage, int64_t max_rows, absl::Duration gather,
                         BatchObserver observer)
    : stage_(stage),
      max_rows_(std::max<int64_t>(1, max_rows)),
      gather_(gather),
      observer_(std::move(observer)) {}

absl::StatusOr<StageOutput> StepBatcher::Run(Sequence& seq, const StageInput& in, int64_t expect,
                                             int64_t* batch_steps) {
  Pending me;
  me.step = BatchedStep{&seq, &in};
  me.rows = StepRows(stage_, in);
  me.expect = std::max<int64_t>(1, expect);
  me.arrived = absl::Now();
  me.result = absl::InternalError("not run");
  absl::MutexLock l(&mu_);
  queue_.push_back(&me);
  while (!me.done) {
    if (running_) {
      // The batch on the stage ends in a step's time; whoever sees it end first leads the
      // next one (the deadline of every step is the caller's, above this).
      auto turn = [this, &me]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return me.done || !running_; };
      mu_.Await(absl::Condition(&turn));
      continue;
    }
    // Lead. If the head's siblings from the previous stage's batch are on their way, give
    // them until `gather_` after the head arrived (bounded: one may have failed).
    running_ = true;
    const Pending* head = queue_.front();
    const int64_t want = std::min(head->expect, max_rows_ / std::max<int64_t>(1, head->rows));
    if (want > 1 && static_cast<int64_t>(queue_.size()) < want) {
      auto gathered = [this, want]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return static_cast<int64_t>(queue_.size()) >= want;
      };
      mu_.AwaitWithDeadline(absl::Condition(&gathered), head->arrived + gather_);
    }
    // Take the queue's head and what follows while it fits max_rows.
    std::vector<Pending*> batch;
    int64_t rows = 0;
    while (!queue_.empty() &&
           (batch.empty() || rows + queue_.front()->rows <= max_rows_)) {
      rows += queue_.front()->rows;
      batch.push_back(queue_.front());
      queue_.pop_front();
    }
    std::vector<BatchedStep> steps;
    steps.reserve(batch.size());
    for (Pending* p : batch) steps.push_back(p->step);
    mu_.Unlock();
    std::vector<absl::StatusOr<StageOutput>> results = stage_.ForwardBatch(steps);
    if (observer_) observer_(static_cast<int64_t>(batch.size()), rows);
    mu_.Lock();
    for (size_t i = 0; i < batch.size(); ++i) {
      batch[i]->result = std::move(results[i]);
      batch[i]->batch_steps = static_cast<int64_t>(batch.size());
      batch[i]->done = true;
    }
    ++batches_;
    largest_ = std::max<int64_t>(largest_, static_cast<int64_t>(batch.size()));
    running_ = false;
  }
  if (batch_steps != nullptr) *batch_steps = me.batch_steps;
  return std::move(me.result);
}

int64_t StepBatcher::batches() const {
  absl::MutexLock l(&mu_);
  return batches_;
}

int64_t StepBatcher::largest_batch() const {
  absl::MutexLock l(&mu_);
  return largest_;
}

bool StepBatcher::idle() const {
  absl::MutexLock l(&mu_);
  return !running_ && queue_.empty();
}

int64_t StepBatcher::queued() const {
  absl::MutexLock l(&mu_);
  return static_cast<int64_t>(queue_.size());
}

bool LoneSequence::Note(const std::string& sequence_id, absl::Time now) {
  absl::MutexLock l(&mu_);
  if (sequence_id != current_) {
    current_ = sequence_id;
    // Alone at once if the previous sequence has not stepped here within the window.
    since_ = now - last_ >= window_ ? now - window_ : now;
  }
  last_ = now;
  return now - since_ >= window_;
}

}  // namespace ring::worker
