// File: bench/glm_slice_bench.cc
//
// Prefill and decode speed of a DeepSeek/GLM slice (e.g. the GLM-5.2 4-layer slice from
// `ringctl synth --arch glm_moe_dsa --preset glm-5.2 --layers 4 --quant mxfp4`) on one
// device, against the bytes a decode step must read, in one run:
//   1. the device's read bandwidth (kernels/cuda/bandwidth.h probe; CUDA builds only);
//   2. the bytes a decode step reads, from the checkpoint's tensor sizes: every tensor of a
//      layer once, except the stacked routed experts (k of E experts per token), the
//      embedding (one row) and the head; per layer, and the KV-cache bytes at a context;
//   3. prefill of a --prompt-token prompt (one untimed warm-up sequence, then --reps timed
//      sequences; all_logits off, greedy argmax on the device, as a server runs it);
//   4. --decode greedy steps after that prompt (context prompt..prompt+decode: with
//      prompt > index_topk the sparse DSA path) and after a --short-token prompt.
// Times are host wall time around Stage::Forward (which returns after the step's work).
// The step order is printed ("step order:") so that a kernel trace of the same run
// (bench/gpu/kernel_trace.cc, RING_CUDA_LAYER_MARKS=1) can be cut into steps and layers:
// bench/gpu/glm_trace_report.py does that and the 78-layer extrapolation.
//
//   glm_slice_bench --model DIR [--device cuda] [--prompt 2048] [--decode 64] [--short 16]
//                   [--reps 3] [--chunk N] [--no-probe] [--grouped-tile N]
// --chunk N prefills the long prompt in steps of N tokens, as ring-server does (its
// prefill_chunk, 512 by default); 0 (default): one step, which the kernel-trace report
// (bench/gpu/glm_trace_report.py) assumes.
// --grouped-tile N forces the prefill GEMM's tile N for the grouped (MoE expert) launches
// only (TEST_SetGroupedGemmTile: 0..2 one tile, 3 the automatic large + small split;
// tuning aid).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "models/model.h"
#include "models/safetensors.h"
#if RING_HAVE_CUDA
#include "kernels/cuda/bandwidth.h"
#include "kernels/cuda/qgemv.cuh"
#endif

namespace {

struct Options {
  std::string model, device = "cuda";
  int prompt = 2048, decode = 64, short_prompt = 16, reps = 3, chunk = 0;
  bool probe = true;
};

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "glm_slice_bench: %s\n", msg.c_str());
  std::exit(1);
}

template <typename T>
T Must(absl::StatusOr<T> v) {
  if (!v.ok()) Die(std::string(v.status().message()));
  return *std::move(v);
}

double NowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<int32_t> Tokens(int n, int seed, int64_t vocab) {
  const int64_t span = std::min<int64_t>(154000, vocab - 10);
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = static_cast<int32_t>((int64_t{i} * 7919 + seed) % span + 10);
  return t;
}

// Bytes of the checkpoint's tensors, by what a decode step does with them.
struct Bytes {
  std::map<int64_t, int64_t> layer;          // every tensor of layer l except routed experts
  std::map<int64_t, int64_t> experts;        // layer l's stacked routed experts (all E)
  std::map<int64_t, int64_t> indexer;        // layer l's indexer tensors (part of layer[l])
  int64_t embed = 0, head = 0;               // embedding table; final norm + lm_head
};

Bytes CountBytes(const std::string& dir) {
  std::unique_ptr<ring::Checkpoint> ck = Must(ring::Checkpoint::Open(dir));
  Bytes b;
  for (const std::string& name : ck->Names()) {
    const ring::TensorEntry e = Must(ck->Describe(name));
    const int64_t n = static_cast<int64_t>(e.end - e.begin);
    if (absl::StartsWith(name, "model.layers.")) {
      int64_t l = 0;
      const size_t dot = name.find('.', 13);
      if (!absl::SimpleAtoi(name.substr(13, dot - 13), &l)) Die("bad tensor name " + name);
      if (absl::StrContains(name, ".switch_mlp.")) {
        b.experts[l] += n;
      } else {
        b.layer[l] += n;
        if (absl::StrContains(name, ".indexer.")) b.indexer[l] += n;
      }
    } else if (absl::StartsWith(name, "model.embed_tokens.")) {
      b.embed += n;
    } else {
      b.head += n;  // lm_head.*, model.norm.*
    }
  }
  return b;
}

