#include "server/server_config.h"

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include <toml++/toml.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/stage_client.h"

namespace ring {
namespace {

// Reads typed values out of one table and remembers which keys were consumed, so the
// leftovers can be reported as unknown.
class Table {
 public:
  Table(const toml::table* t, std::string name) : t_(t), name_(std::move(name)) {}

  template <typename T>
  absl::Status Get(const char* key, T* out) {
    seen_.insert(key);
    if (t_ == nullptr) return absl::OkStatus();
    const toml::node* n = t_->get(key);
    if (n == nullptr) return absl::OkStatus();
    if constexpr (std::is_same_v<T, std::string>) {
      if (!n->is_string()) return Bad(key, "a string");
      *out = *n->value<std::string>();
    } else if constexpr (std::is_same_v<T, bool>) {
      if (!n->is_boolean()) return Bad(key, "true or false");
      *out = *n->value<bool>();
    } else if constexpr (std::is_integral_v<T>) {
      if (!n->is_integer()) return Bad(key, "an integer");
      *out = static_cast<T>(*n->value<int64_t>());
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!n->is_number()) return Bad(key, "a number");
      *out = *n->value<double>();
    } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      const toml::array* a = n->as_array();
      if (a == nullptr) return Bad(key, "an array of strings");
      out->clear();
      for (const auto& e : *a) {
        if (!e.is_string()) return Bad(key, "an array of strings");
        out->push_back(*e.value<std::string>());
      }
    } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      const toml::array* a = n->as_array();
      if (a == nullptr) return Bad(key, "an array of integers");
      out->clear();
      for (const auto& e : *a) {
        if (!e.is_integer()) return Bad(key, "an array of integers");
        out->push_back(*e.value<int64_t>());
      }
    }
    return absl::OkStatus();
  }

  absl::Status CheckUnknown() const {
    if (t_ == nullptr) return absl::OkStatus();
    for (const auto& [k, v] : *t_) {
      if (!seen_.count(std::string(k.str()))) {
        return absl::InvalidArgumentError(absl::StrCat("unknown key ", name_, ".", std::string(k.str()),
                                                       " (known: ", absl::StrJoin(seen_, ", "), ")"));
      }
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Bad(const char* key, const char* want) const {
    return absl::InvalidArgumentError(absl::StrCat(name_, ".", key, " must be ", want));
  }
  const toml::table* t_;
  std::string name_;
  std::set<std::string> seen_;
};

#define RING_CFG(table, key, field) \
  if (auto _s = (table).Get(key, &c.field); !_s.ok()) return _s

}  // namespace

