// ringctl describe: ask one ring-worker what it is, holds and has seen, without a
// coordinator: device and capability attestation, loaded stage and epoch, shadow-check
// statistics and whether it is degraded.
//
//   ringctl describe --worker 10.0.0.2:7001 [--auth-token-file F] [--json]
#include <google/protobuf/util/json_util.h>

#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "server/planner.h"
#include "server/ringctl_command.h"
#include "worker/stage_client.h"

namespace ring::ctl {
namespace {

struct Flags {
  std::string worker, auth_token_file, tls_ca, tls_cert, tls_key;
  double timeout_s = 10;
  bool json = false;
};

int Run(const Flags& f) {
  worker::StageClientOptions o;
  o.call_timeout = absl::Seconds(f.timeout_s);
  auto read = [](const std::string& path, const char* what, std::string* out) {
    if (path.empty()) return true;
    absl::StatusOr<std::string> s = worker::ReadSecretFile(path, what);
    if (!s.ok()) {
      std::cerr << "ringctl describe: " << s.status().message() << "\n";
      return false;
    }
    *out = *s;
    return true;
  };
  if (!read(f.auth_token_file, "--auth-token-file", &o.auth_token) ||
      !read(f.tls_ca, "--tls-ca", &o.tls_ca) || !read(f.tls_cert, "--tls-cert", &o.tls_cert) ||
      !read(f.tls_key, "--tls-key", &o.tls_key)) {
    return 1;
  }
  worker::StageClient c(f.worker, 0, o);
  absl::StatusOr<ringserve::v1::DescribeResponse> d = c.Describe();
  if (!d.ok()) {
    std::cerr << "ringctl describe: " << d.status() << "\n";
    return 1;
  }
  if (f.json) {
    std::string out;
    google::protobuf::util::JsonPrintOptions jo;
    jo.add_whitespace = true;
    jo.preserve_proto_field_names = true;
    (void)google::protobuf::util::MessageToJsonString(*d, &out, jo);
    std::cout << out;
    return 0;
  }
  std::cout << "worker     " << f.worker << " (" << d->backend() << ", build " << d->build_version()
            << ")\n";
  if (d->has_attestation()) std::cout << "device     " << d->attestation().summary() << "\n";
  if (d->loaded()) {
    std::cout << absl::StrFormat("stage      %s layers [%d, %d), epoch %d\n", d->model().model(),
                                 d->layer_begin(), d->layer_end(), d->epoch());
    std::cout << "kv cache   " << HumanBytes(d->kv_cache_bytes()) << " used of "
              << HumanBytes(d->kv_cache_budget_bytes()) << " budget ("
              << HumanBytes(d->kv_cache_free_bytes()) << " free)\n";
  } else {
    std::cout << "stage      none loaded\n";
  }
  std::cout << "checksums  " << d->checksum_failures() << " failures\n";
  // Closed ring: how each hop moves its frames, and why (nccl / grpc).
  if (!d->next_transport().empty()) std::cout << "next hop   " << d->next_transport() << "\n";
  if (!d->prev_transport().empty()) std::cout << "prev hop   " << d->prev_transport() << "\n";
  if (d->has_registration()) {
    // ring-worker --join: is the coordinator hearing from it?
    const auto& r = d->registration();
    const int64_t now = absl::ToUnixSeconds(absl::Now());
    std::cout << "joins      " << r.coordinator() << " as " << r.advertise() << ": "
              << (r.last_success_unix_seconds() > 0
                      ? absl::StrCat("registered ", now - r.last_success_unix_seconds(), "s ago")
                      : std::string("not registered yet"))
              << "\n";
    if (!r.last_error().empty()) {
      std::cout << "  last error " << now - r.last_error_unix_seconds() << "s ago (" << r.consecutive_failures()
                << " in a row): " << r.last_error() << "\n";
    }
  }
  if (d->has_shadow()) {
    const auto& s = d->shadow();
    std::cout << absl::StrFormat(
        "shadow     rate %.4g, threshold %.3g%s: %d steps checked over %d sequences (%d dropped), "
        "%d divergences, last worst rel %.3e, max %.3e\n",
        s.rate(), s.threshold(),
        s.noise_floor() ? absl::StrFormat(" and %.3gx the CPU noise floor", s.floor_factor())
                        : std::string(),
        s.steps_checked(), s.sequences_sampled(), s.sequences_dropped(), s.divergences(),
        s.last_relative_difference(), s.max_relative_difference());
    for (const auto& l : s.layers()) {
      std::cout << absl::StrFormat(
          "  layer %4d  checks %6d  last rel %.3e  max rel %.3e%s  divergences %d\n", l.layer(),
          l.checks(), l.last_relative_difference(), l.max_relative_difference(),
          l.last_noise_floor() >= 0 && s.noise_floor()
              ? absl::StrFormat("  floor %.3e", l.last_noise_floor())
              : std::string(),
          l.divergences());
    }
    if (!s.last_divergence().empty()) std::cout << "  last divergence: " << s.last_divergence() << "\n";
  }
  std::cout << "health     "
            << (d->degraded_reason().empty() ? "ok" : "DEGRADED: " + d->degraded_reason()) << "\n";
  return 0;
}

Registration reg("describe",
                 "Show one worker: device attestation, loaded stage, shadow checks, degraded",
                 [](CLI::App* cmd) -> Handler {
                   auto f = std::make_shared<Flags>();
                   cmd->add_option("--worker", f->worker, "Worker address HOST:PORT")->required();
                   cmd->add_option("--auth-token-file", f->auth_token_file, "Shared ring token file");
                   cmd->add_option("--tls-ca", f->tls_ca, "CA of the workers' certificates (PEM)");
                   cmd->add_option("--tls-cert", f->tls_cert, "Client certificate for mutual TLS (PEM)");
                   cmd->add_option("--tls-key", f->tls_key, "Key of --tls-cert (PEM)");
                   cmd->add_option("--timeout", f->timeout_s, "Seconds to wait for the worker");
                   cmd->add_flag("--json", f->json, "Print the raw DescribeResponse as JSON");
                   return [f] { return Run(*f); };
                 });

}  // namespace
}  // namespace ring::ctl
