// Tests for the assistant-output parser (server/tool_parser.h): GLM and Qwen tool calls,
// reasoning, and streaming == whole-text at every split point.
#include "server/tool_parser.h"

#include <random>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace ring::text {
namespace {

struct Flat {
  std::string content, reasoning;
  std::vector<std::pair<std::string, std::string>> calls;  // (name, arguments)
  bool operator==(const Flat& o) const {
    return content == o.content && reasoning == o.reasoning && calls == o.calls;
  }
};

std::ostream& operator<<(std::ostream& os, const Flat& f) {
  os << "{content=" << testing::PrintToString(f.content)
     << " reasoning=" << testing::PrintToString(f.reasoning) << " calls=[";
  for (const auto& [n, a] : f.calls) os << n << a << ";";
  return os << "]}";
}

Flat Whole(absl::string_view text, ToolCallFormat format, bool in_reasoning,
           const ToolSchemas& schemas = ToolSchemas()) {
  AssistantOutput out = ParseAssistantOutput(text, format, in_reasoning, schemas);
  Flat f{out.content, out.reasoning_content, {}};
  for (const ToolCall& c : out.tool_calls) {
    EXPECT_TRUE(absl::StartsWith(c.id, "call_")) << c.id;
    f.calls.emplace_back(c.name, c.arguments_json);
  }
  return f;
}

Flat Streamed(const std::vector<std::string>& pieces, ToolCallFormat format, bool in_reasoning) {
  StreamingOutputParser p(format, in_reasoning);
  Flat f;
  auto take = [&](const OutputDelta& d) {
    f.content += d.content;
    f.reasoning += d.reasoning_content;
    for (const ToolCall& c : d.tool_calls) f.calls.emplace_back(c.name, c.arguments_json);
  };
  for (const std::string& piece : pieces) take(p.Push(piece));
  take(p.Finish());
  return f;
}

TEST(ToolParserTest, GlmToolCallsWithAndWithoutNewlines) {
  Flat f = Whole(
      "Let me "
      "check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
      "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"
      "<tool_call>search<arg_key>q</arg_key><arg_value>a \"b\"</arg_value><arg_key>opts</arg_key>"
      "<arg_value>{\"n\": 2, \"x\": [true, null]}</arg_value></tool_call>",
      ToolCallFormat::kGlm, false);
  EXPECT_EQ(f.content, "Let me check.");
  ASSERT_EQ(f.calls.size(), 2u);
  EXPECT_EQ(f.calls[0], std::make_pair(std::string("get_weather"),
                                       std::string(R"({"city": "Paris", "days": 3})")));
  EXPECT_EQ(
      f.calls[1],
      std::make_pair(std::string("search"),
                     std::string(R"({"q": "a \"b\"", "opts": {"n": 2, "x": [true, null]}})")));
}

TEST(ToolParserTest, GlmValuesFollowVllmDeserialization) {
  // json.loads, then ast.literal_eval, then the (stripped) string.
  Flat f = Whole(
      "<tool_call>f<arg_key>a</arg_key><arg_value> 1.50 </arg_value>"
      "<arg_key>b</arg_key><arg_value>{'k': True, 'n': None}</arg_value>"
      "<arg_key>c</arg_key><arg_value>true</arg_value>"
      "<arg_key>d</arg_key><arg_value>not json</arg_value>"
      "<arg_key>e</arg_key><arg_value>北京</arg_value></tool_call>",
      ToolCallFormat::kGlm, false);
  ASSERT_EQ(f.calls.size(), 1u);
  EXPECT_EQ(f.calls[0].second,
            R"({"a": 1.5, "b": {"k": true, "n": null}, "c": true, "d": "not json", "e": "北京"})");
  // Declared string parameters stay strings, untouched.
  ToolSchemas schemas = ToolSchemas::FromOpenAiTools(nlohmann::json::parse(R"([
      {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
       "properties": {"zip": {"type": "string"}, "n": {"type": "integer"}}}}}])"));
  f = Whole(
      "<tool_call>f<arg_key>zip</arg_key><arg_value> 01234</arg_value>"
      "<arg_key>n</arg_key><arg_value>5</arg_value></tool_call>",
      ToolCallFormat::kGlm, false, schemas);
  EXPECT_EQ(f.calls[0].second, R"({"zip": " 01234", "n": 5})");
}

