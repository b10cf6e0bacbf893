#include "server/openai_api.h"

#include <chrono>
#include <cstring>
#include <optional>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "server/stop_matcher.h"
#include "server/tool_parser.h"

namespace ring {
namespace {

// ordered_json: tool schemas must reach the chat template with the key order the client
// sent (HF renders them in that order; a sorted map would change the prompt).
using json = nlohmann::ordered_json;

// Thrown by request parsing and caught in Handle: validation reads as a straight line.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;
  std::string code;
};

json ErrorJson(const ApiError& e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

ApiError FromStatus(const absl::Status& s) {
  ApiError e;
  e.message = std::string(s.message());
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      e.status = 400;
      break;
    case absl::StatusCode::kNotFound:
      e.status = 404;
      e.code = "not_found";
      break;
    case absl::StatusCode::kResourceExhausted:
      e.status = 429;
      e.type = "rate_limit_error";
      // Retrying helps once other sequences free their caches (Retry-After is sent).
      if (IsKvCacheExhausted(s)) e.code = "kv_cache_exhausted";
      break;
    case absl::StatusCode::kUnavailable:
      e.status = 503;
      e.type = "server_error";
      e.code = "ring_unavailable";
      break;
    case absl::StatusCode::kDeadlineExceeded:
      e.status = 504;
      e.type = "server_error";
      e.code = "ring_timeout";
      break;
    case absl::StatusCode::kDataLoss:
      e.status = 502;
      e.type = "server_error";
      e.code = "ring_corrupt_frame";
      break;
    default:
      e.status = 500;
      e.type = "server_error";
  }
  return e;
}

std::string RandomId(absl::string_view prefix) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  static const char* kHex = "0123456789abcdef";
  std::string out(prefix);
  for (int i = 0; i < 24; ++i) out.push_back(kHex[rng() % 16]);
  return out;
}

uint64_t RandomSeed() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return rng();
}

// Constant-time comparison: key checks must not leak how much of a guess was right.
bool SameKey(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
}

// Typed access to request fields; errors name the parameter.
class Fields {
 public:
  explicit Fields(const json& j) : j_(j) {}
  bool Has(const char* k) const { return j_.contains(k) && !j_.at(k).is_null(); }
  const json& At(const char* k) const { return j_.at(k); }

  std::optional<double> Number(const char* k, double lo, double hi) const {
    if (!Has(k)) return std::nullopt;
    const json& v = j_.at(k);
    if (!v.is_number()) Fail(k, "must be a number");
    const double d = v.get<double>();
    if (!(d >= lo && d <= hi)) Fail(k, absl::StrCat("must be in [", lo, ", ", hi, "]"));
    return d;
  }
  std::optional<int64_t> Int(const char* k, int64_t lo, int64_t hi) const {
    if (!Has(k)) return std::nullopt;
    const json& v = j_.at(k);
    if (!v.is_number_integer()) Fail(k, "must be an integer");
    const int64_t d = v.get<int64_t>();
    if (d < lo || d > hi) Fail(k, absl::StrCat("must be in [", lo, ", ", hi, "]"));
    return d;
  }
  std::optional<bool> Bool(const char* k) const {
    if (!Has(k)) return std::nullopt;
    if (!j_.at(k).is_boolean()) Fail(k, "must be a boolean");
    return j_.at(k).get<bool>();
  }
  std::optional<std::string> String(const char* k) const {
    if (!Has(k)) return std::nullopt;
    if (!j_.at(k).is_string()) Fail(k, "must be a string");
    return j_.at(k).get<std::string>();
  }
  [[noreturn]] static void Fail(const std::string& param, const std::string& what) {
    throw ApiError{400, absl::StrCat("'", param, "' ", what), "invalid_request_error", param, ""};
  }

 private:
  const json& j_;
};

