// File: server/ring.h
//
// The coordinator's view of a formed ring: the stages of one model, in order, either on
// ring-worker processes (gRPC) or in this process, and per-sequence step runners over
// them. Both `ringctl logits` and `ring-server` drive generation through this, so a
// remote ring and a local one run the same step loop and compare bit for bit.
//
//   RING_ASSIGN_OR_RETURN(auto ring, Ring::Connect({.workers = {"127.0.0.1:7001", ...},
//                                                   .model = "tiny-glm"}));
//   RING_ASSIGN_OR_RETURN(auto seq, ring->NewSequence("req-1"));
//   RING_ASSIGN_OR_RETURN(std::vector<float> logits, seq->Step({1, 2, 3}));
//
// A Ring is thread-safe; a RingSequence is used by one thread at a time and frees its KV
// caches on every stage when destroyed.
#ifndef RINGSERVE_SERVER_RING_H_
#define RINGSERVE_SERVER_RING_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/sampling.h"
#include "models/model.h"
#include "server/planner.h"
#include "worker/stage_client.h"

namespace ring {

// One stage's part of a step as the coordinator sees it (RingOptions::on_stage_step). The
// ring is a star: the coordinator sends the frame to the stage and reads its reply, so the
// stage's "hop" is both directions of that exchange.
struct StageStep {
  size_t stage = 0;
  double seconds = 0;             // encode + Forward round trip + decode
  double round_trip_seconds = 0;  // frame written to reply read (no coordinator codec)
  // The worker's own time on the frame, from the reply (ActivationFrame.worker_seconds);
  // unset from a worker that does not report it.
  std::optional<double> worker_seconds;
  int64_t bytes_sent = 0;      // serialized frame bytes coordinator -> stage
  int64_t bytes_received = 0;  // serialized frame bytes stage -> coordinator
  // Time in transport (gRPC, network, both directions): the round trip minus the worker's
  // time, never negative; unset when the worker did not report its time.
  std::optional<double> TransportSeconds() const {
    if (!worker_seconds) return std::nullopt;
    return std::max(0.0, round_trip_seconds - *worker_seconds);
  }
};

// Closed ring: how frames travel between stages (config ring.transport). kAuto: a hop
// between two CUDA workers on the same host gets an NCCL data plane for its large frames,
// every other hop gRPC; kGrpc: gRPC everywhere.
enum class RingTransport { kAuto, kGrpc };

// Where one closed-ring step's time went, from the trace that comes back with its token.
// Times are the workers' wall clocks: comparable between workers of one host (hop times
// between hosts are as good as their clock sync).
struct ClosedStepTrace {
  double seconds = 0;               // stage 0 starting the step to the token back there
  bool prefill = false;             // the step that carried the prompt (its last chunk)
  int64_t started_unix_nanos = 0;   // stage 0 started the step
  int64_t returned_unix_nanos = 0;  // the token was back at stage 0
  struct Stage {
    size_t index = 0;
    double worker_seconds = 0;   // frame off the wire to reply ready
    double compute_seconds = 0;  // the stage's forward, waiting for a batch slot included
    int64_t received_unix_nanos = 0;
    int64_t sent_unix_nanos = 0;
  };
  std::vector<Stage> stages;  // ring order
};

struct RingOptions {
  // Remote ring: worker addresses in ring order; `model` is a path under their
  // --model-root. Empty: the stages run in this process and `model` is a directory.
  std::vector<std::string> workers;
  std::string model;
  // Layer counts per stage (must sum to the layer count); empty: near-equal split into
  // workers.size() stages (remote) or `local_stages` stages (local).
  std::vector<int64_t> split;
  int local_stages = 1;
  std::optional<cpu::ActDType> act_dtype;  // unset: the checkpoint's
  // Local stages: the device they run on, the per-sequence position limit (0: the model's)
  // and the CPU engine's noise-floor diagnostic (models/model.h LoadOptions).
  DeviceSpec device;
  int64_t max_context = 0;
  double TEST_jitter = 0;
  // Last stage returns logits for every row of a step (ringctl) or only the last (serving).
  bool all_logits = false;
  absl::Duration step_timeout = absl::Seconds(30);
  absl::Duration load_timeout = absl::Minutes(10);
  // Inter-node auth (worker/stage_client.h): shared token and/or TLS, PEM contents.
  std::string auth_token;
  std::string tls_ca, tls_cert, tls_key;
  // Remote ring without a split: plan it by the workers' free memory and measured speed
  // (server/planner.h) instead of an even split.
  bool auto_plan = false;
  // Planning measures speed with a calibration forward on every worker (one layer and the
  // LM head of the model on its device, cached by the worker); false, or when a worker
  // cannot, by weight bytes / measured memory bandwidth.
  bool plan_calibrate = true;
  // Remote ring: called after every stage's part of a step with its timing and bytes
  // (ring-server: ring_stage_round_trip_seconds, ring_hop_latency_seconds and
  // ring_hop_bytes_total).
  std::function<void(const StageStep&)> on_stage_step;
  int64_t plan_context_tokens = 4096;  // KV budget per sequence
  int64_t plan_sequences = 1;
  // Admission gate (remote ring): before loading, each worker verifies its layer range on
  // its device against the CPU reference (Worker.VerifyStage) with these golden tokens, fed
  // stage to stage; a worker over tolerance is refused and marks itself degraded, so the
  // next formation leaves it out. Empty: off.
  std::vector<int32_t> admission_tokens;
  double admission_tolerance = 0.01;
  // The formation barrier's generation (LoadStageRequest.formation): a coordinator that
  // re-forms numbers its formations 1, 2, ... under one random coordinator_id, so a worker
  // refuses a LoadStage that arrives after a later formation's. 0: unnumbered.
  uint64_t formation = 0;
  std::string coordinator_id;
  // Remote ring: close it (Worker.Link) so that generations run round it on their own
  // (RingSequence::Generate): each stage pushes to the next, the last samples and sends
  // the token straight to stage 0. Off: the coordinator drives every step (a star).
  bool closed_loop = false;
  RingTransport transport = RingTransport::kAuto;  // closed ring only
  // Closed ring: called for every step with where its time went (ClosedStepTrace;
  // ring_closed_step_seconds, ring_stage_compute_seconds).
  std::function<void(const ClosedStepTrace&)> on_closed_step;
};

// One generation round a closed ring (RingSequence::Generate).
struct ClosedLoopRequest {
  std::vector<int32_t> tokens;     // fed first: the prompt, on a replay + tokens so far
  int64_t prefill_chunk = 0;       // rows per prefill step; 0: one step
  SamplingParams sampling;
  std::vector<int32_t> generated;  // already generated (a replay): the sampler resumes
  int32_t max_new_tokens = 1;
  std::vector<int32_t> stop_token_ids;
};

// The admission gate's golden prompt of `n` tokens: fixed ids below 1000 (every vocabulary
// has them); the last one is sent as a separate decode step so both attention paths run.
std::vector<int32_t> AdmissionTokens(int64_t n);

struct RingModelInfo {
  std::string model_type;
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;  // 0: unknown
};

struct RingStageInfo {
  std::string name;  // "stage 1 (127.0.0.1:7001)" or "stage 1 (local)"
  StageRange layers;
  int64_t weight_bytes = 0;
};

// One sequence's steps through every stage.
class RingSequence {
 public:
  virtual ~RingSequence() = default;
  // Runs `tokens` (a prefill chunk, or one decode token) through all stages and returns
  // the last stage's logits: [rows, vocab] with all_logits, else [vocab] for the last row.
  // A failure leaves the sequence unusable (positions on the stages may disagree).
  virtual absl::StatusOr<std::vector<float>> Step(const std::vector<int32_t>& tokens) = 0;
  // The same step when only the greedy token of the last row is wanted (temperature 0, no
  // log-probabilities, no penalties): the last stage picks it where its logits are (on
  // its GPU) and sends back the token instead of [vocab] floats. Lowest id on ties. The
  // default takes the argmax of Step's logits.
  virtual absl::StatusOr<int32_t> StepGreedy(const std::vector<int32_t>& tokens);
  virtual int64_t position() const = 0;
  // Closed ring only (closed_loop()): the whole generation runs round the ring; each token
  // is handed to `on_token` as it reaches stage 0, which returns false to stop. Returns
  // when max_new_tokens are out, a stop token came, on_token said stop, or a step failed
  // (the status names the stage). A fresh sequence only (no Step before).
  virtual bool closed_loop() const { return false; }
  virtual absl::Status Generate(const ClosedLoopRequest& req,
                                const std::function<bool(const SampledToken&)>& on_token);
};

class Ring {
 public:
  virtual ~Ring() = default;
  // Loads the stages (remote: LoadStage on every worker, checking they hold the same
  // model) and returns the formed ring.
  static absl::StatusOr<std::unique_ptr<Ring>> Connect(const RingOptions& options);

