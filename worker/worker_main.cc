// ring-worker: serves one pipeline stage over gRPC (proto/ringserve/v1/worker.proto).
//
//   ring-worker --listen 127.0.0.1:7001 --model-root /srv/models [--device cpu|cuda:N]
//
// --listen PORT or :PORT binds 127.0.0.1; all interfaces only when the address says so
// (0.0.0.0:PORT or [::]:PORT), and then only with a shared token (--auth-token-file) or
// mutual TLS (--tls-cert/--tls-key/--tls-client-ca), unless --allow-insecure. Port 0 picks a
// free port; the bound address is printed as "ring-worker listening on ADDR" on stdout.
// SIGTERM/SIGINT: health flips to NOT_SERVING, in-flight calls get kShutdownGrace, exit 0.
//
// --kv-cache-bytes SIZE (e.g. 8GiB) caps the KV cache of the loaded stage; by default the
// budget is derived at each stage load (worker/worker_service.h DefaultKvCacheBudget).
//
// --metrics-listen ADDR serves Prometheus text at http://ADDR/metrics (worker/worker_metrics.h);
// a bare PORT or :PORT binds 127.0.0.1 like --listen. Off unless given. The startup line
// then reads "ring-worker listening on ADDR (metrics http://MADDR/metrics)".
//
// --join ADMIN_ADDR registers this worker with the coordinator's admin service once it
// listens (worker/coordinator_registration.h): Coordinator.Join with --advertise HOST:PORT
// (default: the bound listen address, which must then name a host, not 0.0.0.0 or [::]),
// retried with backoff and repeated every 30 s; on SIGTERM/SIGINT it calls Leave before the
// server stops, so the ring re-forms without it and its requests in flight replay. The
// admin call carries --coordinator-key-file's key, else the ring token (--auth-token-file).
#include <csignal>
#include <cstdlib>
#include <limits>
#include <iostream>
#include <pthread.h>

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "prometheus/exposer.h"

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/coordinator_client.h"
#include "worker/coordinator_registration.h"
#include "worker/mutex_mode.h"
#include "worker/stage_client.h"
#include "worker/worker_metrics.h"
#include "worker/worker_service.h"

namespace {

constexpr absl::Duration kShutdownGrace = absl::Seconds(5);

// "7001", ":7001" -> 127.0.0.1:7001; anything with a host is taken as written.
std::string NormalizeListen(const std::string& listen) {
  int port;
  if (absl::SimpleAtoi(listen, &port)) return absl::StrCat("127.0.0.1:", port);
  if (!listen.empty() && listen[0] == ':') return "127.0.0.1" + listen;
  return listen;
}

// A host a coordinator cannot dial: the listen address binds every interface.
bool IsWildcardHost(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::" || host == "*";
}

}  // namespace