// Messages as the chat template expects them: "developer" is "system", content parts are
// joined into a string (text parts only); tool-call arguments must be JSON (the template
// layer decodes them into objects: GLM's template iterates them).
json NormalizeMessages(const json& msgs) {
  if (!msgs.is_array() || msgs.empty()) Fields::Fail("messages", "must be a non-empty array");
  json out = json::array();
  for (size_t i = 0; i < msgs.size(); ++i) {
    const std::string p = absl::StrCat("messages[", i, "]");
    const json& m = msgs[i];
    if (!m.is_object()) Fields::Fail(p, "must be an object");
    if (!m.contains("role") || !m["role"].is_string()) Fields::Fail(p + ".role", "must be a string");
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      Fields::Fail(p + ".role", "must be one of system, developer, user, assistant, tool");
    }
    json n = m;
    n["role"] = role;
    if (m.contains("content")) {
      const json& c = m["content"];
      if (c.is_array()) {
        std::string text;
        for (size_t k = 0; k < c.size(); ++k) {
          const json& part = c[k];
          const std::string pp = absl::StrCat(p, ".content[", k, "]");
          if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
            Fields::Fail(pp, "must be an object with a 'type'");
          }
          if (part["type"] != "text") {
            Fields::Fail(pp + ".type", absl::StrCat("'", part["type"].get<std::string>(),
                                                    "' content is not supported by this model (text only)"));
          }
          if (!part.contains("text") || !part["text"].is_string()) Fields::Fail(pp + ".text", "must be a string");
          text += part["text"].get<std::string>();
        }
        n["content"] = text;
      } else if (!c.is_string() && !c.is_null()) {
        Fields::Fail(p + ".content", "must be a string, an array of content parts or null");
      }
    } else if (role != "assistant") {
      Fields::Fail(p + ".content", "is required");
    }
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      if (!m["tool_calls"].is_array()) Fields::Fail(p + ".tool_calls", "must be an array");
      for (size_t k = 0; k < m["tool_calls"].size(); ++k) {
        json& tc = n["tool_calls"][k];
        const std::string tp = absl::StrCat(p, ".tool_calls[", k, "]");
        if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object() ||
            !tc["function"].contains("name") || !tc["function"]["name"].is_string()) {
          Fields::Fail(tp, "must be {\"type\": \"function\", \"function\": {\"name\", \"arguments\"}}");
        }
        const json& args = tc["function"]["arguments"];
        if (args.is_string() && json::parse(args.get<std::string>(), nullptr, false).is_discarded()) {
          Fields::Fail(tp + ".function.arguments", "is not valid JSON");
        }
      }
    }
    out.push_back(std::move(n));
  }
  return out;
}

json ValidateTools(const json& tools) {
  if (!tools.is_array()) Fields::Fail("tools", "must be an array");
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const std::string p = absl::StrCat("tools[", i, "]");
    if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") ||
        !t["function"].is_object() || !t["function"].contains("name") || !t["function"]["name"].is_string()) {
      Fields::Fail(p, "must be {\"type\": \"function\", \"function\": {\"name\", ...}}");
    }
  }
  return tools;
}

const char* FinishName(FinishReason f, bool tool_calls) {
  switch (f) {
    case FinishReason::kLength:
      return "length";
    default:
      return tool_calls ? "tool_calls" : "stop";
  }
}

json ToolCallJson(const text::ToolCall& tc, int index, bool with_index) {
  json j = {{"id", tc.id}, {"type", "function"},
            {"function", {{"name", tc.name}, {"arguments", tc.arguments_json}}}};
  if (with_index) j["index"] = index;
  return j;
}

json BytesOf(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

}  // namespace

struct OpenAiApi::Job {
  bool chat = true;
  bool stream = false;
  bool include_usage = false;
  bool ignore_eos = false;
  std::string id;
  GenerateRequest gen;
  std::vector<std::string> stops;
  bool logprobs = false;
  int top_logprobs = 0;
  bool parse_tools = false;
  bool starts_in_reasoning = false;
  text::ToolCallFormat tool_format = text::ToolCallFormat::kNone;
  text::ToolSchemas tool_schemas;
  std::shared_ptr<http::HttpResponder> r;
  std::unique_ptr<Engine::Slot> slot;
  std::atomic<bool> cancelled{false};
};

OpenAiApi::OpenAiApi(ApiOptions options, Engine* engine, ServerMetrics* metrics,
                     const text::Tokenizer* tokenizer, const text::ChatTemplate* chat_template)
    : options_(std::move(options)),
      engine_(engine),
      metrics_(metrics),
      tokenizer_(tokenizer),
      chat_template_(chat_template),
      created_(absl::ToUnixSeconds(absl::Now())) {}

