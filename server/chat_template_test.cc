// Tests for ChatTemplate (server/chat_template.h): loading from a model directory, the
// transformers-compatible message preparation, and golden renders of real templates
// (tests/data/chat_templates; expected strings produced by transformers 5.24).
#include "server/chat_template.h"

#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "models/temp_dir_for_test.h"

namespace ring::text {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

std::string TemplatePath(const std::string& name) {
  std::string here = __FILE__;  // .../server/chat_template_test.cc
  return here.substr(0, here.rfind("/server/")) + "/tests/data/chat_templates/" + name;
}

std::string ReadTemplate(const std::string& name) {
  std::ifstream f(TemplatePath(name));
  EXPECT_TRUE(f.good()) << TemplatePath(name);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

ChatTemplate Load(const std::string& name, std::string bos = "", std::string eos = "") {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::FromString(ReadTemplate(name), bos, eos);
  EXPECT_TRUE(t.ok()) << name << ": " << t.status();
  return *std::move(t);
}

void WriteFile(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path) << text;
}

// A tool round trip in the OpenAI shape (content null on the tool-calling turn).
OrderedChatTemplateInputs ToolRoundTrip() {
  OrderedChatTemplateInputs in;
  in.messages = ordered_json::parse(R"([
    {"role": "user", "content": "Weather?"},
    {"role": "assistant", "content": null, "reasoning_content": "use tool",
     "tool_calls": [{"id": "c1", "type": "function",
                     "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"}])");
  in.tools = ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  return in;
}

TEST(ChatTemplateTest, Glm47GoldenRenders) {
  ChatTemplate t = Load("glm-4.7-flash.jinja");
  EXPECT_EQ(t.tool_call_format(), ToolCallFormat::kGlm);
  OrderedChatTemplateInputs in;
  in.messages = ordered_json::parse(R"([{"role": "user", "content": "Hi"}])");
  EXPECT_EQ(*t.Apply(in), "[gMASK]<sop><|user|>Hi<|assistant|><think>");
  in.kwargs["enable_thinking"] = false;
  EXPECT_EQ(*t.Apply(in), "[gMASK]<sop><|user|>Hi<|assistant|></think>");

  absl::StatusOr<std::string> prompt = t.Apply(ToolRoundTrip());
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_EQ(
      *prompt,
      "[gMASK]<sop><|system|>\n# Tools\n\nYou may call one or more functions to assist with "
      "the user query.\n\nYou are provided with function signatures within <tools></tools> "
      "XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
      "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
      "\"string\"}}}}}\n</tools>\n\nFor each function call, output the function name and "
      "arguments within the following XML format:\n<tool_call>{function-name}<arg_key>"
      "{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value><arg_key>{arg-key-2}"
      "</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call><|user|>Weather?"
      "<|assistant|><think>use tool</think><tool_call>get_weather<arg_key>city</arg_key>"
      "<arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>2</arg_value>"
      "</tool_call><|observation|><tool_response>sunny</tool_response><|assistant|><think>");
  EXPECT_TRUE(ChatTemplate::PromptEndsInReasoning(*prompt));
}

TEST(ChatTemplateTest, QwenFormatsAndThinkingSwitch) {
  ChatTemplate t = Load("qwen3.jinja");
  EXPECT_EQ(t.tool_call_format(), ToolCallFormat::kQwen);
  OrderedChatTemplateInputs in;
  in.messages = ordered_json::parse(R"([{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "Hi"}])");
  EXPECT_EQ(*t.Apply(in),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
  in.kwargs["enable_thinking"] = false;
  std::string off = *t.Apply(in);
  EXPECT_TRUE(absl::EndsWith(off, "<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(ChatTemplate::PromptEndsInReasoning(off));
  EXPECT_TRUE(ChatTemplate::PromptEndsInReasoning(*Load("qwen3-thinking-2507.jinja").Apply(in)));
}

TEST(ChatTemplateTest, DeepSeekHasNoParsedToolFormat) {
  EXPECT_EQ(Load("deepseek-v3.1.jinja").tool_call_format(), ToolCallFormat::kNone);
  EXPECT_EQ(Load("deepseek-v3.2.jinja").tool_call_format(), ToolCallFormat::kNone);
}

TEST(ChatTemplateTest, MessagesArePreparedLikeTransformers) {
  // Null keys are dropped (so `is defined` is false), reasoning is aliased to both names.
  absl::StatusOr<ChatTemplate> t = ChatTemplate::FromString(
      "{% for m in messages %}{{ m.role }}:{{ m.content is defined }}:"
      "{{ m.reasoning_content | default('-') }}:{{ m.thinking | default('-') }}:"
      "{{ m | list | join(',') }};{% endfor %}{{ tools is none }}{{ documents is none }}"
      "{{ bos_token }}{{ eos_token }}{{ add_generation_prompt }}{{ custom }}",
      "<s>", "</s>");
  ASSERT_TRUE(t.ok());
  OrderedChatTemplateInputs in;
  in.messages = ordered_json::parse(R"([
    {"role": "assistant", "content": null, "reasoning": "r1"},
    {"role": "user", "content": "x", "name": null}])");
  in.add_generation_prompt = false;
  in.kwargs["custom"] = 7;
  EXPECT_EQ(*t->Apply(in),
            "assistant:False:r1:r1:thinking,role,reasoning,reasoning_content;"
            "user:True:-:-:role,content;TrueTrue<s></s>False7");
}

TEST(ChatTemplateTest, ParseToolArgumentsDecodesOpenAiStrings) {
  ChatTemplate t = Load("glm-4.7-flash.jinja");
  OrderedChatTemplateInputs in = ToolRoundTrip();
  in.messages[1]["tool_calls"][0]["function"]["arguments"] = R"({"city": "Paris"})";
  // As given (HF behaviour) the GLM template cannot iterate a string...
  EXPECT_FALSE(absl::StrContains(*t.Apply(in), "<arg_key>city</arg_key>"));
  // ...decoded, it can.
  in.parse_tool_arguments = true;
  EXPECT_TRUE(absl::StrContains(*t.Apply(in),
                                "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris"));
}

TEST(ChatTemplateTest, UnorderedInputsWork) {
  ChatTemplate t = Load("synth-qwen.jinja");
  ChatTemplateInputs in;
  in.messages = json::array({{{"role", "user"}, {"content", "hello"}}});
  absl::StatusOr<std::string> out = t.Apply(in);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, RejectsMalformedInputs) {
  ChatTemplate t = Load("synth-glm.jinja");
  OrderedChatTemplateInputs in;
  EXPECT_EQ(t.Apply(in).status().code(), absl::StatusCode::kInvalidArgument);  // empty
  in.messages = ordered_json::parse(R"(["not an object"])");
  EXPECT_EQ(t.Apply(in).status().code(), absl::StatusCode::kInvalidArgument);
  in.messages = ordered_json::parse(R"([{"role": "user", "content": "x"}])");
  in.kwargs["messages"] = ordered_json::array();
  EXPECT_EQ(t.Apply(in).status().message(), "chat_template_kwargs may not set 'messages'");
  in.kwargs = ordered_json::object();
  in.tools = "not a list";
  EXPECT_EQ(t.Apply(in).status().code(), absl::StatusCode::kInvalidArgument);
  in.tools = nullptr;
  ordered_json deep = ordered_json::array();
  for (int k = 0; k < 1000; ++k) deep = ordered_json::array({deep});
  in.messages[0]["content"] = deep;
  EXPECT_EQ(t.Apply(in).status().message(), "chat input nests deeper than 256 levels");
}

TEST(ChatTemplateTest, RaiseExceptionMessageIsVerbatim) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::FromString(
      "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}"
      "{{ raise_exception('Conversation roles must be user/assistant') }}{% endif %}{% endfor %}");
  ASSERT_TRUE(t.ok());
  OrderedChatTemplateInputs in;
  in.messages = ordered_json::parse(R"([{"role": "tool", "content": "x"}])");
  absl::Status s = t->Apply(in).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "Conversation roles must be user/assistant");
}

class ChatTemplateDirTest : public TempDirTest {};

TEST_F(ChatTemplateDirTest, LoadsFromTokenizerConfig) {
  WriteFile(dir_ / "tokenizer_config.json", R"({
    "bos_token": {"__type": "AddedToken", "content": "<B>"}, "eos_token": "<E>",
    "chat_template": [{"name": "tool_use", "template": "tool"},
                      {"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"}]})");
  absl::StatusOr<ChatTemplate> t = ChatTemplate::FromModelDir(dir_.string());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->bos_token(), "<B>");
  EXPECT_EQ(t->eos_token(), "<E>");
  OrderedChatTemplateInputs in;
  in.messages = ordered_json::parse(R"([{"role": "user", "content": "x"}])");
  EXPECT_EQ(*t->Apply(in), "<B>x<E>");
  // chat_template.jinja wins over tokenizer_config.json.
  WriteFile(dir_ / "chat_template.jinja", "jinja file {{ eos_token }}\n");
  t = ChatTemplate::FromModelDir(dir_.string());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t->Apply(in), "jinja file <E>");
}

