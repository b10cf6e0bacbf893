// File: kernels/cuda/nccl_link.h
//
// NcclLink: the device data plane of one ring hop between two GPUs on the same host (or
// any two NCCL-reachable GPUs): this process's GPU and one peer's, as a two-rank NCCL
// communicator. Bytes in, the same bytes out; it knows nothing of models or RPC.
//
// NCCL is not linked: NcclLibrary dlopen()s libnccl.so.2 at run time, because deploy
// bundles cannot carry it (218 MB) and a worker without NCCL must keep working (the ring
// then falls back to gRPC). A missing or too old library is Unavailable, never a crash.
//
//   // Side A (rank 0) makes the id and ships it to side B in a protobuf bytes field.
//   RING_ASSIGN_OR_RETURN(const NcclLibrary* nccl, NcclLibrary::Get());
//   RING_ASSIGN_OR_RETURN(std::string id, NcclLink::NewId(*nccl));
//   // Both sides (B with rank = 1), each with its own deadline:
//   RING_ASSIGN_OR_RETURN(std::unique_ptr<NcclLink> link,
//                         NcclLink::Connect(id, {.device = 0, .rank = 0, .peer = "stage 2"},
//                                           absl::Now() + absl::Seconds(30)));
//   RING_RETURN_IF_ERROR(link->Send(dev_ptr, bytes, absl::Now() + absl::Seconds(5)));
//   // ... and on B: link->Recv(dev_ptr, bytes, deadline). Sizes must match on both sides.
//
// Never hang: the communicators are created non-blocking and every wait (init, each
// transfer, close) polls the CUDA stream and ncclCommGetAsyncError until a deadline. On a
// timeout or any error the communicators are aborted (ncclCommAbort; never destroyed and
// waited on, since destroy can block forever on unfinished work) and every later call
// returns the first error at once. A peer's pending transfer does not necessarily learn of
// the abort (over P2P/NVLink NCCL has no channel to tell it): it ends at its own deadline.
// The abort itself is synchronous (the caller's buffers must be out of NCCL's hands when
// the call returns), so a timed-out call returns after its deadline plus the abort: up to
// ~1.5 s on 2x H200 with NCCL 2.28.9 when the peer had aborted first.
//
// Cost of non-blocking: NCCL 2.28 runs every operation of a non-blocking communicator
// through a helper thread (each ncclSend returns ncclInProgress), measured on 2x H200 at
// ~55 us one-way for a 12 KiB ping-pong against ~18 us with a blocking communicator and
// cudaStreamSynchronize (bench/nccl_hop_bench.cc has the figures).
//
// Full duplex: a link is two communicators, one per direction (rank 0 -> 1 and 1 -> 0),
// each with its own stream. NCCL runs one communicator's operations in issue order, so on
// a single communicator a Recv posted before a Send on both sides would deadlock; with one
// per direction, each direction is an ordered byte pipe and the two are independent.
//
// Thread-compatibility: one thread may send while another receives (the two directions
// share nothing but the first-error record). Calls in the same direction are serialized
// by a mutex, but their pairing with the peer's calls is only defined when one thread per
// direction issues them. Close() and the destructor must not race with transfers. Each
// call makes the link's device current on the calling thread and restores the previous one.
#ifndef RINGSERVE_KERNELS_CUDA_NCCL_LINK_H_
#define RINGSERVE_KERNELS_CUDA_NCCL_LINK_H_

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/cuda/device_buffer.h"

namespace ring::cuda {

// The NCCL entry points the link uses, resolved with dlsym. The library is never unloaded
// (NCCL keeps background threads), so the pointers stay valid for the process.
class NcclLibrary {
 public:
  struct Api {
    ncclResult_t (*get_version)(int*);
    ncclResult_t (*get_unique_id)(ncclUniqueId*);
    ncclResult_t (*comm_init_rank_config)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*);
    ncclResult_t (*comm_get_async_error)(ncclComm_t, ncclResult_t*);
    ncclResult_t (*comm_finalize)(ncclComm_t);
    ncclResult_t (*comm_destroy)(ncclComm_t);
    ncclResult_t (*comm_abort)(ncclComm_t);
    ncclResult_t (*send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    const char* (*get_error_string)(ncclResult_t);
    const char* (*get_last_error)(ncclComm_t);
  };

  // Names the library file, or the directory holding libnccl.so.2 (e.g. the pip package's
  // .../site-packages/nvidia/nccl/lib). When set, only it is tried: a typo must fail
  // loudly rather than silently pick up another NCCL from the loader path.
  static constexpr char kPathEnv[] = "RING_NCCL_LIBRARY";
  static constexpr char kSoname[] = "libnccl.so.2";
  // Non-blocking communicators and ncclCommFinalize arrived in 2.14.
  static constexpr int kMinVersion = 21400;

  // The process's NCCL from DefaultLocation(), loaded on the first call; the outcome (also
  // a failure) is cached. Unavailable says what was tried and why it failed. Thread-safe.
  static absl::StatusOr<const NcclLibrary*> Get();

  // Uncached load of `location`: a file path, a directory holding libnccl.so.2, or a bare
  // soname searched on the loader path (LD_LIBRARY_PATH, rpath, ld.so.cache). Unavailable
  // when it cannot be opened, lacks a symbol, or is older than kMinVersion.
  static absl::StatusOr<std::unique_ptr<NcclLibrary>> Open(const std::string& location);

  // $RING_NCCL_LIBRARY when set and non-empty, else "libnccl.so.2".
  static std::string DefaultLocation();

  const Api& api() const { return api_; }
  int version() const { return version_; }    // NCCL_VERSION_CODE style, e.g. 22809
  std::string VersionString() const;          // "2.28.9"
  const std::string& path() const { return path_; }  // the file actually loaded

