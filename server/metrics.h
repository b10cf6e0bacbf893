// File: server/metrics.h
//
// The Prometheus metrics of ring-server (served as text at GET /metrics). One object,
// created once, passed by pointer; every member is thread-safe (prometheus-cpp).
// Names are prefixed `ring_`; see README "Metrics" for the list.
#ifndef RINGSERVE_SERVER_METRICS_H_
#define RINGSERVE_SERVER_METRICS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace ring {

class ServerMetrics {
 private:
  // Declared first: the public metric references below are built from it.
  std::shared_ptr<prometheus::Registry> registry_;

 public:
  ServerMetrics();
  std::string Render() const;  // Prometheus text exposition format

  void CountHttp(const std::string& route, int status);
  void CountStageError(const std::string& stage);
  // Activation fingerprint of a stage's latest output (drift between stages shows here).
  void SetStageActivation(int stage, double rms, double absmax);
  // ring_worker_up{worker}: 1 when the configured worker answers Describe, else 0.
  void SetWorkerUp(const std::string& worker, bool up);
  // A worker that left the configuration: its series goes, so no alert fires for it.
  void ForgetWorker(const std::string& worker);
  // One stage's part of a step as the coordinator sees it (Forward round trip + codec);
  // minus the worker's ring_worker_step_seconds it is the hop time.
  void ObserveStageRoundTrip(size_t stage, double seconds);
  // The hop between the coordinator and stage `stage` (both directions of the star's
  // spoke): ring_hop_latency_seconds{hop="coordinator-stage<i>"} gets the time in
  // transport (round trip minus the worker's own time; skipped when unknown) and
  // ring_hop_bytes_total{hop,direction} the frame bytes sent to / received from it.
  void ObserveHop(size_t stage, std::optional<double> transport_seconds, int64_t bytes_sent,
                  int64_t bytes_received);
  // One step round a closed ring (RingOptions::closed_loop), from stage 0's view: the
  // whole step (ring_closed_step_seconds), each stage's own time on it
  // (ring_stage_compute_seconds{stage}) and the rest, the time on all hops of the ring
  // together (ring_closed_transport_seconds). Per hop needs synchronized clocks; the
  // workers count each hop's frames and bytes (ring_worker_frames_total{peer}).
  void ObserveClosedStep(double seconds, const std::vector<std::pair<size_t, double>>& stage_seconds);

  prometheus::Counter& prompt_tokens;
  prometheus::Counter& generated_tokens;
  prometheus::Counter& requests_cancelled;
  prometheus::Counter& requests_failed;
  prometheus::Counter& ring_reforms;
  prometheus::Counter& requests_replayed;
  prometheus::Gauge& requests_in_flight;
  prometheus::Gauge& sequences_live;
  prometheus::Gauge& ready;
  prometheus::Gauge& workers_missing;
  prometheus::Gauge& checksum_failures;
  prometheus::Histogram& ttft_seconds;
  prometheus::Histogram& inter_token_seconds;
  prometheus::Histogram& request_seconds;
  prometheus::Histogram& prefill_step_seconds;
  prometheus::Histogram& decode_step_seconds;
  // Forming the ring: every attempt's duration (LoadStage on all workers) and failures.
  prometheus::Histogram& formation_seconds;
  prometheus::Counter& formation_failures;
  // A request whose ring broke waits for the re-formed one (the failover barrier): how
  // long, and how often no ring came within failover_timeout_s.
  prometheus::Histogram& failover_wait_seconds;
  prometheus::Counter& failover_timeouts;

 private:
  prometheus::Family<prometheus::Counter>* http_requests_;
  prometheus::Family<prometheus::Counter>* stage_errors_;
  prometheus::Family<prometheus::Gauge>* activation_rms_;
  prometheus::Family<prometheus::Gauge>* activation_absmax_;
  prometheus::Family<prometheus::Gauge>* worker_up_;
  prometheus::Family<prometheus::Histogram>* stage_round_trip_;
  prometheus::Family<prometheus::Histogram>* hop_latency_;
  prometheus::Family<prometheus::Histogram>* stage_compute_;
  prometheus::Histogram* closed_step_;
  prometheus::Histogram* closed_transport_;
  prometheus::Family<prometheus::Counter>* hop_bytes_;
};

}  // namespace ring

#endif  // RINGSERVE_SERVER_METRICS_H_