void OpenAiApi::Handle(http::HttpRequest req, std::shared_ptr<http::HttpResponder> r) {
  auto send_json = [&](const std::string& route, int status, const json& body,
                       http::HeaderList headers = {}) {
    metrics_->CountHttp(route, status);
    r->Send(status, "application/json", body.dump() + "\n", std::move(headers));
  };
  auto send_error = [&](const std::string& route, const ApiError& e) {
    http::HeaderList h;
    if (e.status == 401) h.emplace_back("WWW-Authenticate", "Bearer");
    if (e.status == 429 || e.status == 503) h.emplace_back("Retry-After", "1");
    send_json(route, e.status, ErrorJson(e), std::move(h));
  };
  auto authorized = [&]() {
    if (options_.auth_disabled) return true;
    std::string key = req.Header("x-api-key");
    const std::string auth = req.Header("authorization");
    if (key.empty() && absl::StartsWithIgnoreCase(auth, "bearer ")) {
      key = std::string(absl::StripAsciiWhitespace(auth.substr(7)));
    }
    bool ok = false;
    for (const auto& k : options_.api_keys) ok |= SameKey(key, k);
    return ok;
  };
  const ApiError kUnauthorized{401, "missing or invalid API key (send 'Authorization: Bearer KEY' or 'x-api-key: KEY')",
                               "invalid_request_error", "", "invalid_api_key"};

  const std::string& path = req.path;
  if (path == "/health") {
    send_json("/health", 200, {{"status", "ok"}});
    return;
  }
  if (path == "/ready") {
    absl::Status s = engine_->Ready();
    if (draining_) s = absl::UnavailableError("shutting down");
    if (s.ok()) {
      json stages = json::array();
      for (const auto& st : engine_->stages()) {
        stages.push_back({{"name", st.name}, {"layers", {st.layers.begin, st.layers.end}}});
      }
      json body = {{"status", "ready"}, {"model", options_.model_name}, {"stages", stages}};
      if (const std::string missing = engine_->Degraded(); !missing.empty()) {
        body["degraded"] = "workers left out of the ring (unreachable): " + missing;
      }
      send_json("/ready", 200, body);
    } else {
      send_json("/ready", 503, {{"status", "not ready"}, {"reason", std::string(s.message())}},
                {{"Retry-After", "1"}});
    }
    return;
  }
  if (path == "/metrics") {
    if (!options_.public_metrics && !authorized()) {
      send_error("/metrics", kUnauthorized);
      return;
    }
    metrics_->CountHttp("/metrics", 200);
    r->Send(200, "text/plain; version=0.0.4", metrics_->Render());
    return;
  }
  if (!absl::StartsWith(path, "/v1/")) {
    send_error("other", {404, absl::StrCat("no route ", req.method, " ", path), "invalid_request_error", "", "not_found"});
    return;
  }
  if (!authorized()) {
    send_error(path == "/v1/chat/completions" || path == "/v1/completions" ? path : "/v1/other",
               kUnauthorized);
    return;
  }
  if (path == "/v1/models" || absl::StartsWith(path, "/v1/models/")) {
    if (req.method != "GET") {
      send_error("/v1/models", {405, "use GET", "invalid_request_error", "", "method_not_allowed"});
      return;
    }
    json m = {{"id", options_.model_name}, {"object", "model"}, {"created", created_}, {"owned_by", "ringserve"}};
    if (const int64_t ctx = engine_->max_context(); ctx > 0) m["max_model_len"] = ctx;
    if (path == "/v1/models") {
      send_json("/v1/models", 200, {{"object", "list"}, {"data", json::array({m})}});
    } else if (path.substr(strlen("/v1/models/")) == options_.model_name) {
      send_json("/v1/models", 200, m);
    } else {
      send_error("/v1/models", {404, absl::StrCat("model '", path.substr(11), "' does not exist"),
                                "invalid_request_error", "model", "model_not_found"});
    }
    return;
  }
  if (path == "/v1/chat/completions" || path == "/v1/completions") {
    if (req.method != "POST") {
      send_error(path, {405, "use POST", "invalid_request_error", "", "method_not_allowed"});
      return;
    }
    HandleCompletion(std::move(req), std::move(r), path == "/v1/chat/completions");
    return;
  }
  send_error("/v1/other", {404, absl::StrCat("no route ", req.method, " ", path), "invalid_request_error", "", "not_found"});
}

