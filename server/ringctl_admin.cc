// ringctl status / drain / undrain / join / leave / apply / rebalance: talk to a running
// ring-server's admin service (proto/ringserve/v1/coordinator.proto).
//
//   ringctl status [--server 127.0.0.1:8001] [--json]
//   ringctl drain 10.0.0.2:7001          # move work off a worker (requests replay, none fail)
//   ringctl undrain 10.0.0.2:7001
//   ringctl join 10.0.0.4:7001           # add a worker at the end of the ring
//   ringctl leave 10.0.0.4:7001
//   ringctl apply --split 30,24,24 [--workers A,B,C] [--dry-run]   # or --config ring.toml
//   ringctl rebalance [--dry-run]        # re-plan on free memory now, move the ring to it
//
// The key is --api-key or $RINGSERVE_API_KEY (an API key or the ring token of the server).
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <sstream>

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "ringserve/v1/coordinator.grpc.pb.h"
#include "server/planner.h"
#include "server/ringctl_command.h"
#include "worker/coordinator_client.h"
#if RING_HAVE_SERVER_CONFIG
#include "server/server_config.h"
#endif

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
  cmd->add_option("--timeout", f->timeout_s, "Deadline in seconds (default 10; apply and rebalance: 600)");
  cmd->add_flag("--json", f->json, "Print JSON instead of a table");
}

std::unique_ptr<pb::Coordinator::Stub> Stub(const AdminFlags& f) { return worker::NewCoordinatorStub(f.server); }

