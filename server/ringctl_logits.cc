// ringctl logits: run a model on the CPU reference engine (optionally split into stages)
// and write float32 logits for every prompt position and every decode step as .npy.
#include <cstdio>
#include <fstream>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kernels/cpu/ops.h"
#include "models/model.h"
#include "server/ringctl_command.h"

namespace ring::ctl {
namespace {

absl::StatusOr<std::vector<int32_t>> ParseTokenList(const std::string& s, const char* flag) {
  std::vector<int32_t> out;
  if (s.empty()) return out;
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipWhitespace())) {
    int32_t v;
    if (!absl::SimpleAtoi(part, &v)) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": '", part, "' is not a token id"));
    }
    out.push_back(v);
  }
  return out;
}

absl::Status WriteNpy(const std::string& path, const std::vector<float>& data, int64_t rows,
                      int64_t cols) {
  std::string header = absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': (",
                                    rows, ", ", cols, "), }");
  // NPY v1: magic(6) + version(2) + len(2) + header padded with spaces to 64 bytes, '\n'.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream f(path, std::ios::binary);
  if (!f) return absl::PermissionDeniedError("cannot write " + path);
  const uint16_t len = static_cast<uint16_t>(header.size());
  f.write("\x93NUMPY\x01\x00", 8);
  f.write(reinterpret_cast<const char*>(&len), 2);
  f.write(header.data(), header.size());
  f.write(reinterpret_cast<const char*>(data.data()), data.size() * sizeof(float));
  if (!f) return absl::DataLossError("short write to " + path);
  return absl::OkStatus();
}

struct Options {
  std::string model, tokens, force_decode, out, backend = "cpu", act = "auto";
  int decode = 0, stages = 1, prefill_chunk = 0;
};

absl::Status Run(const Options& o) {
  if (o.backend != "cpu") {
    return absl::UnimplementedError("--backend " + o.backend +
                                    " is not built in this version; use --backend cpu");
  }
  std::vector<int32_t> prompt, forced;
  { auto p = ParseTokenList(o.tokens, "--tokens"); if (!p.ok()) return p.status(); prompt = *p; }
  { auto p = ParseTokenList(o.force_decode, "--force-decode"); if (!p.ok()) return p.status(); forced = *p; }
  if (prompt.empty()) return absl::InvalidArgumentError("--tokens: need at least one token");
  if (!forced.empty() && o.decode > 0 && static_cast<int>(forced.size()) != o.decode) {
    return absl::InvalidArgumentError("--decode and --force-decode disagree on the step count");
  }
  LoadOptions lo;
  if (o.act == "f32") lo.act_dtype = cpu::ActDType::kF32;
  else if (o.act == "bf16") lo.act_dtype = cpu::ActDType::kBF16;
  else if (o.act != "auto") return absl::InvalidArgumentError("--act must be auto, bf16 or f32");

  // Layer count comes from the first stage's config; load stage 0 over all layers first
  // only when a single stage is asked for.
  std::vector<std::unique_ptr<Stage>> stages;
  {
    lo.layers = {0, -1};
    auto whole = LoadStage(o.model, lo);
    if (!whole.ok()) return whole.status();
    const int64_t n = (*whole)->config().num_hidden_layers;
    if (o.stages < 1 || o.stages > n) {
      return absl::InvalidArgumentError(absl::StrCat("--stages must be in [1, ", n, "]"));
    }
    if (o.stages == 1) {
      stages.push_back(std::move(*whole));
    } else {
      whole->reset();
      for (const StageRange& r : SplitLayers(n, o.stages)) {
        lo.layers = r;
        auto s = LoadStage(o.model, lo);
        if (!s.ok()) return s.status();
        stages.push_back(std::move(*s));
      }
    }
  }
  const int64_t vocab = stages.back()->config().vocab_size;
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (auto& s : stages) seqs.push_back(s->NewSequence());

  std::vector<float> all;
  auto step = [&](const std::vector<int32_t>& toks) -> absl::Status {
    StageInput in;
    in.tokens = toks;
    for (size_t i = 0; i < stages.size(); ++i) {
      auto out = stages[i]->Forward(*seqs[i], in);
      if (!out.ok()) return out.status();
      if (i + 1 == stages.size()) {
        all.insert(all.end(), out->logits.begin(), out->logits.end());
      } else {
        in = StageInput{};
        in.hidden = std::move(out->hidden);
        in.topk = std::move(out->topk);
      }
    }
    return absl::OkStatus();
  };
  const size_t chunk = o.prefill_chunk > 0 ? o.prefill_chunk : prompt.size();
  for (size_t b = 0; b < prompt.size(); b += chunk) {
    std::vector<int32_t> part(prompt.begin() + b,
                              prompt.begin() + std::min(prompt.size(), b + chunk));
    if (auto s = step(part); !s.ok()) return s;
  }
  const int steps = forced.empty() ? o.decode : static_cast<int>(forced.size());
  std::vector<int32_t> emitted;
  for (int i = 0; i < steps; ++i) {
    const int32_t next =
        forced.empty() ? static_cast<int32_t>(cpu::ArgMax(all.data() + all.size() - vocab, vocab))
                       : forced[i];
    emitted.push_back(next);
    if (auto s = step({next}); !s.ok()) return s;
  }
  const int64_t rows = static_cast<int64_t>(all.size()) / vocab;
  if (!o.out.empty()) {
    if (auto s = WriteNpy(o.out, all, rows, vocab); !s.ok()) return s;
  }
  std::cerr << "logits: " << rows << " rows x " << vocab << " (" << stages.size()
            << " stage(s))";
  if (!emitted.empty()) {
    std::cerr << ", decode tokens:";
    for (int32_t t : emitted) std::cerr << ' ' << t;
  }
  std::cerr << "\n";
  return absl::OkStatus();
}

Registration reg("logits", "Run the CPU reference engine and write float32 logits (.npy)",
                 [](CLI::App* cmd) -> Handler {
                   auto o = std::make_shared<Options>();
                   cmd->add_option("--model", o->model, "Model directory (MLX checkpoint)")->required();
                   cmd->add_option("--tokens", o->tokens, "Prompt token ids, comma separated")->required();
                   cmd->add_option("--decode", o->decode, "Greedy decode steps after the prompt");
                   cmd->add_option("--force-decode", o->force_decode,
                                   "Feed these tokens as decode steps instead of greedy ones");
                   cmd->add_option("--prefill-chunk", o->prefill_chunk,
                                   "Process the prompt in chunks of this many tokens (0: one chunk)");
                   cmd->add_option("--stages", o->stages, "Split the layers into N stages in-process");
                   cmd->add_option("--backend", o->backend, "cpu");
                   cmd->add_option("--act", o->act, "Activation dtype: auto (checkpoint's), bf16, f32");
                   cmd->add_option("--out", o->out, "Output .npy file: float32 [rows, vocab]");
                   return [o] {
                     absl::Status s = Run(*o);
                     if (!s.ok()) {
                       std::cerr << "ringctl logits: " << s.message() << "\n";
                       return 1;
                     }
                     return 0;
                   };
                 });

}  // namespace
}  // namespace ring::ctl
