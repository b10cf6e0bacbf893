// File: server/server_config.h
//
// ring-server's configuration: a TOML file (ring.toml) and command-line overrides.
// Every field has a default that is safe on a single machine: listen on loopback, API
// keys required unless `auth = "disabled"` is written explicitly. Unknown keys and wrong
// types are errors naming the key, so a typo never silently changes behaviour.
//
//   [server]
//   listen = "127.0.0.1:8000"
//   admin_listen = "127.0.0.1:8001"    # gRPC admin service for ringctl ("off": none)
//   api_keys = ["sk-local-1"]          # and/or api_key_env = "RINGSERVE_API_KEY"
//   auth = "required"                  # "disabled": no key checks (say so explicitly)
//   max_concurrent_requests = 4        # more in flight: 429 with Retry-After
//   max_body_bytes = 4194304           # larger: 413
//   max_connections = 512
//   read_timeout_s = 30                # whole request (slow-loris)
//   idle_timeout_s = 60                # keep-alive
//   write_timeout_s = 30               # a client that stops reading
//   shutdown_grace_s = 20              # SIGTERM: finish in-flight requests this long
//   public_metrics = true              # /metrics without a key (scrapers)
//   threads = 2
//
//   [model]
//   name = "tiny-glm"                  # the id clients send as "model"
//   path = "tiny-glm"                  # on the workers, under their --model-root
//   local_dir = "/srv/models/tiny-glm" # tokenizer + chat template + config here
//   act_dtype = "auto"                 # auto | bf16 | f32 (activations between stages)
//   max_context = 0                    # 0: config.json max_position_embeddings
//   prefill_chunk = 512
//   default_max_tokens = 256
//   max_stop_sequences = 4
//
//   [ring]
//   workers = ["127.0.0.1:7001", "127.0.0.1:7002"]   # empty: stages in this process
//   split = [2, 2]                      # layer counts per worker; empty: even split
//   local_stages = 1
//   step_timeout_s = 30
//   load_timeout_s = 600
//   failover_timeout_s = 60             # replay on a re-formed ring within this, else fail
//   plan = "auto"                       # no split: by free memory + measured bandwidth; "even"
//   topology = "closed"                 # workers pass steps on and the last stage samples;
//                                       #   "star": the coordinator drives every step
//   transport = "auto"                  # closed ring: hops between CUDA workers on one host
//                                       #   move large frames over NCCL; "grpc": never
//   admission_prompt_len = 8            # > 0: every worker verifies its layers on its device
//   admission_tolerance = 0.01          #   against the CPU reference before it may serve
//   auth_token_file = "/etc/ringserve/ring.token"   # workers run with the same file
//   tls_ca_file = "ca.pem"                           # TLS to the workers (+ mTLS with:)
//   tls_cert_file = "coordinator.pem"
//   tls_key_file = "coordinator.key"
#ifndef RINGSERVE_SERVER_SERVER_CONFIG_H_
#define RINGSERVE_SERVER_SERVER_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/ring.h"

namespace ring {

struct ServerConfig {
  // [server]
  std::string listen = "127.0.0.1:8000";
  std::string admin_listen = "127.0.0.1:8001";  // ringctl's gRPC admin service; "off": none
  std::vector<std::string> api_keys;
  std::string api_key_env;
  bool auth_disabled = false;
  int max_concurrent_requests = 4;
  int64_t max_body_bytes = 4 << 20;
  int max_connections = 512;
  double read_timeout_s = 30, idle_timeout_s = 60, write_timeout_s = 30;
  double shutdown_grace_s = 20;
  bool public_metrics = true;
  int threads = 2;
  // [model]
  std::string model_name;
  std::string model_path;
  std::string local_dir;
  std::string act_dtype = "auto";
  int64_t max_context = 0;
  int64_t prefill_chunk = 512;
  int32_t default_max_tokens = 256;
  int max_stop_sequences = 4;
  // [ring]
  std::vector<std::string> workers;
  std::vector<int64_t> split;
  int local_stages = 1;
  double step_timeout_s = 30, load_timeout_s = 600;
  double failover_timeout_s = 60;  // wait this long for a re-formed ring, then fail
  std::string plan = "auto";       // "auto": split by memory and bandwidth; "even"
  std::string topology = "closed"; // "closed": RingOptions::closed_loop; "star"
  std::string transport = "auto";  // "auto": RingTransport::kAuto; "grpc"
  int64_t admission_prompt_len = 0;  // admission gate: golden prompt length; 0: off
  double admission_tolerance = 0.01;
  std::string auth_token_file, tls_ca_file, tls_cert_file, tls_key_file;
  // Filled by Finalize from the files above.
  std::string auth_token, tls_ca, tls_cert, tls_key;

  // Checks cross-field rules (e.g. a key source unless auth is disabled) and fills
  // defaults derived from other fields. Errors name the key.
  absl::Status Finalize();
  RingOptions ToRingOptions() const;
  // Host and port of `listen`.
  absl::StatusOr<std::pair<std::string, int>> ListenHostPort() const;
};

absl::StatusOr<ServerConfig> ParseServerConfig(const std::string& toml_text,
                                               const std::string& source_name);
absl::StatusOr<ServerConfig> LoadServerConfig(const std::string& path);

}  // namespace ring

#endif  // RINGSERVE_SERVER_SERVER_CONFIG_H_
