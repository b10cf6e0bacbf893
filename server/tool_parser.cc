// File: server/tool_parser.cc
//
// Assistant-output splitting: a small state machine (content / reasoning / inside a tool
// call) over a buffer that only ever holds back a possible marker prefix, so any chunking
// of the same text yields the same result.
#include "server/tool_parser.h"

#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/jinja_ast.h"
#include "server/jinja_value.h"

namespace ring::text {
namespace {

constexpr absl::string_view kThinkOpen = "<think>";
constexpr absl::string_view kThinkClose = "</think>";
constexpr absl::string_view kToolOpen = "<tool_call>";
constexpr absl::string_view kToolClose = "</tool_call>";
constexpr absl::string_view kArgKeyOpen = "<arg_key>";
constexpr absl::string_view kArgKeyClose = "</arg_key>";
constexpr absl::string_view kArgValueOpen = "<arg_value>";
constexpr absl::string_view kArgValueClose = "</arg_value>";

bool IsSpace(char c) {
  return c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == '\f' || c == '\v';
}

std::string NewToolCallId() {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id = "call_";
  std::uniform_int_distribution<int> pick(0, sizeof(kAlphabet) - 2);
  for (int k = 0; k < 24; ++k) id += kAlphabet[pick(rng)];
  return id;
}

// json.dumps(value, ensure_ascii=False): the arguments string vLLM / sglang produce.
std::string PyJson(const jinja::Value& v) {
  jinja::JsonDumpOptions o;
  absl::StatusOr<std::string> s = jinja::PyJsonDumps(v, o);
  return s.ok() ? *s : "null";
}

// vLLM Glm4MoeModelToolParser._deserialize: json.loads, then ast.literal_eval, then the
// string itself.
jinja::Value DeserializeArg(const std::string& text) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(text, nullptr, false);
  if (!j.is_discarded() && !jinja::JsonNestingExceeds(j, jinja::kMaxValueDepth)) {
    return jinja::FromJson(j);
  }
  absl::StatusOr<jinja::Value> lit = jinja::ParsePythonLiteral(text);
  if (lit.ok()) return *lit;
  return jinja::Value::String(text);
}

bool ParseGlm(absl::string_view body, const ToolSchemas& schemas, ToolCall* call) {
  size_t name_end = body.find('\n');
  size_t first_key = body.find(kArgKeyOpen);
  if (first_key != absl::string_view::npos && first_key < name_end) name_end = first_key;
  std::string name(absl::StripAsciiWhitespace(body.substr(0, name_end)));
  if (name.empty() || name.find('<') != std::string::npos) return false;
  jinja::Dict args;
  size_t pos = first_key;
  while (pos != absl::string_view::npos) {
    size_t key_end = body.find(kArgKeyClose, pos);
    if (key_end == absl::string_view::npos) return false;
    std::string key(absl::StripAsciiWhitespace(
        body.substr(pos + kArgKeyOpen.size(), key_end - pos - kArgKeyOpen.size())));
    size_t v = key_end + kArgKeyClose.size();
    while (v < body.size() && IsSpace(body[v])) ++v;
    if (!absl::StartsWith(body.substr(v), kArgValueOpen)) return false;
    size_t val_begin = v + kArgValueOpen.size();
    size_t val_end = body.find(kArgValueClose, val_begin);
    if (val_end == absl::string_view::npos) return false;
    std::string raw(body.substr(val_begin, val_end - val_begin));
    jinja::Value value;
    if (schemas.string_args.count({name, key})) {
      value = jinja::Value::String(raw);
    } else {
      value = DeserializeArg(std::string(absl::StripAsciiWhitespace(raw)));
    }
    args.Set(jinja::Value::String(key), std::move(value));
    // Only whitespace may separate pairs.
    size_t next = val_end + kArgValueClose.size();
    while (next < body.size() && IsSpace(body[next])) ++next;
    if (next >= body.size()) break;
    if (!absl::StartsWith(body.substr(next), kArgKeyOpen)) return false;
    pos = next;
  }
  call->name = std::move(name);
  call->arguments_json = PyJson(jinja::Value::MakeDict(std::move(args)));
  return true;
}

bool ParseQwen(absl::string_view body, ToolCall* call) {
  nlohmann::ordered_json j =
      nlohmann::ordered_json::parse(absl::StripAsciiWhitespace(body), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return false;
  if (jinja::JsonNestingExceeds(j, jinja::kMaxValueDepth)) return false;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get<std::string>().empty()) return false;
  call->name = name->get<std::string>();
  auto args = j.find("arguments");
  if (args == j.end() || args->is_null()) {
    call->arguments_json = "{}";
  } else if (args->is_string()) {
    // Some fine-tunes emit the arguments as a JSON string; keep its object if it is one.
    nlohmann::ordered_json inner =
        nlohmann::ordered_json::parse(args->get<std::string>(), nullptr, false);
    if (inner.is_discarded() || !inner.is_object()) return false;
    call->arguments_json = PyJson(jinja::FromJson(inner));
  } else if (args->is_object()) {
    call->arguments_json = PyJson(jinja::FromJson(*args));
  } else {
    return false;
  }
  return true;
}

// Length of the longest suffix of `buf` that is a proper prefix of one of `markers`.
size_t PartialMarkerSuffix(absl::string_view buf,
                           std::initializer_list<absl::string_view> markers) {
  size_t best = 0;
  for (absl::string_view m : markers) {
    for (size_t len = std::min(buf.size(), m.size() - 1); len > best; --len) {
      if (buf.substr(buf.size() - len) == m.substr(0, len)) {
        best = len;
        break;
      }
    }
  }
  return best;
}

// Bytes at the end of `buf` that start an incomplete UTF-8 sequence.
size_t IncompleteUtf8Suffix(absl::string_view buf) {
  size_t n = buf.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    unsigned char c = static_cast<unsigned char>(buf[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

}  // namespace

ToolSchemas ToolSchemas::FromOpenAiTools(const nlohmann::json& tools) {
  ToolSchemas s;
  if (!tools.is_array()) return s;
  for (const auto& tool : tools) {
    if (!tool.is_object()) continue;
    const nlohmann::json* fn = &tool;
    if (tool.contains("function") && tool["function"].is_object()) fn = &tool["function"];
    if (!fn->contains("name") || !(*fn)["name"].is_string()) continue;
    const std::string name = (*fn)["name"].get<std::string>();
    if (!fn->contains("parameters") || !(*fn)["parameters"].is_object()) continue;
    const auto& params = (*fn)["parameters"];
    if (!params.contains("properties") || !params["properties"].is_object()) continue;
    for (auto it = params["properties"].begin(); it != params["properties"].end(); ++it) {
      if (it.value().is_object() && it.value().contains("type") && it.value()["type"] == "string") {
        s.string_args.emplace(name, it.key());
      }
    }
  }
  return s;
}

bool ParseToolCallBody(absl::string_view body, ToolCallFormat format, const ToolSchemas& schemas,
                       ToolCall* call) {
  switch (format) {
    case ToolCallFormat::kGlm:
      return ParseGlm(body, schemas, call);
    case ToolCallFormat::kQwen:
      return ParseQwen(body, call);
    case ToolCallFormat::kNone:
      return false;
  }
  return false;
}

// --- streaming -------------------------------------------------------------------------

StreamingOutputParser::StreamingOutputParser(ToolCallFormat format, bool starts_in_reasoning)
    : StreamingOutputParser(format, starts_in_reasoning, ToolSchemas()) {}

StreamingOutputParser::StreamingOutputParser(ToolCallFormat format, bool starts_in_reasoning,
                                             ToolSchemas schemas)
    : format_(format),
      schemas_(std::move(schemas)),
      state_(starts_in_reasoning ? State::kReasoning : State::kContent) {}

OutputDelta StreamingOutputParser::Push(absl::string_view text) {
  OutputDelta out;
  if (finished_) return out;
  buf_.append(text.data(), text.size());
  Process(false, &out);
  return out;
}

OutputDelta StreamingOutputParser::Finish() {
  OutputDelta out;
  if (finished_) return out;
  Process(true, &out);
  EndSegment();
  finished_ = true;
  return out;
}

void StreamingOutputParser::EndSegment() {
  pending_ws_.clear();
  segment_has_text_ = false;
}

void StreamingOutputParser::EmitText(absl::string_view text, OutputDelta* out) {
  std::string& dst = state_ == State::kReasoning ? out->reasoning_content : out->content;
  for (char c : text) {
    if (IsSpace(c)) {
      if (segment_has_text_) pending_ws_ += c;
      continue;
    }
    dst += pending_ws_;
    pending_ws_.clear();
    dst += c;
    segment_has_text_ = true;
  }
}

void StreamingOutputParser::CompleteToolCall(absl::string_view body, bool terminated,
                                             OutputDelta* out) {
  ToolCall call;
  if (ParseToolCallBody(body, format_, schemas_, &call)) {
    call.id = NewToolCallId();
    out->tool_calls.push_back(std::move(call));
    return;
  }
  // Not a call we understand: keep the text visible rather than losing it.
  state_ = State::kContent;
  EmitText(absl::StrCat(kToolOpen, body, terminated ? kToolClose : ""), out);
  EndSegment();
}

void StreamingOutputParser::Process(bool final, OutputDelta* out) {
  while (true) {
    if (state_ == State::kToolCall) {
      size_t close = buf_.find(kToolClose.data(), 0, kToolClose.size());
      if (close != std::string::npos) {
        std::string body = buf_.substr(0, close);
        buf_.erase(0, close + kToolClose.size());
        CompleteToolCall(body, true, out);
        state_ = State::kContent;
        EndSegment();
        continue;
      }
      if (final) {
        std::string body = std::move(buf_);
        buf_.clear();
        CompleteToolCall(body, false, out);
        state_ = State::kContent;
      }
      return;
    }
    const bool tools = format_ != ToolCallFormat::kNone;
    // The earliest marker that matters in this state.
    size_t at = std::string::npos;
    absl::string_view marker;
    auto consider = [&](absl::string_view m) {
      size_t p = buf_.find(m.data(), 0, m.size());
      if (p < at) {
        at = p;
        marker = m;
      }
    };
    if (state_ == State::kReasoning) {
      consider(kThinkClose);
    } else {
      consider(kThinkOpen);
      consider(kThinkClose);
      if (tools) consider(kToolOpen);
    }
    if (at != std::string::npos) {
      EmitText(absl::string_view(buf_).substr(0, at), out);
      EndSegment();
      buf_.erase(0, at + marker.size());
      if (marker == kThinkClose) {
        state_ = State::kContent;  // a stray </think> in content is dropped
      } else if (marker == kThinkOpen) {
        state_ = State::kReasoning;
      } else {
        state_ = State::kToolCall;
      }
      continue;
    }
    size_t hold = 0;
    if (!final) {
      hold = state_ == State::kReasoning
                 ? PartialMarkerSuffix(buf_, {kThinkClose})
                 : (tools ? PartialMarkerSuffix(buf_, {kThinkOpen, kThinkClose, kToolOpen})
                          : PartialMarkerSuffix(buf_, {kThinkOpen, kThinkClose}));
      hold = std::max(hold, IncompleteUtf8Suffix(buf_));
    }
    EmitText(absl::string_view(buf_).substr(0, buf_.size() - hold), out);
    buf_.erase(0, buf_.size() - hold);
    return;
  }
}

AssistantOutput ParseAssistantOutput(absl::string_view text, ToolCallFormat format,
                                     bool starts_in_reasoning) {
  return ParseAssistantOutput(text, format, starts_in_reasoning, ToolSchemas());
}

AssistantOutput ParseAssistantOutput(absl::string_view text, ToolCallFormat format,
                                     bool starts_in_reasoning, const ToolSchemas& schemas) {
  StreamingOutputParser parser(format, starts_in_reasoning, schemas);
  AssistantOutput result;
  for (OutputDelta d : {parser.Push(text), parser.Finish()}) {
    result.content += d.content;
    result.reasoning_content += d.reasoning_content;
    for (ToolCall& c : d.tool_calls) result.tool_calls.push_back(std::move(c));
  }
  return result;
}

}  // namespace ring::text
