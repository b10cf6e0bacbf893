// CPU engine end to end: prefill and decode tokens/s of a synthesized model (default: the
// shape of Qwen3-0.6B, affine 4-bit g64 as mlx-community ships it), next to the decode
// roofline of this machine = measured read bandwidth / weight bytes per token, all measured
// in one run.
//
//   build/bench/cpu_model_bench [--preset qwen3-0.6b] [--arch qwen3] [--quant affine4]
//                               [--prompt 128] [--decode 32] [--dir /tmp/ring_bench_model]
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "bench/bench_util.h"
#include "models/model.h"
#include "models/synth.h"

namespace {

using ring::bench::Clock;
using ring::bench::Seconds;

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "cpu_model_bench: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string preset = "qwen3-0.6b", arch = "qwen3", quant = "affine4";
  std::string dir = "/tmp/ring_bench_model";
  int prompt = 128, decode = 32;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--preset") preset = v;
    else if (k == "--arch") arch = v;
    else if (k == "--quant") quant = v;
    else if (k == "--prompt") prompt = std::stoi(v);
    else if (k == "--decode") decode = std::stoi(v);
    else if (k == "--dir") dir = v;
    else { std::fprintf(stderr, "unknown flag %s\n", k.c_str()); return 2; }
  }
  ring::QuantSpec spec = quant == "mxfp4" ? ring::QuantSpec{ring::QuantMode::kMxfp4, 4, 32}
                         : quant == "bf16" ? ring::QuantSpec{}
                                           : ring::QuantSpec{ring::QuantMode::kAffine, 4, 64};
  const std::string model_dir = dir + "/" + preset + "-" + quant;
  if (!std::filesystem::exists(model_dir + "/config.json")) {
    ring::SynthOptions o;
    o.arch = arch;
    o.preset = preset;
    o.quant = spec;
    o.seed = 1;
    o.out_dir = model_dir;
    o.overwrite = true;
    const auto t0 = Clock::now();
    if (auto s = ring::SynthesizeCheckpoint(o); !s.ok()) return Fail(s);
    std::printf("synthesized %s (%s) in %.1f s\n", preset.c_str(), quant.c_str(),
                Seconds(t0, Clock::now()));
  }
  ring::LoadOptions lo;
  lo.all_logits = false;
  auto stage = ring::LoadStage(model_dir, lo);
  if (!stage.ok()) return Fail(stage.status());
  const auto& cfg = (*stage)->config();
  const double weight_bytes = static_cast<double>((*stage)->weight_bytes());

  ring::bench::BandwidthProbe probe(
      std::max<int64_t>(4 * ring::bench::LastLevelCacheBytes(), int64_t{1} << 30));
  const double bw = probe.Measure(5);

  std::vector<int32_t> toks(prompt);
  for (int i = 0; i < prompt; ++i) toks[i] = (i * 7919 + 13) % (cfg.vocab_size - 1) + 1;
  auto seq = (*stage)->NewSequence();
  ring::StageInput in;
  in.tokens = toks;
  auto t0 = Clock::now();
  auto out = (*stage)->Forward(*seq, in);
  if (!out.ok()) return Fail(out.status());
  const double prefill_s = Seconds(t0, Clock::now());
  int32_t next = 1;
  t0 = Clock::now();
  for (int i = 0; i < decode; ++i) {
    in.tokens = {next};
    auto o = (*stage)->Forward(*seq, in);
    if (!o.ok()) return Fail(o.status());
    next = static_cast<int32_t>(ring::cpu::ArgMax(o->logits.data(), cfg.vocab_size));
  }
  const double decode_s = Seconds(t0, Clock::now());
  const double roofline = bw / weight_bytes;
  std::printf("model %s (%s, %s), %lld layers, hidden %lld, %.1f MiB of weights, %d threads\n",
              preset.c_str(), cfg.model_type.c_str(), quant.c_str(),
              static_cast<long long>(cfg.num_hidden_layers),
              static_cast<long long>(cfg.hidden_size), weight_bytes / (1 << 20),
              ring::cpu::NumThreads());
  std::printf("memory read bandwidth (probe): %.2f GB/s\n", bw / 1e9);
  std::printf("| phase | tokens | seconds | tokens/s | roofline tokens/s | ratio |\n");
  std::printf("|---|---|---|---|---|---|\n");
  std::printf("| prefill | %d | %.3f | %.1f | - | - |\n", prompt, prefill_s, prompt / prefill_s);
  std::printf("| decode | %d | %.3f | %.2f | %.2f | %.2f |\n", decode, decode_s,
              decode / decode_s, roofline, decode / decode_s / roofline);
  return 0;
}
