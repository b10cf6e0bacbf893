#include "worker/worker_metrics.h"

#include <algorithm>

#include "prometheus/text_serializer.h"

namespace ring::worker {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

// From a 1-layer tiny test stage (~100 us) to a multi-second GLM prefill chunk.
prometheus::Histogram::BucketBoundaries StepBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
          0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30};
}

const char* PhaseName(WorkerMetrics::Phase p) {
  return p == WorkerMetrics::Phase::kPrefill ? "prefill" : "decode";
}

}  // namespace

WorkerMetrics::WorkerMetrics(const std::string& device, const std::string& version)
    : registry_(std::make_shared<prometheus::Registry>()),
      step_seconds_(BuildHistogram().Name("ring_worker_step_seconds")
                        .Help("Time of one Forward step of this worker's stage, by phase")
                        .Register(*registry_)),
      tokens_(BuildCounter().Name("ring_worker_tokens_total")
                  .Help("Token rows processed by this worker's stage (prefill rows and decode steps)")
                  .Register(*registry_)),
      batch_steps_(BuildHistogram().Name("ring_worker_batch_steps")
                       .Help("Sequences whose steps went through the stage together in one batch "
                             "(continuous batching; 1: a step alone)")
                       .Register(*registry_)
                       .Add({}, prometheus::Histogram::BucketBoundaries{1, 2, 3, 4, 6, 8, 12, 16, 32})),
      frames_(BuildCounter().Name("ring_worker_frames_total")
                  .Help("Activation frames received from / sent to a peer").Register(*registry_)),
      frame_bytes_(BuildCounter().Name("ring_worker_frame_bytes_total")
                       .Help("Bytes of activation frames (serialized: payload, token ids, header) received from / sent to a peer")
                       .Register(*registry_)),
      checksum_failures_(BuildCounter().Name("ring_worker_checksum_failures_total")
                             .Help("Received frames whose XXH3 checksum did not match")
                             .Register(*registry_)),
      nccl_bytes_(BuildCounter().Name("ring_worker_nccl_bytes_total")
                      .Help("Closed-ring frame payload bytes sent / received over an NCCL link (not in frame_bytes)")
                      .Register(*registry_)),
      nccl_bytes_sent_(nccl_bytes_.Add({{"direction", "sent"}})),
      nccl_bytes_received_(nccl_bytes_.Add({{"direction", "received"}})),
      activation_rms_(BuildGauge().Name("ring_worker_activation_rms")
                          .Help("RMS of the finite values of this stage's latest output")
                          .Register(*registry_)),
      activation_absmax_(BuildGauge().Name("ring_worker_activation_absmax")
                             .Help("Max |x| of the finite values of this stage's latest output")
                             .Register(*registry_)),
      activation_nonfinite_(BuildCounter().Name("ring_worker_activation_nonfinite_total")
                                .Help("NaN / Inf values this stage produced (the step fails when > 0)")
                                .Register(*registry_)),
      stage_layers_(BuildGauge().Name("ring_worker_stage_layers")
                        .Help("Layers of the loaded stage (one series: the current model and stage)")
                        .Register(*registry_)),
      shadow_checks_(BuildCounter().Name("ring_worker_shadow_checks_total")
                         .Help("Layer outputs recomputed on the CPU reference by shadow checks")
                         .Register(*registry_)),
      shadow_divergences_(BuildCounter().Name("ring_worker_shadow_divergences_total")
                              .Help("Shadow-checked layer outputs over the divergence threshold")
                              .Register(*registry_)),
      shadow_relative_difference_(
          BuildGauge().Name("ring_worker_shadow_relative_difference")
              .Help("Latest shadow check of a layer: ||device - cpu|| / ||cpu|| of its output")
              .Register(*registry_)),
      degraded_(BuildGauge().Name("ring_worker_degraded")
                    .Help("1: the worker refuses new sequences (shadow divergence or failed "
                          "admission verify)")
                    .Register(*registry_).Add({})),
      kv_cache_bytes_(BuildGauge().Name("ring_worker_kv_cache_bytes")
                          .Help("KV cache bytes held by live sequences").Register(*registry_).Add({})),
      kv_cache_budget_bytes_(BuildGauge().Name("ring_worker_kv_cache_budget_bytes")
                                 .Help("KV cache bytes the loaded stage may hold (--kv-cache-bytes, or "
                                       "free memory after the weights minus headroom); 0: no stage")
                                 .Register(*registry_).Add({})),
      kv_cache_free_bytes_(BuildGauge().Name("ring_worker_kv_cache_free_bytes")
                               .Help("KV cache budget not held by live sequences (budget - used)")
                               .Register(*registry_).Add({})),
      sequences_live_(BuildGauge().Name("ring_worker_sequences_live")
                          .Help("Sequences holding KV cache on this worker").Register(*registry_).Add({})),
      memory_free_bytes_(BuildGauge().Name("ring_worker_memory_free_bytes")
                             .Help("Free memory of this worker's device (host: MemAvailable)")
                             .Register(*registry_).Add({})),
      epoch_(BuildGauge().Name("ring_worker_epoch").Help("Epoch of the loaded stage (0: none)")
                 .Register(*registry_).Add({})),
      epoch_changes_(BuildCounter().Name("ring_worker_epoch_changes_total")
                         .Help("Stages loaded (each bumps the epoch and drops all sequences)")
                         .Register(*registry_).Add({})) {
  BuildGauge().Name("ring_worker_info").Help("Constant 1; labels describe the worker process")
      .Register(*registry_).Add({{"device", device}, {"version", version}}).Set(1);
  // The coordinator is the only sender today: export its zero so `increase()` in the
  // checksum alert sees the first failure instead of a series appearing at 1.
  checksum_failures_.Add({{"peer", "coordinator"}});
}