  virtual const RingModelInfo& model() const = 0;
  virtual const std::vector<RingStageInfo>& stages() const = 0;
  // `id` must be unique among live sequences of this ring.
  virtual absl::StatusOr<std::unique_ptr<RingSequence>> NewSequence(const std::string& id) = 0;
  // Checksum mismatches detected on replies so far.
  virtual uint64_t checksum_failures() const = 0;
  // What every stage is doing now (remote: each worker's flight recorder, with a short
  // deadline), for the error of a step that timed out: names the stage that is stuck.
  virtual std::string Diagnose() = 0;
  // Per stage, the RMS and max |x| of its most recent output (from frame fingerprints);
  // empty for in-process rings.
  struct ActivationStats {
    double rms = 0;
    float absmax = 0;
  };
  virtual std::vector<ActivationStats> activation_stats() const = 0;
};

// Closed ring: how the hop from worker `from` to the next stage's worker `to` (their
// Describe replies) is asked to carry its frames, under kAuto only: through shared memory
// (LinkRequest.shm) when both run on the same host (DescribeResponse.host_id), whatever
// their backends; with an NCCL data plane for large payloads (LinkRequest.nccl) when both
// also run on CUDA devices, except on the hop that closes the ring (last stage -> stage 0:
// `closing`), which carries sampled tokens, never hidden states, and between two workers on
// one GPU (the same DeviceAttestation.gpu_uuid: NCCL needs a device per rank). Without
// NCCL, `reason` says why (LinkRequest.transport_reason).
struct HopTransportChoice {
  bool nccl = false;
  bool shm = false;  // the two are on one host: frames through shared memory (any backend)
  std::string reason;
};
HopTransportChoice ChooseHopTransport(const ringserve::v1::DescribeResponse& from,
                                      const ringserve::v1::DescribeResponse& to,
                                      RingTransport transport, bool closing = false);

// Workers of one host that share a GPU (the same host_id and DeviceAttestation.gpu_uuid)
// while one of them is not an MPS client: one line per GPU naming the workers (`names`, in
// the order of `described`) and what to do. Without MPS the GPU switches between their
// contexts at every hop (one H200, 4 stages: 0.62 of one process's tokens/s, 0.85 with MPS).
std::vector<std::string> SharedGpuWarnings(const std::vector<ringserve::v1::DescribeResponse>& described,
                                           const std::vector<std::string>& names);

// Client options (deadlines, token, TLS) for talking to the workers of `options`.
worker::StageClientOptions ClientOptions(const RingOptions& options, absl::Duration call_timeout);

// Describes every worker of `options` (probing options.model) and plans the split
// (server/planner.h); options.split, when set, is checked instead of optimized.
absl::StatusOr<RingPlan> PlanForWorkers(const RingOptions& options);

// The workers of `options` that answer Describe within `timeout`, in ring order.
std::vector<std::string> ReachableWorkers(const RingOptions& options, absl::Duration timeout);

// Layer ranges from explicit counts (validated against `num_layers`) or a near-equal split.
absl::StatusOr<std::vector<StageRange>> PlanStageRanges(const std::vector<int64_t>& split,
                                                        int64_t num_layers, int stages);

}  // namespace ring

#endif  // RINGSERVE_SERVER_RING_H_
