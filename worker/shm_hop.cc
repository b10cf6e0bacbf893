#include "worker/shm_hop.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <new>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/cpu/cpu_relax.h"

namespace ring::worker {
namespace {

constexpr uint64_t kMagic = 0x70'6f'68'67'6e'69'72'31;  // "1ringhop"
constexpr uint32_t kVersion = 1;
constexpr int64_t kHeaderBytes = 4096;
constexpr char kNamePrefix[] = "/ringserve-hop-";
// Longest sleep between checks of the peer's end and its process.
constexpr absl::Duration kSlice = absl::Milliseconds(50);

static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "the ring's positions are shared between processes");

std::string Errno(absl::string_view what) { return absl::StrCat(what, ": ", std::strerror(errno)); }

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout) {
  const timespec ts = absl::ToTimespec(timeout);
  // Shared (not FUTEX_PRIVATE): the word lives in another process's mapping too.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

bool ProcessGone(int32_t pid) { return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH; }

}  // namespace

// The segment's first page. Each side writes only its own cache line (positions, its
// futex word's sleeping flag, its closed flag); the futex word a side sleeps on is bumped
// by the other side after it made progress.
struct ShmHop::Header {
  uint64_t magic;
  uint32_t version;
  int32_t sender_pid;
  int64_t capacity;
  std::atomic<int32_t> receiver_pid;
  alignas(64) std::atomic<uint64_t> write_pos;    // sender: bytes written so far
  std::atomic<uint32_t> data_word;                // receiver sleeps on it
  std::atomic<uint32_t> sender_sleeping;
  std::atomic<uint32_t> sender_closed;
  alignas(64) std::atomic<uint64_t> read_pos;     // receiver: bytes consumed so far
  std::atomic<uint32_t> space_word;               // sender sleeps on it
  std::atomic<uint32_t> receiver_sleeping;
  std::atomic<uint32_t> receiver_closed;
};

ShmHop::ShmHop(Role role, std::string name, int fd, void* base, int64_t mapped, const ShmHopOptions& options)
    : role_(role),
      name_(std::move(name)),
      fd_(fd),
      base_(base),
      mapped_(mapped),
      options_(options),
      header_(static_cast<Header*>(base)),
      ring_(static_cast<unsigned char*>(base) + kHeaderBytes) {}

absl::StatusOr<std::unique_ptr<ShmHop>> ShmHop::Create(const ShmHopOptions& options) {
  static_assert(sizeof(Header) <= kHeaderBytes);
  if (options.capacity < 4096 || options.capacity > (int64_t{1} << 32)) {
    return absl::InvalidArgumentError(absl::StrCat("shared-memory hop: capacity ", options.capacity,
                                                   " bytes (4 KiB to 4 GiB)"));
  }
  absl::BitGen gen;
  const std::string name = absl::StrFormat("%s%d-%016x%016x", kNamePrefix, getpid(),
                                           absl::Uniform<uint64_t>(gen), absl::Uniform<uint64_t>(gen));
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return absl::UnavailableError(Errno(absl::StrCat("shared memory: shm_open ", name)));
  const int64_t size = kHeaderBytes + options.capacity;
  // Reserved now: tmpfs pages taken at the first write would raise SIGBUS on a full /dev/shm.
  if (int e = posix_fallocate(fd, 0, size); e != 0) {
    shm_unlink(name.c_str());
    close(fd);
    return absl::UnavailableError(absl::StrCat("shared memory: reserving ", size, " bytes for ", name, ": ",
                                               std::strerror(e)));
  }
  // Populated now: a page of the ring first touched by a frame costs that frame a page
  // fault on each side, and a 4 MiB ring takes hundreds of frames to wrap (a 6144-wide
  // frame's hop took ~2x as long until it had; hop_bench --iters 100 vs 3000).
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (base == MAP_FAILED) {
    const std::string why = Errno(absl::StrCat("shared memory: mmap ", name));
    shm_unlink(name.c_str());
    close(fd);
    return absl::UnavailableError(why);
  }
  Header* h = new (base) Header{};
  h->version = kVersion;
  h->sender_pid = getpid();
  h->capacity = options.capacity;
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kMagic;
  return std::unique_ptr<ShmHop>(new ShmHop(Role::kSender, name, fd, base, size, options));
}

