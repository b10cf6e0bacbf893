// The OpenAI layer over a scripted ring: the ring "generates" a fixed token sequence, so
// the paths a random tiny model never takes are exercised deterministically — a GLM tool
// call after reasoning (non-streaming and streamed as deltas), x-api-key auth, EOS.
#include "server/openai_api.h"

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "gtest/gtest.h"
#include "models/bpe_builder.h"
#include "models/temp_dir_for_test.h"
#include "nlohmann/json.hpp"

namespace ring {
namespace {

using json = nlohmann::json;

// Emits `script` one token per step after the prompt, then `eos` forever.
class ScriptedSequence final : public RingSequence {
 public:
  ScriptedSequence(std::vector<int32_t> script, int32_t eos, int64_t vocab)
      : script_(std::move(script)), eos_(eos), vocab_(vocab) {}
  absl::StatusOr<std::vector<float>> Step(const std::vector<int32_t>& tokens) override {
    position_ += static_cast<int64_t>(tokens.size());
    std::vector<float> logits(vocab_, 0.0f);
    const int32_t next = emitted_ < script_.size() ? script_[emitted_] : eos_;
    ++emitted_;
    logits[next] = 100.0f;
    return logits;
  }
  int64_t position() const override { return position_; }

 private:
  std::vector<int32_t> script_;
  int32_t eos_;
  int64_t vocab_;
  size_t emitted_ = 0;
  int64_t position_ = 0;
};

class ScriptedRing final : public Ring {
 public:
  ScriptedRing(std::vector<int32_t> script, int32_t eos, int64_t vocab)
      : script_(std::move(script)), eos_(eos) {
    info_.model_type = "scripted";
    info_.num_layers = 1;
    info_.vocab_size = vocab;
    info_.max_position_embeddings = 4096;
    stages_.push_back({"stage 0 (scripted)", {0, 1}, 0});
  }
  const RingModelInfo& model() const override { return info_; }
  const std::vector<RingStageInfo>& stages() const override { return stages_; }
  absl::StatusOr<std::unique_ptr<RingSequence>> NewSequence(const std::string&) override {
    return std::make_unique<ScriptedSequence>(script_, eos_, info_.vocab_size);
  }
  uint64_t checksum_failures() const override { return 0; }
  std::string Diagnose() override { return "scripted"; }
  std::vector<ActivationStats> activation_stats() const override { return {}; }

 private:
  std::vector<int32_t> script_;
  int32_t eos_;
  RingModelInfo info_;
  std::vector<RingStageInfo> stages_;
};

// Collects a response; Wait() returns once it is complete.
class Capture final : public http::HttpResponder {
 public:
  void Send(int status, std::string, std::string body, http::HeaderList headers) override {
    std::lock_guard<std::mutex> l(mu_);
    status_ = status;
    body_ = std::move(body);
    headers_ = std::move(headers);
    done_ = true;
    cv_.notify_all();
  }
  void StartStream(int status, std::string, http::HeaderList) override {
    std::lock_guard<std::mutex> l(mu_);
    status_ = status;
  }
  bool WriteChunk(std::string data) override {
    std::lock_guard<std::mutex> l(mu_);
    body_ += data;
    return true;
  }
  void EndStream() override {
    std::lock_guard<std::mutex> l(mu_);
    done_ = true;
    cv_.notify_all();
  }
  bool client_gone() const override { return false; }
  void OnClientGone(std::function<void()>) override {}

  std::pair<int, std::string> Wait() {
    std::unique_lock<std::mutex> l(mu_);
    EXPECT_TRUE(cv_.wait_for(l, std::chrono::seconds(20), [this] { return done_; })) << "no response";
    return {status_, body_};
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int status_ = 0;
  std::string body_;
  http::HeaderList headers_;
  bool done_ = false;
};

class OpenAiApiTest : public TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    const std::string dir = dir_.string();
    const TokenizerFiles files = BuildTokenizerFiles(TokenizerStyle::kGlm, 4096);
    std::ofstream(dir + "/tokenizer.json") << files.tokenizer_json;
    std::ofstream(dir + "/tokenizer_config.json") << files.tokenizer_config_json;
    std::ofstream(dir + "/chat_template.jinja") << files.chat_template;
    auto tok = text::Tokenizer::FromModelDir(dir);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = std::move(*tok);
    auto tmpl = text::ChatTemplate::FromModelDir(dir);
    ASSERT_TRUE(tmpl.ok()) << tmpl.status();
    template_.emplace(std::move(*tmpl));
    eos_ = static_cast<int32_t>(files.TokenId("<|endoftext|>"));
    vocab_ = files.vocab_size;
  }

  // Starts an engine + API whose ring generates `text` (then EOS).
  void Script(const std::string& text) {
    auto ids = tokenizer_->Encode(text, /*allow_special=*/true);
    ASSERT_TRUE(ids.ok());
    const std::vector<int32_t> script = *ids;
    const int32_t eos = eos_;
    const int64_t vocab = vocab_;
    Engine::Options eo;
    eo.max_concurrent = 2;
    RingOptions ro;
    ro.model = "scripted";
    engine_ = std::make_unique<Engine>(ro, eo, &metrics_, [script, eos, vocab](const RingOptions&) {
      return absl::StatusOr<std::unique_ptr<Ring>>(std::make_unique<ScriptedRing>(script, eos, vocab));
    });
    engine_->Start();
    ASSERT_TRUE(engine_->WaitReady(absl::Seconds(10)).ok());
    ApiOptions ao;
    ao.model_name = "m";
    ao.api_keys = {"sk-unit-test-key"};
    ao.eos_token_ids = {eos_};
    api_ = std::make_unique<OpenAiApi>(ao, engine_.get(), &metrics_, tokenizer_.get(), &*template_);
  }