TEST_F(ChatTemplateDirTest, RealDeepSeekConfig) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::FromModelDir(TemplatePath("deepseek-v3-model"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->bos_token(), "<｜begin of sentence｜>");
  EXPECT_EQ(t->eos_token(), "<｜end of sentence｜>");
  OrderedChatTemplateInputs in;
  in.messages = ordered_json::parse(R"([{"role": "user", "content": "Hi"}])");
  EXPECT_EQ(
      *t->Apply(in),
      "      <｜begin of sentence｜><｜User｜>Hi<｜end of sentence｜>  <｜begin of sentence｜>"
      "<｜Assistant｜>");  // its indentation is outside block tags, so it stays
}

TEST_F(ChatTemplateDirTest, Errors) {
  EXPECT_EQ(ChatTemplate::FromModelDir(dir_.string()).status().code(), absl::StatusCode::kNotFound);
  WriteFile(dir_ / "tokenizer_config.json", "{not json");
  EXPECT_EQ(ChatTemplate::FromModelDir(dir_.string()).status().code(),
            absl::StatusCode::kInvalidArgument);
  WriteFile(dir_ / "tokenizer_config.json", "{}");
  WriteFile(dir_ / "chat_template.jinja", "{% if %}");
  absl::Status s = ChatTemplate::FromModelDir(dir_.string()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "chat_template.jinja: line 1:7")) << s;
}

TEST(ChatTemplateTest, EveryBundledTemplateParses) {
  for (const char* name :
       {"glm-4.5.jinja", "glm-4.6.jinja", "glm-4.7-flash.jinja", "glm-5.3-flash.jinja",
        "qwen3.jinja", "qwen3-instruct-2507.jinja", "qwen3-thinking-2507.jinja",
        "deepseek-v3.jinja", "deepseek-v3.1.jinja", "deepseek-v3.2.jinja", "synth-glm.jinja",
        "synth-qwen.jinja", "engine-features.jinja"}) {
    EXPECT_TRUE(ChatTemplate::FromString(ReadTemplate(name)).ok()) << name;
  }
}

}  // namespace
}  // namespace ring::text
