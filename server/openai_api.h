// File: server/openai_api.h
//
// The OpenAI-compatible HTTP surface of ring-server:
//   POST /v1/chat/completions, POST /v1/completions, GET /v1/models[/{id}],
//   GET /health (live, public), GET /ready (ring formed; 503 with the reason otherwise),
//   GET /metrics (Prometheus text).
// Requests are validated before any work (400 naming the parameter, 404 unknown model,
// 413 body too large, 429 over the concurrency limit, 503 not ready or shutting down),
// prompts are rendered with the checkpoint's chat template and tokenized here, and
// generation runs on the Engine's pool; streaming answers are SSE chunks. A client that
// disconnects cancels its generation (and frees its KV caches on every stage).
//
// Errors use OpenAI's shape: {"error": {"message", "type", "param", "code"}}.
#ifndef RINGSERVE_SERVER_OPENAI_API_H_
#define RINGSERVE_SERVER_OPENAI_API_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "server/chat_template.h"
#include "server/engine.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/tokenizer.h"

namespace ring {

struct ApiOptions {
  std::string model_name;
  std::vector<std::string> api_keys;
  bool auth_disabled = false;
  bool public_metrics = true;
  int32_t default_max_tokens = 256;
  int max_stop_sequences = 4;
  std::vector<int32_t> eos_token_ids;  // end generation; not part of the output
};

class OpenAiApi {
 public:
  // `tokenizer` and `chat_template` must outlive the API object.
  OpenAiApi(ApiOptions options, Engine* engine, ServerMetrics* metrics,
            const text::Tokenizer* tokenizer, const text::ChatTemplate* chat_template);

  // The HttpHandler of ring-server.
  void Handle(http::HttpRequest req, std::shared_ptr<http::HttpResponder> r);

  // Graceful shutdown: /ready turns 503 and new generations are refused; running ones go on.
  void BeginDrain() { draining_ = true; }
  bool draining() const { return draining_.load(); }
  // Asks every running generation to stop (their clients get finish_reason/cancellation).
  void CancelAll();
  int64_t in_flight() const { return in_flight_.load(); }

 private:
  struct Job;
  void Generate(std::shared_ptr<Job> job);
  void HandleCompletion(http::HttpRequest req, std::shared_ptr<http::HttpResponder> r, bool chat);

  const ApiOptions options_;
  Engine* engine_;
  ServerMetrics* metrics_;
  const text::Tokenizer* tokenizer_;
  const text::ChatTemplate* chat_template_;
  const int64_t created_;
  std::atomic<bool> draining_{false};
  std::atomic<bool> cancel_all_{false};
  std::atomic<int64_t> in_flight_{0};
  std::mutex jobs_mu_;
  std::vector<std::weak_ptr<Job>> jobs_;  // running generations, for CancelAll
};

}  // namespace ring

#endif  // RINGSERVE_SERVER_OPENAI_API_H_