  std::pair<int, std::string> Post(const std::string& path, const json& body,
                                   const std::string& key_header = "authorization") {
    http::HttpRequest req;
    req.method = "POST";
    req.path = req.target = path;
    req.headers[key_header] = key_header == "authorization" ? "Bearer sk-unit-test-key" : "sk-unit-test-key";
    req.body = body.dump();
    auto cap = std::make_shared<Capture>();
    api_->Handle(req, cap);
    return cap->Wait();
  }

  json ToolRequest(bool stream) {
    json r = json::parse(R"({
      "model": "m",
      "messages": [{"role": "user", "content": "Weather in Paris?"}],
      "tools": [{"type": "function", "function": {"name": "get_weather",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    })");
    r["stream"] = stream;
    return r;
  }

  std::unique_ptr<text::Tokenizer> tokenizer_;
  std::optional<text::ChatTemplate> template_;
  int32_t eos_ = 0;
  int64_t vocab_ = 0;
  ServerMetrics metrics_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<OpenAiApi> api_;
};

constexpr char kToolScript[] =
    "check the weather</think><tool_call>get_weather<arg_key>city</arg_key>"
    "<arg_value>Paris</arg_value></tool_call>";

TEST_F(OpenAiApiTest, ToolCallAfterReasoning) {
  Script(kToolScript);
  auto [status, body] = Post("/v1/chat/completions", ToolRequest(false));
  ASSERT_EQ(status, 200) << body;
  const json r = json::parse(body);
  const json& choice = r["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(choice["message"]["reasoning_content"], "check the weather");
  EXPECT_TRUE(choice["message"]["content"].is_null());
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  const json& tc = choice["message"]["tool_calls"][0];
  EXPECT_EQ(tc["type"], "function");
  EXPECT_EQ(tc["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(tc["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}}));
  EXPECT_EQ(r["usage"]["completion_tokens"].get<int>(),
            static_cast<int>(tokenizer_->Encode(kToolScript, true)->size()));
}

TEST_F(OpenAiApiTest, ToolCallStreamsAsDeltas) {
  Script(kToolScript);
  auto [status, body] = Post("/v1/chat/completions", ToolRequest(true), "x-api-key");
  ASSERT_EQ(status, 200) << body;
  std::string reasoning;
  json calls = json::array();
  std::vector<std::string> finishes;
  bool done = false;
  for (size_t at = 0; (at = body.find("data: ", at)) != std::string::npos;) {
    const size_t end = body.find("\n\n", at);
    const std::string data = body.substr(at + 6, end - at - 6);
    at = end;
    if (data == "[DONE]") {
      done = true;
      continue;
    }
    const json c = json::parse(data);
    ASSERT_FALSE(c.contains("error")) << data;
    const json& ch = c["choices"][0];
    if (ch["delta"].contains("reasoning_content")) reasoning += ch["delta"]["reasoning_content"].get<std::string>();
    if (ch["delta"].contains("tool_calls")) {
      for (const auto& t : ch["delta"]["tool_calls"]) calls.push_back(t);
    }
    if (!ch["finish_reason"].is_null()) finishes.push_back(ch["finish_reason"]);
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(reasoning, "check the weather");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["index"], 0);
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(finishes, std::vector<std::string>{"tool_calls"});
}

TEST_F(OpenAiApiTest, WithoutToolsTheMarkupIsContent) {
  Script("plain answer");
  json req = {{"model", "m"},
              {"messages", {{{"role", "user"}, {"content", "hi"}}}},
              {"chat_template_kwargs", {{"enable_thinking", false}}}};
  auto [status, body] = Post("/v1/chat/completions", req);
  ASSERT_EQ(status, 200) << body;
  const json r = json::parse(body);
  EXPECT_EQ(r["choices"][0]["message"]["content"], "plain answer");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");  // EOS
}

TEST_F(OpenAiApiTest, WrongKeyAndMalformedInput) {
  Script("x");
  http::HttpRequest req;
  req.method = "POST";
  req.path = req.target = "/v1/chat/completions";
  req.headers["x-api-key"] = "sk-wrong";
  req.body = "{}";
  auto cap = std::make_shared<Capture>();
  api_->Handle(req, cap);
  auto [status, body] = cap->Wait();
  EXPECT_EQ(status, 401);
  EXPECT_EQ(json::parse(body)["error"]["code"], "invalid_api_key");
  auto [s2, b2] = Post("/v1/chat/completions", {{"model", "m"}, {"messages", "hello"}});
  EXPECT_EQ(s2, 400);
  EXPECT_EQ(json::parse(b2)["error"]["param"], "messages");
  auto [s3, b3] = Post("/v1/chat/completions",
                       {{"model", "m"}, {"messages", {{{"role", "wizard"}, {"content", "x"}}}}});
  EXPECT_EQ(s3, 400);
  EXPECT_EQ(json::parse(b3)["error"]["param"], "messages[0].role");
}

}  // namespace
}  // namespace ring
