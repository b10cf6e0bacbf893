// File: worker/worker_service.h
//
// The Worker gRPC service (proto/ringserve/v1/worker.proto) over one models/ Stage. A
// worker holds at most one stage; sequences are keyed by the coordinator's id and each
// keeps its own KV cache until Release. Safe for concurrent RPCs: different sequences run
// concurrently, frames of one sequence are serialized.
//
//   WorkerService service({.model_root = "/models", .listen_address = "127.0.0.1:7001"});
//   grpc::ServerBuilder b; b.RegisterService(&service); ...
#ifndef RINGSERVE_WORKER_WORKER_SERVICE_H_
#define RINGSERVE_WORKER_WORKER_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/cpu/sampling.h"
#include "models/model.h"
#include "worker/shadow_checker.h"
#include "worker/step_batcher.h"
#include "ringserve/v1/worker.grpc.pb.h"
#include "worker/worker_metrics.h"

namespace ring::worker {

class NcclHop;
class RelayStream;
class ShmHop;
class StageClient;

// Largest message either end accepts: gRPC's 4 MiB default is smaller than one prefill
// frame of a real model (e.g. 2048 rows x 6144 hidden x 4 bytes = 48 MiB).
inline constexpr int kMaxMessageBytes = 1 << 30;

struct WorkerOptions {
  std::string model_root;      // LoadStage paths are resolved inside this directory
  std::string listen_address;  // names this worker in error messages
  std::string device = "cpu";
  // Shared secret every caller must send as "authorization: Bearer TOKEN" metadata
  // (compared in constant time). Empty: no token check (loopback development).
  std::string auth_token;
  // Where steps, frames, KV usage and errors are reported (worker/worker_metrics.h); owned
  // by the caller, who may serve it over HTTP. Null: the service keeps a private one
  // (Describe still reports tokens/s).
  WorkerMetrics* metrics = nullptr;
  // Test-only fault injection: corrupt the payload (after checksumming) of the N-th frame
  // this worker sends, counting from 1; 0 never.
  int64_t TEST_corrupt_frame = 0;
  // Test-only: write a NaN into this worker's output at the N-th step it computes (from 1).
  int64_t TEST_nan_at_step = 0;
  // Run on a CUDA device even when this binary has no SASS for it (PTX JIT); see
  // AttestDevice.
  bool allow_ptx_jit = false;
  // Shadow verification of the loaded stage (worker/shadow_checker.h); rate 0: off.
  ShadowOptions shadow;
  // Test-only: a wrong kernel on this worker's device (LoadOptions::TEST_fault).
  std::string TEST_fault;
  // KV cache budget of the loaded stage, in bytes: a step whose cache growth would take
  // the total of all live sequences past it fails with RESOURCE_EXHAUSTED before it runs.
  // 0: derived at each stage load by DefaultKvCacheBudget from the device's free memory
  // once the weights are loaded.
  int64_t kv_cache_bytes = 0;
  // Closed ring: how long a frame may take to be taken by the next stage (Relay).
  absl::Duration relay_timeout = absl::Seconds(30);
  // Closed ring: credentials this worker presents to the next stage (the ring token is
  // auth_token; TLS PEM contents, empty tls_ca: plaintext).
  std::string peer_tls_ca, peer_tls_cert, peer_tls_key;
  // Closed ring: a hop to a stage on the same host may move large hidden-state frames over
  // NCCL when the coordinator asks (LinkRequest.nccl). false (--no-nccl): always gRPC.
  bool nccl = true;
  // Smallest payload that goes over NCCL; smaller frames stay on gRPC. Measured on 2x H200:
  // one 6144-wide bf16 row (12 KiB) takes ~25-40 us over gRPC on loopback but 69 us over
  // the host-staged NCCL link, whose fixed cost (non-blocking communicator, helper thread,
  // two staging copies) only pays off once the bytes dominate; at 256 KiB (~20 rows of a
  // 6144-wide bf16 model) NCCL's ~4 GB/s adds ~60 us to that fixed cost while gRPC's copies
  // and HTTP/2 framing already cost more. So decode steps stay on gRPC and prefill chunks
  // go over NCCL. A guess until the 2x H200 bench (bench/gpu/nccl_ring_h200.sh) measures
  // the crossover.
  int64_t nccl_min_bytes = 256 << 10;
  // Closed ring: a hop to a stage on the same host carries its frames through shared
  // memory (worker/shm_hop.h) when the coordinator asks (LinkRequest.shm); the Relay
  // stream stays open as the fallback. false (--no-shm): always gRPC.
  bool shm = true;
  // How long the thread that reads a shared-memory hop busy-polls for the next frame (after
  // handling one) before it sleeps, and a sender for room in a full ring. A frame that
  // arrives while the thread polls costs no thread wake-up (most of a loopback hop on an
  // idle server, docs/benchmarks.md); polling costs a core meanwhile. ring-worker: 50 ms
  // on a CUDA device (the cores are idle while the GPU computes), 0 on the CPU backend.
  absl::Duration shm_poll = absl::ZeroDuration();
  int64_t shm_capacity = 4 << 20;  // bytes of each hop's ring
  // How long both ends of a new NCCL hop may take to join it (inside Worker.Link).
  absl::Duration nccl_connect_timeout = absl::Seconds(10);
  // Continuous batching (worker/step_batcher.h): steps of different sequences that arrive
  // while the stage is busy go through it together, up to this many rows (8: the decode
  // GEMV's batch on a GPU, where 8 rows cost ~1.1-1.2x one). 1: every step alone.
  int64_t max_batch_rows = 8;
  // How long a batch may wait for the rest of the previous stage's batch (frames of one
  // batch arrive one after another; StepBatcher).
  absl::Duration batch_gather = absl::Milliseconds(1);
};

// The KV budget a worker without --kv-cache-bytes gives a stage: free memory after the
// weights are loaded minus the planner's headroom (server/planner.h PlanOptions: 10% of
// it, at least 256 MiB), so the caches can grow to what the planner counted on without
// taking the memory the device needs for activations and scratch. Never negative.
int64_t DefaultKvCacheBudget(int64_t free_bytes_after_weights);

// Capability attestation of `device` ("cuda:N") for this binary: compute capability,
// driver/runtime, SASS/PTX archs, whether the code runs natively, kernel variants.
// FailedPrecondition when the device would run JIT-compiled PTX and !allow_ptx_jit;
// Unimplemented for "cpu" and in builds without CUDA.
absl::StatusOr<ringserve::v1::DeviceAttestation> AttestDevice(const std::string& device,
                                                             bool allow_ptx_jit);

// Resolves `model` (relative) inside `root`; refuses absolute paths, ".." components and
// symlinks that lead outside the root (PermissionDenied / InvalidArgument).
absl::StatusOr<std::string> ResolveModelDir(const std::string& root, const std::string& model);

class WorkerService final : public ringserve::v1::Worker::Service {
 public:
  explicit WorkerService(WorkerOptions options);
  // Stops the shadow checker (it reports to metrics_, which may be owned here) first.
  ~WorkerService() override;
  // The address this worker is reached at, for error messages (known after binding).
  void SetListenAddress(std::string address);
  // Where its /metrics is served (Describe reports it; "" when not served).
  void SetMetricsAddress(std::string address);
  // Describe's `registration` (ring-worker --join): called on every Describe, so it must
  // be cheap and thread-safe (CoordinatorRegistration::Snapshot).
  void SetRegistrationSource(std::function<ringserve::v1::CoordinatorRegistration()> source);
  WorkerService(const WorkerService&) = delete;
  WorkerService& operator=(const WorkerService&) = delete;

