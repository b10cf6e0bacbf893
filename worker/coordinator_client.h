// File: worker/coordinator_client.h
//
// How any client reaches the coordinator's admin service (proto/ringserve/v1/coordinator.proto):
// `ringctl status / drain / join ...` and `ring-worker --join` share this, so both dial and
// authenticate the same way. The admin service is plaintext gRPC (loopback or a trusted
// network; ring-server has no TLS there) and authenticates each call by its
// "authorization: Bearer KEY" metadata, KEY being an API key or the ring token.
//
//   auto stub = NewCoordinatorStub("10.0.0.1:8001");
//   grpc::ClientContext ctx;
//   PrepareCoordinatorCall(&ctx, absl::Seconds(10), key);  // deadline + key
//   grpc::Status s = stub->Status(&ctx, {}, &resp);
#ifndef RINGSERVE_WORKER_COORDINATOR_CLIENT_H_
#define RINGSERVE_WORKER_COORDINATOR_CLIENT_H_

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ringserve/v1/coordinator.grpc.pb.h"
#include "worker/coordinator_registration.h"

namespace ring::worker {

std::unique_ptr<ringserve::v1::Coordinator::Stub> NewCoordinatorStub(const std::string& address);

// Every admin call has a deadline (`timeout` from now); `key` ("" for none) goes out as
// the bearer token.
void PrepareCoordinatorCall(grpc::ClientContext* ctx, absl::Duration timeout, const std::string& key);

// CoordinatorTransport over gRPC: Join / Leave with from_worker set. Thread-safe.
class GrpcCoordinatorTransport final : public CoordinatorTransport {
 public:
  // `coordinator`: the admin address; `key`: the ring token or an API key ("" for none).
  GrpcCoordinatorTransport(std::string coordinator, std::string key);

  absl::Status Join(const std::string& address, absl::Duration timeout) override;
  absl::Status Leave(const std::string& address, absl::Duration timeout) override;
  void CancelJoin() override;

 private:
  using MembershipCall = grpc::Status (ringserve::v1::Coordinator::Stub::*)(
      grpc::ClientContext*, const ringserve::v1::JoinRequest&, ringserve::v1::JoinResponse*);
  // `cancellable`: CancelJoin ends it (Join); Leave runs after that and must go out.
  absl::Status Call(MembershipCall call, const char* what, const std::string& address, absl::Duration timeout,
                    bool cancellable);

  const std::string coordinator_;
  const std::string key_;
  std::unique_ptr<ringserve::v1::Coordinator::Stub> stub_;
  absl::Mutex mu_;
  grpc::ClientContext* join_ ABSL_GUARDED_BY(mu_) = nullptr;  // the Join in progress
  bool join_cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ring::worker

#endif  // RINGSERVE_WORKER_COORDINATOR_CLIENT_H_