int main(int argc, char** argv) {
  ring::worker::UseServingMutexMode();
  CLI::App app("ring-worker: one RingServe pipeline stage over gRPC");
  std::string listen = "127.0.0.1:0", model_root, device = "cpu";
  app.add_option("--listen", listen, "HOST:PORT, :PORT or PORT (127.0.0.1 unless a host is given)");
  app.add_option("--model-root", model_root, "Directory holding the models LoadStage may load")
      ->required()->check(CLI::ExistingDirectory);
  app.add_option("--device", device, "Compute device: cpu, cuda or cuda:N");
  std::string metrics_listen;
  app.add_option("--metrics-listen", metrics_listen,
                 "Serve Prometheus metrics at http://ADDR/metrics: HOST:PORT, :PORT or PORT "
                 "(127.0.0.1 unless a host is given; port 0 picks one). Off when not given");
  std::string token_file, tls_cert, tls_key, tls_client_ca;
  bool allow_insecure = false;
  app.add_option("--auth-token-file", token_file,
                 "Shared ring token: callers must send it (same file as the coordinator's)");
  app.add_option("--tls-cert", tls_cert, "Serve TLS with this certificate (PEM)");
  app.add_option("--tls-key", tls_key, "Private key of --tls-cert (PEM)");
  std::string peer_ca;
  app.add_option("--peer-ca", peer_ca,
                 "CA that signed the other workers' --tls-cert, to verify the next stage of a closed "
                 "ring (default: --tls-client-ca)");
  app.add_option("--tls-client-ca", tls_client_ca,
                 "Require client certificates signed by this CA (mutual TLS)");
  app.add_flag("--allow-insecure", allow_insecure,
               "Listen beyond loopback without a token or TLS (trusted networks only)");
  bool allow_ptx_jit = false;
  ring::worker::ShadowOptions shadow;
  app.add_option("--shadow-rate", shadow.rate,
                 "Fraction of sequences recomputed on the CPU reference off the hot path and "
                 "compared layer by layer (0 = off, 0.01 = 1%)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--shadow-threshold", shadow.threshold,
                 "Relative difference of a layer output that counts as a divergence");
  app.add_flag("--shadow-noise-floor,!--no-shadow-noise-floor", shadow.noise_floor,
               "Judge shadow checks against the CPU reference's own noise floor as well as "
               "the threshold (a second, jittered CPU pass per checked step; default on)");
  app.add_option("--shadow-floor-factor", shadow.floor_factor,
                 "With the noise floor: a layer diverges above this many times the floor");
  app.add_flag("--shadow-degrade", shadow.degrade,
               "After a divergence, take no new sequences: the coordinator leaves this worker "
               "out of the ring");
  app.add_flag("--allow-ptx-jit", allow_ptx_jit,
               "Run on a GPU this binary has no machine code (SASS) for, JIT-compiling PTX "
               "(refused by default; verify such a worker with `ringctl verify`)");
  int64_t kv_cache_bytes = 0;
  app.add_option("--kv-cache-bytes", kv_cache_bytes,
                 "KV cache budget of the loaded stage: bytes or a size like 8GiB / 500MB; a step "
                 "that would exceed it fails with RESOURCE_EXHAUSTED. Default: free memory "
                 "after the weights are loaded, less a headroom of 10% of it (at least 256 MiB)")
      ->transform(CLI::AsSizeValue(/*kb_is_1000=*/true))
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  bool no_nccl = false;
  app.add_flag("--no-nccl", no_nccl,
               "Closed ring: keep every hop of this worker on gRPC, even to a GPU on the same host "
               "(by default such a hop moves large hidden-state frames over NCCL when libnccl.so.2 "
               "loads; RING_NCCL_LIBRARY names it)");
  bool no_shm = false;
  app.add_flag("--no-shm", no_shm,
               "Closed ring: keep this worker's hops on gRPC even to a stage on the same host (by "
               "default such a hop carries its frames through shared memory in /dev/shm)");
  int64_t poll_us = -1;
  app.add_option("--poll-us", poll_us,
                 "Closed ring, shared-memory hops: how long the thread that reads the previous "
                 "stage's frames busy-polls for the next one before it sleeps. A frame that arrives "
                 "while it polls costs no thread wake-up; polling costs a core meanwhile. Default: "
                 "50000 on a CUDA device (its cores are idle while the GPU computes), 0 on the CPU "
                 "backend (the core is the compute's)")
      ->check(CLI::Range(int64_t{-1}, int64_t{10'000'000}));
  int64_t max_batch_rows = ring::worker::WorkerOptions{}.max_batch_rows;
  app.add_option("--max-batch", max_batch_rows,
                 "Continuous batching: steps of different sequences that arrive while the stage "
                 "is busy run through it together, up to this many rows (1: every step alone)")
      ->check(CLI::Range(int64_t{1}, int64_t{256}));
  int64_t batch_gather_us = absl::ToInt64Microseconds(ring::worker::WorkerOptions{}.batch_gather);
  app.add_option("--batch-gather-us", batch_gather_us,
                 "Continuous batching: how long a batch may wait for the rest of the previous "
                 "stage's batch, whose frames arrive one after another (0: never wait)")
      ->check(CLI::Range(int64_t{0}, int64_t{100000}));
  int64_t nccl_min_bytes = ring::worker::WorkerOptions{}.nccl_min_bytes;
  app.add_option("--nccl-min-bytes", nccl_min_bytes,
                 "Closed ring: smallest frame payload sent over an NCCL hop; smaller frames (decode "
                 "steps) stay on gRPC, whose fixed cost is lower. Bytes or a size like 256KiB")
      ->transform(CLI::AsSizeValue(/*kb_is_1000=*/true))
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()))
      ->capture_default_str();
  std::string join, advertise, coordinator_key_file;
  app.add_option("--join", join,
                 "Register with the coordinator at this admin address (HOST:PORT, as ringctl --server) "
                 "once listening: Coordinator.Join, retried with backoff, repeated every 30 s; Leave on "
                 "SIGTERM");
  app.add_option("--advertise", advertise,
                 "HOST:PORT the coordinator dials this worker at (with --join). Default: the listen "
                 "address, which must then name a host");
  app.add_option("--coordinator-key-file", coordinator_key_file,
                 "Key for the coordinator's admin service (with --join; an API key or the ring token). "
                 "Default: the --auth-token-file token");
  CLI11_PARSE(app, argc, argv);
  if (join.empty() && (!advertise.empty() || !coordinator_key_file.empty())) {
    std::cerr << "ring-worker: --advertise and --coordinator-key-file need --join\n";
    return 2;
  }
  if (!advertise.empty() && advertise.rfind(':') == std::string::npos) {
    std::cerr << "ring-worker: --advertise " << advertise << ": want HOST:PORT\n";
    return 2;
  }
  absl::StatusOr<ring::DeviceSpec> spec = ring::ParseDevice(device);
  if (!spec.ok()) {
    std::cerr << "ring-worker: --device: " << spec.status().message() << "\n";
    return 2;
  }
  if (spec->kind == ring::DeviceSpec::Kind::kCuda) {
    // Fail at start, not at the first LoadStage, when the device cannot be used.
    absl::Status usable = ring::CheckDevice(*spec);
    if (!usable.ok()) {
      std::cerr << "ring-worker: --device " << device << ": " << usable.message() << "\n";
      return 2;
    }
    // Capability attestation: refuse a device that would run JIT-compiled PTX.
    absl::StatusOr<ringserve::v1::DeviceAttestation> att =
        ring::worker::AttestDevice(device, allow_ptx_jit);
    if (!att.ok()) {
      std::cerr << "ring-worker: --device " << device << ": " << att.status().message() << "\n";
      return 2;
    }
    std::cerr << "ring-worker: " << device << ": " << att->summary() << "\n";
    if (!att->sass_match()) {
      std::cerr << "ring-worker: WARNING: running PTX JIT-compiled by the driver for this "
                   "device (--allow-ptx-jit); check it with `ringctl verify`\n";
    }
  }
  device = spec->ToString();

  // Block the stop signals in every thread (gRPC's included) so only sigwait sees them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