  grpc::Status Describe(grpc::ServerContext* ctx, const ringserve::v1::DescribeRequest* req,
                        ringserve::v1::DescribeResponse* resp) override;
  grpc::Status LoadStage(grpc::ServerContext* ctx, const ringserve::v1::LoadStageRequest* req,
                         ringserve::v1::LoadStageResponse* resp) override;
  grpc::Status VerifyStage(grpc::ServerContext* ctx, const ringserve::v1::VerifyStageRequest* req,
                           ringserve::v1::VerifyStageResponse* resp) override;
  grpc::Status Forward(grpc::ServerContext* ctx,
                       grpc::ServerReaderWriter<ringserve::v1::ActivationFrame,
                                                ringserve::v1::ActivationFrame>* stream) override;
  grpc::Status Release(grpc::ServerContext* ctx, const ringserve::v1::ReleaseRequest* req,
                       ringserve::v1::ReleaseResponse* resp) override;
  grpc::Status FlightRecorder(grpc::ServerContext* ctx,
                              const ringserve::v1::FlightRecorderRequest* req,
                              ringserve::v1::FlightRecorderResponse* resp) override;
  grpc::Status Link(grpc::ServerContext* ctx, const ringserve::v1::LinkRequest* req,
                    ringserve::v1::LinkResponse* resp) override;
  grpc::Status Relay(grpc::ServerContext* ctx,
                     grpc::ServerReader<ringserve::v1::ActivationFrame>* reader,
                     ringserve::v1::RelaySummary* resp) override;
  grpc::Status Generate(grpc::ServerContext* ctx, const ringserve::v1::GenerateRequest* req,
                        grpc::ServerWriter<ringserve::v1::GenerateEvent>* writer) override;
  grpc::Status NcclAccept(grpc::ServerContext* ctx, const ringserve::v1::NcclAcceptRequest* req,
                          ringserve::v1::NcclAcceptResponse* resp) override;
  grpc::Status ShmAccept(grpc::ServerContext* ctx, const ringserve::v1::ShmAcceptRequest* req,
                         ringserve::v1::ShmAcceptResponse* resp) override;

