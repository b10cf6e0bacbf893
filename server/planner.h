// File: server/planner.h
//
// Splits a model's layers into contiguous stages over the ring's workers, in ring order,
// by each worker's free memory (weights + KV cache budget + headroom must fit) and
// measured speed: with a calibration forward from every worker (the decode step time of
// one layer and of the LM head on its device), a stage's time per token is its layers x
// that layer time (+ the head's on the last stage); without, weight bytes / measured
// memory bandwidth (decode reads every weight once per token). Among the splits that fit, it picks
// the one whose slowest stage is fastest (dynamic programming over contiguous splits);
// a manual split is checked against the same limits. Infeasible plans are refused with
// the reason (which worker, how many bytes short).
//
//   RING_ASSIGN_OR_RETURN(RingPlan p, PlanRing(workers, model, {.context_tokens = 8192}));
//   std::cout << p.ToText();
#ifndef RINGSERVE_SERVER_PLANNER_H_
#define RINGSERVE_SERVER_PLANNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ring {

struct PlanWorker {
  std::string address;
  int64_t memory_free_bytes = 0;
  double bandwidth_bytes_per_s = 0;  // <= 0: unknown (treated as the slowest known)
  // Calibration forward on the worker's device (Describe with calibrate): one layer's and
  // the LM head's decode step. 0: not measured (then every worker is planned by bytes).
  double layer_seconds = 0;
  double head_seconds = 0;
};

struct PlanModel {
  std::vector<int64_t> layer_bytes;
  int64_t first_stage_extra_bytes = 0;  // embedding
  int64_t last_stage_extra_bytes = 0;   // final norm + LM head
  int64_t kv_bytes_per_token_per_layer = 0;
};

struct PlanOptions {
  int64_t context_tokens = 4096;  // KV cache budget: this many tokens ...
  int64_t sequences = 1;          // ... for this many concurrent sequences
  double headroom_fraction = 0.10;  // of free memory kept free
  int64_t headroom_min_bytes = 256 << 20;
  std::vector<int64_t> split;     // manual layer counts (checked, not optimized)
};

struct PlanStage {
  std::string address;
  int64_t layer_begin = 0, layer_end = 0;
  int64_t weight_bytes = 0;
  int64_t kv_bytes = 0;
  int64_t usable_bytes = 0;  // free memory minus headroom
  double seconds_per_token = 0;
};

struct RingPlan {
  std::vector<PlanStage> stages;
  bool calibrated = false;  // times from calibration forwards (else bytes / bandwidth)
  // Roofline predictions from weight bytes and measured bandwidth (hops not counted):
  double single_stream_tokens_per_s = 0;  // one sequence: every stage in turn
  double pipelined_tokens_per_s = 0;      // >= N sequences in flight: the slowest stage
  std::string ToText() const;
  std::vector<int64_t> LayerCounts() const;
};

// "12.3 GiB", "640 KiB", "17 B".
std::string HumanBytes(int64_t bytes);

absl::StatusOr<RingPlan> PlanRing(const std::vector<PlanWorker>& workers, const PlanModel& model,
                                  const PlanOptions& options);

}  // namespace ring

#endif  // RINGSERVE_SERVER_PLANNER_H_