absl::StatusOr<ServerConfig> ParseServerConfig(const std::string& text, const std::string& source) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << source << ":" << e.source().begin.line << ":" << e.source().begin.column << ": "
       << e.description();
    return absl::InvalidArgumentError(os.str());
  }
  for (const auto& [k, v] : root) {
    const std::string key(k.str());
    if (key != "server" && key != "model" && key != "ring") {
      return absl::InvalidArgumentError(absl::StrCat(source, ": unknown section [", key,
                                                     "] (known: server, model, ring)"));
    }
    if (!v.is_table()) return absl::InvalidArgumentError(absl::StrCat(source, ": ", key, " must be a table"));
  }
  ServerConfig c;
  Table server(root["server"].as_table(), "server"), model(root["model"].as_table(), "model"),
      ring(root["ring"].as_table(), "ring");
  std::string auth = "required";
  RING_CFG(server, "listen", listen);
  RING_CFG(server, "admin_listen", admin_listen);
  RING_CFG(server, "api_keys", api_keys);
  RING_CFG(server, "api_key_env", api_key_env);
  if (auto s = server.Get("auth", &auth); !s.ok()) return s;
  RING_CFG(server, "max_concurrent_requests", max_concurrent_requests);
  RING_CFG(server, "max_body_bytes", max_body_bytes);
  RING_CFG(server, "max_connections", max_connections);
  RING_CFG(server, "read_timeout_s", read_timeout_s);
  RING_CFG(server, "idle_timeout_s", idle_timeout_s);
  RING_CFG(server, "write_timeout_s", write_timeout_s);
  RING_CFG(server, "shutdown_grace_s", shutdown_grace_s);
  RING_CFG(server, "public_metrics", public_metrics);
  RING_CFG(server, "threads", threads);
  RING_CFG(model, "name", model_name);
  RING_CFG(model, "path", model_path);
  RING_CFG(model, "local_dir", local_dir);
  RING_CFG(model, "act_dtype", act_dtype);
  RING_CFG(model, "max_context", max_context);
  RING_CFG(model, "prefill_chunk", prefill_chunk);
  RING_CFG(model, "default_max_tokens", default_max_tokens);
  RING_CFG(model, "max_stop_sequences", max_stop_sequences);
  RING_CFG(ring, "workers", workers);
  RING_CFG(ring, "split", split);
  RING_CFG(ring, "local_stages", local_stages);
  RING_CFG(ring, "step_timeout_s", step_timeout_s);
  RING_CFG(ring, "load_timeout_s", load_timeout_s);
  RING_CFG(ring, "failover_timeout_s", failover_timeout_s);
  RING_CFG(ring, "plan", plan);
  RING_CFG(ring, "topology", topology);
  RING_CFG(ring, "transport", transport);
  RING_CFG(ring, "admission_prompt_len", admission_prompt_len);
  RING_CFG(ring, "admission_tolerance", admission_tolerance);
  RING_CFG(ring, "auth_token_file", auth_token_file);
  RING_CFG(ring, "tls_ca_file", tls_ca_file);
  RING_CFG(ring, "tls_cert_file", tls_cert_file);
  RING_CFG(ring, "tls_key_file", tls_key_file);
  for (const Table* t : {&server, &model, &ring}) {
    if (auto s = t->CheckUnknown(); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": ", s.message()));
    }
  }
  if (auth != "required" && auth != "disabled") {
    return absl::InvalidArgumentError(absl::StrCat(source, ": server.auth must be \"required\" or \"disabled\""));
  }
  c.auth_disabled = auth == "disabled";
  return c;
}

absl::StatusOr<ServerConfig> LoadServerConfig(const std::string& path) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("config file ", path, ": cannot open"));
  std::stringstream ss;
  ss << f.rdbuf();
  return ParseServerConfig(ss.str(), path);
}

