// File: models/stage_runner.h
//
// One stage of one sequence, as the step loop of a coordinator sees it: StageInput in,
// StageOutput out. LocalStageRunner runs a Stage in-process; worker/stage_client.h has the
// remote one, so the same loop drives both and their results can be compared bit for bit.
#ifndef RINGSERVE_MODELS_STAGE_RUNNER_H_
#define RINGSERVE_MODELS_STAGE_RUNNER_H_

#include <memory>

#include "models/model.h"

namespace ring {

class StageRunner {
 public:
  virtual ~StageRunner() = default;
  // Runs the next step of this runner's sequence. Not thread-safe.
  virtual absl::StatusOr<StageOutput> Forward(const StageInput& in) = 0;
};

// Owns the Stage and one Sequence of it.
class LocalStageRunner final : public StageRunner {
 public:
  explicit LocalStageRunner(std::unique_ptr<Stage> stage)
      : stage_(std::move(stage)), seq_(stage_->NewSequence()) {}
  absl::StatusOr<StageOutput> Forward(const StageInput& in) override {
    return stage_->Forward(*seq_, in);
  }

 private:
  std::unique_ptr<Stage> stage_;
  std::unique_ptr<Sequence> seq_;
};

}  // namespace ring

#endif  // RINGSERVE_MODELS_STAGE_RUNNER_H_
