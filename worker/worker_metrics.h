// File: worker/worker_metrics.h
//
// The Prometheus metrics of one ring-worker (served as text at /metrics on the worker's
// --metrics-listen address). One object, created by main and handed to WorkerService by
// pointer, so the service only reports events and never knows about HTTP. Thread-safe.
//
// Names are prefixed `ring_worker_` so a Prometheus that scrapes the coordinator and the
// workers never mixes the two views of one quantity (e.g. checksum failures seen by the
// coordinator vs by a worker). Labels are bounded: stage index, phase, model, direction
// and peer (the frame's `sender`, i.e. "coordinator" or a stage name) — never sequence ids.
//
//   WorkerMetrics metrics;
//   metrics.ObserveStep(WorkerMetrics::Phase::kDecode, 0.012, /*tokens=*/1);
//   prometheus::Exposer exposer("127.0.0.1:9101");
//   exposer.RegisterCollectable(metrics.registry());
#ifndef RINGSERVE_WORKER_WORKER_METRICS_H_
#define RINGSERVE_WORKER_WORKER_METRICS_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace ring::worker {

class WorkerMetrics {
 public:
  enum class Phase { kPrefill, kDecode };

  // `device` and `version` go into ring_worker_info (constant for the process).
  explicit WorkerMetrics(const std::string& device = "cpu", const std::string& version = "unknown");
  WorkerMetrics(const WorkerMetrics&) = delete;
  WorkerMetrics& operator=(const WorkerMetrics&) = delete;

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }
  std::string Render() const;  // Prometheus text exposition format (tests, debugging)

  // A stage was loaded (a new epoch): the stage/model labels of later observations, the
  // layer count and the epoch. Called once per LoadStage that changed the stage.
  void SetStage(const std::string& model, int stage_index, int64_t layers, uint64_t epoch);
  // One Forward step of the loaded stage: `tokens` rows took `seconds`.
  void ObserveStep(Phase phase, double seconds, int64_t tokens, absl::Time now = absl::Now());
  // One batch through the stage (continuous batching, worker/step_batcher.h): how many
  // sequences' steps it held.
  void ObserveBatch(int64_t steps);
  // Activation fingerprint of the step's output (the frame this worker sends).
  void ObserveActivation(double rms, double absmax, int64_t nan_count, int64_t inf_count);
  // One frame through this worker: received from / sent to `peer`.
  void CountFrame(bool sent, const std::string& peer, int64_t bytes);
  void CountChecksumFailure(const std::string& peer);
  // Payload bytes of closed-ring frames that went over an NCCL link instead of gRPC
  // (ring_worker_nccl_bytes_total{direction}); not counted in frame_bytes.
  void CountNcclBytes(bool sent, int64_t bytes);
  // KV cache bytes held by live sequences, and how many sequences hold them; the free
  // gauge follows (budget - used).
  void SetKvCache(int64_t used_bytes, int64_t live_sequences);
  // The loaded stage's KV cache budget (WorkerOptions::kv_cache_bytes or derived).
  void SetKvCacheBudget(int64_t budget_bytes);
  // Precision guard: one layer's output checked by a shadow recomputation on the CPU
  // reference (worker/shadow_checker.h), and whether that counted as a divergence.
  void ObserveShadow(int64_t layer, double relative_difference, bool diverged);
  // 1 when the worker refuses new sequences (shadow divergence with --shadow-degrade, or a
  // failed admission verify).
  void SetDegraded(bool degraded);
  // Free memory on this machine (MemAvailable, or device memory for GPU workers).
  void SetMemoryFree(int64_t bytes);

  // Tokens (prefill rows + decode steps) processed per second over the last
  // kRateWindow seconds; for Describe and `ringctl status`.
  double TokensPerSecond(absl::Time now = absl::Now()) const;

  static constexpr int kRateWindow = 10;  // seconds

 private:
  std::string StageLabel() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The children of the stage-labelled families for the current stage, resolved once per
  // stage: Family::Add hashes its label map under the family's lock, several a step.
  struct StageSeries {
    int stage = -2;  // the stage_index_ these belong to (-2: none yet)
    prometheus::Histogram* step_seconds[2] = {nullptr, nullptr};  // by Phase
    prometheus::Counter* tokens[2] = {nullptr, nullptr};
    prometheus::Gauge* activation_rms = nullptr;
    prometheus::Gauge* activation_absmax = nullptr;
  };
  StageSeries& Series() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Histogram>& step_seconds_;
  prometheus::Family<prometheus::Counter>& tokens_;
  prometheus::Histogram& batch_steps_;
  prometheus::Family<prometheus::Counter>& frames_;
  prometheus::Family<prometheus::Counter>& frame_bytes_;
  prometheus::Family<prometheus::Counter>& checksum_failures_;
  prometheus::Family<prometheus::Counter>& nccl_bytes_;
  prometheus::Counter& nccl_bytes_sent_;      // both exported from 0, like checksum failures
  prometheus::Counter& nccl_bytes_received_;
  prometheus::Family<prometheus::Gauge>& activation_rms_;
  prometheus::Family<prometheus::Gauge>& activation_absmax_;
  prometheus::Family<prometheus::Counter>& activation_nonfinite_;
  prometheus::Family<prometheus::Gauge>& stage_layers_;
  prometheus::Family<prometheus::Counter>& shadow_checks_;
  prometheus::Family<prometheus::Counter>& shadow_divergences_;
  prometheus::Family<prometheus::Gauge>& shadow_relative_difference_;
  prometheus::Gauge& degraded_;
  prometheus::Gauge& kv_cache_bytes_;
  prometheus::Gauge& kv_cache_budget_bytes_;
  prometheus::Gauge& kv_cache_free_bytes_;
  prometheus::Gauge& sequences_live_;
  prometheus::Gauge& memory_free_bytes_;
  prometheus::Gauge& epoch_;
  prometheus::Counter& epoch_changes_;

  mutable absl::Mutex mu_;
  int stage_index_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t kv_used_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t kv_budget_ ABSL_GUARDED_BY(mu_) = 0;
  prometheus::Gauge* stage_layers_gauge_ ABSL_GUARDED_BY(mu_) = nullptr;
  StageSeries series_ ABSL_GUARDED_BY(mu_);
  // frames_ / frame_bytes_ children by direction (0 received, 1 sent) and peer.
  absl::Mutex frames_mu_;
  absl::flat_hash_map<std::string, std::pair<prometheus::Counter*, prometheus::Counter*>>
      frame_series_[2] ABSL_GUARDED_BY(frames_mu_);
  // Tokens per whole second, in a ring of kRateWindow buckets (bucket = unix second %
  // kRateWindow); a bucket whose second is stale counts as empty.
  std::array<int64_t, kRateWindow> rate_tokens_ ABSL_GUARDED_BY(mu_) = {};
  std::array<int64_t, kRateWindow> rate_second_ ABSL_GUARDED_BY(mu_) = {};
};

}  // namespace ring::worker

#endif  // RINGSERVE_WORKER_WORKER_METRICS_H_
