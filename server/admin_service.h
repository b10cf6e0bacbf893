// File: server/admin_service.h
//
// The Coordinator gRPC service (proto/ringserve/v1/coordinator.proto) of ring-server:
// `ringctl status / drain / undrain / join / leave / apply / rebalance` talk to it. Status asks every
// configured worker for Describe and its flight recorder with a short deadline, so a dead
// or stalled worker shows as "unreachable" with the reason instead of blocking the call.
// Callers authenticate with "authorization: Bearer KEY" (an API key or the ring token)
// unless authentication is disabled.
#ifndef RINGSERVE_SERVER_ADMIN_SERVICE_H_
#define RINGSERVE_SERVER_ADMIN_SERVICE_H_

#include <functional>
#include <string>
#include <vector>

#include "ringserve/v1/coordinator.grpc.pb.h"
#include "server/engine.h"
#include "server/metrics.h"

namespace ring {

struct AdminOptions {
  std::string model_name;
  std::vector<std::string> keys;  // accepted bearer keys; empty: no check
  int max_concurrent = 0;
  std::function<int64_t()> in_flight;
  std::function<bool()> draining;
};

class AdminService final : public ringserve::v1::Coordinator::Service {
 public:
  AdminService(AdminOptions options, Engine* engine, ServerMetrics* metrics);

  grpc::Status Status(grpc::ServerContext* ctx, const ringserve::v1::StatusRequest* req,
                      ringserve::v1::StatusResponse* resp) override;
  grpc::Status Drain(grpc::ServerContext* ctx, const ringserve::v1::DrainRequest* req,
                     ringserve::v1::DrainResponse* resp) override;
  grpc::Status Undrain(grpc::ServerContext* ctx, const ringserve::v1::DrainRequest* req,
                       ringserve::v1::DrainResponse* resp) override;
  grpc::Status Join(grpc::ServerContext* ctx, const ringserve::v1::JoinRequest* req,
                    ringserve::v1::JoinResponse* resp) override;
  grpc::Status Leave(grpc::ServerContext* ctx, const ringserve::v1::JoinRequest* req,
                     ringserve::v1::JoinResponse* resp) override;
  grpc::Status Apply(grpc::ServerContext* ctx, const ringserve::v1::ApplyRequest* req,
                     ringserve::v1::ApplyResponse* resp) override;
  grpc::Status Rebalance(grpc::ServerContext* ctx, const ringserve::v1::RebalanceRequest* req,
                         ringserve::v1::ApplyResponse* resp) override;

 private:
  grpc::Status CheckAuth(const grpc::ServerContext* ctx) const;
  std::string RingState() const;
  // Apply and Rebalance: check `layout`, move the ring to it and wait (bounded by the
  // call's deadline) until it has formed.
  grpc::Status MoveTo(grpc::ServerContext* ctx, absl::StatusOr<Engine::Layout> layout, bool dry_run,
                      ringserve::v1::ApplyResponse* resp);

  const AdminOptions options_;
  Engine* engine_;
  ServerMetrics* metrics_;
  const absl::Time started_;
};

}  // namespace ring

#endif  // RINGSERVE_SERVER_ADMIN_SERVICE_H_