 private:
  struct SequenceState {
    absl::Mutex mu;
    std::unique_ptr<Sequence> seq ABSL_GUARDED_BY(mu);
    int64_t next_step ABSL_GUARDED_BY(mu) = 0;
    // Cache bytes of this sequence already counted in WorkerService::kv_bytes_; guarded by
    // WorkerService::mu_ (not `mu`), like kv_bytes_ itself.
    int64_t accounted_bytes = 0;
    // Last stage of a closed ring: the sequence's sampler (from its first relayed frame).
    std::unique_ptr<Sampler> sampler ABSL_GUARDED_BY(mu);
  };
  // Where a closed ring goes on from this stage (Worker.Link).
  struct LinkState {
    uint64_t epoch = 0;  // the loaded epoch it was made for
    int stage_index = 0;
    int ring_size = 1;
    std::string next_name;  // "stage i (addr)"
    uint64_t next_epoch = 0;
    std::unique_ptr<StageClient> next_client;
    std::unique_ptr<RelayStream> next;  // null in a ring of one stage
    // The hop's NCCL data plane; null: every frame goes over `next` alone.
    std::unique_ptr<NcclHop> nccl;
    // Shared memory to the next stage (same host); null, or broken: frames go over `next`.
    std::unique_ptr<ShmHop> shm;
    // Held across a whole push: a frame whose payload follows over NCCL writes its header on
    // `next` and then the bytes, and no other frame's bytes may come between the two.
    mutable absl::Mutex push_mu;
    mutable absl::Mutex transport_mu;
    // Describe.next_transport: "nccl (cuda:0 -> cuda:1)" or "grpc (why)".
    mutable std::string transport ABSL_GUARDED_BY(transport_mu);
    ~LinkState();
  };
  // Closed ring: the NCCL link from the previous stage (Worker.NcclAccept). Joined on a
  // background thread; a frame that needs it waits for the join (bounded by its deadline).
  struct InboundNccl {
    uint64_t epoch = 0;  // the loaded epoch it was accepted for
    std::string sender;  // "stage i (addr)"
    std::string sender_device;
    absl::Mutex mu;
    bool pending ABSL_GUARDED_BY(mu) = true;
    absl::Status status ABSL_GUARDED_BY(mu);  // why the join failed
    std::shared_ptr<NcclHop> hop ABSL_GUARDED_BY(mu);
  };
  // Closed ring: the shared-memory hop from the previous stage (Worker.ShmAccept) and the
  // thread that reads it; replaced by the next ShmAccept, closed and joined when done.
  struct InboundShm {
    uint64_t epoch = 0;
    std::string sender;  // "stage i (addr)"
    std::unique_ptr<ShmHop> hop;
    std::thread reader;
    std::atomic<bool> done{false};  // the reader returned
    ~InboundShm();
  };
  // Where a generation's steps stand: the step in flight and what comes back from it.
  struct DecodeCursor {
    uint64_t step = 0;          // the step in flight
    int64_t position = 0;       // its first position
    int64_t rows = 0;           // its rows (a prefill chunk, or 1)
    bool sample = false;        // it samples (else a prefill chunk's ack comes back)
    uint32_t came_back_with = 0;  // batch size of the previous step at the last stage
    int32_t emitted = 0;
    absl::Time started;         // when this stage started it
  };
  // What advancing a generation by one returned step produced.
  struct Advanced {
    absl::Status status;
    bool ack = false;   // a prefill chunk's ack: no token, nothing started
    bool last = false;  // the token ends the generation: nothing started
    int32_t token = -1;
    ringserve::v1::GenerateEvent event;  // the token, for the coordinator
  };
  // Stage 0 of a closed ring: one running Generate. Its steps advance on whichever thread
  // holds `claimed`: the Generate thread, or, for a lone token that reaches an idle stage,
  // the Relay thread that read it, which then starts the next step at once instead of
  // waking the Generate thread first (one thread wake-up less on every token's path); the
  // Generate thread only writes the token to the coordinator (`advanced`), off that path.
  struct Generation {
    // Fixed when the call starts.
    std::string sequence_id;
    std::shared_ptr<LinkState> link;
    ringserve::v1::DType wire = ringserve::v1::DTYPE_F32;
    absl::Duration step_timeout;
    int32_t max_new_tokens = 0;
    std::vector<int32_t> stop_ids;
    std::string peer;  // the coordinator, for Step's errors
    absl::Mutex mu;
    std::deque<ringserve::v1::ActivationFrame> arrived ABSL_GUARDED_BY(mu);
    std::deque<Advanced> advanced ABSL_GUARDED_BY(mu);  // by Relay threads, not yet written
    DecodeCursor cursor ABSL_GUARDED_BY(mu);  // current whenever nobody holds the claim
    bool claimed ABSL_GUARDED_BY(mu) = false;
    bool decoding ABSL_GUARDED_BY(mu) = false;  // prompt done: Relay threads may advance it
    bool closed ABSL_GUARDED_BY(mu) = false;    // Generate returned
  };
  struct Loaded {
    std::shared_ptr<const Stage> stage;
    std::unique_ptr<StepBatcher> batcher;  // over *stage (declared after it: goes first)
    ringserve::v1::LoadStageRequest request;  // what produced it (for idempotency)
    ringserve::v1::ModelInfo info;
    uint64_t epoch = 0;
    std::shared_ptr<ShadowChecker> shadow;  // when options_.shadow.rate > 0
    int64_t kv_budget = 0;  // bytes (WorkerOptions::kv_cache_bytes)
  };

