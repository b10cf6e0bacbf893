// ringctl chat-template: render a chat template the way the server will, for checking
// prompts against HF transformers (tests/chat_template_parity.py) or by hand.
//
//   ringctl chat-template --template tests/data/chat_templates/glm-4.6.jinja < cases.jsonl
//   ringctl chat-template --model-dir /models/GLM-5.2-mxfp4 < cases.jsonl
//   ringctl chat-template --model-dir /models/Qwen3-8B --info
//   ringctl chat-template --raw < snippets.jsonl
//
// Each input line is a JSON object {"messages": [...], "tools": [...] | null,
// "add_generation_prompt": bool (default true), "kwargs": {...} (chat_template_kwargs),
// "parse_tool_arguments": bool}; each output line is {"text": "..."} or {"error": "..."}.
// Key order of the input is kept, as transformers keeps it. With --raw, each line is
// {"template": "...", "context": {...}}: the bare engine, no chat preparation (used by the
// parity test's engine fuzz).
//
// Exit code 0 when every line was processed (render errors are reported per line), 1 when
// the template cannot be loaded, 2 for unreadable input lines.
#include <fstream>
#include <iostream>

#ifdef RING_HAVE_TEXT
#include "server/chat_template.h"
#endif
#include "server/ringctl_command.h"

namespace ring::ctl {
namespace {

#ifdef RING_HAVE_TEXT

struct ChatTemplateArgs {
  std::string template_path;
  std::string model_dir;
  std::string bos;
  std::string eos;
  std::string input = "-";
  bool info = false;
  bool raw = false;
};

const char* FormatName(text::ToolCallFormat f) {
  switch (f) {
    case text::ToolCallFormat::kGlm:
      return "glm";
    case text::ToolCallFormat::kQwen:
      return "qwen";
    case text::ToolCallFormat::kNone:
      return "none";
  }
  return "none";
}

void PrintLine(const nlohmann::ordered_json& j) {
  std::cout << j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
}

// --raw: one template per line, rendered with its own context.
nlohmann::ordered_json RenderRaw(const nlohmann::ordered_json& req) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  if (!req.contains("template") || !req["template"].is_string()) {
    out["error"] = "missing \"template\"";
    return out;
  }
  absl::StatusOr<jinja::Template> t = jinja::Template::Parse(req["template"].get<std::string>());
  if (!t.ok()) {
    out["error"] = std::string(t.status().message());
    return out;
  }
  absl::StatusOr<std::string> text =
      t->Render(req.value("context", nlohmann::ordered_json::object()));
  if (text.ok()) {
    out["text"] = *text;
  } else {
    out["error"] = std::string(text.status().message());
  }
  return out;
}

int RunChatTemplate(const ChatTemplateArgs& a) {
  absl::StatusOr<text::ChatTemplate> tmpl = absl::InvalidArgumentError("no template");
  if (a.raw) {
    tmpl = text::ChatTemplate::FromString("");
  } else if (!a.model_dir.empty()) {
    tmpl = text::ChatTemplate::FromModelDir(a.model_dir);
  } else {
    std::ifstream f(a.template_path, std::ios::binary);
    if (!f) {
      std::cerr << "ringctl chat-template: cannot open " << a.template_path << "\n";
      return 1;
    }
    std::string source((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    tmpl = text::ChatTemplate::FromString(source, a.bos, a.eos);
  }
  if (!tmpl.ok()) {
    std::cerr << "ringctl chat-template: " << tmpl.status().message() << "\n";
    return 1;
  }
  if (a.info && !a.raw) {
    nlohmann::ordered_json info;
    info["tool_call_format"] = FormatName(tmpl->tool_call_format());
    info["bos_token"] = tmpl->bos_token();
    info["eos_token"] = tmpl->eos_token();
    PrintLine(info);
    return 0;
  }
  std::ifstream file;
  std::istream* in = &std::cin;
  if (a.input != "-") {
    file.open(a.input);
    if (!file) {
      std::cerr << "ringctl chat-template: cannot open " << a.input << "\n";
      return 1;
    }
    in = &file;
  }
  std::string line;
  int rc = 0;
  while (std::getline(*in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::ordered_json req = nlohmann::ordered_json::parse(line, nullptr, false);
    nlohmann::ordered_json out = nlohmann::ordered_json::object();
    if (req.is_discarded() || !req.is_object()) {
      out["error"] = "input line is not a JSON object";
      PrintLine(out);
      rc = 2;
      continue;
    }
    if (a.raw) {
      PrintLine(RenderRaw(req));
      continue;
    }
    text::OrderedChatTemplateInputs inputs;
    inputs.messages = req.value("messages", nlohmann::ordered_json());
    inputs.tools = req.value("tools", nlohmann::ordered_json());
    inputs.add_generation_prompt = req.value("add_generation_prompt", true);
    inputs.kwargs = req.value("kwargs", nlohmann::ordered_json::object());
    inputs.parse_tool_arguments = req.value("parse_tool_arguments", false);
    absl::StatusOr<std::string> prompt = tmpl->Apply(inputs);
    if (prompt.ok()) {
      out["text"] = *prompt;
    } else {
      out["error"] = std::string(prompt.status().message());
    }
    PrintLine(out);
  }
  return rc;
}

Registration reg(
    "chat-template", "Render a chat template over JSON-lines conversations",
    [](CLI::App* cmd) -> Handler {
      auto a = std::make_shared<ChatTemplateArgs>();
      auto* src = cmd->add_option("--template", a->template_path, "chat template file (.jinja)");
      auto* dir = cmd->add_option("--model-dir", a->model_dir,
                                  "model directory (chat_template.jinja or "
                                  "tokenizer_config.json)");
      src->excludes(dir);
      cmd->add_option("--bos", a->bos, "bos_token (with --template)");
      cmd->add_option("--eos", a->eos, "eos_token (with --template)");
      cmd->add_option("--input", a->input, "JSON-lines input ('-': stdin)");
      cmd->add_flag("--info", a->info, "print the detected tool-call format and special tokens");
      cmd->add_flag("--raw", a->raw, "lines are {template, context}: render with the bare engine");
      return [a]() -> int {
        if (!a->raw && a->template_path.empty() && a->model_dir.empty()) {
          std::cerr << "ringctl chat-template: need --template or --model-dir\n";
          return 2;
        }
        return RunChatTemplate(*a);
      };
    });

#endif  // RING_HAVE_TEXT

}  // namespace
}  // namespace ring::ctl