// FLOPs of the linear layers (2 x rows x cols a token) of a T-token prompt in one step, as
// the GPU stage runs it with every row seeing at most index_topk keys: MLA's projections, its
// latent cache expanded into T keys' and values' heads, the indexer's projections on layers
// with their own, the dense MLP or the MoE router, shared and top-k routed experts, and
// lm_head on the last row. 0 where the model is not MLA or T is past index_topk (rows then
// run absorbed, whose products are not a linear layer's).
struct LinearFlops {
  double total = 0, routed = 0;
};
LinearFlops PrefillLinearFlops(const ring::ModelConfig& c, int64_t T) {
  LinearFlops f;
  if (c.kv_lora_rank <= 0 || (c.has_indexer() && T > c.index_topk)) return f;
  const double t = static_cast<double>(T), h = static_cast<double>(c.hidden_size);
  const double H = static_cast<double>(c.num_attention_heads);
  const double qd = H * (c.qk_nope_head_dim + c.qk_rope_head_dim);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    double per_tok = c.q_lora_rank ? h * *c.q_lora_rank + *c.q_lora_rank * qd : h * qd;
    per_tok += h * (c.kv_lora_rank + c.qk_rope_head_dim);                     // kv_a
    per_tok += c.kv_lora_rank * H * (c.qk_nope_head_dim + c.v_head_dim);      // expanded K, V
    per_tok += H * c.v_head_dim * h;                                          // o_proj
    if (c.has_indexer() && c.has_indexer_weights(l)) {
      per_tok += (c.q_lora_rank ? *c.q_lora_rank : h) * c.index_n_heads * c.index_head_dim +
                 h * c.index_head_dim + h * c.index_n_heads;                  // wq_b, wk, weights
    }
    if (c.is_moe_layer(l)) {
      const double expert = 3.0 * h * c.moe_intermediate_size;
      per_tok += h * c.n_routed_experts + c.n_shared_experts * expert;        // router, shared
      f.routed += 2 * t * c.num_experts_per_tok * expert;
    } else {
      per_tok += 3.0 * h * c.intermediate_size;
    }
    f.total += 2 * t * per_tok;
  }
  f.total += f.routed + 2 * h * c.vocab_size;  // lm_head, last row
  return f;
}

ring::StageOutput Step(const ring::Stage& st, ring::Sequence& seq, const std::vector<int32_t>& toks) {
  ring::StageInput in;
  in.tokens = toks;
  in.argmax_only = true;
  return Must(st.Forward(seq, in));
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Die("missing value after " + a);
      return argv[++i];
    };
    auto num = [&]() {
      int v = 0;
      if (!absl::SimpleAtoi(next(), &v) || v < 0) Die("bad number after " + a);
      return v;
    };
    if (a == "--model") o.model = next();
    else if (a == "--device") o.device = next();
    else if (a == "--prompt") o.prompt = num();
    else if (a == "--decode") o.decode = num();
    else if (a == "--short") o.short_prompt = num();
    else if (a == "--reps") o.reps = std::max(1, num());
    else if (a == "--chunk") o.chunk = num();
    else if (a == "--no-probe") o.probe = false;
#if RING_HAVE_CUDA
    else if (a == "--grouped-tile") ring::cuda::TEST_SetGroupedGemmTile(num());
#endif
    else Die("unknown flag " + a);
  }
  if (o.model.empty()) Die("--model DIR is required");

  double gbps = 0;
#if RING_HAVE_CUDA
  if (o.probe && o.device != "cpu") {
    gbps = Must(ring::cuda::ReadBandwidth(0)) / 1e9;
    std::printf("read bandwidth probe: %.0f GB/s\n", gbps);
  }
