#include "worker/coordinator_client.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/grpc_status.h"

namespace ring::worker {

namespace pb = ringserve::v1;

std::unique_ptr<pb::Coordinator::Stub> NewCoordinatorStub(const std::string& address) {
  return pb::Coordinator::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

void PrepareCoordinatorCall(grpc::ClientContext* ctx, absl::Duration timeout, const std::string& key) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!key.empty()) ctx->AddMetadata("authorization", "Bearer " + key);
}

GrpcCoordinatorTransport::GrpcCoordinatorTransport(std::string coordinator, std::string key)
    : coordinator_(std::move(coordinator)), key_(std::move(key)), stub_(NewCoordinatorStub(coordinator_)) {}

absl::Status GrpcCoordinatorTransport::Call(MembershipCall call, const char* what, const std::string& address,
                                            absl::Duration timeout, bool cancellable) {
  grpc::ClientContext ctx;
  PrepareCoordinatorCall(&ctx, timeout, key_);
  if (cancellable) {
    absl::MutexLock l(&mu_);
    if (join_cancelled_) return absl::CancelledError(absl::StrCat(what, " at coordinator ", coordinator_, ": shutting down"));
    join_ = &ctx;
  }
  pb::JoinRequest req;
  req.set_address(address);
  req.set_from_worker(true);
  pb::JoinResponse resp;
  const grpc::Status s = ((*stub_).*call)(&ctx, req, &resp);
  if (cancellable) {
    absl::MutexLock l(&mu_);
    join_ = nullptr;
  }
  return FromGrpcStatus(s, absl::StrCat(what, " at coordinator ", coordinator_));
}

absl::Status GrpcCoordinatorTransport::Join(const std::string& address, absl::Duration timeout) {
  return Call(&pb::Coordinator::Stub::Join, "Join", address, timeout, /*cancellable=*/true);
}

absl::Status GrpcCoordinatorTransport::Leave(const std::string& address, absl::Duration timeout) {
  return Call(&pb::Coordinator::Stub::Leave, "Leave", address, timeout, /*cancellable=*/false);
}

void GrpcCoordinatorTransport::CancelJoin() {
  absl::MutexLock l(&mu_);
  join_cancelled_ = true;
  if (join_ != nullptr) join_->TryCancel();
}

}  // namespace ring::worker
