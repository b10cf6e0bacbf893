#include "server/metrics.h"

#include "prometheus/text_serializer.h"

namespace ring {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;

Histogram::BucketBoundaries LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
}

// Finer than LatencyBuckets at the low end: a loopback hop is tens of microseconds.
const Histogram::BucketBoundaries& HopBuckets() {
  static const Histogram::BucketBoundaries kBuckets = {
      0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
      0.025,   0.05,     0.1,     0.25,   0.5,     1,      2.5,   5,      10,    30};
  return kBuckets;
}

std::string HopLabel(size_t stage) { return "coordinator-stage" + std::to_string(stage); }

}  // namespace

// Members are references into families the registry owns; build them in the initializer
// list so they are never null.
ServerMetrics::ServerMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      prompt_tokens(BuildCounter().Name("ring_prompt_tokens_total").Help("Prompt tokens processed")
                        .Register(*registry_).Add({})),
      generated_tokens(BuildCounter().Name("ring_generated_tokens_total").Help("Tokens generated")
                           .Register(*registry_).Add({})),
      requests_cancelled(BuildCounter().Name("ring_requests_cancelled_total")
                             .Help("Generations cancelled because the client went away")
                             .Register(*registry_).Add({})),
      requests_failed(BuildCounter().Name("ring_requests_failed_total")
                          .Help("Generations that failed in the ring (after admission)")
                          .Register(*registry_).Add({})),
      ring_reforms(BuildCounter().Name("ring_reforms_total")
                       .Help("Times the ring was (re)formed after a stage failure")
                       .Register(*registry_).Add({})),
      requests_replayed(BuildCounter().Name("ring_requests_replayed_total")
                            .Help("Requests replayed on a re-formed ring after a stage failure")
                            .Register(*registry_).Add({})),
      requests_in_flight(BuildGauge().Name("ring_requests_in_flight")
                             .Help("Generations admitted and not finished").Register(*registry_).Add({})),
      sequences_live(BuildGauge().Name("ring_sequences_live")
                         .Help("Sequences holding KV cache on the ring").Register(*registry_).Add({})),
      ready(BuildGauge().Name("ring_ready").Help("1 when the ring is formed and admitting")
                .Register(*registry_).Add({})),
      workers_missing(BuildGauge().Name("ring_workers_missing")
                          .Help("Configured workers left out of the current (degraded) ring")
                          .Register(*registry_).Add({})),
      checksum_failures(BuildGauge().Name("ring_checksum_failures")
                            .Help("Activation frames whose XXH3 checksum did not match, since the ring formed")
                            .Register(*registry_).Add({})),
      ttft_seconds(BuildHistogram().Name("ring_time_to_first_token_seconds")
                       .Help("Admission to first generated token").Register(*registry_)
                       .Add({}, LatencyBuckets())),
      inter_token_seconds(BuildHistogram().Name("ring_inter_token_latency_seconds")
                              .Help("Time between consecutive generated tokens").Register(*registry_)
                              .Add({}, LatencyBuckets())),
      request_seconds(BuildHistogram().Name("ring_request_duration_seconds")
                          .Help("Admission to last token").Register(*registry_)
                          .Add({}, LatencyBuckets())),
      prefill_step_seconds(BuildHistogram().Name("ring_step_seconds_prefill")
                               .Help("One prefill chunk through every stage").Register(*registry_)
                               .Add({}, LatencyBuckets())),
      decode_step_seconds(BuildHistogram().Name("ring_step_seconds_decode")
                              .Help("One decode token through every stage").Register(*registry_)
                              .Add({}, LatencyBuckets())),
      formation_seconds(BuildHistogram().Name("ring_formation_seconds")
                            .Help("One attempt to form the ring (probe + LoadStage on every worker)")
                            .Register(*registry_).Add({}, LatencyBuckets())),
      formation_failures(BuildCounter().Name("ring_formation_failures_total")
                             .Help("Attempts to form the ring that failed").Register(*registry_).Add({})),
      failover_wait_seconds(BuildHistogram().Name("ring_failover_wait_seconds")
                                .Help("Time a request whose ring broke waited for the re-formed ring")
                                .Register(*registry_).Add({}, LatencyBuckets())),
      failover_timeouts(BuildCounter().Name("ring_failover_timeouts_total")
                            .Help("Requests that failed because no ring formed within failover_timeout_s")
                            .Register(*registry_).Add({})) {
  stage_round_trip_ = &BuildHistogram().Name("ring_stage_round_trip_seconds")
                           .Help("One stage's part of a step seen from the coordinator: Forward round trip "
                                 "(both hops + the worker's compute) and frame codec")
                           .Register(*registry_);
  hop_latency_ = &BuildHistogram().Name("ring_hop_latency_seconds")
                      .Help("Time a step's frames spent in transport between the coordinator and a "
                            "stage, both directions: Forward round trip minus the worker's own time")
                      .Register(*registry_);
  stage_compute_ = &BuildHistogram().Name("ring_stage_compute_seconds")
                       .Help("Closed ring: one stage's own time on a step (frame in to frame out), "
                             "reported round the ring to the coordinator")
                       .Register(*registry_);
  closed_step_ = &BuildHistogram().Name("ring_closed_step_seconds")
                      .Help("Closed ring: one step round the whole ring, from stage 0 starting it to "
                            "the sampled token coming back")
                      .Register(*registry_).Add({}, HopBuckets());
  closed_transport_ = &BuildHistogram().Name("ring_closed_transport_seconds")
                           .Help("Closed ring: the part of a step spent on the hops (all together): the "
                                 "step minus every stage's own time")
                           .Register(*registry_).Add({}, HopBuckets());
  hop_bytes_ = &BuildCounter().Name("ring_hop_bytes_total")
                    .Help("Activation frame bytes (serialized) the coordinator sent to "
                          "(direction=sent) or received from (direction=received) a stage")
                    .Register(*registry_);
  worker_up_ = &BuildGauge().Name("ring_worker_up")
                    .Help("1 when the configured worker answers Describe, 0 when it does not")
                    .Register(*registry_);
  http_requests_ = &BuildCounter().Name("ring_http_requests_total")
                        .Help("HTTP requests by route and status").Register(*registry_);
  activation_rms_ = &BuildGauge().Name("ring_stage_activation_rms")
                         .Help("Root mean square of the stage's latest output (frame fingerprint)")
                         .Register(*registry_);
  activation_absmax_ = &BuildGauge().Name("ring_stage_activation_absmax")
                            .Help("Max |x| of the stage's latest output (frame fingerprint)")
                            .Register(*registry_);
  stage_errors_ = &BuildCounter().Name("ring_stage_errors_total")
                       .Help("Failed ring steps by the stage that failed").Register(*registry_);
}

