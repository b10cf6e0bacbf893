#include "kernels/cuda/nccl_link.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/nccl_status.h"
#include "kernels/status.h"

namespace ring::cuda {
namespace {

// Runs `fn` with `device` current on this thread and puts the caller's device back: the
// link is used from worker threads that may drive another GPU too.
absl::Status WithDevice(int device, absl::FunctionRef<absl::Status()> fn) {
  int prev = 0;
  RING_CUDA_RETURN_IF_ERROR(cudaGetDevice(&prev));
  if (prev != device) RING_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  absl::Status st = fn();
  if (prev != device) {
    const cudaError_t e = cudaSetDevice(prev);
    if (st.ok()) RING_CUDA_RETURN_IF_ERROR(e);
  }
  return st;
}

// Calls `poll` until it reports done, fails, or `deadline` passes (then the status from
// `on_timeout`). `poll` runs at least once, so a deadline already past still sees work
// that has completed. Spins (yielding) first: an activation hop is a few microseconds and
// a sleep would cost more than the hop itself.
absl::Status PollUntil(absl::Time deadline, const NcclLinkOptions& options,
                       absl::FunctionRef<absl::StatusOr<bool>()> poll,
                       absl::FunctionRef<absl::Status()> on_timeout) {
  const absl::Time spin_until = absl::Now() + options.spin;
  while (true) {
    RING_ASSIGN_OR_RETURN(const bool done, poll());
    if (done) return absl::OkStatus();
    const absl::Time now = absl::Now();
    if (now >= deadline) return on_timeout();
    if (now < spin_until) {
      std::this_thread::yield();
    } else {
      absl::SleepFor(options.poll_interval);
    }
  }
}

// One poll of a non-blocking communicator: done when its pending NCCL call (init,
// enqueue, finalize) has finished, an error when it failed.
absl::StatusOr<bool> CommReady(const NcclLibrary::Api& api, ncclComm_t comm) {
  ncclResult_t async = ncclSuccess;
  RING_NCCL_RETURN_IF_ERROR(api.comm_get_async_error(comm, &async));
  if (async == ncclInProgress) return false;
  if (async != ncclSuccess) return RING_NCCL_STATUS(async, "ncclCommGetAsyncError(comm)");
  return true;
}

// A non-blocking call that returned ncclInProgress has been accepted; completion is
// learned by polling.
bool Accepted(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

std::string SecondsString(absl::Duration d) {
  return absl::StrFormat("%.3f s", absl::ToDoubleSeconds(d));
}

template <typename Fn>
absl::Status Resolve(void* handle, const char* symbol, const std::string& file, Fn* out) {
  void* p = dlsym(handle, symbol);
  if (p == nullptr) {
    return absl::UnavailableError(
        absl::StrCat(file, " has no symbol ", symbol, ": not an NCCL library, or too old"));
  }
  *out = reinterpret_cast<Fn>(p);
  return absl::OkStatus();
}

}  // namespace

// ---- NcclLibrary -------------------------------------------------------------------------

std::string NcclLibrary::DefaultLocation() {
  const char* env = std::getenv(kPathEnv);
  if (env != nullptr && env[0] != '\0') return env;
  return kSoname;
}

absl::StatusOr<std::unique_ptr<NcclLibrary>> NcclLibrary::Open(const std::string& location) {
  std::string file = location;
  struct stat st {};
  if (stat(location.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    file = absl::StrCat(location, "/", kSoname);
  }
  dlerror();
  void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return absl::UnavailableError(absl::StrCat(
        "cannot load NCCL from '", file, "' (", why != nullptr ? why : "unknown error",
        "); set ", kPathEnv, " to libnccl.so.2 or the directory holding it (e.g. pip "
        "nvidia-nccl-cu13's site-packages/nvidia/nccl/lib), or put it on LD_LIBRARY_PATH"));
  }
  std::unique_ptr<NcclLibrary> lib(new NcclLibrary());
  Api& a = lib->api_;
  absl::Status resolved = [&]() -> absl::Status {
    RING_RETURN_IF_ERROR(Resolve(handle, "ncclGetVersion", file, &a.get_version));
    RING_RETURN_IF_ERROR(Resolve(handle, "ncclGetUniqueId", file, &a.get_unique_id));
    RING_RETURN_IF_ERROR(
        Resolve(handle, "ncclCommInitRankConfig", file, &a.comm_init_rank_config));
    RING_RETURN_IF_ERROR(
        Resolve(handle, "ncclCommGetAsyncError", file, &a.comm_get_async_error));
    RING_RETURN_IF_ERROR(Resolve(handle, "ncclCommFinalize", file, &a.comm_finalize));
    RING_RETURN_IF_ERROR(Resolve(handle, "ncclCommDestroy", file, &a.comm_destroy));
    RING_RETURN_IF_ERROR(Resolve(handle, "ncclCommAbort", file, &a.comm_abort));
    RING_RETURN_IF_ERROR(Resolve(handle, "ncclSend", file, &a.send));
    RING_RETURN_IF_ERROR(Resolve(handle, "ncclRecv", file, &a.recv));
    RING_RETURN_IF_ERROR(Resolve(handle, "ncclGetErrorString", file, &a.get_error_string));
    return Resolve(handle, "ncclGetLastError", file, &a.get_last_error);
  }();
  if (resolved.ok() && a.get_version(&lib->version_) != ncclSuccess) {
    resolved = absl::UnavailableError(absl::StrCat("ncclGetVersion failed in ", file));
  }
  if (resolved.ok() && lib->version_ < kMinVersion) {
    resolved = absl::UnavailableError(absl::StrCat("NCCL ", lib->VersionString(), " at ", file,
                                                   " is older than 2.14 (non-blocking "
                                                   "communicators)"));
  }
  if (!resolved.ok()) {
    // Nothing of it has run, so unloading is safe here (never after a successful load).
    dlclose(handle);
    return resolved;
  }
  Dl_info info{};
  lib->path_ = dladdr(reinterpret_cast<void*>(a.get_version), &info) != 0 &&
                       info.dli_fname != nullptr
                   ? info.dli_fname
                   : file;
  internal::SetNcclTextSource(a.get_error_string, a.get_last_error);
  return lib;
}

absl::StatusOr<const NcclLibrary*> NcclLibrary::Get() {
  static const auto* const loaded =
      new absl::StatusOr<std::unique_ptr<NcclLibrary>>(Open(DefaultLocation()));
  if (!loaded->ok()) return loaded->status();
  return loaded->value().get();
}

std::string NcclLibrary::VersionString() const {
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return absl::StrCat(version_ / 10000, ".", version_ / 100 % 100, ".", version_ % 100);
}

// ---- NcclLink ----------------------------------------------------------------------------

absl::StatusOr<std::string> NcclLink::NewId(const NcclLibrary& lib) {
  std::string id(kIdBytes, '\0');
  for (int dir = 0; dir < 2; ++dir) {
    ncclUniqueId uid;
    RING_NCCL_RETURN_IF_ERROR(lib.api().get_unique_id(&uid));
    std::memcpy(id.data() + dir * NCCL_UNIQUE_ID_BYTES, uid.internal, NCCL_UNIQUE_ID_BYTES);
  }
  return id;
}

NcclLink::NcclLink(const NcclLibrary& lib, const NcclLinkOptions& options)
    : lib_(lib), options_(options) {
  send_.name = "send";
  recv_.name = "recv";
}

absl::StatusOr<std::unique_ptr<NcclLink>> NcclLink::Connect(absl::string_view id,
                                                            const NcclLinkOptions& options,
                                                            absl::Time deadline) {
  if (id.size() != kIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NCCL link id has ", id.size(), " bytes, expected ", kIdBytes, " (NcclLink::NewId)"));
  }
  if (options.rank != 0 && options.rank != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL link rank must be 0 or 1, got ", options.rank));
  }
  if (options.device < 0) {
    return absl::InvalidArgumentError(absl::StrCat("bad CUDA device ", options.device));
  }
  if (options.peer.empty()) {
    return absl::InvalidArgumentError("NCCL link needs a peer name (errors name the peer)");
  }
  if (options.spin < absl::ZeroDuration() || options.poll_interval <= absl::ZeroDuration() ||
      options.close_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("NCCL link: negative spin/close_timeout or "
                                      "non-positive poll_interval");
  }
  const NcclLibrary* lib = options.library;
  if (lib == nullptr) {
    RING_ASSIGN_OR_RETURN(lib, NcclLibrary::Get());
  }
  RING_ASSIGN_OR_RETURN(const int devices, DeviceCount());
  if (options.device >= devices) {
    return absl::FailedPreconditionError(absl::StrCat(
        "NCCL link on CUDA device ", options.device, " but this process sees ", devices));
  }

  std::unique_ptr<NcclLink> link(new NcclLink(*lib, options));
  const NcclLibrary::Api& api = lib->api();
  const int peer_rank = 1 - options.rank;
  const absl::Time start = absl::Now();
  absl::MutexLock send_lock(&link->send_.mu);
  absl::MutexLock recv_lock(&link->recv_.mu);
  absl::Status st = WithDevice(options.device, [&]() -> absl::Status {
    for (Direction* dir : {&link->send_, &link->recv_}) {
      RING_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&dir->stream, cudaStreamNonBlocking));
      if (options.staging_bytes > 0) {
        RING_ASSIGN_OR_RETURN(dir->staging, DeviceBuffer::Allocate(options.staging_bytes));
      }
      // Communicator k carries rank k -> rank 1-k: this side sends on its own rank's
      // communicator and receives on the peer's.
      const int k = dir == &link->send_ ? options.rank : peer_rank;
      ncclUniqueId uid;
      std::memcpy(uid.internal, id.data() + k * NCCL_UNIQUE_ID_BYTES, NCCL_UNIQUE_ID_BYTES);
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      // Non-blocking: init (and every later call) returns at once and is polled, so a peer
      // that never joins costs a deadline, not a hung thread.
      config.blocking = 0;
      const ncclResult_t r =
          api.comm_init_rank_config(&dir->comm, 2, uid, options.rank, &config);
      if (!Accepted(r)) {
        dir->comm = nullptr;
        return RING_NCCL_STATUS(r, "ncclCommInitRankConfig");
      }
    }
    return PollUntil(
        deadline, options,
        [&]() -> absl::StatusOr<bool> {
          RING_ASSIGN_OR_RETURN(const bool send_ready, CommReady(api, link->send_.comm));
          RING_ASSIGN_OR_RETURN(const bool recv_ready, CommReady(api, link->recv_.comm));
          return send_ready && recv_ready;
        },
        [&] {
          return absl::DeadlineExceededError(absl::StrFormat(
              "NCCL link to peer '%s' not ready after %s (rank %d on GPU %d): the peer did "
              "not join by the deadline; communicators aborted",
              options.peer, SecondsString(absl::Now() - start), options.rank, options.device));
        });
  });
  if (!st.ok()) {
    // Half-made communicators are aborted, not destroyed: destroy could wait for a peer
    // that is not coming.
    WithDevice(options.device, [&] {
      link->AbortLocked(link->send_);
      link->AbortLocked(link->recv_);
      return absl::OkStatus();
    }).IgnoreError();
    link->failed_.store(true, std::memory_order_release);
    {
      absl::MutexLock l(&link->error_mu_);
      link->first_error_ = st;
    }
    return st;
  }
  return link;
}

