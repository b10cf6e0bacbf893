// File: worker/shadow_checker.h
//
// Shadow verification: while a worker serves, a sampled fraction of its sequences is
// recomputed step by step on the CPU reference engine, off the hot path, and every layer's
// output is compared with what the serving device computed for the same step. A device
// that drifts (a kernel that is wrong only on this arch, only for these shapes, only after
// the context grows) shows up as a relative difference per layer, counted and reported in
// Describe, and optionally takes the worker out of the ring ("degraded").
//
//   ShadowChecker shadow(std::move(cpu_stage), {.rate = 0.01}, "stage 1 (10.0.0.2:7001)");
//   in.capture_layers = shadow.Sampled(seq_id);
//   out = stage.Forward(seq, in);
//   if (in.capture_layers) shadow.Observe(seq_id, in, std::move(out.layer_hidden));
//
// Sampling is per sequence (a hash of its id), so a sampled sequence is mirrored from its
// first step and the reference's KV cache follows the device's. The queue is bounded: when
// the CPU falls behind, a sequence stops being mirrored (counted as dropped) rather than
// slowing the device. Thread-safe.
//
// Noise floor (on by default): in bf16, random or badly conditioned weights amplify any
// rounding difference (MoE routing near-ties), so a correct device can sit well above a
// fixed threshold. A second reference, the CPU engine with every matmul output perturbed by
// a relative 1e-6 (LoadOptions::TEST_jitter, weights shared through the mapped file), runs
// the same steps; a layer diverges only when it is over the threshold and over
// floor_factor x the reference's distance to itself there: the rule of `ringctl verify
// --noise-floor` (models/verify.h LayerWithinTolerance).
//
// Judged over a window: a single decode row whose MoE routing flips on a near-tie (the
// device and the reference pick one different expert out of 8) is ~0.16 away, and the
// jittered reference flips as often but at other steps; rows of one sequence stay near the
// same tie, so flips come in runs (on the H200 with the GLM-5.2-dims slice, a window of 9
// checks had a median of 3.3e-2 against a median floor of 1.4e-2 while every op was right).
// So each layer keeps its last `window` checks and diverges when the (lower) MEDIAN device
// difference is over the threshold and over floor_factor x the floor's 75th percentile
// (once `min_checks` are in): a kernel that is wrong is wrong at most steps, and a model
// whose own jitter moves a layer far at a quarter of the steps gets that much slack there.
// NaN/Inf and single differences over `hard_limit` diverge at once.
#ifndef RINGSERVE_WORKER_SHADOW_CHECKER_H_
#define RINGSERVE_WORKER_SHADOW_CHECKER_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "models/model.h"
#include "ringserve/v1/worker.pb.h"

namespace ring::worker {

struct ShadowOptions {
  double rate = 0;          // fraction of sequences mirrored (0: off, 1: every sequence)
  double threshold = 0.01;  // relative difference ||dev - cpu|| / ||cpu|| of a layer output
  bool degrade = false;     // after a divergence, refuse new sequences (out of the ring)
  size_t max_queue = 64;    // pending steps before sequences stop being mirrored
  bool noise_floor = true;  // judge against the reference's own noise floor (see above)
  double floor_factor = 2.0;
  double noise_jitter = 1e-6;  // of the floor reference's matmul outputs (LoadOptions)
  int window = 32;           // latest checks per layer the judgement looks at
  int min_checks = 8;        // a layer is judged (except NaN/Inf, hard_limit) from then on
  double hard_limit = 1.0;   // a single check off by more than the output itself diverges
  // Run the CPU work in the idle scheduling class (cpu::SetIdlePriority), for workers whose
  // hot path is a GPU: the reference then only uses cores the serving path leaves free.
  bool idle_priority = false;
};

class ShadowChecker {
 public:
  // `reference`: the same layers loaded on the CPU engine; `floor_reference`: the same with
  // LoadOptions::TEST_jitter = options.noise_jitter (null, or options.noise_floor false:
  // judged against the threshold alone; Stats().noise_floor says which). `stage_name` names the stage in logs.
  // `on_layer` (may be empty) is called from the checker's thread for every layer checked:
  // (layer, relative difference, diverged).
  using LayerObserver = std::function<void(int64_t, double, bool)>;
  ShadowChecker(std::unique_ptr<Stage> reference, std::unique_ptr<Stage> floor_reference,
                ShadowOptions options, std::string stage_name, LayerObserver on_layer = {});
  ~ShadowChecker();  // waits for the step being recomputed, drops the rest
  ShadowChecker(const ShadowChecker&) = delete;
  ShadowChecker& operator=(const ShadowChecker&) = delete;

  // Whether `sequence_id`'s steps are mirrored (deterministic in the id and the rate).
  bool Sampled(const std::string& sequence_id) const;
  // Queues one computed step of a sampled sequence: its input and the device's output of
  // every layer (StageInput::capture_layers).
  void Observe(const std::string& sequence_id, const StageInput& in,
               std::vector<std::vector<float>> device_layers);
  void Release(const std::string& sequence_id);
  // Non-empty once a divergence was seen with `degrade` set: why the worker is degraded.
  std::string degraded_reason() const;
  ringserve::v1::ShadowStats Stats() const;
  // Blocks until the queue is empty (tests).
  void Drain();

 private:
  struct Item {
    std::string sequence_id;
    bool release = false;
    StageInput in;
    std::vector<std::vector<float>> device_layers;
  };
  void Run();
  void Check(Item& item);

  const std::unique_ptr<Stage> reference_;
  const std::unique_ptr<Stage> floor_reference_;  // null: no noise floor
  const ShadowOptions options_;
  const std::string stage_name_;
  const LayerObserver on_layer_;

  mutable absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, bool> dropped_ ABSL_GUARDED_BY(mu_);  // sequences no longer mirrored
  ringserve::v1::ShadowStats stats_ ABSL_GUARDED_BY(mu_);
  std::string degraded_ ABSL_GUARDED_BY(mu_);
  // Reference state per mirrored sequence; only the checker thread touches it.
  struct Mirror {
    std::unique_ptr<Sequence> ref, floor;
  };
  std::map<std::string, Mirror> sequences_;
  // Per layer of the stage, the latest `window` (device difference, floor) pairs.
  std::vector<std::deque<std::pair<double, double>>> recent_;
  std::thread thread_;
};

}  // namespace ring::worker

#endif  // RINGSERVE_WORKER_SHADOW_CHECKER_H_