void Prepare(grpc::ClientContext* ctx, const AdminFlags& f) {
  std::string key = f.api_key;
  if (key.empty()) {
    if (const char* k = std::getenv("RINGSERVE_API_KEY")) key = k;
  }
  worker::PrepareCoordinatorCall(ctx, absl::Seconds(f.timeout_s), key);
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
  std::cout << absl::StrFormat("%-22s %-5s %-11s %-8s %-14s %-21s %-4s %-21s %-7s %-5s %-5s %s\n", "WORKER",
                               "STAGE", "STATE", "LAYERS", "DEVICE", "MEM USED/FREE", "SEQS",
                               "KV USED/BUDGET", "TOK/S", "EPOCH", "CKSUM", "NOW / ERROR");
  for (const auto& w : r.workers()) {
    const std::string layers = w.layer_end() > w.layer_begin()
                                   ? absl::StrCat(w.layer_begin(), "-", w.layer_end() - 1)
                                   : "-";
    const bool unreachable = w.state() == "unreachable";
    // Used of budget, e.g. "1.5 MiB/7.2 GiB"; "-" for a worker without a loaded stage.
    const std::string kv = w.layer_end() > w.layer_begin()
                               ? absl::StrCat(Bytes(w.cache_bytes()), "/", Bytes(w.kv_cache_budget_bytes()))
                               : "-";
    // "cuda:0 sm_90" / "cpu x86_64": which device and which machine code runs the stage.
    std::string device = w.devices().empty() ? w.backend() : w.devices(0);
    if (!w.arch().empty()) absl::StrAppend(&device, " ", w.arch());
    // Used: the stage's weights and the KV cache its sequences hold; free: the device's.
    const std::string mem =
        unreachable ? "-"
                    : absl::StrCat(Bytes(w.weight_bytes() + w.cache_bytes()), "/",
                                   w.memory_free_bytes() ? Bytes(w.memory_free_bytes()) : "-");
    std::cout << absl::StrFormat(
        "%-22s %-5s %-11s %-8s %-14s %-21s %-4d %-21s %-7s %-5d %-5d %s\n", w.address(),
        w.stage_index() >= 0 ? std::to_string(w.stage_index()) : "-", w.state(), layers,
        device.empty() ? "-" : device, mem,
        w.live_sequences(), kv, unreachable ? "-" : absl::StrFormat("%.1f", w.tokens_per_second()),
        w.epoch(), w.checksum_failures(), unreachable ? w.last_error() : w.waiting_on());
    // A reachable worker's latest failure, on its own line: it explains a replay or a
    // stage error even after the worker went back to idle.
    if (!w.degraded_reason().empty()) std::cout << "    DEGRADED: " << w.degraded_reason() << "\n";
    if (!unreachable && !w.last_error().empty()) {
      const int64_t ago = absl::ToUnixSeconds(absl::Now()) - w.last_error_unix_seconds();
      std::cout << "    last error " << ago << "s ago: " << w.last_error() << "\n";
    }
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

// Prints the layout Apply / Rebalance applied (or would, with --dry-run).
int PrintLayout(const pb::ApplyResponse& r, const AdminFlags& f, bool dry_run, const char* what) {
  if (f.json) {
    std::cout << Json(r);
    return 0;
  }
  std::cout << r.plan();
  if (!r.plan().empty() && r.plan().back() != '\n') std::cout << "\n";
  if (dry_run) {
    std::cout << what << ": dry run, " << (r.changed() ? "the ring would move to this layout" : "the ring already has this layout")
              << "\n";
  } else if (!r.changed()) {
    std::cout << what << ": the ring already has this layout; nothing moved\n";
  } else {
    std::cout << what << ": ring " << r.state() << ":";
    for (const auto& st : r.stages()) std::cout << " [" << st << ")";
    std::cout << "\n";
  }
  return 0;
}

struct ApplyFlags {
  std::string split, workers, config;
  bool dry_run = false;
};

int Apply(const AdminFlags& f, const ApplyFlags& a) {
  pb::ApplyRequest req;
  req.set_dry_run(a.dry_run);
  if (!a.config.empty()) {
#if RING_HAVE_SERVER_CONFIG
    auto cfg = LoadServerConfig(a.config);
    if (!cfg.ok()) {
      std::cerr << "ringctl apply: " << cfg.status().message() << "\n";
      return 2;
    }
    for (const auto& w : cfg->workers) req.add_workers(w);
    for (int64_t n : cfg->split) req.add_split(n);
#else
    std::cerr << "ringctl apply: --config needs a build with ring-server (toml++)\n";
    return 2;
#endif
  }
  if (!a.workers.empty()) {
    req.clear_workers();
    for (absl::string_view w : absl::StrSplit(a.workers, ',', absl::SkipEmpty())) req.add_workers(std::string(w));
  }
  if (!a.split.empty()) {
    req.clear_split();
    for (absl::string_view n : absl::StrSplit(a.split, ',', absl::SkipEmpty())) {
      int64_t v;
      if (!absl::SimpleAtoi(n, &v)) {
        std::cerr << "ringctl apply: --split " << a.split << ": want layer counts like 30,24,24\n";
        return 2;
      }
      req.add_split(v);
    }
  }
  if (req.workers().empty() && req.split().empty()) {
    std::cerr << "ringctl apply: give --split, --workers or --config (ringctl rebalance re-plans the split)\n";
    return 2;
  }
  grpc::ClientContext ctx;
  Prepare(&ctx, f);
  pb::ApplyResponse r;
  grpc::Status s = Stub(f)->Apply(&ctx, req, &r);
  if (!s.ok()) return Report(s, f, "apply");
  return PrintLayout(r, f, a.dry_run, "apply");
}

int Rebalance(const AdminFlags& f, bool dry_run) {
  grpc::ClientContext ctx;
  Prepare(&ctx, f);
  pb::RebalanceRequest req;
  req.set_dry_run(dry_run);
  pb::ApplyResponse r;
  grpc::Status s = Stub(f)->Rebalance(&ctx, req, &r);
  if (!s.ok()) return Report(s, f, "rebalance");
  return PrintLayout(r, f, dry_run, "rebalance");
}

// Loading stages takes as long as reading the weights: a longer default deadline than the
// quick admin calls, still finite.
constexpr double kLayoutTimeoutS = 600;

Registration apply_reg(
    "apply", "Move the running ring to a layout: worker order and/or layer split (requests replay; none fail)",
    [](CLI::App* cmd) -> Handler {
      auto f = std::make_shared<AdminFlags>();
      auto a = std::make_shared<ApplyFlags>();
      AddAdminFlags(cmd, f.get());
      f->timeout_s = kLayoutTimeoutS;
      cmd->add_option("--split", a->split, "Layer counts per serving worker, in ring order, e.g. 30,24,24");
      cmd->add_option("--workers", a->workers, "New ring order HOST:PORT,... (default: the configured workers)");
      cmd->add_option("--config", a->config, "Take [ring] workers and split from this ring.toml")
          ->check(CLI::ExistingFile);
      cmd->add_flag("--dry-run", a->dry_run, "Only check the layout against the workers' memory; move nothing");
      return [f, a] { return Apply(*f, *a); };
    });

Registration rebalance_reg(
    "rebalance", "Re-plan the split on the workers' free memory and bandwidth now and move the ring to it",
    [](CLI::App* cmd) -> Handler {
      auto f = std::make_shared<AdminFlags>();
      auto dry_run = std::make_shared<bool>(false);
      AddAdminFlags(cmd, f.get());
      f->timeout_s = kLayoutTimeoutS;
      cmd->add_flag("--dry-run", *dry_run, "Only print the new plan; move nothing");
      return [f, dry_run] { return Rebalance(*f, *dry_run); };
    });

}  // namespace
}  // namespace ring::ctl