TEST(ToolParserTest, GlmReasoningStartsInPrompt) {
  Flat f = Whole(
      "The user wants weather.\n</think>I'll look it up.\n<tool_call>get_weather\n"
      "<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n</tool_call>",
      ToolCallFormat::kGlm, true);
  EXPECT_EQ(f.reasoning, "The user wants weather.");
  EXPECT_EQ(f.content, "I'll look it up.");
  ASSERT_EQ(f.calls.size(), 1u);
  EXPECT_EQ(f.calls[0].second, R"({"city": "Oslo"})");
  // Tool markup inside reasoning is just reasoning.
  f = Whole("maybe <tool_call>x</tool_call>?</think>ok", ToolCallFormat::kGlm, true);
  EXPECT_EQ(f.reasoning, "maybe <tool_call>x</tool_call>?");
  EXPECT_EQ(f.content, "ok");
  EXPECT_TRUE(f.calls.empty());
  // Truncated generation: everything stays reasoning.
  EXPECT_EQ(Whole("still thinking", ToolCallFormat::kGlm, true).reasoning, "still thinking");
}

TEST(ToolParserTest, QwenToolCallsAndSelfOpenedThinking) {
  Flat f = Whole(
      "<think>\nNeed two lookups.\n</think>\n\nSure.\n<tool_call>\n"
      "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": \\\"CET\\\"}\"}\n"
      "</tool_call>",
      ToolCallFormat::kQwen, false);
  EXPECT_EQ(f.reasoning, "Need two lookups.");
  EXPECT_EQ(f.content, "Sure.");
  ASSERT_EQ(f.calls.size(), 2u);
  EXPECT_EQ(f.calls[0].second, R"({"city": "Paris"})");
  EXPECT_EQ(f.calls[1], std::make_pair(std::string("get_time"), std::string(R"({"tz": "CET"})")));
  // No arguments -> {}.
  f = Whole("<tool_call>{\"name\": \"now\"}</tool_call>", ToolCallFormat::kQwen, false);
  EXPECT_EQ(f.calls[0].second, "{}");
}

TEST(ToolParserTest, MalformedCallsStayVisible) {
  Flat f = Whole("a<tool_call>{not json}</tool_call>b", ToolCallFormat::kQwen, false);
  EXPECT_TRUE(f.calls.empty());
  EXPECT_EQ(f.content, "a<tool_call>{not json}</tool_call>b");
  f = Whole("<tool_call>f<arg_key>k</arg_key>junk</tool_call>", ToolCallFormat::kGlm, false);
  EXPECT_TRUE(f.calls.empty());
  EXPECT_EQ(f.content, "<tool_call>f<arg_key>k</arg_key>junk</tool_call>");
  // Without a tool format nothing is parsed.
  f = Whole("<tool_call>{\"name\": \"x\"}</tool_call>", ToolCallFormat::kNone, false);
  EXPECT_EQ(f.content, "<tool_call>{\"name\": \"x\"}</tool_call>");
}

TEST(ToolParserTest, UnterminatedCallAtEndOfStream) {
  Flat f = Whole("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}", ToolCallFormat::kQwen,
                 false);
  ASSERT_EQ(f.calls.size(), 1u);
  EXPECT_EQ(f.calls[0].second, R"({"a": 1})");
  f = Whole("<tool_call>\n{\"name\": \"f\", \"argu", ToolCallFormat::kQwen, false);
  EXPECT_TRUE(f.calls.empty());
  EXPECT_EQ(f.content, "<tool_call>\n{\"name\": \"f\", \"argu");
}

TEST(ToolParserTest, StreamingHoldsBackPartialMarkers) {
  StreamingOutputParser p(ToolCallFormat::kGlm, false);
  OutputDelta d = p.Push("Hello <thi");
  EXPECT_EQ(d.content, "Hello");
  d = p.Push("nk>plan</th");
  EXPECT_EQ(d.content, "");
  EXPECT_EQ(d.reasoning_content, "plan");
  d = p.Push("ink>Done <tool_");
  EXPECT_EQ(d.content, "Done");
  d = p.Push("call>f<arg_key>a</arg_key><arg_value>1</arg_value></tool_ca");
  EXPECT_TRUE(d.empty());
  d = p.Push("ll> a < b");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.content, "a < b");
  EXPECT_TRUE(p.Finish().empty());
}

