// File: server/chat_template.cc
//
// Loading a model's chat template and the transformers-compatible message preparation
// around rendering it (transformers/utils/chat_template_utils.py: _normalize_chat_messages,
// _alias_reasoning_fields, render_jinja_template).
#include "server/chat_template.h"

#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/jinja_value.h"

namespace ring::text {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool FileExists(const std::string& path) { return std::ifstream(path).good(); }

// A special token in tokenizer_config.json: "text" or {"content": "text", ...}.
std::string TokenText(const nlohmann::json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return "";
}

// tokenizer_config.json "chat_template": a string or [{name, template}, ...].
absl::StatusOr<std::string> TemplateFromConfig(const nlohmann::json& value,
                                               const std::string& path) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_array()) {
    const nlohmann::json* first = nullptr;
    for (const auto& entry : value) {
      if (!entry.is_object() || !entry.contains("template") || !entry["template"].is_string()) {
        continue;
      }
      if (!first) first = &entry;
      if (entry.value("name", "") == "default") return entry["template"].get<std::string>();
    }
    if (first) return (*first)["template"].get<std::string>();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": chat_template is neither a string nor a list of {name, template}"));
}

ToolCallFormat DetectFormat(absl::string_view source) {
  if (absl::StrContains(source, "<arg_key>")) return ToolCallFormat::kGlm;
  // Qwen3-Coder's XML calls (<function=name><parameter=...>) also sit in <tool_call>; they
  // are not parsed, so say so instead of misreading them as JSON.
  if (absl::StrContains(source, "<function=")) return ToolCallFormat::kNone;
  if (absl::StrContains(source, "<tool_call>") && absl::StrContains(source, "arguments")) {
    return ToolCallFormat::kQwen;
  }
  return ToolCallFormat::kNone;
}

// transformers: drop None-valued keys, then alias the reasoning fields:
//   {"thinking": r, **message, "reasoning_content": r}
template <typename Json>
absl::StatusOr<Json> PrepareMessages(const Json& messages, bool parse_tool_arguments) {
  if (!messages.is_array()) {
    return absl::InvalidArgumentError("messages must be an array of message objects");
  }
  if (messages.empty()) {
    return absl::InvalidArgumentError(
        "Cannot apply chat template to an empty conversation. Provide at least one message.");
  }
  Json out = Json::array();
  for (const auto& m : messages) {
    if (!m.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Chat messages should be dicts, but got ", m.dump()));
    }
    Json msg = Json::object();
    for (auto it = m.begin(); it != m.end(); ++it) {
      if (!it.value().is_null()) msg[it.key()] = it.value();
    }
    if (parse_tool_arguments && msg.contains("tool_calls") && msg["tool_calls"].is_array()) {
      for (auto& call : msg["tool_calls"]) {
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) {
          continue;
        }
        auto& fn = call["function"];
        if (fn.contains("arguments") && fn["arguments"].is_string()) {
          Json parsed = Json::parse(fn["arguments"].template get<std::string>(), nullptr, false);
          if (!parsed.is_discarded() && parsed.is_object()) fn["arguments"] = std::move(parsed);
        }
      }
    }
    const Json* reasoning = nullptr;
    for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
      if (msg.contains(key)) {
        reasoning = &msg[key];
        break;
      }
    }
    if (reasoning) {
      Json r = *reasoning;
      Json aliased = Json::object();
      aliased["thinking"] = r;
      for (auto it = msg.begin(); it != msg.end(); ++it) aliased[it.key()] = it.value();
      aliased["reasoning_content"] = r;
      msg = std::move(aliased);
    }
    out.push_back(std::move(msg));
  }
  return out;
}

}  // namespace

ChatTemplate::ChatTemplate(jinja::Template tmpl, std::string source, std::string bos,
                           std::string eos)
    : template_(std::move(tmpl)),
      source_(std::move(source)),
      bos_token_(std::move(bos)),
      eos_token_(std::move(eos)),
      tool_call_format_(DetectFormat(source_)) {}