void WorkerMetrics::ObserveShadow(int64_t layer, double relative_difference, bool diverged) {
  absl::MutexLock l(&mu_);
  const std::string stage = StageLabel();
  shadow_checks_.Add({{"stage", stage}}).Increment();
  // Created at the first check so a divergence shows as an increase from 0.
  auto& div = shadow_divergences_.Add({{"stage", stage}});
  if (diverged) div.Increment();
  shadow_relative_difference_.Add({{"stage", stage}, {"layer", std::to_string(layer)}})
      .Set(relative_difference);
}

void WorkerMetrics::SetDegraded(bool degraded) { degraded_.Set(degraded ? 1 : 0); }

std::string WorkerMetrics::Render() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

std::string WorkerMetrics::StageLabel() const { return std::to_string(stage_index_); }

WorkerMetrics::StageSeries& WorkerMetrics::Series() {
  if (series_.stage != stage_index_) series_ = StageSeries{.stage = stage_index_};
  return series_;
}

void WorkerMetrics::SetStage(const std::string& model, int stage_index, int64_t layers, uint64_t epoch) {
  absl::MutexLock l(&mu_);
  // One series only: an old stage's layer count would read as still loaded.
  if (stage_layers_gauge_ != nullptr) stage_layers_.Remove(stage_layers_gauge_);
  stage_layers_gauge_ = &stage_layers_.Add({{"model", model}, {"stage", std::to_string(stage_index)}});
  stage_layers_gauge_->Set(static_cast<double>(layers));
  stage_index_ = stage_index;
  epoch_.Set(static_cast<double>(epoch));
  epoch_changes_.Increment();
}

void WorkerMetrics::ObserveBatch(int64_t steps) {
  batch_steps_.Observe(static_cast<double>(steps));
}