NcclLink::~NcclLink() {
  if (!closed_) Close(absl::Now() + options_.close_timeout).IgnoreError();
}

absl::Status NcclLink::status() const {
  absl::MutexLock l(&error_mu_);
  return first_error_;
}

absl::Status NcclLink::FailedEarlier() const {
  absl::MutexLock l(&error_mu_);
  return absl::Status(first_error_.code(), absl::StrCat("NCCL link to peer '", options_.peer,
                                                        "' is unusable: ",
                                                        first_error_.message()));
}

void NcclLink::AbortLocked(Direction& dir) {
  if (dir.comm == nullptr) return;
  // Abort sets NCCL's abort flag, which its kernels poll, so a transfer stuck on the GPU
  // ends and the stream drains; the result is not actionable (the link is dead anyway).
  lib_.api().comm_abort(dir.comm);
  dir.comm = nullptr;
}

absl::Status NcclLink::Fail(Direction& dir, absl::Status error) {
  {
    absl::MutexLock l(&error_mu_);
    if (first_error_.ok()) first_error_ = error;
  }
  failed_.store(true, std::memory_order_release);
  AbortLocked(dir);
  // A thread inside a transfer in the other direction holds its lock; it sees failed_ on
  // its next poll and aborts its own communicator. Never block here: that thread may be
  // waiting out a long deadline.
  Direction& other = Other(dir);
  if (other.mu.TryLock()) {
    AbortLocked(other);
    other.mu.Unlock();
  }
  return error;
}