absl::StatusOr<ChatTemplate> ChatTemplate::FromString(absl::string_view source,
                                                      std::string bos_token,
                                                      std::string eos_token) {
  absl::StatusOr<jinja::Template> t = jinja::Template::Parse(source);
  if (!t.ok()) return t.status();
  return ChatTemplate(std::move(*t), std::string(source), std::move(bos_token),
                      std::move(eos_token));
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromModelDir(const std::string& dir) {
  const std::string config_path = dir + "/tokenizer_config.json";
  nlohmann::json config = nlohmann::json::object();
  if (FileExists(config_path)) {
    absl::StatusOr<std::string> text = ReadFile(config_path);
    if (!text.ok()) return text.status();
    config = nlohmann::json::parse(*text, nullptr, false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(config_path, ": not a JSON object"));
    }
  }
  std::string source, origin;
  const std::string jinja_path = dir + "/chat_template.jinja";
  const std::string json_path = dir + "/chat_template.json";
  if (FileExists(jinja_path)) {
    absl::StatusOr<std::string> text = ReadFile(jinja_path);
    if (!text.ok()) return text.status();
    source = std::move(*text);
    origin = jinja_path;
  } else if (FileExists(json_path)) {
    absl::StatusOr<std::string> text = ReadFile(json_path);
    if (!text.ok()) return text.status();
    nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("chat_template")) {
      return absl::InvalidArgumentError(absl::StrCat(json_path, ": no \"chat_template\""));
    }
    absl::StatusOr<std::string> t = TemplateFromConfig(j["chat_template"], json_path);
    if (!t.ok()) return t.status();
    source = std::move(*t);
    origin = json_path;
  } else if (config.contains("chat_template")) {
    absl::StatusOr<std::string> t = TemplateFromConfig(config["chat_template"], config_path);
    if (!t.ok()) return t.status();
    source = std::move(*t);
    origin = config_path;
  } else {
    return absl::NotFoundError(
        absl::StrCat(dir,
                     ": no chat template (chat_template.jinja, chat_template.json or "
                     "tokenizer_config.json \"chat_template\")"));
  }
  absl::StatusOr<ChatTemplate> t =
      FromString(source, TokenText(config, "bos_token"), TokenText(config, "eos_token"));
  if (!t.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": ", t.status().message()));
  }
  return t;
}

namespace {

template <typename Json>
absl::StatusOr<std::string> ApplyImpl(const jinja::Template& tmpl, const std::string& bos,
                                      const std::string& eos,
                                      const BasicChatTemplateInputs<Json>& in) {
  // Checked before anything copies them: nlohmann copies recurse.
  for (const Json* part : {&in.messages, &in.tools, &in.kwargs}) {
    if (jinja::JsonNestingExceeds(*part, jinja::kMaxValueDepth)) {
      return absl::InvalidArgumentError("chat input nests deeper than 256 levels");
    }
  }
  absl::StatusOr<Json> messages = PrepareMessages(in.messages, in.parse_tool_arguments);
  if (!messages.ok()) return messages.status();
  if (!in.tools.is_null() && !in.tools.is_array()) {
    return absl::InvalidArgumentError("tools must be null or an array of tool objects");
  }
  if (!in.kwargs.is_null() && !in.kwargs.is_object()) {
    return absl::InvalidArgumentError("chat_template_kwargs must be an object");
  }
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  ctx["messages"] = std::move(*messages);
  ctx["tools"] = in.tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = in.add_generation_prompt;
  // tokenizer.special_tokens_map first; chat_template_kwargs may override them.
  if (!bos.empty()) ctx["bos_token"] = bos;
  if (!eos.empty()) ctx["eos_token"] = eos;
  if (in.kwargs.is_object()) {
    for (auto it = in.kwargs.begin(); it != in.kwargs.end(); ++it) {
      const std::string& key = it.key();
      if (key == "messages" || key == "tools" || key == "documents" ||
          key == "add_generation_prompt") {
        return absl::InvalidArgumentError(
            absl::StrCat("chat_template_kwargs may not set '", key, "'"));
      }
      ctx[key] = it.value();
    }
  }
  return tmpl.Render(ctx);
}

}  // namespace

absl::StatusOr<std::string> ChatTemplate::Apply(const ChatTemplateInputs& in) const {
  return ApplyImpl(template_, bos_token_, eos_token_, in);
}

absl::StatusOr<std::string> ChatTemplate::Apply(const OrderedChatTemplateInputs& in) const {
  return ApplyImpl(template_, bos_token_, eos_token_, in);
}

bool ChatTemplate::PromptEndsInReasoning(absl::string_view prompt) {
  return absl::EndsWith(absl::StripTrailingAsciiWhitespace(prompt), "<think>");
}

}  // namespace ring::text
