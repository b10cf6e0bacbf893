// File: worker/stage_client.h
//
// What a coordinator uses to drive one ring worker. Every call carries a deadline, and
// every error is an absl::Status with the gRPC code unchanged and a message naming the
// worker ("stage 1 (127.0.0.1:7001)"), so a failed ring says which hop failed.
//
//   StageClient c("127.0.0.1:7001", /*stage_index=*/0, {});
//   RING_ASSIGN_OR_RETURN(auto loaded, c.LoadStage(req));
//   RemoteStageRunner r(&c, "seq-1", loaded.epoch(), loaded.model().hidden_size(), DTYPE_F32);
//   RING_ASSIGN_OR_RETURN(StageOutput out, r.Forward(in));   // opens the Forward stream
//   RING_ASSIGN_OR_RETURN(out, r.Forward(next));               // same stream, next step
//
// A sequence keeps one Forward stream per stage open for its lifetime: opening a stream
// costs an HTTP/2 stream set-up and a round trip of headers and trailers per step, several
// times the cost of the frame itself. A gRPC deadline covers a whole call, which for a
// long-lived stream would be the whole sequence, so each step gets its own deadline from
// a watchdog that cancels the stream when a step overruns (ForwardStream::Step).
#ifndef RINGSERVE_WORKER_STAGE_CLIENT_H_
#define RINGSERVE_WORKER_STAGE_CLIENT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "models/stage_runner.h"
#include "ringserve/v1/worker.grpc.pb.h"

namespace ring::worker {

struct StageClientOptions {
  absl::Duration call_timeout = absl::Seconds(30);   // Describe, Release, FlightRecorder, one Forward step
  absl::Duration load_timeout = absl::Minutes(10);   // LoadStage reads weights
  std::string auth_token;  // sent as "authorization: Bearer TOKEN" when set
  // TLS (PEM contents, not paths): the CA that signed the workers' certificates, and this
  // client's certificate + key for mutual TLS. Empty tls_ca: plaintext.
  std::string tls_ca, tls_cert, tls_key;
};

// Reads a secret or PEM file for the options above; errors name the file.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path, const char* what);

// Cancels client calls whose deadline passed, for calls that outlive any single gRPC
// deadline (persistent streams). One thread for the process, sleeping until the earliest
// armed deadline; arming a later deadline than the one it sleeps on does not wake it, so
// the per-step cost is one uncontended mutex.
class CallWatchdog {
 public:
  static CallWatchdog& Get();
  // After `deadline`, calls ctx->TryCancel() unless Disarm(id) came first. `ctx` must
  // outlive the alarm (until Disarm returns).
  uint64_t Arm(grpc::ClientContext* ctx, absl::Time deadline);
  // Removes the alarm; true when it had already fired (the call was cancelled).
  bool Disarm(uint64_t id);

 private:
  CallWatchdog();
  void Loop();

  struct Alarm {
    grpc::ClientContext* ctx;
    absl::Time deadline;
  };
  absl::Mutex mu_;
  absl::CondVar cv_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Alarm> armed_ ABSL_GUARDED_BY(mu_);
  // The deadline the loop sleeps until; Arm wakes it only for an earlier one.
  absl::Time sleeping_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// One open Worker.Forward stream: frames of one sequence to one stage, one reply per
// frame. Every step has a deadline (enforced by CallWatchdog, so a stalled worker cannot
// hang the caller); the first failure cancels and finishes the stream, and every later
// call returns that same error. Thread-compatible: one step at a time.
class ForwardStream {
 public:
  ~ForwardStream();  // Close() with a short deadline
  ForwardStream(const ForwardStream&) = delete;
  ForwardStream& operator=(const ForwardStream&) = delete;

  // Sends `f` and returns the worker's reply (checksum not yet checked), both within
  // `timeout`. Errors keep the gRPC code and name the stage ("Forward stage 1 (addr): ...");
  // a step that overran is DeadlineExceeded.
  absl::StatusOr<ringserve::v1::ActivationFrame> Step(const ringserve::v1::ActivationFrame& f,
                                                      absl::Duration timeout);
  // Half-closes and waits (up to `timeout`) for the worker's status. Idempotent.
  absl::Status Close(absl::Duration timeout);
  bool broken() const { return !status_.ok(); }