absl::Status ServerConfig::Finalize() {
  if (model_path.empty()) model_path = local_dir;
  if (local_dir.empty() && workers.empty()) local_dir = model_path;
  if (model_path.empty()) return absl::InvalidArgumentError("model.path (or model.local_dir) is required");
  if (local_dir.empty()) {
    return absl::InvalidArgumentError(
        "model.local_dir is required with ring.workers: the coordinator reads the tokenizer, "
        "chat template and config.json from it");
  }
  if (model_name.empty()) {
    const std::string p = model_path.back() == '/' ? model_path.substr(0, model_path.size() - 1) : model_path;
    model_name = p.substr(p.rfind('/') + 1);
  }
  if (!api_key_env.empty()) {
    const char* v = std::getenv(api_key_env.c_str());
    if (v == nullptr || *v == '\0') {
      return absl::InvalidArgumentError(absl::StrCat("server.api_key_env: $", api_key_env, " is not set"));
    }
    api_keys.emplace_back(v);
  }
  if (!auth_disabled && api_keys.empty()) {
    return absl::InvalidArgumentError(
        "no API key configured: set server.api_keys or server.api_key_env (or --api-key), "
        "or server.auth = \"disabled\" to serve without authentication");
  }
  for (const auto& k : api_keys) {
    if (k.size() < 8) return absl::InvalidArgumentError("server.api_keys: keys must be at least 8 characters");
  }
  if (act_dtype != "auto" && act_dtype != "bf16" && act_dtype != "f32") {
    return absl::InvalidArgumentError("model.act_dtype must be auto, bf16 or f32");
  }
  if (max_concurrent_requests < 1) return absl::InvalidArgumentError("server.max_concurrent_requests must be >= 1");
  if (max_body_bytes < 1024) return absl::InvalidArgumentError("server.max_body_bytes must be >= 1024");
  if (default_max_tokens < 1) return absl::InvalidArgumentError("model.default_max_tokens must be >= 1");
  if (plan != "auto" && plan != "even") return absl::InvalidArgumentError("ring.plan must be \"auto\" or \"even\"");
  if (topology != "closed" && topology != "star") {
    return absl::InvalidArgumentError("ring.topology must be \"closed\" or \"star\"");
  }
  if (transport != "auto" && transport != "grpc") {
    return absl::InvalidArgumentError("ring.transport must be \"auto\" or \"grpc\"");
  }
  if (failover_timeout_s < 0) return absl::InvalidArgumentError("ring.failover_timeout_s must be >= 0");
  if (admission_prompt_len < 0 || admission_prompt_len > 4096) {
    return absl::InvalidArgumentError("ring.admission_prompt_len must be in [0, 4096]");
  }
  if (admission_tolerance <= 0) return absl::InvalidArgumentError("ring.admission_tolerance must be > 0");
  if (step_timeout_s <= 0 || load_timeout_s <= 0 || read_timeout_s <= 0 || idle_timeout_s <= 0 ||
      write_timeout_s <= 0) {
    return absl::InvalidArgumentError("timeouts must be > 0");
  }
  if (!split.empty() && !workers.empty() && split.size() != workers.size()) {
    return absl::InvalidArgumentError("ring.split must have one entry per ring.workers entry");
  }
  struct {
    const std::string* path;
    std::string* out;
    const char* what;
  } files[] = {{&auth_token_file, &auth_token, "ring.auth_token_file"},
               {&tls_ca_file, &tls_ca, "ring.tls_ca_file"},
               {&tls_cert_file, &tls_cert, "ring.tls_cert_file"},
               {&tls_key_file, &tls_key, "ring.tls_key_file"}};
  for (auto& f : files) {
    if (f.path->empty()) continue;
    auto v = worker::ReadSecretFile(*f.path, f.what);
    if (!v.ok()) return v.status();
    *f.out = *v;
  }
  if (tls_cert.empty() != tls_key.empty()) {
    return absl::InvalidArgumentError("ring.tls_cert_file and ring.tls_key_file go together");
  }
  if (!tls_cert.empty() && tls_ca.empty()) {
    return absl::InvalidArgumentError("ring.tls_cert_file needs ring.tls_ca_file");
  }
  return ListenHostPort().status();
}

RingOptions ServerConfig::ToRingOptions() const {
  RingOptions o;
  o.workers = workers;
  o.model = workers.empty() ? local_dir : model_path;
  o.split = split;
  o.local_stages = split.empty() ? local_stages : static_cast<int>(split.size());
  if (act_dtype == "f32") o.act_dtype = cpu::ActDType::kF32;
  if (act_dtype == "bf16") o.act_dtype = cpu::ActDType::kBF16;
  o.all_logits = false;
  o.step_timeout = absl::Seconds(step_timeout_s);
  o.load_timeout = absl::Seconds(load_timeout_s);
  o.auto_plan = plan == "auto";
  o.closed_loop = topology == "closed";
  o.transport = transport == "grpc" ? RingTransport::kGrpc : RingTransport::kAuto;
  o.plan_context_tokens = max_context > 0 ? max_context : 4096;
  o.plan_sequences = max_concurrent_requests;
  o.admission_tokens = AdmissionTokens(admission_prompt_len);
  o.admission_tolerance = admission_tolerance;
  o.auth_token = auth_token;
  o.tls_ca = tls_ca;
  o.tls_cert = tls_cert;
  o.tls_key = tls_key;
  return o;
}

absl::StatusOr<std::pair<std::string, int>> ServerConfig::ListenHostPort() const {
  const size_t colon = listen.rfind(':');
  int port;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("server.listen '", listen, "': want HOST:PORT"));
  }
  std::string host = listen.substr(0, colon);
  if (host.empty()) host = "127.0.0.1";
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return std::make_pair(host, port);
}

}  // namespace ring