  // Why this worker takes no new sequences (a shadow check diverged); empty: healthy.
  std::string DegradedReason() const;
  // Memory read bandwidth of this machine (bytes/s), measured on first use.
  double MeasuredBandwidth();
  // UNAUTHENTICATED unless the call carries the configured token.
  grpc::Status CheckAuth(const grpc::ServerContext* ctx) const;
  // One frame through the stage; the reply is ready to send. Errors name the hop.
  // `received`: when the frame came off the wire (for the step's trace).
  absl::StatusOr<ringserve::v1::ActivationFrame> Step(const ringserve::v1::ActivationFrame& in,
                                                      const std::string& peer,
                                                      absl::Time received = absl::Now());
  void Record(bool sent, const ringserve::v1::ActivationFrame& f, const std::string& peer);
  // WorkerOptions::TEST_corrupt_frame: damages the payload of the N-th frame sent.
  void MaybeCorrupt(ringserve::v1::ActivationFrame* f);
  // Closed ring: what a stage does with a frame from Relay (compute and push on, or at
  // stage 0 hand it to its Generate).
  void HandleRelayed(ringserve::v1::ActivationFrame in, const std::string& peer, absl::Time received);
  // Closed ring, stage > 0: computes a relayed frame and pushes the result (or the step's
  // error) on to the next stage.
  void ComputeRelayed(const ringserve::v1::ActivationFrame& in, const std::string& peer,
                      absl::Time received);
  // The threads that run ComputeRelayed when batching is on (relay_threads_).
  void RelayLoop();
  // Nothing computing or waiting to compute on this worker's stage.
  bool StageIdle();
  // Describe with calibrate: the calibration forward of `model` on this worker's device,
  // cached by model hash (an error in the result when it cannot be measured now).
  ringserve::v1::Calibration Calibrate(const std::string& model, const ringserve::v1::ModelInfo& info);
  // A relayed frame whose payload follows over NCCL (nccl_payload_bytes): receives the
  // bytes from the inbound link into `payload`. Errors name both stages.
  absl::Status ReceiveNcclPayload(ringserve::v1::ActivationFrame* f);
  // Link: sets up `link`'s NCCL data plane when the coordinator asked for one; returns
  // the hop's transport ("nccl (...)" or "grpc (why)"). Never fails the Link.
  std::string LinkNccl(const ringserve::v1::LinkRequest& req, absl::Time deadline, LinkState* link);
  // Link: sets up `link`'s shared-memory hop when the coordinator asked for one; returns
  // the frames' transport ("shm" or "grpc (why)"). Never fails the Link.
  std::string LinkShm(const ringserve::v1::LinkRequest& req, LinkState* link);
  // The reader thread of an inbound shared-memory hop: each frame as Relay's.
  void ShmReadLoop(InboundShm* in);
  // After a failure of the hop's frames' (frames) or large payloads' transport: records
  // `what` in place of that part of link.transport.
  static void SetHopTransport(const LinkState& link, bool frames, const std::string& what);
  // Describe / FlightRecorder: the transports of this worker's hops.
  std::pair<std::string, std::string> Transports() const;
  // Generate: starts step `c->step` of `g` with `tokens` (Step, then PushNext; in a ring of
  // one stage the reply, which is also what comes back, is returned).
  absl::StatusOr<std::optional<ringserve::v1::ActivationFrame>> StartStep(
      Generation& g, DecodeCursor* c, std::vector<int32_t> tokens, bool sample,
      const ringserve::v1::SamplingSpec* sampling);
  // Generate: takes the frame that came back for `c->step` (its token, ack or error) and,
  // with start_next and unless the token ends the generation, starts the next step.
  Advanced AdvanceGeneration(Generation& g, DecodeCursor* c, const ringserve::v1::ActivationFrame& back,
                             bool start_next);
  // Generate: waits until Relay threads advanced `g` (*done) or a frame came back that this
  // thread now holds the claim for (*back, with *c = the cursor). Deadline: the step's.
  absl::Status AwaitRound(Generation& g, grpc::ServerContext* ctx, DecodeCursor* c,
                          std::deque<Advanced>* done, std::optional<ringserve::v1::ActivationFrame>* back);
  // Sends `f` (a reply of Step or an error) to the next stage under its epoch.
  absl::Status PushNext(const LinkState& link, ringserve::v1::ActivationFrame f, absl::Duration timeout);
  std::shared_ptr<LinkState> CurrentLink() const;
  // What this worker waits on, for its flight recorder: the parts' concatenation, written
  // into the one string in place (it runs several times a relayed step; no allocation once
  // the string has grown).
  template <typename... Parts>
  void SetWaitingOn(const Parts&... parts) {
    absl::MutexLock l(&mu_);
    waiting_on_.clear();
    absl::StrAppend(&waiting_on_, parts...);
  }
  // Keeps the latest failure for Describe (`ringctl status` shows it).
  void SetLastError(const absl::Status& status);
  // Adds the growth of `state`'s cache to the KV total, if `loaded` is still the stage.
  void AccountCache(const Loaded* loaded, SequenceState* state, int64_t cache_bytes);
  // Reserves `bytes` of the KV budget for a step of `state` before it runs (AccountCache
  // settles it afterwards); RESOURCE_EXHAUSTED naming hop(), the bytes and the budget when
  // they do not fit (the name is made only then).
  absl::Status ReserveCache(const Loaded* loaded, SequenceState* state, int64_t bytes,
                            absl::FunctionRef<std::string()> hop, const ringserve::v1::ActivationFrame& in);
  std::string HopName() const;
  std::string HopNameLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const WorkerOptions options_;
  // RING_WORKER_STEP_STATS=1 (diagnostic): a relayed step's host time by segment (decode,
  // forward, encode, the push to the next stage), printed to stderr when the service goes.
  struct StepStats;
  const std::unique_ptr<StepStats> step_stats_;
  std::unique_ptr<WorkerMetrics> owned_metrics_;  // when options_.metrics is null
  WorkerMetrics* const metrics_;
  std::optional<ringserve::v1::DeviceAttestation> attestation_;  // CUDA devices
  mutable absl::Mutex mu_;
  int64_t kv_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  int64_t last_error_unix_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  std::string metrics_address_ ABSL_GUARDED_BY(mu_);
  std::function<ringserve::v1::CoordinatorRegistration()> registration_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const Loaded> loaded_ ABSL_GUARDED_BY(mu_);
  std::string degraded_ ABSL_GUARDED_BY(mu_);  // from a replaced stage's shadow checker
  std::map<std::string, std::shared_ptr<SequenceState>> sequences_ ABSL_GUARDED_BY(mu_);
  uint64_t next_epoch_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t frames_sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t steps_computed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t checksum_failures_ ABSL_GUARDED_BY(mu_) = 0;
  // The flight recorder's last frames: a ring of kMaxEvents slots, events_recorded_ %
  // size the next to overwrite. Slots, not FrameEvent messages: Record runs twice a relayed
  // step, and reassigning a slot's strings reuses their storage.
  struct EventSlot {
    bool sent = false;
    uint64_t step = 0;
    int64_t payload_bytes = 0;
    int64_t unix_micros = 0;
    std::string sequence_id;
    std::string peer;
  };
  std::vector<EventSlot> events_ ABSL_GUARDED_BY(mu_);
  int64_t events_recorded_ ABSL_GUARDED_BY(mu_) = 0;
  std::string listen_address_ ABSL_GUARDED_BY(mu_);
  std::string waiting_on_ ABSL_GUARDED_BY(mu_) = "idle: no stage loaded";
  std::shared_ptr<LinkState> link_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<Generation>> generations_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<InboundNccl> inbound_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<InboundShm> inbound_shm_ ABSL_GUARDED_BY(mu_);
  // Replaced inbound hops whose readers may still be finishing a frame (under its
  // deadlines); joined at the next ShmAccept once done, the rest in the destructor.
  std::vector<std::shared_ptr<InboundShm>> retired_shm_ ABSL_GUARDED_BY(mu_);
  // NcclAccept's joins; each ends by its deadline. Finished ones are joined at the next
  // NcclAccept, the rest in the destructor.
  std::vector<std::pair<std::thread, std::shared_ptr<InboundNccl>>> accept_threads_ ABSL_GUARDED_BY(mu_);
  // With batching on, a Relay stream's frames are computed on these threads, so that the
  // stream keeps being read while a step runs and the frames that arrive meanwhile can go
  // through the stage as the next batch (one reader computing inline would take them one
  // at a time).
  struct RelayWork {
    ringserve::v1::ActivationFrame frame;
    std::string peer;
    absl::Time received;
  };
  absl::Mutex calibration_mu_;
  std::map<uint64_t, ringserve::v1::Calibration> calibrations_ ABSL_GUARDED_BY(calibration_mu_);
  absl::Mutex relay_mu_;
  std::deque<RelayWork> relay_queue_ ABSL_GUARDED_BY(relay_mu_);
  bool relay_stop_ ABSL_GUARDED_BY(relay_mu_) = false;
  std::vector<std::thread> relay_threads_;
  LoneSequence lone_;  // steps of one sequence alone: computed on the reading thread
  // LoadStage is slow and must not block Forward of the current stage: serialize loads
  // separately from mu_.
  absl::Mutex load_mu_;
  // The formation barrier (LoadStageRequest.formation): latest accepted per coordinator.
  std::string formation_coordinator_ ABSL_GUARDED_BY(load_mu_);
  uint64_t formation_ ABSL_GUARDED_BY(load_mu_) = 0;
  absl::Mutex bandwidth_mu_;
  double bandwidth_ ABSL_GUARDED_BY(bandwidth_mu_) = 0;
};

}  // namespace ring::worker

#endif  // RINGSERVE_WORKER_WORKER_SERVICE_H_
