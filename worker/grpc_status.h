// File: worker/grpc_status.h
//
// absl::Status <-> grpc::Status. Abseil's canonical codes are defined to match
// google/rpc/code.proto, i.e. gRPC's, so the code crosses the RPC boundary unchanged and
// only the peer is added to the message.
#ifndef RINGSERVE_WORKER_GRPC_STATUS_H_
#define RINGSERVE_WORKER_GRPC_STATUS_H_

#include <string>

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ring::worker {

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// `what` names the call and peer, e.g. "Forward to stage 1 (127.0.0.1:5001)".
inline absl::Status FromGrpcStatus(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

}  // namespace ring::worker

#endif  // RINGSERVE_WORKER_GRPC_STATUS_H_
