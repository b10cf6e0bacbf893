#include "worker/worker_metrics.h"

#include <string>

#include "gtest/gtest.h"

namespace ring::worker {
namespace {

bool Has(const std::string& text, const std::string& line) {
  return text.find(line) != std::string::npos;
}

TEST(WorkerMetrics, StepsAreLabelledByStageAndPhase) {
  WorkerMetrics m("cpu", "1.2.3");
  m.SetStage("tiny-glm", 1, 2, 7);
  m.ObserveStep(WorkerMetrics::Phase::kPrefill, 0.02, 16);
  m.ObserveStep(WorkerMetrics::Phase::kDecode, 0.003, 1);
  m.ObserveStep(WorkerMetrics::Phase::kDecode, 0.004, 1);
  const std::string t = m.Render();
  EXPECT_TRUE(Has(t, "ring_worker_tokens_total{phase=\"prefill\",stage=\"1\"} 16")) << t;
  EXPECT_TRUE(Has(t, "ring_worker_tokens_total{phase=\"decode\",stage=\"1\"} 2")) << t;
  EXPECT_TRUE(Has(t, "ring_worker_step_seconds_count{phase=\"decode\",stage=\"1\"} 2")) << t;
  EXPECT_TRUE(Has(t, "ring_worker_stage_layers{model=\"tiny-glm\",stage=\"1\"} 2")) << t;
  EXPECT_TRUE(Has(t, "ring_worker_epoch 7")) << t;
  EXPECT_TRUE(Has(t, "ring_worker_info{device=\"cpu\",version=\"1.2.3\"} 1")) << t;
}

// The per-stage series are resolved once per stage: after a new stage is loaded, steps and
// fingerprints go to the new stage's series and the old ones keep their counts.
TEST(WorkerMetrics, ObservationsFollowTheLoadedStage) {
  WorkerMetrics m;
  m.SetStage("m", 0, 2, 1);
  m.ObserveStep(WorkerMetrics::Phase::kDecode, 0.003, 1);
  m.ObserveActivation(1.5, 3.0, 0, 0);
  m.SetStage("m", 3, 2, 2);
  m.ObserveStep(WorkerMetrics::Phase::kDecode, 0.003, 1);
  m.ObserveStep(WorkerMetrics::Phase::kDecode, 0.003, 1);
  m.ObserveActivation(2.5, 4.0, 0, 0);
  m.CountFrame(/*sent=*/true, "stage 1", 10);
  m.CountFrame(/*sent=*/true, "stage 2", 20);
  m.CountFrame(/*sent=*/true, "stage 1", 30);
  const std::string t = m.Render();
  EXPECT_TRUE(Has(t, "ring_worker_tokens_total{phase=\"decode\",stage=\"0\"} 1")) << t;
  EXPECT_TRUE(Has(t, "ring_worker_tokens_total{phase=\"decode\",stage=\"3\"} 2")) << t;
  EXPECT_FALSE(Has(t, "phase=\"prefill\"")) << t;
  EXPECT_TRUE(Has(t, "ring_worker_activation_rms{stage=\"0\"} 1.5")) << t;
  EXPECT_TRUE(Has(t, "ring_worker_activation_rms{stage=\"3\"} 2.5")) << t;
  EXPECT_TRUE(Has(t, "ring_worker_frame_bytes_total{direction=\"sent\",peer=\"stage 1\"} 40")) << t;
  EXPECT_TRUE(Has(t, "ring_worker_frames_total{direction=\"sent\",peer=\"stage 2\"} 1")) << t;
}

TEST(WorkerMetrics, ANewStageReplacesTheOldLayersSeries) {
  WorkerMetrics m;
  m.SetStage("tiny-glm", 0, 4, 1);
  m.SetStage("tiny-glm", 1, 2, 2);
  const std::string t = m.Render();
  EXPECT_FALSE(Has(t, "stage=\"0\"} 4")) << t;
  EXPECT_TRUE(Has(t, "ring_worker_stage_layers{model=\"tiny-glm\",stage=\"1\"} 2")) << t;
  EXPECT_TRUE(Has(t, "ring_worker_epoch_changes_total 2")) << t;
}

TEST(WorkerMetrics, FramesBytesChecksumsAndKv) {
  WorkerMetrics m;
  m.CountFrame(/*sent=*/false, "coordinator", 100);
  m.CountFrame(/*sent=*/false, "coordinator", 28);
  m.CountFrame(/*sent=*/true, "coordinator", 64);
  m.CountChecksumFailure("coordinator");
  m.SetKvCache(4096, 3);
  m.SetMemoryFree(1 << 20);
  const std::string t = m.Render();
  EXPECT_TRUE(Has(t, "ring_worker_frames_total{direction=\"received\",peer=\"coordinator\"} 2")) << t;
  EXPECT_TRUE(Has(t, "ring_worker_frame_bytes_total{direction=\"received\",peer=\"coordinator\"} 128")) << t;
  EXPECT_TRUE(Has(t, "ring_worker_frame_bytes_total{direction=\"sent\",peer=\"coordinator\"} 64")) << t;
  EXPECT_TRUE(Has(t, "ring_worker_checksum_failures_total{peer=\"coordinator\"} 1")) << t;
  EXPECT_TRUE(Has(t, "ring_worker_kv_cache_bytes 4096")) << t;
  EXPECT_TRUE(Has(t, "ring_worker_sequences_live 3")) << t;
  EXPECT_TRUE(Has(t, "ring_worker_memory_free_bytes 1048576")) << t;
}

TEST(WorkerMetrics, NcclBytesByDirectionStartAtZero) {
  WorkerMetrics m;
  EXPECT_TRUE(Has(m.Render(), "ring_worker_nccl_bytes_total{direction=\"received\"} 0"));
  m.CountNcclBytes(/*sent=*/true, 1 << 20);
  m.CountNcclBytes(/*sent=*/true, 1 << 20);
  m.CountNcclBytes(/*sent=*/false, 4096);
  const std::string t = m.Render();
  EXPECT_TRUE(Has(t, "ring_worker_nccl_bytes_total{direction=\"sent\"} 2097152")) << t;
  EXPECT_TRUE(Has(t, "ring_worker_nccl_bytes_total{direction=\"received\"} 4096")) << t;
}

TEST(WorkerMetrics, KvBudgetAndFreeFollowTheUse) {
  WorkerMetrics m;
  EXPECT_TRUE(Has(m.Render(), "ring_worker_kv_cache_budget_bytes 0"));
  m.SetKvCacheBudget(10000);
  m.SetKvCache(4096, 2);
  std::string t = m.Render();
  EXPECT_TRUE(Has(t, "ring_worker_kv_cache_budget_bytes 10000")) << t;
  EXPECT_TRUE(Has(t, "ring_worker_kv_cache_free_bytes 5904")) << t;
  m.SetKvCacheBudget(3000);  // a new stage with a smaller budget, before its caches drop
  t = m.Render();
  EXPECT_TRUE(Has(t, "ring_worker_kv_cache_free_bytes 0")) << t;
}

TEST(WorkerMetrics, ActivationFingerprintAndNonFiniteCounts) {
  WorkerMetrics m;
  m.SetStage("m", 2, 1, 1);
  m.ObserveActivation(1.5, 9.25, 0, 0);
  std::string t = m.Render();
  EXPECT_TRUE(Has(t, "ring_worker_activation_rms{stage=\"2\"} 1.5")) << t;
  EXPECT_TRUE(Has(t, "ring_worker_activation_absmax{stage=\"2\"} 9.25")) << t;
  EXPECT_FALSE(Has(t, "ring_worker_activation_nonfinite_total{")) << t;
  m.ObserveActivation(1.0, 2.0, 3, 1);
  t = m.Render();
  EXPECT_TRUE(Has(t, "ring_worker_activation_nonfinite_total{kind=\"nan\",stage=\"2\"} 3")) << t;
  EXPECT_TRUE(Has(t, "ring_worker_activation_nonfinite_total{kind=\"inf\",stage=\"2\"} 1")) << t;
}

// The rate is computed from explicit times: no sleeping, no timing assumptions.
TEST(WorkerMetrics, TokensPerSecondOverTheWindow) {
  WorkerMetrics m;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_EQ(m.TokensPerSecond(t0), 0);
  for (int s = 0; s < 5; ++s) m.ObserveStep(WorkerMetrics::Phase::kDecode, 0.01, 4, t0 + absl::Seconds(s));
  m.ObserveStep(WorkerMetrics::Phase::kPrefill, 0.1, 30, t0 + absl::Seconds(4));
  EXPECT_DOUBLE_EQ(m.TokensPerSecond(t0 + absl::Seconds(4)), (5 * 4 + 30) / 10.0);
  // Seconds 1000..1004 fall out of the window one by one.
  EXPECT_DOUBLE_EQ(m.TokensPerSecond(t0 + absl::Seconds(10)), (4 * 4 + 30) / 10.0);
  EXPECT_DOUBLE_EQ(m.TokensPerSecond(t0 + absl::Seconds(14)), 0.0);
  EXPECT_DOUBLE_EQ(m.TokensPerSecond(t0 + absl::Seconds(100)), 0.0);
  // A bucket reused by a later second starts from zero.
  m.ObserveStep(WorkerMetrics::Phase::kDecode, 0.01, 2, t0 + absl::Seconds(20));
  EXPECT_DOUBLE_EQ(m.TokensPerSecond(t0 + absl::Seconds(20)), 0.2);
}

}  // namespace
}  // namespace ring::worker
