// ring-server: the coordinator. Forms the ring (ring-worker processes listed in the config,
// or the model's stages in this process), and serves the OpenAI-compatible API.
//
//   ring-server --config ring.toml
//   ring-server --model /srv/models/tiny-glm --no-auth            # one process, loopback
//   ring-server --model-dir /srv/models/tiny-glm --model-path tiny-glm
//               --workers 127.0.0.1:7001,127.0.0.1:7002 --api-key "$KEY"
//
// Prints "ring-server listening on http://HOST:PORT" once the HTTP port is bound (the ring
// may still be forming: /ready says when it is). SIGTERM/SIGINT: stop admitting, /ready
// 503, let in-flight requests finish for shutdown_grace_s, cancel the rest, exit 0.
#include <csignal>
#include <iostream>
#include <pthread.h>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "models/config.h"
#include <grpcpp/grpcpp.h>

#include "server/admin_service.h"
#include "server/chat_template.h"
#include "server/engine.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/openai_api.h"
#include "server/server_config.h"
#include "server/tokenizer.h"
#include "worker/mutex_mode.h"

namespace {

int Fail(const absl::Status& s) {
  std::cerr << "ring-server: " << s.message() << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  ring::worker::UseServingMutexMode();
  CLI::App app("ring-server: RingServe coordinator and OpenAI-compatible API");
  std::string config_path, listen, admin_listen, model_dir, model_path, workers, split, name;
  std::vector<std::string> api_keys;
  bool no_auth = false;
  int max_concurrent = 0, local_stages = 0;
  app.add_option("--config", config_path, "ring.toml (see server/server_config.h)");
  app.add_option("--listen", listen, "HOST:PORT for the HTTP API (default 127.0.0.1:8000)");
  app.add_option("--admin-listen", admin_listen, "HOST:PORT of the admin service for ringctl (\"off\": none)");
  app.add_option("--model,--model-dir", model_dir,
                 "Model directory on this machine (tokenizer, chat template, config; and the "
                 "weights when the stages run in this process)");
  app.add_option("--model-path", model_path, "Model path under the workers' --model-root");
  app.add_option("--workers", workers, "Ring workers ADDR,ADDR,... in ring order");
  app.add_option("--split", split, "Layer counts per stage, e.g. 2,1,1");
  app.add_option("--local-stages", local_stages, "Split an in-process model into N stages");
  app.add_option("--name", name, "Model id clients use (default: the directory name)");
  app.add_option("--api-key", api_keys, "Accepted API key (repeatable)");
  app.add_flag("--no-auth", no_auth, "Serve without API keys (explicit opt-out)");
  app.add_option("--max-concurrent", max_concurrent, "Generations in flight before 429");
  std::string topology;
  app.add_option("--topology", topology, "closed (workers pass steps on; default) or star (ring.topology)")
      ->check(CLI::IsMember({"closed", "star"}));
  std::string transport;
  app.add_option("--transport", transport,
                 "auto (closed ring: NCCL between CUDA workers on one host; default) or grpc (ring.transport)")
      ->check(CLI::IsMember({"auto", "grpc"}));
  CLI11_PARSE(app, argc, argv);

  ring::ServerConfig cfg;
  if (!config_path.empty()) {
    auto c = ring::LoadServerConfig(config_path);
    if (!c.ok()) return Fail(c.status());
    cfg = *c;
  }
  if (!listen.empty()) cfg.listen = listen;
  if (!admin_listen.empty()) cfg.admin_listen = admin_listen;
  if (!model_dir.empty()) cfg.local_dir = model_dir;
  if (!model_path.empty()) cfg.model_path = model_path;
  if (!name.empty()) cfg.model_name = name;
  for (auto& k : api_keys) cfg.api_keys.push_back(k);
  if (no_auth) cfg.auth_disabled = true;
  if (max_concurrent > 0) cfg.max_concurrent_requests = max_concurrent;
  if (local_stages > 0) cfg.local_stages = local_stages;
  if (!topology.empty()) cfg.topology = topology;
  if (!transport.empty()) cfg.transport = transport;
  if (!workers.empty()) {
    cfg.workers.clear();
    for (absl::string_view w : absl::StrSplit(workers, ',', absl::SkipWhitespace())) cfg.workers.emplace_back(w);
  }
  if (!split.empty()) {
    cfg.split.clear();
    for (absl::string_view s : absl::StrSplit(split, ',', absl::SkipWhitespace())) {
      int64_t v;
      if (!absl::SimpleAtoi(s, &v)) return Fail(absl::InvalidArgumentError("--split: '" + std::string(s) + "' is not a number"));
      cfg.split.push_back(v);
    }
  }
  if (cfg.workers.empty() && cfg.model_path.empty()) cfg.model_path = cfg.local_dir;
  if (auto s = cfg.Finalize(); !s.ok()) return Fail(s);
  auto hp = cfg.ListenHostPort();

  // Text side: everything the coordinator needs from the model directory, checked before
  // the port opens so a broken model dir fails fast.
  auto tokenizer = ring::text::Tokenizer::FromModelDir(cfg.local_dir);
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  auto chat_template = ring::text::ChatTemplate::FromModelDir(cfg.local_dir);
  if (!chat_template.ok()) return Fail(chat_template.status());
  auto model_cfg = ring::LoadModelConfig(cfg.local_dir);
  if (!model_cfg.ok()) return Fail(model_cfg.status());

  // Block the stop signals in every thread so only sigwait sees them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  signal(SIGPIPE, SIG_IGN);

  ring::ServerMetrics metrics;
  ring::Engine::Options eo;
  eo.max_concurrent = cfg.max_concurrent_requests;
  eo.prefill_chunk = cfg.prefill_chunk;
  eo.failover_timeout = absl::Seconds(cfg.failover_timeout_s);
  eo.max_context = cfg.max_context > 0 ? cfg.max_context : model_cfg->max_position_embeddings;
  auto engine = std::make_unique<ring::Engine>(cfg.ToRingOptions(), eo, &metrics);
  engine->Start();

  ring::ApiOptions ao;
  ao.model_name = cfg.model_name;
  ao.api_keys = cfg.api_keys;
  ao.auth_disabled = cfg.auth_disabled;
  ao.public_metrics = cfg.public_metrics;
  ao.default_max_tokens = cfg.default_max_tokens;
  ao.max_stop_sequences = cfg.max_stop_sequences;
  for (int64_t id : model_cfg->eos_token_ids) ao.eos_token_ids.push_back(static_cast<int32_t>(id));
  if (auto eos = (*tokenizer)->eos_id()) ao.eos_token_ids.push_back(*eos);
  ring::OpenAiApi api(ao, engine.get(), &metrics, tokenizer->get(), &*chat_template);

  ring::http::HttpServer::Options ho;
  ho.address = hp->first;
  ho.port = hp->second;
  ho.threads = cfg.threads;
  ho.max_body_bytes = cfg.max_body_bytes;
  ho.max_connections = cfg.max_connections;
  ho.read_timeout = absl::Seconds(cfg.read_timeout_s);
  ho.idle_timeout = absl::Seconds(cfg.idle_timeout_s);
  ho.write_timeout = absl::Seconds(cfg.write_timeout_s);
  ho.on_cut = [](const std::string& what) { std::cerr << "ring-server: http: " << what << "\n"; };
  auto server = ring::http::HttpServer::Start(
      ho, [&api](ring::http::HttpRequest req, std::shared_ptr<ring::http::HttpResponder> r) {
        api.Handle(std::move(req), std::move(r));
      });
  if (!server.ok()) return Fail(server.status());
  if (cfg.auth_disabled) std::cerr << "ring-server: WARNING: API keys disabled (auth = \"disabled\")\n";
  std::cout << "ring-server listening on http://" << hp->first << ":" << (*server)->port()
            << " (model '" << cfg.model_name << "', "
            << (cfg.workers.empty() ? "stages in-process" : std::to_string(cfg.workers.size()) + " workers")
            << ")" << std::endl;

  // Admin service for ringctl (gRPC, loopback by default).
  std::unique_ptr<grpc::Server> admin_server;
  ring::AdminOptions ad;
  ad.model_name = cfg.model_name;
  if (!cfg.auth_disabled) ad.keys = cfg.api_keys;
  if (!cfg.auth_token.empty()) ad.keys.push_back(cfg.auth_token);
  ad.max_concurrent = cfg.max_concurrent_requests;
  ad.in_flight = [&api] { return api.in_flight(); };
  ad.draining = [&api] { return api.draining(); };
  ring::AdminService admin(ad, engine.get(), &metrics);
  if (cfg.admin_listen != "off" && !cfg.admin_listen.empty()) {
    grpc::ServerBuilder b;
    int admin_port = 0;
    b.AddListeningPort(cfg.admin_listen, grpc::InsecureServerCredentials(), &admin_port);
    b.RegisterService(&admin);
    admin_server = b.BuildAndStart();
    if (!admin_server || admin_port == 0) {
      return Fail(absl::UnavailableError("cannot listen on admin address " + cfg.admin_listen));
    }
    std::cout << "ring-server admin on " << cfg.admin_listen.substr(0, cfg.admin_listen.rfind(':')) << ":"
              << admin_port << std::endl;
  }

  int sig = 0;
  sigwait(&stop, &sig);
  std::cerr << "ring-server: signal " << sig << ", draining (grace " << cfg.shutdown_grace_s << " s)\n";
  api.BeginDrain();
  (*server)->StopAccepting();
  const absl::Time deadline = absl::Now() + absl::Seconds(cfg.shutdown_grace_s);
  while (api.in_flight() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(50));
  if (api.in_flight() > 0) {
    std::cerr << "ring-server: cancelling " << api.in_flight() << " request(s) still running\n";
    api.CancelAll();
    const absl::Time hard = absl::Now() + absl::Seconds(10);
    while (api.in_flight() > 0 && absl::Now() < hard) absl::SleepFor(absl::Milliseconds(50));
  }
  // The last chunks of a finished stream may still be queued: let them reach the client.
  if (!(*server)->WaitUntilClosed(absl::Seconds(5))) {
    std::cerr << "ring-server: closing " << (*server)->open_connections() << " connection(s) still open\n";
  }
  (*server)->Shutdown();
  if (admin_server) admin_server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  if (api.in_flight() > 0) {
    // A step stuck past every deadline: exit rather than hang (the ring frees the caches).
    std::cerr << "ring-server: " << api.in_flight() << " request(s) did not stop; exiting anyway\n";
    std::_Exit(1);
  }
  engine.reset();
  std::cerr << "ring-server: stopped\n";
  return 0;
}