 private:
  NcclLibrary() = default;
  Api api_{};
  int version_ = 0;
  std::string path_;
};

struct NcclLinkOptions {
  int device = 0;        // this process's CUDA ordinal
  int rank = 0;          // 0 on the side that made the id, 1 on the other
  std::string peer;      // names the other side in errors, e.g. "stage 2 (10.0.0.7:7002)"
  // Preallocated device staging for SendHost/RecvHost, per direction. A larger transfer
  // grows it (cudaFree of the old buffer synchronizes the device), so set it to the
  // largest frame. 0: allocate on first use.
  size_t staging_bytes = 0;
  // The destructor's bound on finalizing the communicators before it aborts them.
  absl::Duration close_timeout = absl::Seconds(5);
  // Waits busy-poll (yielding) for `spin`, then sleep `poll_interval` between polls: hops
  // of a few microseconds stay fast, long waits do not burn a core.
  absl::Duration spin = absl::Milliseconds(2);
  absl::Duration poll_interval = absl::Microseconds(20);
  // Null: NcclLibrary::Get().
  const NcclLibrary* library = nullptr;
};

class NcclLink {
 public:
  // Bytes of a link id: one ncclUniqueId per direction.
  static constexpr size_t kIdBytes = 2 * NCCL_UNIQUE_ID_BYTES;

  // A fresh link id (ncclGetUniqueId twice). The process that calls this hosts NCCL's
  // rendezvous for the link, so it is normally the rank-0 side.
  static absl::StatusOr<std::string> NewId(const NcclLibrary& lib);

  // Joins the link `id` as options.rank on options.device; returns once both directions'
  // communicators are ready. Arguments are checked before NCCL is loaded or CUDA touched
  // (InvalidArgument); no NCCL is Unavailable; a peer that has not joined by `deadline` is
  // DeadlineExceeded naming it (the half-made communicators are aborted).
  static absl::StatusOr<std::unique_ptr<NcclLink>> Connect(absl::string_view id,
                                                           const NcclLinkOptions& options,
                                                           absl::Time deadline);

  // Close(now + close_timeout) unless Close was called.
  ~NcclLink();
  NcclLink(const NcclLink&) = delete;
  NcclLink& operator=(const NcclLink&) = delete;

  // Sends `bytes` of device memory (on this link's device) to the peer, which must Recv
  // the same size. OK means the data left this GPU's buffer (it may be reused), not that
  // the peer has consumed it. Bytes are moved verbatim (any dtype is bit-exact).
  absl::Status Send(const void* device_src, size_t bytes, absl::Time deadline);
  // Receives `bytes` from the peer into device memory; OK means the data is in place.
  absl::Status Recv(void* device_dst, size_t bytes, absl::Time deadline);

  // The same from/to host memory (e.g. a stage's std::vector output), staged through a
  // device buffer owned by the link: host -> device -> NCCL -> device -> host.
  absl::Status SendHost(const void* host_src, size_t bytes, absl::Time deadline);
  absl::Status RecvHost(void* host_dst, size_t bytes, absl::Time deadline);

  // Finalizes both communicators, waiting for the peer until `deadline`, then aborts any
  // that did not finish. OK only if the link was healthy and closed cleanly. Idempotent;
  // every transfer after it fails.
  absl::Status Close(absl::Time deadline);

  // OK while healthy, else the first error (what every later call returns).
  absl::Status status() const;

  int device() const { return options_.device; }
  int rank() const { return options_.rank; }
  const std::string& peer() const { return options_.peer; }

 private:
  // One direction: its communicator (null once aborted or closed), stream and staging.
  struct Direction {
    const char* name = "";  // "send" or "recv", for messages
    absl::Mutex mu;         // held for a whole transfer in this direction
    ncclComm_t comm ABSL_GUARDED_BY(mu) = nullptr;
    cudaStream_t stream ABSL_GUARDED_BY(mu) = nullptr;
    DeviceBuffer staging ABSL_GUARDED_BY(mu);
  };

  NcclLink(const NcclLibrary& lib, const NcclLinkOptions& options);

  absl::Status Transfer(Direction& dir, void* device_ptr, size_t bytes, const void* host_src,
                        void* host_dst, absl::Time deadline);
  // Polls until the direction's enqueued work is done (stream idle, no async error).
  absl::Status Wait(Direction& dir, absl::string_view what, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(dir.mu);
  // Records `error` as the link's first error (if it is), aborts `dir`, and aborts the
  // other direction too unless a transfer holds it (that one aborts itself on its next
  // poll). Returns `error`.
  absl::Status Fail(Direction& dir, absl::Status error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(dir.mu);
  void AbortLocked(Direction& dir) ABSL_EXCLUSIVE_LOCKS_REQUIRED(dir.mu);
  // The first error, prefixed for a call that arrives after it.
  absl::Status FailedEarlier() const;
  absl::Status CheckHealthy(Direction& dir) ABSL_EXCLUSIVE_LOCKS_REQUIRED(dir.mu);
  Direction& Other(Direction& dir) { return &dir == &send_ ? recv_ : send_; }

  const NcclLibrary& lib_;
  const NcclLinkOptions options_;
  Direction send_;  // this rank -> peer
  Direction recv_;  // peer -> this rank
  // Set once, with first_error_, when the link fails or closes; polled lock-free by waits.
  std::atomic<bool> failed_{false};
  mutable absl::Mutex error_mu_;
  absl::Status first_error_ ABSL_GUARDED_BY(error_mu_);
  bool closed_ = false;
  absl::Status close_result_;  // what Close returned, for repeated calls
};

}  // namespace ring::cuda

#endif  // RINGSERVE_KERNELS_CUDA_NCCL_LINK_H_
