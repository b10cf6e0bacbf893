// Byte-level BPE training and HF tokenizer.json / tokenizer_config.json / chat template
// generation for synthetic checkpoints. See bpe_builder.h.
#include "models/bpe_builder.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"

namespace ring {
namespace {

using OrderedJson = nlohmann::ordered_json;

// --- GPT-2 byte <-> unicode ------------------------------------------------------------

std::string EncodeUtf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    s.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    s.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    s.push_back(static_cast<char>(0xf0 | (cp >> 18)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
  return s;
}

bool IsGpt2Printable(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
}

struct ByteTables {
  std::string unicode[256];      // byte -> UTF-8 of its stand-in character
  std::vector<uint8_t> order;    // GPT-2 vocabulary order of the 256 bytes
};

const ByteTables& Tables() {
  static const ByteTables* tables = [] {
    auto* t = new ByteTables;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      if (IsGpt2Printable(b)) {
        t->unicode[b] = EncodeUtf8(static_cast<uint32_t>(b));
        t->order.push_back(static_cast<uint8_t>(b));
      }
    }
    for (int b = 0; b < 256; ++b) {
      if (!IsGpt2Printable(b)) {
        t->unicode[b] = EncodeUtf8(static_cast<uint32_t>(256 + n++));
        t->order.push_back(static_cast<uint8_t>(b));
      }
    }
    return t;
  }();
  return *tables;
}

// --- Unicode classes (approximate, see header) -----------------------------------------

struct CodePoint {
  uint32_t cp;
  size_t begin;  // byte offset in the text
  size_t end;
};

std::vector<CodePoint> DecodeUtf8(absl::string_view s) {
  std::vector<CodePoint> out;
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<uint8_t>(s[i]);
    int len = 1;
    uint32_t cp = c;
    if (c >= 0xf0 && c < 0xf8) {
      len = 4;
      cp = c & 0x07;
    } else if (c >= 0xe0) {
      len = c < 0xf0 ? 3 : 1;
      cp = c & 0x0f;
    } else if (c >= 0xc0) {
      len = 2;
      cp = c & 0x1f;
    }
    bool ok = len > 1 && i + len <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      const auto cc = static_cast<uint8_t>(s[i + k]);
      if ((cc & 0xc0) != 0x80) ok = false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (!ok) {  // ASCII, or an invalid byte taken on its own
      len = 1;
      cp = c < 0x80 ? c : 0xfffd;
    }
    out.push_back({cp, i, i + len});
    i += len;
  }
  return out;
}

bool IsLetter(uint32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  if (c == 0xaa || c == 0xb5 || c == 0xba) return true;
  if (c >= 0xc0 && c <= 0x24f) return c != 0xd7 && c != 0xf7;  // Latin-1 + Latin Extended
  if (c >= 0x370 && c <= 0x3ff) return c != 0x37e && c != 0x387;  // Greek
  if (c >= 0x400 && c <= 0x52f) return !(c >= 0x482 && c <= 0x489);  // Cyrillic
  if (c >= 0x3041 && c <= 0x3096) return true;  // Hiragana
  if (c >= 0x30a1 && c <= 0x30fa) return true;  // Katakana
  if (c >= 0x30fc && c <= 0x30ff) return true;
  if (c >= 0x3400 && c <= 0x4dbf) return true;  // CJK Extension A
  if (c >= 0x4e00 && c <= 0x9fff) return true;  // CJK Unified Ideographs
  if (c >= 0xac00 && c <= 0xd7a3) return true;  // Hangul syllables
  if (c >= 0xf900 && c <= 0xfaff) return true;  // CJK compatibility
  if (c >= 0xff21 && c <= 0xff3a) return true;  // fullwidth Latin
  if (c >= 0xff41 && c <= 0xff5a) return true;
  return false;
}

bool IsNumber(uint32_t c) {
  if (c >= '0' && c <= '9') return true;
  if (c == 0xb2 || c == 0xb3 || c == 0xb9 || (c >= 0xbc && c <= 0xbe)) return true;
  if (c >= 0x660 && c <= 0x669) return true;
  if (c >= 0x2160 && c <= 0x2188) return true;  // Roman numerals
  if (c >= 0xff10 && c <= 0xff19) return true;  // fullwidth digits
  return false;
}

bool IsSpace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
         c == 0x205f || c == 0x3000;
}

