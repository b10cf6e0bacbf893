// ring-worker: serves one pipeline stage over gRPC (proto/ringserve/v1/worker.proto).
//
//   ring-worker --listen 127.0.0.1:7001 --model-root /srv/models [--device cpu|cuda:N]
//
// --listen PORT or :PORT binds 127.0.0.1; all interfaces only when the address says so
// (0.0.0.0:PORT or [::]:PORT), since the service has no authentication yet. Port 0 picks a
// free port; the bound address is printed as "ring-worker listening on ADDR" on stdout.
// SIGTERM/SIGINT: health flips to NOT_SERVING, in-flight calls get kShutdownGrace, exit 0.
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <pthread.h>

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("ring-worker: one RingServe pipeline stage over gRPC");
  std::string listen = "127.0.0.1:0", model_root, device = "cpu";
  app.add_option("--listen", listen, "HOST:PORT, :PORT or PORT (127.0.0.1 unless a host is given)");
  app.add_option("--model-root", model_root, "Directory holding the models LoadStage may load")
      ->required()->check(CLI::ExistingDirectory);
  app.add_option("--device", device, "Compute device: cpu, cuda or cuda:N");
  CLI11_PARSE(app, argc, argv);
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
  }
  device = spec->ToString();

  // Block the stop signals in every thread (gRPC's included) so only sigwait sees them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  ring::worker::WorkerOptions options;
  options.model_root = model_root;
  options.device = device;
  if (const char* n = std::getenv("RING_TEST_CORRUPT_FRAME")) {
    if (!absl::SimpleAtoi(n, &options.TEST_corrupt_frame)) {
      std::cerr << "ring-worker: RING_TEST_CORRUPT_FRAME must be an integer\n";
      return 2;
    }
    std::cerr << "ring-worker: TEST fault injection: corrupting sent frame #"
              << options.TEST_corrupt_frame << "\n";
  }

  const std::string address = NormalizeListen(listen);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
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
  std::cout << "ring-worker listening on " << host << ":" << port << std::endl;

  int sig = 0;
  sigwait(&stop, &sig);
  std::cerr << "ring-worker: signal " << sig << ", shutting down\n";
  server->GetHealthCheckService()->Shutdown();
  server->Shutdown(absl::ToChronoTime(absl::Now() + kShutdownGrace));
  server->Wait();
  return 0;
}