absl::StatusOr<std::unique_ptr<ShmHop>> ShmHop::Open(const std::string& name, const ShmHopOptions& options) {
  if (!absl::StartsWith(name, kNamePrefix) || name.find('/', 1) != std::string::npos ||
      name.size() > 200) {
    return absl::InvalidArgumentError(absl::StrCat("shared-memory hop: '", name, "' is not a hop's name"));
  }
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    const absl::StatusCode code = errno == ENOENT   ? absl::StatusCode::kNotFound
                                  : errno == EACCES ? absl::StatusCode::kPermissionDenied
                                                    : absl::StatusCode::kUnavailable;
    return absl::Status(code, Errno(absl::StrCat("shared memory: shm_open ", name)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size < kHeaderBytes + 4096) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("shared-memory hop ", name, ": ", st.st_size,
                                                   " bytes, too small for a hop"));
  }
  const int64_t size = st.st_size;
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);  // as in Create
  if (base == MAP_FAILED) {
    const std::string why = Errno(absl::StrCat("shared memory: mmap ", name));
    close(fd);
    return absl::UnavailableError(why);
  }
  auto* h = static_cast<Header*>(base);
  std::atomic_thread_fence(std::memory_order_acquire);
  std::string wrong;
  if (h->magic != kMagic || h->version != kVersion) {
    wrong = absl::StrFormat("not a hop of this version (magic %#x, version %d)", h->magic, h->version);
  } else if (h->capacity + kHeaderBytes != size) {
    wrong = absl::StrCat("capacity ", h->capacity, " does not match its size ", size);
  } else if (int32_t none = 0; !h->receiver_pid.compare_exchange_strong(none, getpid())) {
    wrong = absl::StrCat("already opened by process ", none);
  }
  if (!wrong.empty()) {
    munmap(base, size);
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("shared-memory hop ", name, ": ", wrong));
  }
  return std::unique_ptr<ShmHop>(new ShmHop(Role::kReceiver, name, fd, base, size, options));
}

ShmHop::~ShmHop() {
  Close();
  Unlink();
  munmap(base_, mapped_);
  close(fd_);
}

void ShmHop::Unlink() {
  if (role_ == Role::kSender && linked_.exchange(false)) shm_unlink(name_.c_str());
}

void ShmHop::Close() {
  closed_.store(true);
  (role_ == Role::kSender ? header_->sender_closed : header_->receiver_closed).store(1);
  // Both words: whichever side sleeps (this end's other thread, or the peer) wakes.
  header_->data_word.fetch_add(1);
  header_->space_word.fetch_add(1);
  FutexWake(&header_->data_word);
  FutexWake(&header_->space_word);
}

absl::Status ShmHop::status() const {
  absl::MutexLock l(&status_mu_);
  return status_;
}

absl::Status ShmHop::Broken(absl::Status s) {
  absl::MutexLock l(&status_mu_);
  if (status_.ok()) status_ = s;
  return status_;
}

void ShmHop::Notify(bool data) {
  // Sequentially consistent with the waiter's "sleeping" store and its re-check (WaitUntil):
  // either it sees the progress, or this sees it sleeping and wakes it.
  std::atomic<uint32_t>& word = data ? header_->data_word : header_->space_word;
  std::atomic<uint32_t>& sleeping = data ? header_->receiver_sleeping : header_->sender_sleeping;
  word.fetch_add(1);
  if (sleeping.load() != 0) FutexWake(&word);
}

template <typename Ready>
absl::Status ShmHop::WaitUntil(Ready ready, absl::Time deadline, const char* what) {
  const bool sender = role_ == Role::kSender;
  std::atomic<uint32_t>& word = sender ? header_->space_word : header_->data_word;
  std::atomic<uint32_t>& sleeping = sender ? header_->sender_sleeping : header_->receiver_sleeping;
  const std::atomic<uint32_t>& peer_closed = sender ? header_->receiver_closed : header_->sender_closed;
  auto ended = [&]() -> absl::Status {
    if (closed_.load()) return absl::CancelledError(absl::StrCat("shared-memory hop to/from ", options_.peer, ": closed"));
    if (peer_closed.load() != 0) {
      return absl::FailedPreconditionError(absl::StrCat(options_.peer, " closed its end of the shared-memory hop"));
    }
    return absl::OkStatus();
  };
  if (ready()) return absl::OkStatus();
  if (options_.spin > absl::ZeroDuration()) {
    const absl::Time spin_end = std::min(deadline, absl::Now() + options_.spin);
    for (uint32_t i = 1;; ++i) {
      if (ready()) return absl::OkStatus();
      cpu::CpuRelax();
      // The clock and the flags every 128 polls: a poll is a load and a pause (~10-40 ns),
      // the clock ~20 ns.
      if ((i & 127) == 0) {
        if (absl::Status e = ended(); !e.ok()) return e;
        if (absl::Now() >= spin_end) break;
      }
    }
  }
  const int32_t peer_pid = sender ? header_->receiver_pid.load() : header_->sender_pid;
  while (true) {
    const uint32_t seen = word.load();
    sleeping.store(1);
    if (ready()) {
      sleeping.store(0);
      return absl::OkStatus();
    }
    if (absl::Status e = ended(); !e.ok()) {
      sleeping.store(0);
      return e;
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      sleeping.store(0);
      return absl::DeadlineExceededError(absl::StrCat("shared-memory hop ", sender ? "to " : "from ",
                                                      options_.peer, ": ", what));
    }
    FutexWait(&word, seen, std::min(deadline - now, kSlice));
    sleeping.store(0);
    if (!ready() && ProcessGone(peer_pid)) {
      return absl::UnavailableError(absl::StrCat(options_.peer, " (process ", peer_pid,
                                                 ") exited; its shared-memory hop is gone"));
    }
  }
}

