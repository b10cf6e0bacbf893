// ringctl tokenize: run the C++ tokenizer (server/tokenizer.h) over JSON lines, for the
// HF parity test (tests/tokenizer_parity.py) and the benchmark (bench/tokenizer_bench.py).
//
//   ringctl tokenize --model /models/GLM-5.2 < in.jsonl > out.jsonl
//   ringctl tokenize --tokenizer tokenizer.json --input in.jsonl --skip-special
//   ringctl tokenize --tokenizer tokenizer.json --input corpus.jsonl --bench --repeat 5
//
// Input, one JSON value per line:
//   "text"                                  encode (and decode the ids back)
//   {"text": "...", "allow_special": false, "skip_special": true}   same, per-line flags
//   {"ids": [1, 2, 3], "skip_special": true}                         decode only
// Output, one line per input line:
//   {"ids": [...], "decoded": "...", "stream": "..."}  ("ids" only when encoding)
//   {"error": "..."}                                   when encoding fails
// "decoded" is Decode(ids); "stream" the concatenation of StreamDecoder's Push()es and
// Finish(), which must be equal to it.
//
// --bench reads the lines (strings) first and then times Encode() alone, single-threaded,
// best of --repeat passes; it prints one JSON object with the throughput.
//
// Exit code 0 when every line was processed (an {"error"} line included), 1 when the
// tokenizer or the input cannot be read, 2 for usage errors.
#ifdef RING_HAVE_TEXT

#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "server/ringctl_command.h"
#include "server/tokenizer.h"

namespace ring::ctl {
namespace {

using Json = nlohmann::json;
using text::StreamDecoder;
using text::Tokenizer;

struct TokenizeArgs {
  std::string model;
  std::string tokenizer;
  std::string input = "-";
  std::string output = "-";
  bool no_special = false;
  bool skip_special = false;
  bool bench = false;
  int repeat = 3;
};

absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const TokenizeArgs& a) {
  if (!a.model.empty()) return Tokenizer::FromModelDir(a.model);
  std::ifstream in(a.tokenizer, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", a.tokenizer));
  std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return Tokenizer::FromJson(json);
}

Json DecodeBoth(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special,
                Json out) {
  out["decoded"] = tok.Decode(ids, skip_special);
  StreamDecoder stream(&tok, skip_special);
  std::string streamed;
  for (int32_t id : ids) streamed += stream.Push(id);
  streamed += stream.Finish();
  out["stream"] = std::move(streamed);
  return out;
}

Json ProcessLine(const Tokenizer& tok, const Json& in, const TokenizeArgs& a) {
  bool allow_special = !a.no_special;
  bool skip_special = a.skip_special;
  const Json* text = nullptr;
  if (in.is_string()) {
    text = &in;
  } else if (in.is_object()) {
    if (auto it = in.find("allow_special"); it != in.end()) allow_special = it->get<bool>();
    if (auto it = in.find("skip_special"); it != in.end()) skip_special = it->get<bool>();
    if (auto it = in.find("ids"); it != in.end()) {
      return DecodeBoth(tok, it->get<std::vector<int32_t>>(), skip_special, Json::object());
    }
    if (auto it = in.find("text"); it != in.end()) text = &*it;
  }
  if (text == nullptr || !text->is_string()) {
    return {{"error", "expected a string, {\"text\": ...} or {\"ids\": [...]}"}};
  }
  absl::StatusOr<std::vector<int32_t>> ids =
      tok.Encode(text->get_ref<const std::string&>(), allow_special);
  if (!ids.ok()) return {{"error", std::string(ids.status().message())}};
  Json out = Json::object();
  out["ids"] = *ids;
  return DecodeBoth(tok, *ids, skip_special, std::move(out));
}

int RunBench(const Tokenizer& tok, std::istream& in, std::ostream& out, const TokenizeArgs& a,
             double load_s) {
  std::vector<std::string> lines;
  size_t bytes = 0;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_string()) {
      std::cerr << "ringctl tokenize --bench: every line must be a JSON string\n";
      return 1;
    }
    lines.push_back(j.get<std::string>());
    bytes += lines.back().size();
  }
  double best = 1e30;
  size_t tokens = 0;
  for (int r = 0; r < std::max(1, a.repeat); ++r) {
    tokens = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (const std::string& s : lines) {
      absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(s, !a.no_special);
      if (!ids.ok()) {
        std::cerr << "ringctl tokenize --bench: " << ids.status().message() << "\n";
        return 1;
      }
      tokens += ids->size();
    }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                              .count());
  }
  Json result = {{"lines", lines.size()},  {"bytes", bytes},
                 {"tokens", tokens},       {"seconds", best},
                 {"repeat", a.repeat},     {"load_seconds", load_s},
                 {"mb_per_s", bytes / best / 1e6}, {"tokens_per_s", tokens / best}};
  out << result.dump() << "\n";
  return 0;
}

int RunTokenize(const TokenizeArgs& a) {
  if (a.model.empty() == a.tokenizer.empty()) {
    std::cerr << "ringctl tokenize: give exactly one of --model DIR or --tokenizer FILE\n";
    return 2;
  }
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Load(a);
  if (!tok.ok()) {
    std::cerr << "ringctl tokenize: " << tok.status().message() << "\n";
    return 1;
  }
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::ifstream in_file;
  std::ofstream out_file;
  if (a.input != "-") {
    in_file.open(a.input, std::ios::binary);
    if (!in_file) {
      std::cerr << "ringctl tokenize: cannot open " << a.input << "\n";
      return 1;
    }
  }
  if (a.output != "-") {
    out_file.open(a.output, std::ios::binary);
    if (!out_file) {
      std::cerr << "ringctl tokenize: cannot write " << a.output << "\n";
      return 1;
    }
  }
  std::istream& in = a.input == "-" ? std::cin : in_file;
  std::ostream& out = a.output == "-" ? std::cout : out_file;
  if (a.bench) return RunBench(**tok, in, out, a, load_s);

  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      std::cerr << "ringctl tokenize: line " << line_no << " is not JSON\n";
      return 1;
    }
    Json result;
    try {
      result = ProcessLine(**tok, j, a);
    } catch (const Json::exception& e) {
      result = {{"error", absl::StrCat("line ", line_no, ": ", e.what())}};
    }
    // Decoded text is valid UTF-8 by construction; replace just in case, never throw.
    out << result.dump(-1, ' ', false, Json::error_handler_t::replace) << "\n";
  }
  out.flush();
  return out ? 0 : 1;
}

Registration reg("tokenize", "Tokenize / detokenize JSON lines with a model's tokenizer.json",
                 [](CLI::App* cmd) -> Handler {
                   auto a = std::make_shared<TokenizeArgs>();
                   cmd->add_option("--model", a->model,
                                   "model directory (tokenizer.json + tokenizer_config.json)");
                   cmd->add_option("--tokenizer", a->tokenizer, "a tokenizer.json file");
                   cmd->add_option("--input", a->input, "JSON lines to read (- = stdin)");
                   cmd->add_option("--output", a->output, "where to write (- = stdout)");
                   cmd->add_flag("--no-special", a->no_special,
                                 "treat special added tokens in the text as plain text");
                   cmd->add_flag("--skip-special", a->skip_special,
                                 "drop special tokens when decoding");
                   cmd->add_flag("--bench", a->bench,
                                 "time encoding of the input lines (strings) only");
                   cmd->add_option("--repeat", a->repeat, "--bench passes (best is kept)");
                   return [a] { return RunTokenize(*a); };
                 });

}  // namespace
}  // namespace ring::ctl

#endif  // RING_HAVE_TEXT