void OpenAiApi::HandleCompletion(http::HttpRequest req, std::shared_ptr<http::HttpResponder> r,
                                 bool chat) {
  const std::string route = chat ? "/v1/chat/completions" : "/v1/completions";
  auto job = std::make_shared<Job>();
  try {
    json body;
    try {
      body = json::parse(req.body);
    } catch (const json::parse_error& e) {
      throw ApiError{400, absl::StrCat("malformed JSON body: ", e.what()), "invalid_request_error", "", ""};
    }
    if (!body.is_object()) {
      throw ApiError{400, "the request body must be a JSON object", "invalid_request_error", "", ""};
    }
    Fields f(body);
    const auto model = f.String("model");
    if (!model) Fields::Fail("model", "is required");
    if (*model != options_.model_name) {
      throw ApiError{404, absl::StrCat("model '", *model, "' does not exist; this server serves '",
                                       options_.model_name, "'"),
                     "invalid_request_error", "model", "model_not_found"};
    }
    if (auto n = f.Int("n", 1, 128); n && *n != 1) Fields::Fail("n", "must be 1: several choices per request are not supported");
    if (auto b = f.Int("best_of", 1, 128); b && *b != 1) Fields::Fail("best_of", "must be 1 (not supported)");
    if (auto e = f.Bool("echo"); e && *e) Fields::Fail("echo", "is not supported");
    if (f.Has("suffix")) Fields::Fail("suffix", "is not supported");
    if (f.Has("logit_bias") && !(body["logit_bias"].is_object() && body["logit_bias"].empty())) {
      Fields::Fail("logit_bias", "is not supported");
    }
    if (f.Has("response_format")) {
      const json& rf = body["response_format"];
      if (!rf.is_object() || rf.value("type", "") != "text") {
        Fields::Fail("response_format", "only {\"type\": \"text\"} is supported");
      }
    }

    job->chat = chat;
    job->stream = f.Bool("stream").value_or(false);
    // vLLM's extension: generate through EOS (benchmarks, tests).
    job->ignore_eos = f.Bool("ignore_eos").value_or(false);
    if (f.Has("stream_options")) {
      const json& so = body["stream_options"];
      if (!so.is_object()) Fields::Fail("stream_options", "must be an object");
      Fields sf(so);
      job->include_usage = sf.Bool("include_usage").value_or(false);
    }
    SamplingParams& sp = job->gen.sampling;
    sp.temperature = static_cast<float>(f.Number("temperature", 0, 2).value_or(1.0));
    sp.top_p = static_cast<float>(f.Number("top_p", 0, 1).value_or(1.0));
    if (sp.top_p == 0) Fields::Fail("top_p", "must be > 0");
    sp.top_k = static_cast<int32_t>(f.Int("top_k", -1, 1 << 30).value_or(0));
    if (sp.top_k < 0) sp.top_k = 0;  // -1 means "off" in vLLM's API
    sp.min_p = static_cast<float>(f.Number("min_p", 0, 1).value_or(0.0));
    sp.presence_penalty = static_cast<float>(f.Number("presence_penalty", -2, 2).value_or(0.0));
    sp.frequency_penalty = static_cast<float>(f.Number("frequency_penalty", -2, 2).value_or(0.0));
    if (auto seed = f.Int("seed", INT64_MIN, INT64_MAX)) {
      sp.seed = static_cast<uint64_t>(*seed);
    } else {
      sp.seed = RandomSeed();
    }
    if (chat) {
      job->logprobs = f.Bool("logprobs").value_or(false);
      job->top_logprobs = static_cast<int>(f.Int("top_logprobs", 0, 20).value_or(0));
      if (job->top_logprobs > 0 && !job->logprobs) Fields::Fail("top_logprobs", "requires logprobs: true");
    } else if (f.Has("logprobs")) {
      job->top_logprobs = static_cast<int>(*f.Int("logprobs", 0, 5));
      job->logprobs = true;
    }
    sp.logprobs = job->logprobs;
    sp.top_logprobs = job->top_logprobs;
    if (auto s = sp.Validate(); !s.ok()) throw FromStatus(s);

    if (f.Has("stop")) {
      const json& st = body["stop"];
      if (st.is_string()) {
        job->stops.push_back(st.get<std::string>());
      } else if (st.is_array()) {
        for (const json& s : st) {
          if (!s.is_string()) Fields::Fail("stop", "must be a string or an array of strings");
          job->stops.push_back(s.get<std::string>());
        }
      } else {
        Fields::Fail("stop", "must be a string or an array of strings");
      }
      if (static_cast<int>(job->stops.size()) > options_.max_stop_sequences) {
        Fields::Fail("stop", absl::StrCat("has more than ", options_.max_stop_sequences, " entries"));
      }
      for (const auto& s : job->stops) {
        if (s.empty() || s.size() > 256) Fields::Fail("stop", "entries must be 1..256 bytes");
      }
    }

    // The prompt.
    if (chat) {
      if (!body.contains("messages")) Fields::Fail("messages", "is required");
      text::OrderedChatTemplateInputs in;
      in.messages = NormalizeMessages(body["messages"]);
      std::string tool_choice = "auto";
      if (f.Has("tool_choice")) {
        const json& tc = body["tool_choice"];
        if (!tc.is_string()) Fields::Fail("tool_choice", "only \"auto\" and \"none\" are supported");
        tool_choice = tc.get<std::string>();
        if (tool_choice != "auto" && tool_choice != "none") {
          Fields::Fail("tool_choice", "only \"auto\" and \"none\" are supported");
        }
      }
      if (f.Has("tools") && tool_choice != "none") {
        in.tools = ValidateTools(body["tools"]);
        job->parse_tools = !in.tools.empty();
      }
      if (f.Has("chat_template_kwargs")) {
        if (!body["chat_template_kwargs"].is_object()) Fields::Fail("chat_template_kwargs", "must be an object");
        in.kwargs = body["chat_template_kwargs"];
      }
      in.add_generation_prompt = f.Bool("add_generation_prompt").value_or(true);
      in.parse_tool_arguments = true;
      job->tool_schemas = text::ToolSchemas::FromOpenAiTools(nlohmann::json::parse(in.tools.dump()));
      auto prompt = chat_template_->Apply(in);
      if (!prompt.ok()) {
        throw ApiError{400, absl::StrCat("chat template: ", prompt.status().message()),
                       "invalid_request_error", "messages", ""};
      }
      job->starts_in_reasoning = text::ChatTemplate::PromptEndsInReasoning(*prompt);
      job->tool_format = job->parse_tools ? chat_template_->tool_call_format() : text::ToolCallFormat::kNone;
      auto ids = tokenizer_->Encode(*prompt, /*allow_special=*/true);
      if (!ids.ok()) throw FromStatus(ids.status());
      job->gen.prompt = std::move(*ids);
    } else {
      if (!f.Has("prompt")) Fields::Fail("prompt", "is required");
      json p = body["prompt"];
      if (p.is_array() && p.size() == 1 && (p[0].is_string() || p[0].is_array())) p = p[0];
      if (p.is_string()) {
        auto ids = tokenizer_->Encode(p.get<std::string>(), /*allow_special=*/true);
        if (!ids.ok()) throw FromStatus(ids.status());
        job->gen.prompt = std::move(*ids);
      } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
        for (const json& t : p) {
          if (!t.is_number_integer()) Fields::Fail("prompt", "token arrays must hold integers only");
          job->gen.prompt.push_back(t.get<int32_t>());
        }
      } else {
        Fields::Fail("prompt", "must be a string, an array of token ids, or an array holding one of those "
                               "(several prompts per request are not supported)");
      }
      const int64_t vocab = tokenizer_->vocab_size();
      for (int32_t t : job->gen.prompt) {
        if (t < 0 || t >= vocab) Fields::Fail("prompt", absl::StrCat("token id ", t, " is outside [0, ", vocab, ")"));
      }
    }
    if (job->gen.prompt.empty()) Fields::Fail(chat ? "messages" : "prompt", "renders to an empty prompt");

    // Length limits, before any work.
    const int64_t prompt_len = static_cast<int64_t>(job->gen.prompt.size());
    const int64_t ctx = engine_->max_context();
    std::optional<int64_t> max_tokens = f.Int("max_completion_tokens", 1, INT32_MAX);
    if (!max_tokens) max_tokens = f.Int("max_tokens", 1, INT32_MAX);
    if (max_tokens) {
      if (ctx > 0 && prompt_len + *max_tokens > ctx) {
        throw ApiError{400,
                       absl::StrCat("this model's maximum context length is ", ctx, " tokens; the request has ",
                                    prompt_len, " prompt tokens and asks for ", *max_tokens,
                                    " completion tokens"),
                       "invalid_request_error", f.Has("max_completion_tokens") ? "max_completion_tokens" : "max_tokens",
                       "context_length_exceeded"};
      }
      job->gen.max_tokens = static_cast<int32_t>(*max_tokens);
    } else {
      if (ctx > 0 && prompt_len >= ctx) {
        throw ApiError{400, absl::StrCat("the prompt has ", prompt_len, " tokens; this model's maximum context length is ", ctx),
                       "invalid_request_error", chat ? "messages" : "prompt", "context_length_exceeded"};
      }
      job->gen.max_tokens = static_cast<int32_t>(
          ctx > 0 ? std::min<int64_t>(options_.default_max_tokens, ctx - prompt_len) : options_.default_max_tokens);
    }
  } catch (const ApiError& e) {
    http::HeaderList h;
    metrics_->CountHttp(route, e.status);
    r->Send(e.status, "application/json", ErrorJson(e).dump() + "\n", std::move(h));
    return;
  }

  // Admission.
  auto refuse = [&](int status, const std::string& msg, const std::string& type, const std::string& code) {
    metrics_->CountHttp(route, status);
    r->Send(status, "application/json", ErrorJson({status, msg, type, "", code}).dump() + "\n",
            {{"Retry-After", "1"}});
  };
  if (draining_) return refuse(503, "server is shutting down", "server_error", "shutting_down");
  if (absl::Status s = engine_->Ready(); !s.ok()) {
    return refuse(503, std::string(s.message()), "server_error", "ring_unavailable");
  }
  job->slot = engine_->TryAcquire();
  if (job->slot == nullptr) {
    return refuse(429, "too many concurrent requests; retry later", "rate_limit_error", "rate_limit_exceeded");
  }
  job->id = RandomId(chat ? "chatcmpl-" : "cmpl-");
  job->gen.id = job->id;
  if (!job->ignore_eos) job->gen.stop_token_ids = options_.eos_token_ids;
  job->r = r;
  std::weak_ptr<Job> weak = job;
  r->OnClientGone([weak] {
    if (auto j = weak.lock()) j->cancelled = true;
  });
  ++in_flight_;
  {
    std::lock_guard<std::mutex> l(jobs_mu_);
    std::erase_if(jobs_, [](const std::weak_ptr<Job>& w) { return w.expired(); });
    jobs_.push_back(job);
  }
  engine_->Submit([this, job] {
    Generate(job);
    job->slot.reset();
    --in_flight_;
  });
}