std::string ServerMetrics::Render() const {
  prometheus::TextSerializer s;
  return s.Serialize(registry_->Collect());
}

void ServerMetrics::CountHttp(const std::string& route, int status) {
  http_requests_->Add({{"route", route}, {"code", std::to_string(status)}}).Increment();
}

void ServerMetrics::SetStageActivation(int stage, double rms, double absmax) {
  const std::string s = std::to_string(stage);
  activation_rms_->Add({{"stage", s}}).Set(rms);
  activation_absmax_->Add({{"stage", s}}).Set(absmax);
}

void ServerMetrics::SetWorkerUp(const std::string& worker, bool up) {
  worker_up_->Add({{"worker", worker}}).Set(up ? 1 : 0);
}

void ServerMetrics::ForgetWorker(const std::string& worker) {
  // Add() returns the existing series for these labels, which Remove() then drops.
  worker_up_->Remove(&worker_up_->Add({{"worker", worker}}));
}

void ServerMetrics::ObserveStageRoundTrip(size_t stage, double seconds) {
  stage_round_trip_->Add({{"stage", std::to_string(stage)}}, HopBuckets()).Observe(seconds);
}

void ServerMetrics::ObserveHop(size_t stage, std::optional<double> transport_seconds,
                               int64_t bytes_sent, int64_t bytes_received) {
  const std::string hop = HopLabel(stage);
  if (transport_seconds) hop_latency_->Add({{"hop", hop}}, HopBuckets()).Observe(*transport_seconds);
  hop_bytes_->Add({{"hop", hop}, {"direction", "sent"}}).Increment(static_cast<double>(bytes_sent));
  hop_bytes_->Add({{"hop", hop}, {"direction", "received"}}).Increment(static_cast<double>(bytes_received));
}

void ServerMetrics::ObserveClosedStep(double seconds,
                                      const std::vector<std::pair<size_t, double>>& stage_seconds) {
  double compute = 0;
  for (const auto& [stage, t] : stage_seconds) {
    stage_compute_->Add({{"stage", std::to_string(stage)}}, HopBuckets()).Observe(t);
    compute += t;
  }
  closed_step_->Observe(seconds);
  closed_transport_->Observe(std::max(0.0, seconds - compute));
}

void ServerMetrics::CountStageError(const std::string& stage) {
  stage_errors_->Add({{"stage", stage}}).Increment();
}

}  // namespace ring