absl::Status NcclLink::CheckHealthy(Direction& dir) {
  if (!failed_.load(std::memory_order_acquire)) return absl::OkStatus();
  AbortLocked(dir);
  return FailedEarlier();
}

absl::Status NcclLink::Wait(Direction& dir, absl::string_view what, absl::Time deadline) {
  const absl::Time start = absl::Now();
  absl::Status st = PollUntil(
      deadline, options_,
      [&]() -> absl::StatusOr<bool> {
        if (failed_.load(std::memory_order_acquire)) return FailedEarlier();
        RING_ASSIGN_OR_RETURN(const bool enqueued, CommReady(lib_.api(), dir.comm));
        if (!enqueued) return false;
        const cudaError_t e = cudaStreamQuery(dir.stream);
        if (e == cudaErrorNotReady) return false;
        RING_CUDA_RETURN_IF_ERROR(e);
        return true;
      },
      [&] {
        return absl::DeadlineExceededError(absl::StrFormat(
            "NCCL %s (peer '%s', rank %d on GPU %d) not done after %s, at its deadline; "
            "link aborted",
            what, options_.peer, options_.rank, options_.device,
            SecondsString(absl::Now() - start)));
      });
  if (st.ok()) return st;
  return Fail(dir, std::move(st));
}

absl::Status NcclLink::Transfer(Direction& dir, void* device_ptr, size_t bytes,
                                const void* host_src, void* host_dst, absl::Time deadline) {
  absl::MutexLock lock(&dir.mu);
  RING_RETURN_IF_ERROR(CheckHealthy(dir));
  const bool sending = &dir == &send_;
  const bool staged = host_src != nullptr || host_dst != nullptr;
  if (bytes == 0) return absl::OkStatus();
  if (device_ptr == nullptr && !staged) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL ", dir.name, " of ", bytes,
                                                   " bytes from/to a null device pointer"));
  }
  const std::string what = absl::StrCat(dir.name, staged ? " (host-staged)" : "", " of ",
                                        bytes, " bytes");
  // A staging copy that cannot even be queued leaves the context in an unknown state:
  // fail the link like any other transfer error.
  auto queue_copy = [&](void* dst, const void* src, cudaMemcpyKind kind) -> absl::Status {
    absl::Status st = [&]() -> absl::Status {
      RING_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, kind, dir.stream));
      return absl::OkStatus();
    }();
    return st.ok() ? st : Fail(dir, std::move(st));
  };
  return WithDevice(options_.device, [&]() -> absl::Status {
    if (staged) {
      if (dir.staging.size() < bytes) {
        // Not a link failure: the caller may retry with less, or use device memory.
        dir.staging = DeviceBuffer();
        RING_ASSIGN_OR_RETURN(dir.staging, DeviceBuffer::Allocate(bytes));
      }
      device_ptr = dir.staging.data();
    }
    // The stream is idle here (every transfer waits for its own completion), so a copy
    // from pageable host memory cannot queue behind a stuck NCCL kernel.
    if (host_src != nullptr) {
      RING_RETURN_IF_ERROR(queue_copy(device_ptr, host_src, cudaMemcpyHostToDevice));
    }
    const int peer_rank = 1 - options_.rank;
    const ncclResult_t r =
        sending ? lib_.api().send(device_ptr, bytes, ncclUint8, peer_rank, dir.comm, dir.stream)
                : lib_.api().recv(device_ptr, bytes, ncclUint8, peer_rank, dir.comm, dir.stream);
    if (!Accepted(r)) {
      return Fail(dir, RING_NCCL_STATUS(r, sending ? "ncclSend" : "ncclRecv"));
    }
    RING_RETURN_IF_ERROR(Wait(dir, what, deadline));
    if (host_dst == nullptr) return absl::OkStatus();
    // Queued only after the receive completed: a D2H copy to pageable memory blocks the
    // thread until the stream drains, which must not be an NCCL kernel without deadline.
    RING_RETURN_IF_ERROR(queue_copy(host_dst, device_ptr, cudaMemcpyDeviceToHost));
    return Wait(dir, absl::StrCat(what, ": copy to host"), deadline);
  });
}

