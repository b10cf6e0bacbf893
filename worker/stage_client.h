// File: worker/stage_client.h
//
// What a coordinator uses to drive one ring worker. Every call carries a deadline, and
// every error is an absl::Status with the gRPC code unchanged and a message naming the
// worker ("stage 1 (127.0.0.1:7001)"), so a failed ring says which hop failed.
//
//   StageClient c("127.0.0.1:7001", /*stage_index=*/0, {});
//   RING_ASSIGN_OR_RETURN(auto loaded, c.LoadStage(req));
//   RemoteStageRunner r(&c, "seq-1", loaded.epoch(), loaded.model().hidden_size(), DTYPE_F32);
//   RING_ASSIGN_OR_RETURN(StageOutput out, r.Forward(in));
#ifndef RINGSERVE_WORKER_STAGE_CLIENT_H_
#define RINGSERVE_WORKER_STAGE_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
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

// Thread-compatible; one client per worker.
class StageClient {
 public:
  StageClient(std::string address, int stage_index, StageClientOptions options);

  absl::StatusOr<ringserve::v1::DescribeResponse> Describe(const std::string& probe_model = "");
  absl::StatusOr<ringserve::v1::LoadStageResponse> LoadStage(ringserve::v1::LoadStageRequest req);
  // Admission verify of a layer range (Worker.VerifyStage); load_timeout applies.
  absl::StatusOr<ringserve::v1::VerifyStageResponse> VerifyStage(ringserve::v1::VerifyStageRequest req);
  // Sends one frame and returns the worker's reply as received (checksum not yet checked).
  absl::StatusOr<ringserve::v1::ActivationFrame> Forward(const ringserve::v1::ActivationFrame& f);
  // `timeout` overrides call_timeout (releases are best effort and must not hold a
  // failover up for a whole step deadline).
  absl::StatusOr<ringserve::v1::ReleaseResponse> Release(const std::string& sequence_id,
                                                         absl::Duration timeout = absl::ZeroDuration());
  absl::StatusOr<ringserve::v1::FlightRecorderResponse> FlightRecorder();

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
  absl::StatusOr<StageOutput> Forward(const StageInput& in) override;
  uint64_t checksum_failures() const { return checksum_failures_; }
  // Of the last reply's values: root mean square and max |x| (from its fingerprint).
  double last_rms() const { return last_rms_; }
  float last_absmax() const { return last_absmax_; }

 private:
  StageClient* client_;
  const std::string sequence_id_;
  const uint64_t epoch_;
  const int64_t hidden_size_;
  const ringserve::v1::DType wire_dtype_;
  uint64_t step_ = 0;
  int64_t position_ = 0;
  uint64_t checksum_failures_ = 0;
  double last_rms_ = 0;
  float last_absmax_ = 0;
};

}  // namespace ring::worker

#endif  // RINGSERVE_WORKER_STAGE_CLIENT_H_
