// ringctl bench (this file is not *_bench.cc: that suffix marks benchmark binaries): how fast this machine runs layers of a model, against its own memory
// bandwidth. Probes the device's read bandwidth first, then times a prefill and greedy
// decode steps of the stage, and reports decode tokens/s as a fraction of the roofline
// (probed bandwidth / weight bytes a decode step must read).
//
//   ringctl bench --model /m/glm-5.2-mxfp4 --layers 0-3 --device cuda:0 [--json]
//
// Bytes per decoded token: every weight of the stage's layers, except routed experts, of
// which only the selected top-k of E are read (num_experts_per_tok / experts); on the last
// stage the LM head. The embedding gathers one row per token and is not counted.
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "kernels/cpu/bandwidth.h"
#include "kernels/status.h"
#include "models/inspect.h"
#include "models/model.h"
#include "nlohmann/json.hpp"
#include "server/ringctl_command.h"

#ifdef RING_HAVE_CUDA
#include "kernels/cuda/bandwidth.h"
#endif

namespace ring::ctl {
namespace {

struct Flags {
  std::string model, layers, device = "cpu";
  int64_t prompt_len = 64;
  int decode = 16;
  bool json = false;
};

// Weight bytes one decode step of layers [begin, end) (+ the head when last) reads.
absl::StatusOr<double> DecodeBytes(const std::string& dir, int64_t begin, int64_t end) {
  RING_ASSIGN_OR_RETURN(InspectReport rep, InspectCheckpoint(dir));
  if (!rep.config) return absl::FailedPreconditionError("this build cannot parse " + dir);
  const ModelConfig& c = *rep.config;
  const int64_t experts = c.n_routed_experts > 0 ? c.n_routed_experts : c.num_experts;
  const double active = experts > 0 ? static_cast<double>(c.num_experts_per_tok) / experts : 1.0;
  double bytes = 0;
  for (const InspectGroup& g : rep.groups) {
    const bool last = end == c.num_hidden_layers;
    if (g.layers.empty()) {
      const bool head = absl::StrContains(g.kind, "lm_head") ||
                        (c.tie_word_embeddings && absl::StrContains(g.kind, "embed_tokens"));
      if (last && (head || absl::StrContains(g.kind, "model.norm"))) bytes += g.bytes;
      continue;
    }
    int64_t in_range = 0;
    for (int64_t l : g.layers) in_range += l >= begin && l < end;
    const double per_layer = static_cast<double>(g.bytes) / g.layers.size();
    const double share = absl::StrContains(g.kind, ".switch_mlp.") ? active : 1.0;
    bytes += per_layer * in_range * share;
  }
  return bytes;
}

absl::StatusOr<double> ProbeBandwidth(const DeviceSpec& d) {
  if (d.kind == DeviceSpec::Kind::kCpu) {
    cpu::BandwidthProbe probe(int64_t{1} << 30);
    return probe.Measure(5);
  }
#ifdef RING_HAVE_CUDA
  return cuda::ReadBandwidth(d.ordinal);
#else
  return absl::UnimplementedError("this build has no CUDA backend");
#endif
}

int Run(const Flags& f) {
  auto fail = [](const absl::Status& s) {
    std::cerr << "ringctl bench: " << s << "\n";
    return 1;
  };
  absl::StatusOr<DeviceSpec> dev = ParseDevice(f.device);
  if (!dev.ok()) return fail(dev.status());
  if (absl::Status s = CheckDevice(*dev); !s.ok()) return fail(s);
  absl::StatusOr<ModelConfig> cfg = LoadModelConfig(f.model);
  if (!cfg.ok()) return fail(cfg.status());
  StageRange range{0, cfg->num_hidden_layers};
  if (!f.layers.empty()) {
    std::vector<std::string> p = absl::StrSplit(f.layers, '-');
    int64_t a = 0, b = 0;
    if (!(p.size() == 2 && absl::SimpleAtoi(p[0], &a) && absl::SimpleAtoi(p[1], &b) && a >= 0 &&
          b >= a && b < cfg->num_hidden_layers)) {
      std::cerr << "ringctl bench: --layers '" << f.layers << "': expected A-B inside [0, "
                << cfg->num_hidden_layers << ")\n";
      return 2;
    }
    range = {a, b + 1};
  }
  if (f.prompt_len < 1 || f.decode < 1) {
    std::cerr << "ringctl bench: --prompt-len and --decode must be >= 1\n";
    return 2;
  }
  absl::StatusOr<double> bw = ProbeBandwidth(*dev);
  if (!bw.ok()) return fail(bw.status());
  absl::StatusOr<double> bytes = DecodeBytes(f.model, range.begin, range.end);
  if (!bytes.ok()) return fail(bytes.status());

  LoadOptions lo;
  lo.layers = range;
  lo.device = *dev;
  lo.all_logits = false;
  lo.max_context = f.prompt_len + f.decode;
  const absl::Time t_load = absl::Now();
  absl::StatusOr<std::unique_ptr<Stage>> stage = LoadStage(f.model, lo);
  if (!stage.ok()) return fail(stage.status());
  const double load_s = absl::ToDoubleSeconds(absl::Now() - t_load);
  const int64_t hidden = cfg->hidden_size;
  auto input = [&](int64_t rows, int64_t seed) {
    StageInput in;
    if ((*stage)->is_first()) {
      for (int64_t i = 0; i < rows; ++i) {
        in.tokens.push_back(static_cast<int32_t>((seed + i * 7919) % cfg->vocab_size));
      }
    } else {
      // A later stage gets hidden states of a typical scale (RMS-normalized rows).
      in.hidden.resize(rows * hidden);
      for (size_t i = 0; i < in.hidden.size(); ++i) {
        in.hidden[i] = static_cast<float>(((seed + i * 2654435761u) % 2001) / 1000.0 - 1.0);
      }
    }
    return in;
  };
  std::unique_ptr<Sequence> seq = (*stage)->NewSequence();
  absl::Time t0 = absl::Now();
  absl::StatusOr<StageOutput> out = (*stage)->Forward(*seq, input(f.prompt_len, 1));
  if (!out.ok()) return fail(out.status());
  const double prefill_s = absl::ToDoubleSeconds(absl::Now() - t0);
  // One untimed decode step first: it pays one-time costs (page faults, graph capture).
  out = (*stage)->Forward(*seq, input(1, 2));
  if (!out.ok()) return fail(out.status());
  t0 = absl::Now();
  for (int i = 0; i < f.decode - 1; ++i) {
    out = (*stage)->Forward(*seq, input(1, 3 + i));
    if (!out.ok()) return fail(out.status());
  }
  const int timed = f.decode - 1;
  const double decode_s = timed > 0 ? absl::ToDoubleSeconds(absl::Now() - t0) / timed : 0;
  const double roofline = *bytes > 0 ? *bw / *bytes : 0;
  const double tok_s = decode_s > 0 ? 1.0 / decode_s : 0;
  if (f.json) {
    nlohmann::ordered_json j = {
        {"model", f.model}, {"layers", {range.begin, range.end}}, {"device", dev->ToString()},
        {"bandwidth_bytes_per_s", *bw}, {"decode_bytes_per_token", *bytes},
        {"load_seconds", load_s}, {"prefill_tokens", f.prompt_len},
        {"prefill_seconds", prefill_s}, {"decode_steps_timed", timed},
        {"decode_seconds_per_step", decode_s}, {"decode_tokens_per_s", tok_s},
        {"roofline_tokens_per_s", roofline},
        {"fraction_of_roofline", roofline > 0 ? tok_s / roofline : 0}};
    std::cout << j.dump(1) << "\n";
    return 0;
  }
  std::cout << absl::StrFormat(
      "bench %s layers [%d, %d) on %s\n"
      "read bandwidth (probed):  %.1f GB/s\n"
      "bytes per decoded token:  %.1f MB (active weights: top-k of routed experts%s)\n"
      "load:                     %.2f s\n"
      "prefill %d tokens:        %.1f ms (%.1f tok/s)\n"
      "decode (%d timed steps):   %.3f ms/step (%.1f tok/s)\n"
      "roofline:                 %.1f tok/s; decode at %.1f%% of it\n",
      f.model, range.begin, range.end, dev->ToString(), *bw / 1e9, *bytes / 1e6,
      range.end == cfg->num_hidden_layers ? ", LM head" : "", load_s, f.prompt_len,
      prefill_s * 1e3, f.prompt_len / prefill_s, timed, decode_s * 1e3, tok_s, roofline,
      roofline > 0 ? 100 * tok_s / roofline : 0);
  return 0;
}

Registration reg("bench",
                 "Time prefill and decode of layers of a model on a device, against its probed "
                 "memory bandwidth",
                 [](CLI::App* cmd) -> Handler {
                   auto f = std::make_shared<Flags>();
                   cmd->add_option("--model", f->model, "Model directory")->required();
                   cmd->add_option("--layers", f->layers,
                                   "Layers A-B (inclusive); default: all");
                   cmd->add_option("--device", f->device, "cpu or cuda:N");
                   cmd->add_option("--prompt-len", f->prompt_len, "Prefill tokens");
                   cmd->add_option("--decode", f->decode, "Decode steps (the first is untimed)");
                   cmd->add_flag("--json", f->json, "Print JSON");
                   return [f] { return Run(*f); };
                 });

}  // namespace
}  // namespace ring::ctl
