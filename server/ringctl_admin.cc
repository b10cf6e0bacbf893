// ringctl status / drain / undrain / join / leave: talk to a running ring-server's admin
// service (proto/ringserve/v1/coordinator.proto).
//
//   ringctl status [--server 127.0.0.1:8001] [--json]
//   ringctl drain 10.0.0.2:7001          # move work off a worker (requests replay, none fail)
//   ringctl undrain 10.0.0.2:7001
//   ringctl join 10.0.0.4:7001           # add a worker at the end of the ring
//   ringctl leave 10.0.0.4:7001
//
// The key is --api-key or $RINGSERVE_API_KEY (an API key or the ring token of the server).
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <sstream>

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "ringserve/v1/coordinator.grpc.pb.h"
#include "server/planner.h"
#include "server/ringctl_command.h"

namespace ring::ctl {
namespace {

namespace pb = ringserve::v1;

struct AdminFlags {
  std::string server = "127.0.0.1:8001";
  std::string api_key;
  double timeout_s = 10;
  bool json = false;
};

void AddAdminFlags(CLI::App* cmd, AdminFlags* f) {
  cmd->add_option("--server", f->server, "ring-server admin address (default 127.0.0.1:8001)");
  cmd->add_option("--api-key", f->api_key, "Key (default: $RINGSERVE_API_KEY)");
  cmd->add_option("--timeout", f->timeout_s, "Deadline in seconds (default 10)");
  cmd->add_flag("--json", f->json, "Print JSON instead of a table");
}

std::unique_ptr<pb::Coordinator::Stub> Stub(const AdminFlags& f) {
  return pb::Coordinator::NewStub(grpc::CreateChannel(f.server, grpc::InsecureChannelCredentials()));
}

void Prepare(grpc::ClientContext* ctx, const AdminFlags& f) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(f.timeout_s)));
  std::string key = f.api_key;
  if (key.empty()) {
    if (const char* k = std::getenv("RINGSERVE_API_KEY")) key = k;
  }
  if (!key.empty()) ctx->AddMetadata("authorization", "Bearer " + key);
}

int Report(const grpc::Status& s, const AdminFlags& f, const char* what) {
  std::cerr << "ringctl " << what << ": " << f.server << ": " << s.error_message() << " (code "
            << s.error_code() << ")\n";
  return 1;
}

std::string Bytes(int64_t b) { return HumanBytes(b); }

std::string Json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

int Status(const AdminFlags& f) {
  grpc::ClientContext ctx;
  Prepare(&ctx, f);
  pb::StatusResponse r;
  grpc::Status s = Stub(f)->Status(&ctx, {}, &r);
  if (!s.ok()) return Report(s, f, "status");
  if (f.json) {
    std::cout << Json(r);
    return r.state() == "ready" ? 0 : 3;
  }
  std::cout << "ring " << r.state() << (r.reason().empty() ? "" : " (" + r.reason() + ")") << "\n"
            << "model " << r.model() << " (" << r.model_type() << ", " << r.num_layers() << " layers)"
            << "  requests " << r.requests_in_flight() << "/" << r.max_concurrent()
            << "  tokens " << static_cast<int64_t>(r.generated_tokens_total())
            << "  replayed " << static_cast<int64_t>(r.requests_replayed_total())
            << "  reforms " << static_cast<int64_t>(r.ring_reforms_total())
            << "  up " << r.uptime_seconds() << "s  build " << r.build_version() << "\n\n";
  std::cout << absl::StrFormat("%-22s %-5s %-11s %-8s %-7s %-10s %-4s %-10s %-5s %-5s %s\n", "WORKER", "STAGE",
                               "STATE", "LAYERS", "BACKEND", "MEM FREE", "SEQS", "KV CACHE", "EPOCH",
                               "CKSUM", "NOW / ERROR");
  for (const auto& w : r.workers()) {
    const std::string layers = w.layer_end() > w.layer_begin()
                                   ? absl::StrCat(w.layer_begin(), "-", w.layer_end() - 1)
                                   : "-";
    std::cout << absl::StrFormat(
        "%-22s %-5s %-11s %-8s %-7s %-10s %-4d %-10s %-5d %-5d %s\n", w.address(),
        w.stage_index() >= 0 ? std::to_string(w.stage_index()) : "-", w.state(), layers,
        w.backend().empty() ? "-" : w.backend(), w.memory_free_bytes() ? Bytes(w.memory_free_bytes()) : "-",
        w.live_sequences(), Bytes(w.cache_bytes()), w.epoch(), w.checksum_failures(),
        w.state() == "unreachable" ? w.last_error() : w.waiting_on());
  }
  return r.state() == "ready" ? 0 : 3;
}

template <typename Req, typename Resp>
using Call = grpc::Status (pb::Coordinator::Stub::*)(grpc::ClientContext*, const Req&, Resp*);

template <typename Req, typename Resp>
int Change(const AdminFlags& f, const std::string& address, Call<Req, Resp> call, const char* what) {
  grpc::ClientContext ctx;
  Prepare(&ctx, f);
  Req req;
  req.set_address(address);
  Resp resp;
  auto stub = Stub(f);
  grpc::Status s = ((*stub).*call)(&ctx, req, &resp);
  if (!s.ok()) return Report(s, f, what);
  if (f.json) {
    std::cout << Json(resp);
  } else {
    std::cout << what << " " << address << ": ok\n" << resp.DebugString();
  }
  return 0;
}

Registration status_reg("status", "Ring state, workers, memory, sequences (from a running ring-server)",
                        [](CLI::App* cmd) -> Handler {
                          auto f = std::make_shared<AdminFlags>();
                          AddAdminFlags(cmd, f.get());
                          return [f] { return Status(*f); };
                        });

#define RING_MEMBERSHIP_COMMAND(NAME, HELP, METHOD, REQ, RESP)                                  \
  Registration NAME##_reg(#NAME, HELP, [](CLI::App* cmd) -> Handler {                        \
    auto f = std::make_shared<AdminFlags>();                                                  \
    auto addr = std::make_shared<std::string>();                                              \
    AddAdminFlags(cmd, f.get());                                                              \
    cmd->add_option("worker", *addr, "Worker address HOST:PORT")->required();                \
    return [f, addr] { return Change<REQ, RESP>(*f, *addr, &pb::Coordinator::Stub::METHOD, #NAME); }; \
  })

RING_MEMBERSHIP_COMMAND(drain, "Move all work off a worker (in-flight requests replay; none fail)", Drain,
                        pb::DrainRequest, pb::DrainResponse);
RING_MEMBERSHIP_COMMAND(undrain, "Let a drained worker back into the ring", Undrain, pb::DrainRequest,
                        pb::DrainResponse);
RING_MEMBERSHIP_COMMAND(join, "Add a worker at the end of the ring (re-splits the layers)", Join,
                        pb::JoinRequest, pb::JoinResponse);
RING_MEMBERSHIP_COMMAND(leave, "Remove a worker from the ring (re-splits the layers)", Leave,
                        pb::JoinRequest, pb::JoinResponse);

}  // namespace
}  // namespace ring::ctl