void WorkerMetrics::ObserveStep(Phase phase, double seconds, int64_t tokens, absl::Time now) {
  absl::MutexLock l(&mu_);
  StageSeries& s = Series();
  const int p = static_cast<int>(phase);
  if (s.step_seconds[p] == nullptr) {  // created at the phase's first step, as before
    const prometheus::Labels labels = {{"stage", StageLabel()}, {"phase", PhaseName(phase)}};
    s.step_seconds[p] = &step_seconds_.Add(labels, StepBuckets());
    s.tokens[p] = &tokens_.Add(labels);
  }
  s.step_seconds[p]->Observe(seconds);
  s.tokens[p]->Increment(static_cast<double>(tokens));
  const int64_t sec = absl::ToUnixSeconds(now);
  const size_t slot = static_cast<size_t>(sec % kRateWindow);
  if (rate_second_[slot] != sec) {
    rate_second_[slot] = sec;
    rate_tokens_[slot] = 0;
  }
  rate_tokens_[slot] += tokens;
}

double WorkerMetrics::TokensPerSecond(absl::Time now) const {
  absl::MutexLock l(&mu_);
  const int64_t sec = absl::ToUnixSeconds(now);
  int64_t total = 0;
  for (int i = 0; i < kRateWindow; ++i) {
    if (rate_second_[i] > sec - kRateWindow && rate_second_[i] <= sec) total += rate_tokens_[i];
  }
  return static_cast<double>(total) / kRateWindow;
}

void WorkerMetrics::ObserveActivation(double rms, double absmax, int64_t nan_count, int64_t inf_count) {
  absl::MutexLock l(&mu_);
  StageSeries& s = Series();
  if (s.activation_rms == nullptr) {
    s.activation_rms = &activation_rms_.Add({{"stage", StageLabel()}});
    s.activation_absmax = &activation_absmax_.Add({{"stage", StageLabel()}});
  }
  s.activation_rms->Set(rms);
  s.activation_absmax->Set(absmax);
  // Rare (the step fails): looked up when it happens.
  if (nan_count > 0) activation_nonfinite_.Add({{"stage", StageLabel()}, {"kind", "nan"}}).Increment(nan_count);
  if (inf_count > 0) activation_nonfinite_.Add({{"stage", StageLabel()}, {"kind", "inf"}}).Increment(inf_count);
}

void WorkerMetrics::CountFrame(bool sent, const std::string& peer, int64_t bytes) {
  std::pair<prometheus::Counter*, prometheus::Counter*> c;
  {
    absl::MutexLock l(&frames_mu_);
    auto [it, fresh] = frame_series_[sent ? 1 : 0].try_emplace(peer);
    if (fresh) {
      const prometheus::Labels labels = {{"direction", sent ? "sent" : "received"}, {"peer", peer}};
      it->second = {&frames_.Add(labels), &frame_bytes_.Add(labels)};
    }
    c = it->second;
  }
  c.first->Increment();
  c.second->Increment(static_cast<double>(bytes));
}

void WorkerMetrics::CountNcclBytes(bool sent, int64_t bytes) {
  (sent ? nccl_bytes_sent_ : nccl_bytes_received_).Increment(static_cast<double>(bytes));
}

void WorkerMetrics::CountChecksumFailure(const std::string& peer) {
  checksum_failures_.Add({{"peer", peer}}).Increment();
}

void WorkerMetrics::SetKvCache(int64_t used_bytes, int64_t live_sequences) {
  absl::MutexLock l(&mu_);
  kv_used_ = used_bytes;
  kv_cache_bytes_.Set(static_cast<double>(used_bytes));
  kv_cache_free_bytes_.Set(static_cast<double>(std::max<int64_t>(0, kv_budget_ - kv_used_)));
  sequences_live_.Set(static_cast<double>(live_sequences));
}

void WorkerMetrics::SetKvCacheBudget(int64_t budget_bytes) {
  absl::MutexLock l(&mu_);
  kv_budget_ = budget_bytes;
  kv_cache_budget_bytes_.Set(static_cast<double>(budget_bytes));
  kv_cache_free_bytes_.Set(static_cast<double>(std::max<int64_t>(0, kv_budget_ - kv_used_)));
}

void WorkerMetrics::SetMemoryFree(int64_t bytes) { memory_free_bytes_.Set(static_cast<double>(bytes)); }

}  // namespace ring::worker