 private:
  friend class StageClient;
  ForwardStream(std::string what, std::unique_ptr<grpc::ClientContext> ctx,
                std::unique_ptr<grpc::ClientReaderWriter<ringserve::v1::ActivationFrame,
                                                         ringserve::v1::ActivationFrame>> stream);
  // Finishes the stream after a failed read/write and records why in status_.
  absl::Status Fail(bool deadline_fired, absl::Duration timeout, absl::string_view during);

  const std::string what_;  // "Forward stage i (addr)"
  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<ringserve::v1::ActivationFrame,
                                           ringserve::v1::ActivationFrame>> stream_;
  absl::Status status_;  // not OK once the stream failed or was closed
  bool finished_ = false;
};

// The sending end of a closed ring's hop (Worker.Relay): one long-lived stream from a
// worker to the next stage, shared by every sequence, frames one way. Each write has a
// deadline; a failed write finishes the stream and the next Push opens a new one (the
// peer may have restarted). Thread-safe: pushes are serialized, so frames keep their
// order on the hop.
class RelayStream {
 public:
  ~RelayStream();
  RelayStream(const RelayStream&) = delete;
  RelayStream& operator=(const RelayStream&) = delete;
  // Errors keep the gRPC code and name the hop ("Relay to stage 1 (addr): ...").
  absl::Status Push(const ringserve::v1::ActivationFrame& f, absl::Duration timeout);

 private:
  friend class StageClient;
  RelayStream(std::string what, ringserve::v1::Worker::Stub* stub, std::string auth_token)
      : what_(std::move(what)), stub_(stub), auth_token_(std::move(auth_token)) {}
  void FinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string what_;
  ringserve::v1::Worker::Stub* const stub_;  // owned by the StageClient, which outlives this
  const std::string auth_token_;
  absl::Mutex mu_;
  std::unique_ptr<grpc::ClientContext> ctx_ ABSL_GUARDED_BY(mu_);
  ringserve::v1::RelaySummary summary_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<grpc::ClientWriter<ringserve::v1::ActivationFrame>> writer_ ABSL_GUARDED_BY(mu_);
};

// A Worker.Generate call to stage 0 of a closed ring: the coordinator's side of one
// generation. Each Next waits at most its timeout, so a ring that stops sending tokens
// (a stalled stage 0) cannot hang the caller. Thread-compatible.
class GenerateCall {
 public:
  ~GenerateCall();  // cancels the call if it is still running
  GenerateCall(const GenerateCall&) = delete;
  GenerateCall& operator=(const GenerateCall&) = delete;
  // The next token; nullopt when stage 0 finished the generation (max tokens or a stop
  // token). A deadline is DeadlineExceeded naming stage 0.
  absl::StatusOr<std::optional<ringserve::v1::GenerateEvent>> Next(absl::Duration timeout);
  // Stops the generation (the client went away or a stop string matched).
  void Cancel();

 private:
  friend class StageClient;
  GenerateCall(std::string what, std::unique_ptr<grpc::ClientContext> ctx,
               std::unique_ptr<grpc::ClientReader<ringserve::v1::GenerateEvent>> reader)
      : what_(std::move(what)), ctx_(std::move(ctx)), reader_(std::move(reader)) {}
  absl::Status Finish(bool deadline_fired, absl::Duration timeout);

  const std::string what_;  // "stage 0 (addr)"
  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<grpc::ClientReader<ringserve::v1::GenerateEvent>> reader_;
  bool finished_ = false;
  absl::Status status_;
};

// Thread-safe (gRPC stubs are); one client per worker, shared by all sequences.
class StageClient {
 public:
  StageClient(std::string address, int stage_index, StageClientOptions options);