bool IsNewline(uint32_t c) { return c == '\r' || c == '\n'; }

uint32_t Lower(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

// Length (in code points) of the regex match at position i, following the alternation
//   (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}{1,D} |
//   ' '?[^\s\p{L}\p{N}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
// with D = 3 (GLM) or 1 (Qwen). Always >= 1.
size_t MatchAt(const std::vector<CodePoint>& t, size_t i, size_t max_digits) {
  const size_t n = t.size();
  auto cp = [&](size_t k) { return t[k].cp; };
  // Contractions.
  if (cp(i) == '\'') {
    static const char* kSuffixes[] = {"s", "t", "re", "ve", "m", "ll", "d"};
    for (const char* suf : kSuffixes) {
      const size_t len = std::char_traits<char>::length(suf);
      if (i + len >= n) continue;  // needs code points i+1 .. i+len
      bool ok = true;
      for (size_t k = 0; k < len; ++k) {
        if (Lower(cp(i + 1 + k)) != static_cast<uint32_t>(suf[k])) ok = false;
      }
      if (ok) return 1 + len;
    }
  }
  // Optional non-letter/number/newline, then letters.
  {
    size_t j = i;
    if (!IsLetter(cp(j)) && !IsNumber(cp(j)) && !IsNewline(cp(j))) ++j;
    if (j < n && IsLetter(cp(j))) {
      while (j < n && IsLetter(cp(j))) ++j;
      return j - i;
    }
  }
  // Digits.
  if (IsNumber(cp(i))) {
    size_t j = i;
    while (j < n && j - i < max_digits && IsNumber(cp(j))) ++j;
    return j - i;
  }
  // Punctuation run with an optional leading space and trailing newlines.
  {
    size_t j = i;
    if (cp(j) == ' ') ++j;
    size_t k = j;
    while (k < n && !IsSpace(cp(k)) && !IsLetter(cp(k)) && !IsNumber(cp(k))) ++k;
    if (k > j) {
      while (k < n && IsNewline(cp(k))) ++k;
      return k - i;
    }
  }
  // Whitespace alternatives.
  size_t run_end = i;
  while (run_end < n && IsSpace(cp(run_end))) ++run_end;
  if (run_end > i) {
    size_t last_newline = n;
    for (size_t k = i; k < run_end; ++k) {
      if (IsNewline(cp(k))) last_newline = k;
    }
    if (last_newline != n) return last_newline + 1 - i;  // \s*[\r\n]+
    if (run_end == n) return run_end - i;                // \s+(?!\S) at the end
    if (run_end - 1 > i) return run_end - 1 - i;         // \s+(?!\S) leaving one space
    return run_end - i;                                  // \s+
  }
  return 1;
}

// --- training sample -------------------------------------------------------------------

constexpr absl::string_view kSample = R"SAMPLE(The quick brown fox jumps over the lazy dog. It is the first sentence that many people type when they test a new keyboard, because it uses every letter of the English alphabet.
A language model reads text as a sequence of tokens. The tokenizer splits the text into pieces, and each piece is mapped to an integer id. Common words such as "the", "and", "of" and "to" become single tokens, while rare words are broken into smaller parts.
In 2024 the team trained a model with 8 billion parameters on 15 trillion tokens; the run took 1,234 hours on 512 GPUs and cost about $3.5 million.
We don't know whether it's going to rain, but they'll bring umbrellas anyway. She's sure we've seen this before, and I'm sure you'd agree.
Distributed inference splits a large model across several machines. Each machine holds a contiguous range of layers, receives the activations from the previous stage, runs its layers, and sends the result to the next stage of the ring.

def fibonacci(n: int) -> int:
    """Return the n-th Fibonacci number."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


class Tokenizer:
    def __init__(self, vocab, merges):
        self.vocab = vocab
        self.merges = {pair: rank for rank, pair in enumerate(merges)}

    def encode(self, text):
        return [self.vocab[token] for token in self.split(text)]

#include <cstdint>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  for (const std::string& arg : args) {
    if (arg == "--help") return 0;
  }
  return 1;
}

{"model": "glm-5", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 128, "temperature": 0.7}

自然语言处理是人工智能的一个重要方向。大语言模型通过学习大量的文本数据，能够理解和生成自然语言。今天的天气很好，我们一起去公园散步吧。这个模型可以回答问题、写代码，也可以翻译文章。
机器学习的基本思想是从数据中学习规律，然后用这些规律对新的数据进行预测。分布式推理把一个大模型切分到多台机器上运行。
東京は日本の首都です。今日はとても良い天気ですね。私は毎朝コーヒーを飲みます。
Once upon a time there was a small village at the edge of a great forest. The people of the village were farmers, and every morning they walked to their fields while the sun was rising over the hills. In the evening they came home, cooked dinner, and told stories about the old days.
To make a simple tomato sauce, heat two tablespoons of olive oil in a pan, add one chopped onion and cook it for five minutes. Then add the tomatoes, a pinch of salt and some fresh basil, and let the sauce simmer for twenty minutes while you stir it from time to time.
The server accepts requests over HTTP and returns the generated text as a stream of events. Each request has a deadline; when the client disconnects, the request is cancelled on every stage of the pipeline, and the memory that held its cache is returned to the pool.
Questions to ask before deploying a model: How many users will send requests at the same time? What is the longest prompt we expect? Which machines are available, and how fast is the network between them?

import json
import os


def load_config(path):
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    if "quantization" in config:
        print("quantized with", config["quantization"]["bits"], "bits")
    return config


for layer in range(config["num_hidden_layers"]):
    weights = checkpoint.get(f"model.layers.{layer}.self_attn.q_proj.weight")
    if weights is None:
        raise ValueError(f"missing weights for layer {layer}")

absl::Status Server::Start(const Options& options) {
  if (options.port <= 0) {
    return absl::InvalidArgumentError("port must be positive");
  }
  for (int i = 0; i < options.num_workers; ++i) {
    workers_.push_back(std::make_unique<Worker>(i));
  }
  return absl::OkStatus();
}

$ ringctl synth --arch glm_moe_dsa --preset tiny --out /tmp/model && ringctl inspect /tmp/model

深度学习模型由许多层组成，每一层都会对输入的数据进行计算，然后把结果传给下一层。训练的时候，我们需要大量的数据和计算资源；推理的时候，我们希望模型能够又快又准确地回答用户的问题。
我们的服务器可以同时处理很多请求。如果一台机器的内存不够，就把模型分成几部分，放在不同的机器上，然后通过网络把它们连接起来。
)SAMPLE";

// --- chat templates --------------------------------------------------------------------

// GLM-4.7/5 style (shared spec §6): "[gMASK]<sop>", role tokens with no newline after
// them, assistant history as "</think>" + content (reasoning kept only after the last
// user turn), tool results under <|observation|>, generation prompt "<|assistant|><think>"
// or "<|assistant|></think>" when enable_thinking is false.
constexpr absl::string_view kGlmTemplate = R"JINJA([gMASK]<sop>
{%- if tools -%}
<|system|>
# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{% for tool in tools %}
{{ tool | tojson(ensure_ascii=False) }}
{% endfor %}
</tools>

For each function call, output the function name and arguments within the following XML format:
<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value><arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>
{%- endif -%}
{%- macro visible_text(content) -%}
    {%- if content is string -%}
        {{- content }}
    {%- elif content is iterable and content is not mapping -%}
        {%- for item in content -%}
            {%- if item is mapping and item.type == 'text' -%}
                {{- item.text }}
            {%- elif item is string -%}
                {{- item }}
            {%- endif -%}
        {%- endfor -%}
    {%- elif content is none -%}
        {{- '' }}
    {%- else -%}
        {{- content }}
    {%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(last_user_index=-1) -%}
{%- for m in messages -%}
    {%- if m.role == 'user' -%}
        {%- set ns.last_user_index = loop.index0 -%}
    {%- endif -%}
{%- endfor -%}
{%- for m in messages -%}
{%- if m.role == 'user' -%}
<|user|>{{ visible_text(m.content) }}
{%- elif m.role == 'assistant' -%}
<|assistant|>
{%- set reasoning_content = '' -%}
{%- set content = visible_text(m.content) -%}
{%- if m.reasoning_content is string -%}
    {%- set reasoning_content = m.reasoning_content -%}
{%- elif '</think>' in content -%}
    {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}
    {%- set content = content.split('</think>')[-1].lstrip('\n') -%}
{%- endif -%}
{%- if ((clear_thinking is defined and not clear_thinking) or loop.index0 > ns.last_user_index) and reasoning_content -%}
{{ '<think>' + reasoning_content.strip() + '</think>' }}
{%- else -%}
{{ '</think>' }}
{%- endif -%}
{%- if content.strip() -%}
{{ content.strip() }}
{%- endif -%}
{%- if m.tool_calls -%}
{%- for tc in m.tool_calls -%}
{%- if tc.function -%}
    {%- set tc = tc.function -%}
{%- endif -%}
{{ '<tool_call>' + tc.name }}
{%- set _args = tc.arguments -%}
{%- if _args is string -%}
{{ _args }}
{%- else -%}
{%- for k, v in _args.items() -%}
<arg_key>{{ k }}</arg_key><arg_value>{{ v | tojson(ensure_ascii=False) if v is not string else v }}</arg_value>
{%- endfor -%}
{%- endif -%}
</tool_call>
{%- endfor -%}
{%- endif -%}
{%- elif m.role == 'tool' -%}
{%- if loop.first or (messages[loop.index0 - 1].role != 'tool') -%}
<|observation|>
{%- endif -%}
<tool_response>{{ visible_text(m.content) }}</tool_response>
{%- elif m.role == 'system' -%}
<|system|>{{ visible_text(m.content) }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|assistant|>{{ '</think>' if (enable_thinking is defined and not enable_thinking) else '<think>' }}
{%- endif -%}
)JINJA";

// Qwen3 (shared spec §6): "<|im_start|>{role}\n{content}<|im_end|>\n" per message, tools
// in the system turn, tool results as user turns wrapped in <tool_response>, reasoning of
// past assistant turns dropped except after the last user query, "<think>\n\n</think>\n\n"
// appended to the generation prompt when enable_thinking is false.
constexpr absl::string_view kQwenTemplate = R"JINJA({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
)JINJA";

// Pre-tokenizer regexes (shared spec §6).
constexpr absl::string_view kGlmSplitRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr absl::string_view kQwenSplitRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr int kNumMerges = 400;

std::vector<AddedToken> AddedTokensFor(TokenizerStyle style) {
  // special=false marks tokens that carry content a client wants to see when special
  // tokens are skipped (reasoning and tool-call markup), as Qwen's tokenizer does.
  if (style == TokenizerStyle::kGlm) {
    return {
        {"<|endoftext|>", 0, true},   {"[MASK]", 0, true},
        {"[gMASK]", 0, true},         {"[sMASK]", 0, true},
        {"<sop>", 0, true},           {"<eop>", 0, true},
        {"<|system|>", 0, true},      {"<|user|>", 0, true},
        {"<|assistant|>", 0, true},   {"<|observation|>", 0, true},
        {"<think>", 0, false},        {"</think>", 0, false},
        {"<tool_call>", 0, false},    {"</tool_call>", 0, false},
        {"<tool_response>", 0, false}, {"</tool_response>", 0, false},
        {"<arg_key>", 0, false},      {"</arg_key>", 0, false},
        {"<arg_value>", 0, false},    {"</arg_value>", 0, false},
    };
  }
  return {
      {"<|endoftext|>", 0, true},     {"<|im_start|>", 0, true},
      {"<|im_end|>", 0, true},        {"<tool_call>", 0, false},
      {"</tool_call>", 0, false},     {"<tool_response>", 0, false},
      {"</tool_response>", 0, false}, {"<think>", 0, false},
      {"</think>", 0, false},
  };
}

OrderedJson PreTokenizerJson(TokenizerStyle style) {
  OrderedJson split = {
      {"type", "Split"},
      {"pattern",
       {{"Regex",
         std::string(style == TokenizerStyle::kGlm ? kGlmSplitRegex : kQwenSplitRegex)}}},
      {"behavior", "Isolated"},
      {"invert", false},
  };
  OrderedJson byte_level = {
      {"type", "ByteLevel"},
      {"add_prefix_space", false},
      {"trim_offsets", false},
      {"use_regex", false},
  };
  return {{"type", "Sequence"}, {"pretokenizers", OrderedJson::array({split, byte_level})}};
}

}  // namespace

const std::string& ByteToUnicode(uint8_t b) { return Tables().unicode[b]; }

std::vector<std::string> PreTokenize(absl::string_view text, TokenizerStyle style) {
  const std::vector<CodePoint> cps = DecodeUtf8(text);
  const size_t max_digits = style == TokenizerStyle::kGlm ? 3 : 1;
  std::vector<std::string> out;
  size_t i = 0;
  while (i < cps.size()) {
    const size_t len = MatchAt(cps, i, max_digits);
    const size_t begin = cps[i].begin;
    const size_t end = cps[i + len - 1].end;
    out.emplace_back(text.substr(begin, end - begin));
    i += len;
  }
  return out;
}

absl::string_view BpeTrainingSample() { return kSample; }
absl::string_view GlmChatTemplate() { return kGlmTemplate; }
absl::string_view QwenChatTemplate() { return kQwenTemplate; }

BpeModel TrainByteLevelBpe(absl::string_view text, int num_merges, TokenizerStyle style) {
  BpeModel model;
  std::map<std::string, int64_t> ids;
  for (uint8_t b : Tables().order) {
    ids[ByteToUnicode(b)] = static_cast<int64_t>(model.vocab.size());
    model.vocab.push_back(ByteToUnicode(b));
  }

  // Distinct pre-tokens with their counts, each as a sequence of symbols.
  std::map<std::string, int64_t> counts;
  for (const std::string& piece : PreTokenize(text, style)) ++counts[piece];
  struct Word {
    std::vector<std::string> symbols;
    int64_t count;
  };
  std::vector<Word> words;
  for (const auto& [piece, count] : counts) {
    Word w{{}, count};
    for (char c : piece) w.symbols.push_back(ByteToUnicode(static_cast<uint8_t>(c)));
    words.push_back(std::move(w));
  }

  for (int m = 0; m < num_merges; ++m) {
    std::map<std::pair<std::string, std::string>, int64_t> pairs;
    for (const Word& w : words) {
      for (size_t k = 0; k + 1 < w.symbols.size(); ++k) {
        pairs[{w.symbols[k], w.symbols[k + 1]}] += w.count;
      }
    }
    // Most frequent pair; the map is ordered, so the first maximum is the smallest pair.
    const std::pair<std::string, std::string>* best = nullptr;
    int64_t best_count = 1;
    for (const auto& [pair, count] : pairs) {
      if (count > best_count) {
        best = &pair;
        best_count = count;
      }
    }
    if (best == nullptr) break;  // no pair occurs twice
    const std::pair<std::string, std::string> merge = *best;
    const std::string merged = merge.first + merge.second;
    model.merges.push_back(merge);
    if (ids.emplace(merged, static_cast<int64_t>(model.vocab.size())).second) {
      model.vocab.push_back(merged);
    }
    for (Word& w : words) {
      std::vector<std::string> next;
      next.reserve(w.symbols.size());
      for (size_t k = 0; k < w.symbols.size(); ++k) {
        if (k + 1 < w.symbols.size() && w.symbols[k] == merge.first &&
            w.symbols[k + 1] == merge.second) {
          next.push_back(merged);
          ++k;
        } else {
          next.push_back(std::move(w.symbols[k]));
        }
      }
      w.symbols = std::move(next);
    }
  }
  return model;
}

int64_t TokenizerFiles::TokenId(absl::string_view content) const {
  for (const AddedToken& t : added_tokens) {
    if (t.content == content) return t.id;
  }
  return -1;
}

TokenizerFiles BuildTokenizerFiles(TokenizerStyle style, int64_t model_max_length) {
  const BpeModel bpe = TrainByteLevelBpe(kSample, kNumMerges, style);
  TokenizerFiles files;
  files.bpe_vocab_size = static_cast<int64_t>(bpe.vocab.size());
  files.added_tokens = AddedTokensFor(style);
  for (size_t i = 0; i < files.added_tokens.size(); ++i) {
    files.added_tokens[i].id = files.bpe_vocab_size + static_cast<int64_t>(i);
  }
  files.vocab_size = files.bpe_vocab_size + static_cast<int64_t>(files.added_tokens.size());
  const bool glm = style == TokenizerStyle::kGlm;

  // tokenizer.json
  OrderedJson added = OrderedJson::array();
  for (const AddedToken& t : files.added_tokens) {
    added.push_back({{"id", t.id},
                     {"content", t.content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", t.special}});
  }
  OrderedJson vocab = OrderedJson::object();
  for (size_t i = 0; i < bpe.vocab.size(); ++i) vocab[bpe.vocab[i]] = i;
  OrderedJson merges = OrderedJson::array();
  for (const auto& [a, b] : bpe.merges) merges.push_back(OrderedJson::array({a, b}));
  OrderedJson tok;
  tok["version"] = "1.0";
  tok["truncation"] = nullptr;
  tok["padding"] = nullptr;
  tok["added_tokens"] = std::move(added);
  tok["normalizer"] = glm ? OrderedJson(nullptr) : OrderedJson({{"type", "NFC"}});
  tok["pre_tokenizer"] = PreTokenizerJson(style);
  tok["post_processor"] = glm ? OrderedJson(nullptr)
                              : OrderedJson({{"type", "ByteLevel"},
                                             {"add_prefix_space", false},
                                             {"trim_offsets", false},
                                             {"use_regex", false}});
  tok["decoder"] = {{"type", "ByteLevel"},
                    {"add_prefix_space", true},
                    {"trim_offsets", true},
                    {"use_regex", true}};
  tok["model"] = {{"type", "BPE"},
                  {"dropout", nullptr},
                  {"unk_token", nullptr},
                  {"continuing_subword_prefix", ""},
                  {"end_of_word_suffix", ""},
                  {"fuse_unk", false},
                  {"byte_fallback", false},
                  {"ignore_merges", false},
                  {"vocab", std::move(vocab)},
                  {"merges", std::move(merges)}};
  files.tokenizer_json = tok.dump(2);

  // tokenizer_config.json (keys sorted, as transformers writes them).
  nlohmann::json cfg;
  nlohmann::json decoder = nlohmann::json::object();
  for (const AddedToken& t : files.added_tokens) {
    decoder[std::to_string(t.id)] = {{"content", t.content}, {"lstrip", false},
                                     {"normalized", false},  {"rstrip", false},
                                     {"single_word", false}, {"special", t.special}};
  }
  cfg["added_tokens_decoder"] = std::move(decoder);
  cfg["bos_token"] = nullptr;
  cfg["clean_up_tokenization_spaces"] = false;
  cfg["eos_token"] = glm ? "<|endoftext|>" : "<|im_end|>";
  cfg["pad_token"] = "<|endoftext|>";
  cfg["unk_token"] = nullptr;
  cfg["errors"] = "replace";
  cfg["model_max_length"] = model_max_length;
  cfg["padding_side"] = "left";
  cfg["split_special_tokens"] = false;
  cfg["add_prefix_space"] = false;
  cfg["tokenizer_class"] = "PreTrainedTokenizerFast";
  files.tokenizer_config_json = cfg.dump(2);

  files.chat_template = std::string(glm ? kGlmTemplate : kQwenTemplate);
  return files;
}

}  // namespace ring
