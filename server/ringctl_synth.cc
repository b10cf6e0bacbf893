// ringctl synth: write a random checkpoint in mlx-lm's layout (models/synth.h).
//
//   ringctl synth --arch glm_moe_dsa --preset glm-5.2 --layers 4 --quant mxfp4 --out /tmp/g
//   ringctl synth --preset tiny --arch qwen3_moe --quant affine --bits 4 --out /tmp/q
//   ringctl synth --preset glm-5.2 --layers 4 --dry-run       # list tensors, write nothing
#include <chrono>
#include <cstdio>
#include <iostream>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "models/synth.h"
#include "server/ringctl_command.h"

namespace ring::ctl {
namespace {

struct SynthArgs {
  std::string arch;
  std::string preset = "tiny";
  int64_t layers = 0;
  std::string quant;
  int bits = 0;
  int group_size = 0;
  uint64_t seed = 0;
  int64_t index_topk = 0;
  std::string out;
  double max_shard_gb = 5.0;
  bool force = false;
  bool dry_run = false;
  bool quiet = false;
};

double GiB(uint64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0); }

int RunSynth(const SynthArgs& a, CLI::App* cmd) {
  SynthOptions o;
  o.arch = a.arch;
  o.preset = a.preset;
  if (cmd->count("--layers")) o.layers = a.layers;
  if (cmd->count("--index-topk")) o.index_topk = a.index_topk;
  o.seed = a.seed;
  o.out_dir = a.out;
  o.overwrite = a.force;
  if (a.max_shard_gb <= 0) {
    std::cerr << "ringctl synth: --max-shard-gb must be > 0\n";
    return 2;
  }
  o.max_shard_bytes = static_cast<uint64_t>(a.max_shard_gb * 1024.0 * 1024.0 * 1024.0);
  std::string quant = a.quant;
  if (quant.empty()) {
    // mlx-community conventions: GLM/DeepSeek in mxfp4, Qwen3 in affine 4-bit.
    const std::string arch = a.arch.empty() ? (a.preset.rfind("qwen3", 0) == 0 ? "qwen3" : "")
                                            : a.arch;
    quant = arch.rfind("qwen3", 0) == 0 ? "affine" : "mxfp4";
  }
  absl::StatusOr<QuantSpec> spec = ParseSynthQuant(quant, a.bits, a.group_size);
  if (!spec.ok()) {
    std::cerr << "ringctl synth: " << spec.status().message() << "\n";
    return 2;
  }
  o.quant = *spec;

  absl::StatusOr<SynthPlan> plan = PlanSynthCheckpoint(o);
  if (!plan.ok()) {
    std::cerr << "ringctl synth: " << plan.status().message() << "\n";
    return 2;
  }
  const ModelConfig& c = plan->config;
  const std::vector<StoredTensor> tensors = plan->Tensors();
  std::cout << absl::StrFormat(
      "%s preset %s: %d layers, hidden %d, vocab %d, quant %s, seed %d\n"
      "%d tensors, %.3f GiB, %d parameters\n",
      c.model_type, a.preset, c.num_hidden_layers, c.hidden_size, c.vocab_size,
      o.quant.mode == QuantMode::kNone ? std::string("bf16") : o.quant.ToString(), o.seed,
      tensors.size(), GiB(plan->total_bytes), plan->total_parameters);
  if (a.dry_run) {
    for (const StoredTensor& t : tensors) {
      std::cout << absl::StrFormat("%-64s %-5s %s\n", t.name, DTypeName(t.dtype),
                                   ShapeToString(t.shape));
    }
    return 0;
  }
  if (a.out.empty()) {
    std::cerr << "ringctl synth: --out DIR is required (or use --dry-run)\n";
    return 2;
  }

  const auto start = std::chrono::steady_clock::now();
  auto last = start;
  if (!a.quiet) {
    o.progress = [&](const SynthProgress& p) {
      const auto now = std::chrono::steady_clock::now();
      const bool done = p.params_done == p.params_total;
      if (!done && now - last < std::chrono::seconds(2)) return;
      last = now;
      const double secs = std::chrono::duration<double>(now - start).count();
      std::cerr << absl::StrFormat("  [%5.1f%%] %d/%d params, %.2f/%.2f GiB, %.0fs  %s\n",
                                   p.bytes_total ? 100.0 * p.bytes_done / p.bytes_total : 100.0,
                                   p.params_done, p.params_total, GiB(p.bytes_done),
                                   GiB(p.bytes_total), secs, p.tensor);
    };
  }
  absl::Status st = SynthesizeCheckpoint(o);
  if (!st.ok()) {
    std::cerr << "ringctl synth: " << st.message() << "\n";
    return 1;
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << absl::StrFormat("wrote %s in %.1fs\n", a.out, secs);
  return 0;
}

Registration reg("synth", "Write a random checkpoint in mlx-lm's layout (any family, any quant)",
                 [](CLI::App* cmd) -> Handler {
                   auto a = std::make_shared<SynthArgs>();
                   cmd->add_option("--arch", a->arch,
                                   "model_type: " + absl::StrJoin(SynthArchNames(), ", ") +
                                       " (default: the preset's; tiny: glm_moe_dsa)");
                   cmd->add_option("--preset", a->preset,
                                   "dimensions: " + absl::StrJoin(SynthPresetNames(), ", "))
                       ->capture_default_str();
                   cmd->add_option("--layers", a->layers, "num_hidden_layers to write");
                   cmd->add_option("--quant", a->quant,
                                   "mxfp4 | mxfp8 | nvfp4 | affine | affine<bits> | bf16 "
                                   "(default: mxfp4; qwen3*: affine)");
                   cmd->add_option("--bits", a->bits, "affine bits (2,3,4,5,6,8)");
                   cmd->add_option("--group-size", a->group_size, "group size (affine: 32/64/128)");
                   cmd->add_option("--seed", a->seed, "random seed")->capture_default_str();
                   cmd->add_option("--index-topk", a->index_topk, "DSA index_topk override");
                   cmd->add_option("--out", a->out, "output directory");
                   cmd->add_option("--max-shard-gb", a->max_shard_gb, "shard size limit in GiB")
                       ->capture_default_str();
                   cmd->add_flag("--force", a->force, "replace a checkpoint already in --out");
                   cmd->add_flag("--dry-run", a->dry_run, "print the tensor plan, write nothing");
                   cmd->add_flag("--quiet", a->quiet, "no progress lines");
                   return [a, cmd] { return RunSynth(*a, cmd); };
                 });

}  // namespace
}  // namespace ring::ctl