  // With `calibrate` (and a probe_model) the worker also runs its calibration forward,
  // which may load weights: the call gets the load timeout.
  absl::StatusOr<ringserve::v1::DescribeResponse> Describe(const std::string& probe_model = "",
                                                           bool calibrate = false);
  absl::StatusOr<ringserve::v1::LoadStageResponse> LoadStage(ringserve::v1::LoadStageRequest req);
  // Admission verify of a layer range (Worker.VerifyStage); load_timeout applies.
  absl::StatusOr<ringserve::v1::VerifyStageResponse> VerifyStage(ringserve::v1::VerifyStageRequest req);
  // Opens a Forward stream for many steps (see ForwardStream). Does not block: headers go
  // out with the first frame.
  std::unique_ptr<ForwardStream> OpenForward();
  // One frame on a stream of its own, under call_timeout: for one-off probes and for
  // bench/hop_bench's comparison; sequences use OpenForward.
  absl::StatusOr<ringserve::v1::ActivationFrame> Forward(const ringserve::v1::ActivationFrame& f);
  // `timeout` overrides call_timeout (releases are best effort and must not hold a
  // failover up for a whole step deadline).
  absl::StatusOr<ringserve::v1::ReleaseResponse> Release(const std::string& sequence_id,
                                                         absl::Duration timeout = absl::ZeroDuration());
  absl::StatusOr<ringserve::v1::FlightRecorderResponse> FlightRecorder();
  // Closes the ring at this worker (Worker.Link), under call_timeout; the reply says which
  // transport its hop to the next stage uses.
  absl::StatusOr<ringserve::v1::LinkResponse> Link(const ringserve::v1::LinkRequest& req);
  // Asks this worker to join an NCCL link from the previous stage (Worker.NcclAccept),
  // under call_timeout; it replies before the link is up.
  absl::StatusOr<ringserve::v1::NcclAcceptResponse> NcclAccept(const ringserve::v1::NcclAcceptRequest& req);
  // Asks this worker to map a shared-memory hop from the previous stage and read frames
  // from it (Worker.ShmAccept), under call_timeout.
  absl::Status ShmAccept(const ringserve::v1::ShmAcceptRequest& req);
  // The closed ring's hop to this worker (see RelayStream); opens its stream lazily.
  std::unique_ptr<RelayStream> OpenRelay();
  // Starts a generation on this worker as stage 0 of a closed ring. Does not block.
  std::unique_ptr<GenerateCall> Generate(const ringserve::v1::GenerateRequest& req);

  const std::string& address() const { return address_; }
  const StageClientOptions& options() const { return options_; }
  int stage_index() const { return stage_index_; }
  std::string name() const;  // "stage i (address)"

 private:
  const std::string address_;
  const int stage_index_;
  void Prepare(grpc::ClientContext* ctx, absl::Duration timeout) const;

  const StageClientOptions options_;
  std::unique_ptr<ringserve::v1::Worker::Stub> stub_;
};

// A StageRunner over a StageClient: one sequence's steps on a remote stage. Tracks the step
// number and position the worker checks, and verifies the reply's checksum.
class RemoteStageRunner final : public StageRunner {
 public:
  RemoteStageRunner(StageClient* client, std::string sequence_id, uint64_t epoch,
                    int64_t hidden_size, ringserve::v1::DType wire_dtype)
      : client_(client), sequence_id_(std::move(sequence_id)), epoch_(epoch),
        hidden_size_(hidden_size), wire_dtype_(wire_dtype) {}
  // Opens this sequence's stream to the stage on the first call and reuses it; after a
  // failure the stream is gone and so is the sequence (its step count on the worker is
  // unknown), so every later call fails too.
  absl::StatusOr<StageOutput> Forward(const StageInput& in) override;
  uint64_t checksum_failures() const { return checksum_failures_; }
  // Of the last reply's values: root mean square and max |x| (from its fingerprint).
  double last_rms() const { return last_rms_; }
  float last_absmax() const { return last_absmax_; }
  // The last step's frame exchange: from writing the frame to reading the reply (no
  // coordinator-side codec), the worker's own time on it (ActivationFrame.worker_seconds;
  // unset from workers that do not report it) and the bytes of each serialized frame
  // (payload, token ids and header: what crosses the hop, less gRPC framing).
  struct Exchange {
    double round_trip_seconds = 0;
    std::optional<double> worker_seconds;
    int64_t bytes_sent = 0;
    int64_t bytes_received = 0;
  };
  const Exchange& last_exchange() const { return last_exchange_; }

 private:
  StageClient* client_;
  std::unique_ptr<ForwardStream> stream_;
  absl::Status failed_;  // the first error; later steps return it
  const std::string sequence_id_;
  const uint64_t epoch_;
  const int64_t hidden_size_;
  const ringserve::v1::DType wire_dtype_;
  uint64_t step_ = 0;
  int64_t position_ = 0;
  uint64_t checksum_failures_ = 0;
  double last_rms_ = 0;
  float last_absmax_ = 0;
  Exchange last_exchange_;
};

}  // namespace ring::worker

#endif  // RINGSERVE_WORKER_STAGE_CLIENT_H_