#endif

  ring::LoadOptions lo;
  lo.device = Must(ring::ParseDevice(o.device));
  lo.all_logits = false;
  lo.max_context = o.prompt + o.decode + 8;
  const double t_load = NowMs();
  std::unique_ptr<ring::Stage> st = Must(ring::LoadStage(o.model, lo));
  const ring::ModelConfig& c = st->config();
  std::printf("model %s: %lld layers, loaded in %.1f s (%.2f GB of weights)\n", o.model.c_str(),
              static_cast<long long>(c.num_hidden_layers), (NowMs() - t_load) / 1e3,
              st->weight_bytes() / 1e9);

  // Bytes a decode step reads.
  const Bytes b = CountBytes(o.model);
  const double kfrac = c.n_routed_experts > 0
                           ? static_cast<double>(c.num_experts_per_tok) / c.n_routed_experts
                           : 0;
  const double embed_row = c.vocab_size > 0 ? static_cast<double>(b.embed) / c.vocab_size : 0;
  double weights_total = embed_row + b.head;
  std::printf("decode bytes per token (weights): embedding row %.0f B, head %.1f MB\n", embed_row,
              b.head / 1e6);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const auto get = [l](const std::map<int64_t, int64_t>& m) {
      auto it = m.find(l);
      return it == m.end() ? int64_t{0} : it->second;
    };
    const double lb = get(b.layer) + kfrac * get(b.experts);
    weights_total += lb;
    std::printf("  layer %lld (%s, indexer %s): %.1f MB (non-expert %.1f MB, of it indexer %.1f MB; "
                "routed experts %d of %lld: %.1f MB)\n",
                static_cast<long long>(l), c.is_moe_layer(l) ? "moe" : "dense",
                !c.has_indexer() ? "none" : c.has_indexer_weights(l) ? "full" : "shared", lb / 1e6,
                get(b.layer) / 1e6, get(b.indexer) / 1e6,
                static_cast<int>(c.num_experts_per_tok),
                static_cast<long long>(c.n_routed_experts), kfrac * get(b.experts) / 1e6);
  }
  // KV-cache bytes read per layer at context S (fp32 caches): MLA latent + rope key of
  // min(S, index_topk) rows when sparse (all S when dense), indexer keys of all S rows on
  // full layers.
  auto cache_bytes = [&](int64_t S) {
    double tot = 0;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const bool sparse = c.has_indexer() && S > c.index_topk;
      tot += 4.0 * (sparse ? c.index_topk : S) * (c.kv_lora_rank + c.qk_rope_head_dim);
      if (c.has_indexer() && c.has_indexer_weights(l)) tot += 4.0 * S * c.index_head_dim;
    }
    return tot;
  };
  std::printf("decode bytes per token: weights %.1f MB\n", weights_total / 1e6);

  // Prefill.
  const LinearFlops lf = PrefillLinearFlops(c, o.prompt);
  if (lf.total > 0 && o.chunk == 0) {
    std::printf("prefill linear FLOPs: %.6g TFLOP (routed experts %.6g TFLOP)\n", lf.total / 1e12,
                lf.routed / 1e12);
  }
  const std::vector<int32_t> prompt = Tokens(o.prompt, 3, c.vocab_size);
  std::printf("step order: prefill %d (warm-up), prefill %d x %d, decode %d, prefill %d, decode %d\n",
              o.prompt, o.prompt, o.reps, o.decode, o.short_prompt, o.decode);
  std::vector<double> pre;
  std::unique_ptr<ring::Sequence> seq;
  for (int r = 0; r <= o.reps; ++r) {
    seq = st->NewSequence();
    const double t0 = NowMs();
    const size_t chunk = o.chunk > 0 ? static_cast<size_t>(o.chunk) : prompt.size();
    for (size_t b = 0; b < prompt.size(); b += chunk) {
      Step(*st, *seq, std::vector<int32_t>(prompt.begin() + b, prompt.begin() + std::min(prompt.size(), b + chunk)));
    }
    const double ms = NowMs() - t0;
    std::printf("prefill %d tokens%s: %.1f ms (%.0f tok/s)\n", o.prompt, r == 0 ? " (warm-up)" : "",
                ms, 1e3 * o.prompt / ms);
    if (r > 0) pre.push_back(ms);
  }
  const double pre_ms = Median(pre);

  // Decode after the long prompt, then after a short one.
  auto decode = [&](ring::Sequence& s, int32_t first, const char* what) {
    std::vector<double> ms;
    int32_t tok = first;
    for (int i = 0; i < o.decode; ++i) {
      const double t0 = NowMs();
      ring::StageOutput out = Step(*st, s, {tok});
      ms.push_back(NowMs() - t0);
      tok = out.argmax.empty() ? tok : out.argmax.back();
    }
    // The first two steps capture graphs: left out.
    std::vector<double> warm(ms.begin() + std::min<size_t>(2, ms.size()), ms.end());
    const double med = Median(warm);
    double sum = 0;
    for (double v : warm) sum += v;
    std::printf("decode %s: %d steps, median %.3f ms/step, mean %.3f ms/step (steps 3..%d), "
                "first %.2f ms\n", what, o.decode, med, warm.empty() ? 0 : sum / warm.size(),
                o.decode, ms.empty() ? 0 : ms[0]);
    return med;
  };
  const double long_ms = decode(*seq, 11, "after the long prompt");
  auto short_seq = st->NewSequence();
  Step(*st, *short_seq, Tokens(o.short_prompt, 5, c.vocab_size));
  const double short_ms = decode(*short_seq, 22, "after the short prompt");

  // Summary.
  const double s_long = o.prompt + o.decode / 2.0, s_short = o.short_prompt + o.decode / 2.0;
  std::printf("\nsummary (%s):\n", o.device.c_str());
  std::printf("  prefill %d tokens: %.1f ms median of %d, %.0f tok/s\n", o.prompt, pre_ms, o.reps,
              1e3 * o.prompt / pre_ms);
  for (auto [name, ms, S] : {std::tuple{"long", long_ms, s_long}, std::tuple{"short", short_ms, s_short}}) {
    const double bytes = weights_total + cache_bytes(static_cast<int64_t>(S));
    std::printf("  decode (%s context, mean S %.0f): %.3f ms/step (%.0f tok/s); bytes/step %.1f MB",
                name, S, ms, 1e3 / ms, bytes / 1e6);
    if (gbps > 0) {
      const double roof = bytes / (gbps * 1e9) * 1e3;
      std::printf("; roofline %.3f ms at %.0f GB/s; measured / roofline %.2fx (%.0f%% of roofline)",
                  roof, gbps, ms / roof, 100 * roof / ms);
    }
    std::printf("\n");
  }
  return 0;
}
