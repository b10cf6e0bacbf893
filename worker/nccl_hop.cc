#include "worker/nccl_hop.h"

#include <unistd.h>

#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

#ifdef RING_HAVE_NCCL
#include "kernels/cuda/nccl_link.h"
#endif

namespace ring::worker {
namespace {

std::string FirstLine(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return std::string(absl::StripAsciiWhitespace(line));
}

}  // namespace

const std::string& HostId() {
  static const std::string* const id = [] {
    std::string machine = FirstLine("/etc/machine-id");
    if (machine.empty()) machine = FirstLine("/proc/sys/kernel/random/boot_id");
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
    return new std::string(absl::StrCat(machine, "/", host));
  }();
  return *id;
}

#ifdef RING_HAVE_NCCL

struct NcclHop::Impl {
  std::unique_ptr<cuda::NcclLink> link;
};

absl::Status NcclHop::Available() { return cuda::NcclLibrary::Get().status(); }

absl::StatusOr<std::string> NcclHop::NewId() {
  absl::StatusOr<const cuda::NcclLibrary*> lib = cuda::NcclLibrary::Get();
  if (!lib.ok()) return lib.status();
  return cuda::NcclLink::NewId(**lib);
}

absl::StatusOr<std::unique_ptr<NcclHop>> NcclHop::Connect(const std::string& id,
                                                         const NcclHopOptions& options,
                                                         absl::Time deadline) {
  cuda::NcclLinkOptions o;
  o.device = options.device;
  o.rank = options.rank;
  o.peer = options.peer;
  // Dropping a hop aborts: a finalize would wait on a peer that may be gone or stuck.
  o.close_timeout = absl::ZeroDuration();
  absl::StatusOr<std::unique_ptr<cuda::NcclLink>> link = cuda::NcclLink::Connect(id, o, deadline);
  if (!link.ok()) return link.status();
  auto impl = std::make_unique<Impl>();
  impl->link = *std::move(link);
  return std::unique_ptr<NcclHop>(new NcclHop(std::move(impl)));
}

absl::Status NcclHop::Send(absl::string_view bytes, absl::Time deadline) {
  return impl_->link->SendHost(bytes.data(), bytes.size(), deadline);
}

absl::StatusOr<std::string> NcclHop::Receive(int64_t bytes, absl::Time deadline) {
  std::string out(static_cast<size_t>(bytes), '\0');
  if (absl::Status s = impl_->link->RecvHost(out.data(), out.size(), deadline); !s.ok()) return s;
  return out;
}

absl::Status NcclHop::status() const { return impl_->link->status(); }

#else  // !RING_HAVE_NCCL

struct NcclHop::Impl {};

namespace {
absl::Status NoNccl() {
  return absl::UnavailableError("this build has no NCCL link (built without CUDA or nccl.h)");
}
}  // namespace

absl::Status NcclHop::Available() { return NoNccl(); }
absl::StatusOr<std::string> NcclHop::NewId() { return NoNccl(); }
absl::StatusOr<std::unique_ptr<NcclHop>> NcclHop::Connect(const std::string&, const NcclHopOptions&,
                                                         absl::Time) {
  return NoNccl();
}
absl::Status NcclHop::Send(absl::string_view, absl::Time) { return NoNccl(); }
absl::StatusOr<std::string> NcclHop::Receive(int64_t, absl::Time) { return NoNccl(); }
absl::Status NcclHop::status() const { return NoNccl(); }

#endif  // RING_HAVE_NCCL

NcclHop::NcclHop(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NcclHop::~NcclHop() = default;

}  // namespace ring::worker
