// File: worker/shm_hop.h
//
// One direction of a closed-ring hop between two worker processes on one host: a
// single-producer, single-consumer byte ring in POSIX shared memory that carries whole
// messages (serialized ActivationFrames) of any size (larger ones stream through it).
//
// Why it exists: on an idle server most of a loopback gRPC hop is not gRPC's work but the
// wake-up of the sleeping threads on the way (poller, stream handler; ~0.1 ms each on a
// VM, measured in docs/benchmarks.md). Here a waiting side can busy-poll the other side's
// position for a while (`spin`) before it sleeps on a futex, so a frame that arrives while
// the receiver polls costs two memcpys and no system call at all.
//
//   // Sender, inside Worker.Link:
//   RING_ASSIGN_OR_RETURN(auto hop, ShmHop::Create({.peer = "stage 1 (addr)"}));
//   ... the receiver is sent hop->name() (Worker.ShmAccept) and calls ShmHop::Open ...
//   hop->Unlink();                                  // both have it mapped now
//   RING_RETURN_IF_ERROR(hop->Send(bytes, deadline));
//   // Receiver, on its own thread:
//   absl::StatusOr<std::string> m = hop->Receive(idle_deadline, message_timeout);
//
// Every wait has a deadline, and is cut into slices of at most 50 ms at which the other
// side's end (Close) and its process's exit are noticed. After any error but an idle
// DeadlineExceeded from Receive the hop is broken: every later call returns that error.
#ifndef RINGSERVE_WORKER_SHM_HOP_H_
#define RINGSERVE_WORKER_SHM_HOP_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ring::worker {

struct ShmHopOptions {
  // Bytes of the ring (the segment adds one page of header). Reserved up front, so a full
  // /dev/shm fails Create cleanly instead of faulting at the first write.
  int64_t capacity = 4 << 20;
  // How long a waiting side polls before it sleeps (0: sleep at once). Costs a core while
  // it polls; ring-worker polls on GPU workers, whose cores are otherwise idle.
  absl::Duration spin = absl::ZeroDuration();
  // Names the other end in errors ("stage 1 (127.0.0.1:7001)").
  std::string peer;
};

class ShmHop {
 public:
  // Largest message either end accepts (a length above it means the ring is corrupt).
  static constexpr int64_t kMaxMessageBytes = int64_t{1} << 30;

  // Sender: a fresh segment under a random name, readable by this user only. Unavailable
  // when shared memory cannot be had (no /dev/shm, out of space).
  static absl::StatusOr<std::unique_ptr<ShmHop>> Create(const ShmHopOptions& options);
  // Receiver: maps the segment a sender on this host created. NotFound / PermissionDenied
  // when it cannot be opened (another host or container, another user), InvalidArgument
  // when it is not a hop of this version.
  static absl::StatusOr<std::unique_ptr<ShmHop>> Open(const std::string& name, const ShmHopOptions& options);
  // Closes this end (the peer's waits end with an error) and unmaps.
  ~ShmHop();
  ShmHop(const ShmHop&) = delete;
  ShmHop& operator=(const ShmHop&) = delete;

  const std::string& name() const { return name_; }
  // Sender: removes the name once the receiver has opened it (the mappings stay valid).
  void Unlink();

  // Sender: appends one message; OK once all of it is in the ring. Waits for space until
  // `deadline` (DeadlineExceeded naming the peer; the hop is broken then, since part of
  // the message may be in the ring already).
  absl::Status Send(absl::string_view bytes, absl::Time deadline);
  // Receiver: the next message. DeadlineExceeded when none has begun by `idle_deadline`
  // (the hop stays usable: call again); once one has begun, the rest must follow within
  // `message_timeout`. Cancelled after Close() of this end.
  absl::StatusOr<std::string> Receive(absl::Time idle_deadline, absl::Duration message_timeout);
  // The same into *out, whose storage a reader that calls it in a loop keeps from message to
  // message (resized to the message; contents unspecified after an error).
  absl::Status ReceiveInto(std::string* out, absl::Time idle_deadline, absl::Duration message_timeout);
  // Either end, from any thread: ends this end. Its own pending and later calls return
  // Cancelled; the peer's return FailedPrecondition ("closed its end").
  void Close();
  // OK while usable; else the error that broke it.
  absl::Status status() const;

 private:
  struct Header;
  enum class Role { kSender, kReceiver };
  ShmHop(Role role, std::string name, int fd, void* base, int64_t mapped, const ShmHopOptions& options);
  // Waits until `ready()` is true; see the class comment for the slices.
  template <typename Ready>
  absl::Status WaitUntil(Ready ready, absl::Time deadline, const char* what);
  absl::Status Broken(absl::Status s);
  void Notify(bool data);

  const Role role_;
  const std::string name_;
  const int fd_;
  void* const base_;
  const int64_t mapped_;
  const ShmHopOptions options_;
  Header* const header_;
  unsigned char* const ring_;
  std::atomic<bool> linked_{true};  // the sender has not unlinked the name yet
  std::atomic<bool> closed_{false};  // Close() of this end
  mutable absl::Mutex status_mu_;
  absl::Status status_ ABSL_GUARDED_BY(status_mu_);
};

}  // namespace ring::worker

#endif  // RINGSERVE_WORKER_SHM_HOP_H_