absl::Status ShmHop::Send(absl::string_view bytes, absl::Time deadline) {
  if (role_ != Role::kSender) return absl::FailedPreconditionError("Send on the receiving end of a hop");
  if (absl::Status s = status(); !s.ok()) return s;
  if (closed_.load()) return absl::CancelledError("shared-memory hop: closed");
  if (header_->receiver_closed.load() != 0) {
    return Broken(absl::FailedPreconditionError(
        absl::StrCat(options_.peer, " closed its end of the shared-memory hop")));
  }
  // A frame written into the ring of a dead receiver would wait there unnoticed until the
  // step's deadline; a gRPC push to it fails at once, and so does this (one syscall).
  if (const int32_t pid = header_->receiver_pid.load(); ProcessGone(pid)) {
    return Broken(absl::UnavailableError(
        absl::StrCat(options_.peer, " (process ", pid, ") exited; its shared-memory hop is gone")));
  }
  if (static_cast<int64_t>(bytes.size()) > kMaxMessageBytes) {
    return absl::InvalidArgumentError(absl::StrCat("shared-memory hop: a ", bytes.size(), "-byte message"));
  }
  const uint64_t cap = static_cast<uint64_t>(header_->capacity);
  uint64_t wp = header_->write_pos.load(std::memory_order_relaxed);
  auto put = [&](const unsigned char* p, uint64_t n) -> absl::Status {
    while (n > 0) {
      uint64_t free = cap - (wp - header_->read_pos.load(std::memory_order_acquire));
      if (free == 0) {
        header_->write_pos.store(wp, std::memory_order_release);  // let the receiver drain it
        Notify(/*data=*/true);
        absl::Status s = WaitUntil(
            [&] { return wp - header_->read_pos.load(std::memory_order_acquire) < cap; }, deadline,
            "no room in the ring (the receiver is not reading)");
        if (!s.ok()) return Broken(s);
        continue;
      }
      const uint64_t chunk = std::min(free, n);
      const uint64_t off = wp % cap;
      const uint64_t first = std::min(chunk, cap - off);
      std::memcpy(ring_ + off, p, first);
      std::memcpy(ring_, p + first, chunk - first);
      wp += chunk;
      p += chunk;
      n -= chunk;
    }
    return absl::OkStatus();
  };
  const uint64_t length = bytes.size();
  if (absl::Status s = put(reinterpret_cast<const unsigned char*>(&length), sizeof(length)); !s.ok()) return s;
  if (absl::Status s = put(reinterpret_cast<const unsigned char*>(bytes.data()), length); !s.ok()) return s;
  header_->write_pos.store(wp, std::memory_order_release);
  Notify(/*data=*/true);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ShmHop::Receive(absl::Time idle_deadline, absl::Duration message_timeout) {
  std::string out;
  if (absl::Status s = ReceiveInto(&out, idle_deadline, message_timeout); !s.ok()) return s;
  return out;
}

absl::Status ShmHop::ReceiveInto(std::string* out, absl::Time idle_deadline, absl::Duration message_timeout) {
  if (role_ != Role::kReceiver) return absl::FailedPreconditionError("Receive on the sending end of a hop");
  if (absl::Status s = status(); !s.ok()) return s;
  const uint64_t cap = static_cast<uint64_t>(header_->capacity);
  uint64_t rp = header_->read_pos.load(std::memory_order_relaxed);
  auto available = [&] { return header_->write_pos.load(std::memory_order_acquire) - rp; };
  if (absl::Status s = WaitUntil([&] { return available() > 0; }, idle_deadline, "no frame yet"); !s.ok()) {
    return absl::IsDeadlineExceeded(s) ? s : Broken(s);
  }
  const absl::Time deadline = absl::Now() + message_timeout;
  auto get = [&](unsigned char* p, uint64_t n) -> absl::Status {
    while (n > 0) {
      uint64_t avail = available();
      if (avail == 0) {
        header_->read_pos.store(rp, std::memory_order_release);  // room for the rest
        Notify(/*data=*/false);
        absl::Status s = WaitUntil([&] { return available() > 0; }, deadline,
                                   "the rest of a frame did not arrive");
        if (!s.ok()) return Broken(s);
        continue;
      }
      const uint64_t chunk = std::min(avail, n);
      const uint64_t off = rp % cap;
      const uint64_t first = std::min(chunk, cap - off);
      std::memcpy(p, ring_ + off, first);
      std::memcpy(p + first, ring_, chunk - first);
      rp += chunk;
      p += chunk;
      n -= chunk;
    }
    return absl::OkStatus();
  };
  uint64_t length = 0;
  if (absl::Status s = get(reinterpret_cast<unsigned char*>(&length), sizeof(length)); !s.ok()) return s;
  if (length > static_cast<uint64_t>(kMaxMessageBytes)) {
    return Broken(absl::DataLossError(absl::StrCat("shared-memory hop from ", options_.peer, ": a message of ",
                                                   length, " bytes (the ring is corrupt)")));
  }
  out->resize(length);
  if (absl::Status s = get(reinterpret_cast<unsigned char*>(out->data()), length); !s.ok()) return s;
  header_->read_pos.store(rp, std::memory_order_release);
  Notify(/*data=*/false);
  return absl::OkStatus();
}

}  // namespace ring::worker
