// File: worker/nccl_hop.h
//
// The NCCL data plane of one closed-ring hop, as the worker sees it: a thin wrapper over
// kernels/cuda/nccl_link.h that exists in every build. Builds without CUDA or nccl.h get
// the same interface with every factory returning Unavailable, so the worker service has
// no #ifdef and a worker without NCCL (at build or at run time) simply stays on gRPC.
//
//   // Sender (rank 0), inside Worker.Link:
//   RING_ASSIGN_OR_RETURN(std::string id, NcclHop::NewId());
//   ... the receiver is sent `id` (Worker.NcclAccept) and joins as rank 1 ...
//   RING_ASSIGN_OR_RETURN(auto hop, NcclHop::Connect(id, {.device = 0, .rank = 0,
//                                                       .peer = "stage 1 (addr)"}, deadline));
//   RING_RETURN_IF_ERROR(hop->Send(payload, deadline));     // receiver: hop->Receive(n, ...)
#ifndef RINGSERVE_WORKER_NCCL_HOP_H_
#define RINGSERVE_WORKER_NCCL_HOP_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ring::worker {

// Which machine this process runs on: "MACHINE_ID/HOSTNAME", from /etc/machine-id (else
// the kernel's boot_id, which at least differs between machines up at the same time) and
// the hostname (containers built from one image can share a machine-id). Read once.
const std::string& HostId();

struct NcclHopOptions {
  int device = 0;    // this process's CUDA ordinal
  int rank = 0;      // 0: the sender (made the id), 1: the receiver
  std::string peer;  // names the other stage in errors
};

// One hop's NCCL link. Frames are moved one direction only (sender -> receiver); the
// order of Send calls on one side must match Receive calls on the other, which the
// caller guarantees (the worker pairs each with a header frame on the hop's gRPC stream).
// Thread-compatible per direction. Destroying it aborts the communicators at once
// (never waits on the peer, whose pending Receive then ends at its own deadline).
class NcclHop {
 public:
  // OK when this build has the link and libnccl loads; else Unavailable saying why.
  static absl::Status Available();
  // A fresh link id (the sender makes it; NCCL's rendezvous runs in its process).
  static absl::StatusOr<std::string> NewId();
  // Joins link `id`; both sides must call it before `deadline` (DeadlineExceeded naming
  // the peer otherwise). Unavailable in builds without NCCL.
  static absl::StatusOr<std::unique_ptr<NcclHop>> Connect(const std::string& id,
                                                         const NcclHopOptions& options,
                                                         absl::Time deadline);
  ~NcclHop();
  NcclHop(const NcclHop&) = delete;
  NcclHop& operator=(const NcclHop&) = delete;

  // Sends `bytes` (host memory); OK once they left this GPU.
  absl::Status Send(absl::string_view bytes, absl::Time deadline);
  // Receives exactly `bytes` bytes sent by one Send of the peer.
  absl::StatusOr<std::string> Receive(int64_t bytes, absl::Time deadline);
  // OK while healthy; after any failure, the first error (every later call fails).
  absl::Status status() const;

 private:
  struct Impl;
  explicit NcclHop(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ring::worker

#endif  // RINGSERVE_WORKER_NCCL_HOP_H_