absl::Status NcclLink::Send(const void* device_src, size_t bytes, absl::Time deadline) {
  return Transfer(send_, const_cast<void*>(device_src), bytes, nullptr, nullptr, deadline);
}

absl::Status NcclLink::Recv(void* device_dst, size_t bytes, absl::Time deadline) {
  return Transfer(recv_, device_dst, bytes, nullptr, nullptr, deadline);
}

absl::Status NcclLink::SendHost(const void* host_src, size_t bytes, absl::Time deadline) {
  if (host_src == nullptr && bytes > 0) {
    return absl::InvalidArgumentError("NCCL SendHost from a null host pointer");
  }
  return Transfer(send_, nullptr, bytes, host_src, nullptr, deadline);
}

absl::Status NcclLink::RecvHost(void* host_dst, size_t bytes, absl::Time deadline) {
  if (host_dst == nullptr && bytes > 0) {
    return absl::InvalidArgumentError("NCCL RecvHost into a null host pointer");
  }
  return Transfer(recv_, nullptr, bytes, nullptr, host_dst, deadline);
}

absl::Status NcclLink::Close(absl::Time deadline) {
  if (closed_) return close_result_;
  closed_ = true;
  absl::MutexLock send_lock(&send_.mu);
  absl::MutexLock recv_lock(&recv_.mu);
  const bool healthy = !failed_.load(std::memory_order_acquire);
  const NcclLibrary::Api& api = lib_.api();
  absl::Status result = healthy ? absl::OkStatus() : FailedEarlier();
  absl::Status cleanup = WithDevice(options_.device, [&]() -> absl::Status {
    if (healthy && send_.comm != nullptr && recv_.comm != nullptr) {
      // Finalize flushes outstanding work and quiesces with the peer; it is polled like
      // everything else, and whatever has not finished by the deadline is aborted below.
      result = [&]() -> absl::Status {
        for (Direction* dir : {&send_, &recv_}) {
          const ncclResult_t r = api.comm_finalize(dir->comm);
          if (!Accepted(r)) return RING_NCCL_STATUS(r, "ncclCommFinalize");
        }
        const absl::Time start = absl::Now();
        return PollUntil(
            deadline, options_,
            [&]() -> absl::StatusOr<bool> {
              RING_ASSIGN_OR_RETURN(const bool send_done, CommReady(api, send_.comm));
              RING_ASSIGN_OR_RETURN(const bool recv_done, CommReady(api, recv_.comm));
              return send_done && recv_done;
            },
            [&] {
              return absl::DeadlineExceededError(absl::StrFormat(
                  "NCCL link to peer '%s' did not finalize within %s; aborted", options_.peer,
                  SecondsString(absl::Now() - start)));
            });
      }();
      if (result.ok()) {
        for (Direction* dir : {&send_, &recv_}) {
          // Finalized: destroy only releases local resources and cannot wait on the peer.
          const ncclResult_t r = api.comm_destroy(dir->comm);
          dir->comm = nullptr;
          if (r != ncclSuccess && result.ok()) result = RING_NCCL_STATUS(r, "ncclCommDestroy");
        }
      }
    }
    AbortLocked(send_);
    AbortLocked(recv_);
    for (Direction* dir : {&send_, &recv_}) {
      dir->staging = DeviceBuffer();
      if (dir->stream != nullptr) RING_CUDA_RETURN_IF_ERROR(cudaStreamDestroy(dir->stream));
      dir->stream = nullptr;
    }
    return absl::OkStatus();
  });
  if (result.ok()) result = cleanup;
  {
    absl::MutexLock l(&error_mu_);
    if (first_error_.ok()) {
      first_error_ = result.ok() ? absl::FailedPreconditionError("closed") : result;
    }
  }
  failed_.store(true, std::memory_order_release);
  close_result_ = result;
  return result;
}

}  // namespace ring::cuda
