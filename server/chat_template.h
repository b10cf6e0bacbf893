// File: server/chat_template.h
//
// A model's chat template: turns an OpenAI-shaped conversation into the prompt text,
// rendering exactly what HF transformers' tokenizer.apply_chat_template(messages,
// tools=..., add_generation_prompt=..., **chat_template_kwargs, tokenize=False) renders
// (tests/chat_template_parity.py checks this against transformers itself). Like
// transformers, Apply first drops message keys whose value is null and copies a message's
// reasoning (reasoning_content / thinking / reasoning) into both `reasoning_content` and
// `thinking`; the template sees `messages`, `tools`, `documents` (None),
// `add_generation_prompt`, bos_token / eos_token, and every chat_template_kwargs entry.
//
//   absl::StatusOr<ChatTemplate> t = ChatTemplate::FromModelDir("/models/GLM-5.2-mxfp4");
//   ring::text::OrderedChatTemplateInputs in;
//   in.messages = request["messages"];           // request parsed as nlohmann::ordered_json
//   in.tools = request.value("tools", nlohmann::ordered_json());
//   in.kwargs = request.value("chat_template_kwargs", nlohmann::ordered_json::object());
//   in.parse_tool_arguments = true;              // OpenAI sends arguments as JSON strings
//   absl::StatusOr<std::string> prompt = t->Apply(in);
//   bool thinking = ChatTemplate::PromptEndsInReasoning(*prompt);
//   StreamingOutputParser parser(t->tool_call_format(), thinking);
//
// Key order: Python dicts keep insertion order and templates print tools with tojson, so
// for byte-identical prompts parse the request with nlohmann::ordered_json and use
// OrderedChatTemplateInputs. ChatTemplateInputs (nlohmann::json) works too, but its
// objects iterate in sorted key order.
//
// Thread safety: a ChatTemplate is immutable; Apply may run concurrently.
#ifndef RINGSERVE_SERVER_CHAT_TEMPLATE_H_
#define RINGSERVE_SERVER_CHAT_TEMPLATE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "server/jinja.h"
#include "server/tool_parser.h"

namespace ring::text {

template <typename Json>
struct BasicChatTemplateInputs {
  // OpenAI shape: role, content (string or list of parts), tool_calls, tool_call_id,
  // reasoning_content, name.
  Json messages = Json::array();
  Json tools;  // null, or an array of OpenAI tool objects
  bool add_generation_prompt = true;
  Json kwargs = Json::object();  // chat_template_kwargs, e.g. {"enable_thinking": false}
  // OpenAI clients send tool_calls[].function.arguments as a JSON string, while GLM-style
  // templates iterate it as a mapping. true: decode such strings into objects first, as
  // vLLM does for every template. HF apply_chat_template does not (parity tests keep this
  // false); strings that are not JSON objects are left alone either way.
  bool parse_tool_arguments = false;
};
using ChatTemplateInputs = BasicChatTemplateInputs<nlohmann::json>;
using OrderedChatTemplateInputs = BasicChatTemplateInputs<nlohmann::ordered_json>;

class ChatTemplate {
 public:
  // chat_template.jinja if present, else chat_template.json {"chat_template": ...}, else
  // tokenizer_config.json "chat_template" (a string, or a list of {name, template}: the
  // one named "default", else the first). bos_token / eos_token come from
  // tokenizer_config.json (a string or {"content": ...}). NotFound when the directory has
  // no template; InvalidArgument for malformed JSON or a template that does not parse.
  static absl::StatusOr<ChatTemplate> FromModelDir(const std::string& dir);
  static absl::StatusOr<ChatTemplate> FromString(absl::string_view source,
                                                 std::string bos_token = "",
                                                 std::string eos_token = "");

  // Renders the prompt. InvalidArgument for a malformed conversation (not a non-empty array
  // of objects; kwargs overriding messages/tools/documents/add_generation_prompt) and for
  // template errors (raise_exception's message verbatim, others with "line L:C: ").
  absl::StatusOr<std::string> Apply(const ChatTemplateInputs& in) const;
  absl::StatusOr<std::string> Apply(const OrderedChatTemplateInputs& in) const;

  // How the model writes tool calls, detected from the template text: kGlm when it
  // documents <arg_key>/<arg_value>, kQwen when it documents <tool_call> with a JSON
  // {"name", "arguments"} object, else kNone (DeepSeek's and Qwen3-Coder's formats too).
  ToolCallFormat tool_call_format() const { return tool_call_format_; }

  // Whether `prompt` (an Apply result) leaves the model inside a reasoning block: it ends
  // with "<think>" (optionally followed by whitespace). Pass as starts_in_reasoning.
  static bool PromptEndsInReasoning(absl::string_view prompt);

  const std::string& source() const { return source_; }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }

 private:
  ChatTemplate(jinja::Template tmpl, std::string source, std::string bos, std::string eos);

  jinja::Template template_;
  std::string source_;
  std::string bos_token_;
  std::string eos_token_;
  ToolCallFormat tool_call_format_ = ToolCallFormat::kNone;
};

}  // namespace ring::text

#endif  // RINGSERVE_SERVER_CHAT_TEMPLATE_H_
