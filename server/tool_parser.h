// File: server/tool_parser.h
//
// Splits what the model generated into the OpenAI assistant message fields: visible
// content, reasoning_content (the <think>…</think> part) and tool_calls.
//
// Formats (the chat template's, see ChatTemplate::tool_call_format()):
//   kGlm   GLM-4.5 … GLM-5.x: <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…
//          </tool_call>, newlines between the parts optional. A value is kept as JSON when
//          it parses as JSON (or as a Python literal), else as the string — vLLM's
//          glm4_moe parser rule; with tool schemas, arguments whose declared type is
//          "string" are always kept verbatim.
//   kQwen  Qwen3: <tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>.
//   kNone  no tool calls (DeepSeek's formats are not parsed); only reasoning is split off.
// Reasoning: text between <think> and </think>. `starts_in_reasoning` says the prompt
// already opened the block (GLM-5 / Qwen3-thinking / DeepSeek-V3.1 end their generation
// prompt with "<think>" when thinking is on; see ChatTemplate::PromptEndsInReasoning), so
// generation starts inside it; the model may also emit <think> itself (Qwen3 hybrid).
// Whitespace: each content or reasoning segment is trimmed at both ends (the newlines
// models put around </think> and between tool calls); inner whitespace is kept.
// A <tool_call> block that does not parse is passed through as content, never dropped.
//
//   ring::text::AssistantOutput out = ring::text::ParseAssistantOutput(
//       generated, ToolCallFormat::kGlm, /*starts_in_reasoning=*/true);
//
//   ring::text::StreamingOutputParser p(ToolCallFormat::kQwen, false);
//   for (piece : decoded_pieces) Send(p.Push(piece));   // partial markers held back
//   Send(p.Finish());
//
// Streaming and whole-text parsing agree exactly (apart from the random tool call ids):
// ParseAssistantOutput is Push(text) + Finish().
#ifndef RINGSERVE_SERVER_TOOL_PARSER_H_
#define RINGSERVE_SERVER_TOOL_PARSER_H_

#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace ring::text {

enum class ToolCallFormat { kNone, kGlm, kQwen };

struct ToolCall {
  std::string id;  // "call_" + 24 random alphanumerics
  std::string name;
  std::string arguments_json;  // a JSON object, json.dumps style: {"city": "Paris"}
};

struct AssistantOutput {
  std::string content;
  std::string reasoning_content;
  std::vector<ToolCall> tool_calls;
};

// What the request's `tools` declare, for the GLM rule "declared string arguments stay
// strings" (`{"type": "string"}` properties). Empty: no schemas, every value may be JSON.
struct ToolSchemas {
  std::set<std::pair<std::string, std::string>> string_args;  // (function, argument)

  // From an OpenAI `tools` array; ignores entries it does not understand.
  static ToolSchemas FromOpenAiTools(const nlohmann::json& tools);
};

// Whole-text parse.
AssistantOutput ParseAssistantOutput(absl::string_view text, ToolCallFormat format,
                                     bool starts_in_reasoning);
AssistantOutput ParseAssistantOutput(absl::string_view text, ToolCallFormat format,
                                     bool starts_in_reasoning, const ToolSchemas& schemas);

struct OutputDelta {
  std::string content;
  std::string reasoning_content;
  std::vector<ToolCall> tool_calls;

  bool empty() const { return content.empty() && reasoning_content.empty() && tool_calls.empty(); }
};

// Incremental parse of decoded text pieces. Push returns what can be emitted now; text
// that may be the start of a marker ("<thi", "</tool_") or an incomplete UTF-8 sequence is
// held back, and a tool call is emitted once its </tool_call> arrives. Finish flushes the
// rest (an unterminated tool call that still parses is emitted; otherwise it is content).
// Not thread-safe; one parser per generation.
class StreamingOutputParser {
 public:
  StreamingOutputParser(ToolCallFormat format, bool starts_in_reasoning);
  StreamingOutputParser(ToolCallFormat format, bool starts_in_reasoning, ToolSchemas schemas);

  OutputDelta Push(absl::string_view text);
  OutputDelta Finish();

 private:
  enum class State { kContent, kReasoning, kToolCall };

  void Process(bool final, OutputDelta* out);
  // Appends segment text with the trimming rule (leading and trailing whitespace of a
  // segment dropped; inner whitespace emitted once non-space text follows it).
  void EmitText(absl::string_view text, OutputDelta* out);
  void EndSegment();
  void CompleteToolCall(absl::string_view body, bool terminated, OutputDelta* out);

  ToolCallFormat format_;
  ToolSchemas schemas_;
  State state_;
  std::string buf_;
  std::string pending_ws_;
  bool segment_has_text_ = false;
  bool finished_ = false;
};

// Parses one tool call body (the text between <tool_call> and </tool_call>). False when
// it is not a well-formed call of `format`.
bool ParseToolCallBody(absl::string_view body, ToolCallFormat format, const ToolSchemas& schemas,
                       ToolCall* call);

}  // namespace ring::text

#endif  // RINGSERVE_SERVER_TOOL_PARSER_H_