#ifndef RING_BUILD_VERSION
#define RING_BUILD_VERSION "unknown"
#endif
  ring::worker::WorkerMetrics metrics(device, RING_BUILD_VERSION);
  ring::worker::WorkerOptions options;
  options.model_root = model_root;
  options.device = device;
  options.metrics = &metrics;
  options.allow_ptx_jit = allow_ptx_jit;
  options.shadow = shadow;
  options.kv_cache_bytes = kv_cache_bytes;
  options.nccl = !no_nccl;
  options.nccl_min_bytes = nccl_min_bytes;
  options.shm = !no_shm;
  options.shm_poll = absl::Microseconds(
      poll_us >= 0 ? poll_us : (spec->kind == ring::DeviceSpec::Kind::kCuda ? 50'000 : 0));
  options.max_batch_rows = max_batch_rows;
  options.batch_gather = absl::Microseconds(batch_gather_us);
  if (const char* f = std::getenv("RING_TEST_FAULT")) {
    options.TEST_fault = f;
    std::cerr << "ring-worker: TEST fault injection: kernel fault '" << f << "'\n";
  }
  if (const char* n = std::getenv("RING_TEST_CORRUPT_FRAME")) {
    if (!absl::SimpleAtoi(n, &options.TEST_corrupt_frame)) {
      std::cerr << "ring-worker: RING_TEST_CORRUPT_FRAME must be an integer\n";
      return 2;
    }
    std::cerr << "ring-worker: TEST fault injection: corrupting sent frame #"
              << options.TEST_corrupt_frame << "\n";
  }

  if (const char* n = std::getenv("RING_TEST_NAN_AT_STEP")) {
    if (!absl::SimpleAtoi(n, &options.TEST_nan_at_step)) {
      std::cerr << "ring-worker: RING_TEST_NAN_AT_STEP must be an integer\n";
      return 2;
    }
    std::cerr << "ring-worker: TEST fault injection: NaN in the output of step #"
              << options.TEST_nan_at_step << "\n";
  }

  const std::string address = NormalizeListen(listen);
  const std::string host_part = address.substr(0, address.rfind(':'));
  const bool loopback = host_part == "127.0.0.1" || host_part == "localhost" || host_part == "[::1]";
  if (!token_file.empty()) {
    auto t = ring::worker::ReadSecretFile(token_file, "--auth-token-file");
    if (!t.ok()) {
      std::cerr << "ring-worker: " << t.status().message() << "\n";
      return 2;
    }
    options.auth_token = *t;
  }
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!tls_cert.empty() || !tls_key.empty() || !tls_client_ca.empty()) {
    if (tls_cert.empty() || tls_key.empty()) {
      std::cerr << "ring-worker: --tls-cert and --tls-key go together\n";
      return 2;
    }
    auto cert = ring::worker::ReadSecretFile(tls_cert, "--tls-cert");
    auto key = ring::worker::ReadSecretFile(tls_key, "--tls-key");
    if (!cert.ok() || !key.ok()) {
      std::cerr << "ring-worker: " << (cert.ok() ? key.status() : cert.status()).message() << "\n";
      return 2;
    }
    grpc::SslServerCredentialsOptions ssl(
        tls_client_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                              : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    ssl.pem_key_cert_pairs.push_back({*key, *cert});
    if (!tls_client_ca.empty()) {
      auto ca = ring::worker::ReadSecretFile(tls_client_ca, "--tls-client-ca");
      if (!ca.ok()) {
        std::cerr << "ring-worker: " << ca.status().message() << "\n";
        return 2;
      }
      ssl.pem_root_certs = *ca;
    }
    creds = grpc::SslServerCredentials(ssl);
    // Closed ring: this worker dials the next stage, which serves TLS too; it verifies it
    // with --peer-ca (default: --tls-client-ca: one CA for the ring) and shows its own
    // certificate.
    const std::string& peer_ca_file = peer_ca.empty() ? tls_client_ca : peer_ca;
    if (!peer_ca_file.empty()) {
      auto ca = ring::worker::ReadSecretFile(peer_ca_file, "--peer-ca");
      if (!ca.ok()) {
        std::cerr << "ring-worker: " << ca.status().message() << "\n";
        return 2;
      }
      options.peer_tls_ca = *ca;
      options.peer_tls_cert = *cert;
      options.peer_tls_key = *key;
    }
  }
  // Before binding: a worker the coordinator cannot dial back should not start at all.
  if (!join.empty() && advertise.empty() && IsWildcardHost(host_part)) {
    std::cerr << "ring-worker: --join: --listen " << address
              << " binds every interface; give the address the coordinator dials with --advertise HOST:PORT\n";
    return 2;
  }
  std::string coordinator_key = options.auth_token;
  if (!coordinator_key_file.empty()) {
    auto k = ring::worker::ReadSecretFile(coordinator_key_file, "--coordinator-key-file");
    if (!k.ok()) {
      std::cerr << "ring-worker: " << k.status().message() << "\n";
      return 2;
    }
    coordinator_key = *k;
  }
  if (!loopback && options.auth_token.empty() && tls_client_ca.empty() && !allow_insecure) {
    std::cerr << "ring-worker: refusing to listen on " << address
              << " without --auth-token-file or --tls-client-ca (or --allow-insecure)\n";
    return 2;
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, creds, &port);
  builder.SetMaxReceiveMessageSize(ring::worker::kMaxMessageBytes);
  builder.SetMaxSendMessageSize(ring::worker::kMaxMessageBytes);
  const std::string host = address.substr(0, address.rfind(':'));
  options.listen_address = address;
  auto service = std::make_unique<ring::worker::WorkerService>(options);
  builder.RegisterService(service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    std::cerr << "ring-worker: cannot listen on " << address << "\n";
    return 1;
  }
  // With port 0 the real port is only known now; errors should name what clients dial.
  service->SetListenAddress(absl::StrCat(host, ":", port));
  // The exposer's HTTP threads only read the registry; it is destroyed before `metrics`.
  std::unique_ptr<prometheus::Exposer> exposer;
  std::string metrics_note;
  if (!metrics_listen.empty()) {
    const std::string maddr = NormalizeListen(metrics_listen);
    try {
      exposer = std::make_unique<prometheus::Exposer>(maddr, /*num_threads=*/2);
    } catch (const std::exception& e) {
      std::cerr << "ring-worker: --metrics-listen " << maddr << ": " << e.what() << "\n";
      return 1;
    }
    exposer->RegisterCollectable(metrics.registry());
    const std::vector<int> ports = exposer->GetListeningPorts();
    const std::string bound =
        absl::StrCat(maddr.substr(0, maddr.rfind(':')), ":", ports.empty() ? 0 : ports[0]);
    service->SetMetricsAddress(bound);
    metrics_note = absl::StrCat(" (metrics http://", bound, "/metrics)");
  }
  std::cout << "ring-worker listening on " << host << ":" << port << metrics_note << std::endl;

  // Registration starts only now: the coordinator probes this worker before it accepts it.
  std::unique_ptr<ring::worker::CoordinatorRegistration> registration;
  if (!join.empty()) {
    ring::worker::RegistrationOptions ro;
    ro.coordinator = join;
    ro.advertise = advertise.empty() ? absl::StrCat(host, ":", port) : advertise;
    registration = std::make_unique<ring::worker::CoordinatorRegistration>(
        ro, std::make_unique<ring::worker::GrpcCoordinatorTransport>(join, coordinator_key));
    service->SetRegistrationSource([r = registration.get()] { return r->Snapshot(); });
    registration->Start();
  }

  int sig = 0;
  sigwait(&stop, &sig);
  std::cerr << "ring-worker: signal " << sig << ", shutting down\n";
  // Leave while still serving: the coordinator re-forms the ring without this worker and
  // the requests in flight replay there; their streams here keep working through the
  // grace period below, so none fails. Best effort, with a short deadline.
  if (registration) (void)registration->Stop();
  server->GetHealthCheckService()->Shutdown();
  server->Shutdown(absl::ToChronoTime(absl::Now() + kShutdownGrace));
  server->Wait();
  return 0;
}