TEST(ToolParserTest, StreamingNeverSplitsUtf8) {
  StreamingOutputParser p(ToolCallFormat::kNone, false);
  std::string s = "é😀";
  std::string got;
  for (char c : s) {
    OutputDelta d = p.Push(std::string(1, c));
    got += d.content;
    EXPECT_TRUE(d.content.empty() || (static_cast<unsigned char>(d.content.back()) & 0xC0) != 0xC0)
        << "emitted a partial code point";
  }
  got += p.Finish().content;
  EXPECT_EQ(got, s);
}

// The defining property: any chunking of the same text parses like the whole text.
TEST(ToolParserTest, StreamingEqualsWholeTextAtEveryByteBoundary) {
  struct Case {
    std::string text;
    ToolCallFormat format;
    bool in_reasoning;
  };
  const std::vector<Case> cases = {
      {"Reasoning 🤔 here.\n</think>\n\nAnswer: <b>bold</b> & more.\n<tool_call>get_weather\n"
       "<arg_key>city</arg_key>\n<arg_value>北京</arg_value>\n</tool_call>\n<tool_call>f<arg_key>"
       "x</arg_key><arg_value>[1, 2]</arg_value></tool_call>",
       ToolCallFormat::kGlm, true},
      {"<think>\nhmm < think >\n</think>\n\nText <tool_call>\n{\"name\": \"a\", \"arguments\": "
       "{\"k\": \"v\"}}\n</tool_call> tail </think> end <tool_call>{bad}</tool_call>",
       ToolCallFormat::kQwen, false},
      {"plain text with <thinking> and </tool_call> and <tool_call", ToolCallFormat::kQwen, false},
      {"  leading and trailing  \n", ToolCallFormat::kNone, false},
  };
  for (const Case& c : cases) {
    Flat whole = Whole(c.text, c.format, c.in_reasoning);
    for (size_t cut = 0; cut <= c.text.size(); ++cut) {
      EXPECT_EQ(Streamed({c.text.substr(0, cut), c.text.substr(cut)}, c.format, c.in_reasoning),
                whole)
          << "split at byte " << cut << " of " << c.text;
    }
    std::vector<std::string> bytes;
    for (char ch : c.text) bytes.emplace_back(1, ch);
    EXPECT_EQ(Streamed(bytes, c.format, c.in_reasoning), whole) << "byte by byte: " << c.text;
    std::mt19937 rng(7);
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<std::string> pieces;
      for (size_t pos = 0; pos < c.text.size();) {
        size_t n = std::uniform_int_distribution<size_t>(1, 6)(rng);
        pieces.push_back(c.text.substr(pos, n));
        pos += n;
      }
      EXPECT_EQ(Streamed(pieces, c.format, c.in_reasoning), whole) << "trial " << trial;
    }
  }
}

TEST(ToolParserTest, HostileNestingFallsBackToStrings) {
  std::string deep = std::string(100000, '[') + std::string(100000, ']');
  Flat f = Whole("<tool_call>f<arg_key>a</arg_key><arg_value>" + deep + "</arg_value></tool_call>",
                 ToolCallFormat::kGlm, false);
  ASSERT_EQ(f.calls.size(), 1u);
  EXPECT_EQ(f.calls[0].second.size(), deep.size() + 9);  // {"a": "[[...]]"}
  f = Whole("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": " + deep + "}}</tool_call>",
            ToolCallFormat::kQwen, false);
  EXPECT_TRUE(f.calls.empty());
}

TEST(ToolParserTest, ToolCallIdsAreUnique) {
  std::set<std::string> ids;
  for (int k = 0; k < 100; ++k) {
    AssistantOutput out = ParseAssistantOutput("<tool_call>{\"name\": \"f\"}</tool_call>",
                                               ToolCallFormat::kQwen, false);
    ASSERT_EQ(out.tool_calls.size(), 1u);
    EXPECT_EQ(out.tool_calls[0].id.size(), 29u);
    ids.insert(out.tool_calls[0].id);
  }
  EXPECT_EQ(ids.size(), 100u);
}

}  // namespace
}  // namespace ring::text