void OpenAiApi::CancelAll() {
  cancel_all_ = true;
  std::lock_guard<std::mutex> l(jobs_mu_);
  for (auto& w : jobs_) {
    if (auto j = w.lock()) j->cancelled = true;
  }
}

void OpenAiApi::Generate(std::shared_ptr<Job> job) {
  const std::string route = job->chat ? "/v1/chat/completions" : "/v1/completions";
  const int64_t created = absl::ToUnixSeconds(absl::Now());
  http::HttpResponder& r = *job->r;
  text::StreamDecoder decoder(tokenizer_, /*skip_special_tokens=*/true);
  StopMatcher stop(job->stops);
  std::optional<text::StreamingOutputParser> parser;
  if (job->chat) parser.emplace(job->tool_format, job->starts_in_reasoning, job->tool_schemas);

  // Accumulated output (non-streaming answers and usage).
  std::string content, reasoning, completion_text;
  std::vector<text::ToolCall> tool_calls;
  json chat_logprobs = json::array();
  json cmpl_tokens = json::array(), cmpl_token_lps = json::array(), cmpl_top = json::array(),
       cmpl_offsets = json::array();
  bool stream_started = false;
  bool sent_role = false;
  int completion_tokens = 0;

  auto chunk_base = [&]() {
    json c = {{"id", job->id}, {"created", created}, {"model", options_.model_name},
              {"system_fingerprint", "ringserve-" RING_BUILD_VERSION}};
    c["object"] = job->chat ? "chat.completion.chunk" : "text_completion";
    if (job->include_usage) c["usage"] = nullptr;
    return c;
  };
  auto send_event = [&](const json& j) {
    if (!stream_started) {
      metrics_->CountHttp(route, 200);
      r.StartStream(200, "text/event-stream");
      stream_started = true;
    }
    r.WriteChunk("data: " + j.dump() + "\n\n");
  };
  // One token's logprob record, in the shape of the endpoint.
  auto token_text = [&](int32_t id) { return tokenizer_->Decode(std::vector<int32_t>{id}, false); };
  json pending_lp = json::array();  // chat: entries not yet sent
  auto record_logprob = [&](const SampledToken& t) {
    if (!job->logprobs) return;
    const std::string tok = token_text(t.id);
    if (job->chat) {
      json top = json::array();
      for (const auto& [id, lp] : t.top_logprobs) {
        const std::string s = token_text(id);
        top.push_back({{"token", s}, {"logprob", lp}, {"bytes", BytesOf(s)}});
      }
      json e = {{"token", tok}, {"logprob", t.logprob}, {"bytes", BytesOf(tok)}, {"top_logprobs", top}};
      chat_logprobs.push_back(e);
      pending_lp.push_back(e);
    } else {
      json top = json::object();
      // Keys are token texts; two tokens can decode alike (e.g. partial UTF-8 -> U+FFFD):
      // keep the first, i.e. the more likely one.
      for (const auto& [id, lp] : t.top_logprobs) {
        const std::string key = token_text(id);
        if (!top.contains(key)) top[key] = lp;
      }
      cmpl_offsets.push_back(static_cast<int64_t>(completion_text.size()));
      cmpl_tokens.push_back(tok);
      cmpl_token_lps.push_back(t.logprob);
      cmpl_top.push_back(top);
    }
  };
  // Reasoning / content / tool-call pieces from the parser: accumulated, and streamed.
  auto emit_chat = [&](const text::OutputDelta& d) {
    content += d.content;
    reasoning += d.reasoning_content;
    const size_t first_new = tool_calls.size();
    for (const auto& tc : d.tool_calls) tool_calls.push_back(tc);
    if (!job->stream) return;
    const bool payload = !d.content.empty() || !d.reasoning_content.empty() || !d.tool_calls.empty();
    if (!payload && pending_lp.empty()) return;
    json delta = json::object();
    if (!sent_role) {
      delta["role"] = "assistant";
      sent_role = true;
    }
    if (!d.content.empty()) delta["content"] = d.content;
    if (!d.reasoning_content.empty()) delta["reasoning_content"] = d.reasoning_content;
    if (!d.tool_calls.empty()) {
      json arr = json::array();
      for (size_t i = first_new; i < tool_calls.size(); ++i) {
        arr.push_back(ToolCallJson(tool_calls[i], static_cast<int>(i), true));
      }
      delta["tool_calls"] = arr;
    }
    json choice = {{"index", 0}, {"delta", delta}, {"finish_reason", nullptr}};
    choice["logprobs"] = pending_lp.empty() ? json(nullptr) : json({{"content", pending_lp}});
    pending_lp = json::array();
    json c = chunk_base();
    c["choices"] = json::array({choice});
    send_event(c);
  };
  size_t cmpl_lp_sent = 0;
  // Text that passed the stop matcher: to the reasoning/tool parser (chat) and the client.
  auto deliver = [&](const std::string& piece) {
    if (job->chat) {
      emit_chat(parser->Push(piece));
      return;
    }
    completion_text += piece;
    const bool new_lp = cmpl_tokens.size() > cmpl_lp_sent;
    if (!job->stream || (piece.empty() && !new_lp)) return;
    json lp = nullptr;
    if (new_lp) {
      auto slice = [&](const json& a) {
        return json(std::vector<json>(a.begin() + cmpl_lp_sent, a.end()));
      };
      lp = {{"tokens", slice(cmpl_tokens)}, {"token_logprobs", slice(cmpl_token_lps)},
            {"top_logprobs", slice(cmpl_top)}, {"text_offset", slice(cmpl_offsets)}};
      cmpl_lp_sent = cmpl_tokens.size();
    }
    json c = chunk_base();
    c["choices"] = json::array({{{"index", 0}, {"text", piece}, {"finish_reason", nullptr}, {"logprobs", lp}}});
    send_event(c);
  };

  bool stopped_by_string = false;
  TokenSink sink = [&](const SampledToken& t) -> bool {
    ++completion_tokens;
    if (cancel_all_) job->cancelled = true;
    record_logprob(t);
    const std::string piece = decoder.Push(t.id);
    StopMatcher::Result sr = stop.Push(piece);
    deliver(sr.text);
    if (sr.stopped) stopped_by_string = true;
    return !sr.stopped;
  };

  absl::StatusOr<GenerateResult> res = engine_->Generate(job->gen, sink, &job->cancelled);

  if (res.ok() && res->finish == FinishReason::kCancelled) {
    if (!r.client_gone()) {
      // Cancelled by shutdown while the client is still there: tell it why.
      res = absl::UnavailableError("server is shutting down; generation cancelled");
    } else {
      metrics_->CountHttp(route, 499);
      if (stream_started) r.EndStream();
      return;
    }
  }
  if (!res.ok()) {
    ApiError e = FromStatus(res.status());
    if (stream_started) {
      // Mid-stream failure: an error event (the OpenAI client raises it), then the end.
      send_event(ErrorJson(e));
      r.WriteChunk("data: [DONE]\n\n");
      r.EndStream();
    } else {
      metrics_->CountHttp(route, e.status);
      http::HeaderList h;
      if (e.status == 503 || e.status == 429) h.emplace_back("Retry-After", "1");
      r.Send(e.status, "application/json", ErrorJson(e).dump() + "\n", std::move(h));
    }
    return;
  }

  // Flush what the decoder and the stop matcher held back.
  if (!stopped_by_string) {
    StopMatcher::Result sr = stop.Push(decoder.Finish());
    deliver(sr.text);
    stopped_by_string = sr.stopped;
    if (!sr.stopped) deliver(stop.Flush());
  }
  if (job->chat) emit_chat(parser->Finish());

  const FinishReason finish = stopped_by_string ? FinishReason::kStop : res->finish;
  const std::string finish_name = FinishName(finish, !tool_calls.empty());
  const int prompt_tokens = static_cast<int>(job->gen.prompt.size());
  json usage = {{"prompt_tokens", prompt_tokens},
                {"completion_tokens", completion_tokens},
                {"total_tokens", prompt_tokens + completion_tokens}};

  if (job->stream) {
    json c = chunk_base();
    json choice = {{"index", 0}, {"finish_reason", finish_name}};
    if (job->chat) {
      json delta = json::object();
      if (!sent_role) delta["role"] = "assistant";
      choice["delta"] = delta;
      choice["logprobs"] = pending_lp.empty() ? json(nullptr) : json({{"content", pending_lp}});
    } else {
      choice["text"] = "";
      choice["logprobs"] = nullptr;
    }
    c["choices"] = json::array({choice});
    send_event(c);
    if (job->include_usage) {
      json u = chunk_base();
      u["choices"] = json::array();
      u["usage"] = usage;
      send_event(u);
    }
    r.WriteChunk("data: [DONE]\n\n");
    r.EndStream();
    return;
  }

  json out = {{"id", job->id}, {"created", created}, {"model", options_.model_name},
              {"system_fingerprint", "ringserve-" RING_BUILD_VERSION}, {"usage", usage}};
  if (job->chat) {
    json msg = {{"role", "assistant"}};
    msg["content"] = content.empty() && !tool_calls.empty() ? json(nullptr) : json(content);
    if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
    if (!tool_calls.empty()) {
      json arr = json::array();
      for (size_t i = 0; i < tool_calls.size(); ++i) arr.push_back(ToolCallJson(tool_calls[i], static_cast<int>(i), false));
      msg["tool_calls"] = arr;
    }
    out["object"] = "chat.completion";
    out["choices"] = json::array({{{"index", 0}, {"message", msg}, {"finish_reason", finish_name},
                                   {"logprobs", job->logprobs ? json({{"content", chat_logprobs}}) : json(nullptr)}}});
  } else {
    out["object"] = "text_completion";
    json lp = nullptr;
    if (job->logprobs) {
      lp = {{"tokens", cmpl_tokens}, {"token_logprobs", cmpl_token_lps},
            {"top_logprobs", cmpl_top}, {"text_offset", cmpl_offsets}};
    }
    out["choices"] = json::array({{{"index", 0}, {"text", completion_text}, {"finish_reason", finish_name},
                                   {"logprobs", lp}}});
  }
  metrics_->CountHttp(route, 200);
  r.Send(200, "application/json", out.dump() + "\n");
}

}  // namespace ring
