// ringctl logits: run a model on the CPU reference engine or a CUDA device (--backend
// cpu|cuda|cuda:N; optionally split into stages) and write float32 logits for every prompt
// position and every decode step as .npy.
// With --workers the stages run on ring-worker processes instead (the coordinator sends
// each step through them in order); the step loop is the same, so in-process and remote
// results are comparable bit for bit.
//
//   ringctl logits --model /m/tiny --tokens 1,2,3 --stages 2 --out a.npy
//   ringctl logits --model /m/tiny --tokens 1,2,3 --backend cuda --out g.npy
//   ringctl logits --workers 127.0.0.1:7001,127.0.0.1:7002 --model tiny --tokens 1,2,3 --out b.npy
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <fstream>
#include <iostream>
#include <numeric>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kernels/cpu/ops.h"
#include "kernels/status.h"
#include "models/model.h"
#include "models/stage_runner.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#ifdef RING_HAVE_WORKER
#include "worker/stage_client.h"
#endif
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
  std::string workers, split;
  int decode = 0, stages = 1, prefill_chunk = 0;
  int64_t max_context = 0;
  bool timing = false;
  double jitter = 0;
  double step_timeout_s = 30;
};

// --split 2,1,1: explicit layer counts per stage (must sum to the layer count), e.g. to
// put a boundary right before a GLM IndexShare "shared" layer. Empty: SplitLayers(n, parts).
absl::StatusOr<std::vector<StageRange>> StageRanges(const std::string& split, int64_t n, int parts) {
  if (split.empty()) {
    if (parts < 1 || parts > n) {
      return absl::InvalidArgumentError(absl::StrCat("stage count must be in [1, ", n, "]"));
    }
    return SplitLayers(n, parts);
  }
  std::vector<StageRange> out;
  int64_t begin = 0;
  for (absl::string_view part : absl::StrSplit(split, ',')) {
    int64_t len;
    if (!absl::SimpleAtoi(part, &len) || len < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--split: '", part, "' is not a layer count >= 1"));
    }
    out.push_back({begin, begin + len});
    begin += len;
  }
  if (begin != n || static_cast<int>(out.size()) != parts) {
    return absl::InvalidArgumentError(absl::StrCat("--split must give ", parts,
                                                   " layer counts summing to ", n));
  }
  return out;
}

// The stages of one sequence, in ring order, and what the step loop needs to know.
struct Ring {
  std::vector<std::unique_ptr<StageRunner>> runners;
  int64_t vocab = 0;
  std::function<void()> release;  // frees remote KV caches; empty in-process
};

absl::StatusOr<Ring> LocalRing(const Options& o, LoadOptions lo) {
  Ring ring;
  // Layer count comes from the checkpoint; load it whole when a single stage is asked for.
  lo.layers = {0, -1};
  RING_ASSIGN_OR_RETURN(std::unique_ptr<Stage> whole, LoadStage(o.model, lo));
  const int64_t n = whole->config().num_hidden_layers;
  ring.vocab = whole->config().vocab_size;
  const int parts = o.split.empty() ? o.stages : 1 + std::count(o.split.begin(), o.split.end(), ',');
  RING_ASSIGN_OR_RETURN(std::vector<StageRange> ranges, StageRanges(o.split, n, parts));
  if (ranges.size() == 1) {
    ring.runners.push_back(std::make_unique<LocalStageRunner>(std::move(whole)));
    return ring;
  }
  whole.reset();
  for (const StageRange& r : ranges) {
    lo.layers = r;
    RING_ASSIGN_OR_RETURN(std::unique_ptr<Stage> s, LoadStage(o.model, lo));
    ring.runners.push_back(std::make_unique<LocalStageRunner>(std::move(s)));
  }
  return ring;
}

#ifdef RING_HAVE_WORKER
absl::StatusOr<Ring> RemoteRing(const Options& o, const LoadOptions& lo) {
  namespace pb = ringserve::v1;
  worker::StageClientOptions co;
  co.call_timeout = absl::Seconds(o.step_timeout_s);
  // Clients outlive the runners and the release callback that point at them.
  auto clients = std::make_shared<std::vector<std::unique_ptr<worker::StageClient>>>();
  for (absl::string_view addr : absl::StrSplit(o.workers, ',', absl::SkipWhitespace())) {
    clients->push_back(std::make_unique<worker::StageClient>(
        std::string(addr), static_cast<int>(clients->size()), co));
  }
  RING_ASSIGN_OR_RETURN(pb::DescribeResponse d, clients->front()->Describe(o.model));
  const pb::ModelInfo& info = d.probed();
  RING_ASSIGN_OR_RETURN(std::vector<StageRange> ranges,
                        StageRanges(o.split, info.num_layers(), static_cast<int>(clients->size())));
  // fp32 on the wire when asked for (bit-exact); otherwise the model's activation dtype.
  pb::DType act = pb::DTYPE_UNSPECIFIED;
  if (lo.act_dtype) act = *lo.act_dtype == cpu::ActDType::kF32 ? pb::DTYPE_F32 : pb::DTYPE_BF16;
  const pb::DType wire = act != pb::DTYPE_UNSPECIFIED ? act
                         : info.dtype() == "bf16"     ? pb::DTYPE_BF16
                                                      : pb::DTYPE_F32;
  const std::string seq_id = absl::StrCat("ringctl-", getpid(), "-", absl::ToUnixMicros(absl::Now()));
  Ring ring;
  ring.vocab = info.vocab_size();
  for (size_t i = 0; i < clients->size(); ++i) {
    pb::LoadStageRequest req;
    req.set_model(o.model);
    req.set_layer_begin(ranges[i].begin);
    req.set_layer_end(ranges[i].end);
    req.set_act_dtype(act);
    req.set_all_logits(lo.all_logits);
    RING_ASSIGN_OR_RETURN(pb::LoadStageResponse loaded, (*clients)[i]->LoadStage(req));
    if (loaded.model().model_hash() != info.model_hash()) {
      return absl::FailedPreconditionError(absl::StrCat(
          (*clients)[i]->name(), " holds a different '", o.model, "' than ", clients->front()->name()));
    }
    ring.runners.push_back(std::make_unique<worker::RemoteStageRunner>(
        (*clients)[i].get(), seq_id, loaded.epoch(), info.hidden_size(), wire));
  }
  ring.release = [clients, seq_id] {
    for (auto& c : *clients) {
      if (auto r = c->Release(seq_id); !r.ok()) std::cerr << "warning: " << r.status().message() << "\n";
    }
  };
  return ring;
}
#endif

absl::Status Run(const Options& o) {
  absl::StatusOr<DeviceSpec> device = ParseDevice(o.backend);
  if (!device.ok()) return absl::InvalidArgumentError("--backend: " + std::string(device.status().message()));
  if (device->kind != DeviceSpec::Kind::kCpu && !o.workers.empty()) {
    return absl::InvalidArgumentError(
        "--backend applies to in-process stages; with --workers each ring-worker's --device "
        "chooses");
  }
  std::vector<int32_t> prompt, forced;
  { auto p = ParseTokenList(o.tokens, "--tokens"); if (!p.ok()) return p.status(); prompt = *p; }
  { auto p = ParseTokenList(o.force_decode, "--force-decode"); if (!p.ok()) return p.status(); forced = *p; }
  if (prompt.empty()) return absl::InvalidArgumentError("--tokens: need at least one token");
  if (!forced.empty() && o.decode > 0 && static_cast<int>(forced.size()) != o.decode) {
    return absl::InvalidArgumentError("--decode and --force-decode disagree on the step count");
  }
  LoadOptions lo;
  lo.device = *device;
  lo.max_context = o.max_context;
  lo.TEST_jitter = o.jitter;
  if (o.act == "f32") lo.act_dtype = cpu::ActDType::kF32;
  else if (o.act == "bf16") lo.act_dtype = cpu::ActDType::kBF16;
  else if (o.act != "auto") return absl::InvalidArgumentError("--act must be auto, bf16 or f32");

  Ring ring;
  if (o.workers.empty()) {
    RING_ASSIGN_OR_RETURN(ring, LocalRing(o, lo));
  } else {
#ifdef RING_HAVE_WORKER
    RING_ASSIGN_OR_RETURN(ring, RemoteRing(o, lo));
#else
    return absl::UnimplementedError("--workers: this ringctl was built without gRPC");
#endif
  }
  const int64_t vocab = ring.vocab;

  std::vector<float> all;
  // Every row's logits come back; reserve them all so growing the buffer never copies
  // (at 150k vocab and 2k rows that is a 1.3 GB copy inside a timed decode step).
  all.reserve((prompt.size() + (forced.empty() ? o.decode : forced.size())) * vocab);
  int32_t greedy = -1;  // argmax of the last row, as the last stage computed it
  auto step = [&](const std::vector<int32_t>& toks) -> absl::Status {
    StageInput in;
    in.tokens = toks;
    for (size_t i = 0; i < ring.runners.size(); ++i) {
      RING_ASSIGN_OR_RETURN(StageOutput out, ring.runners[i]->Forward(in));
      if (i + 1 == ring.runners.size()) {
        all.insert(all.end(), out.logits.begin(), out.logits.end());
        greedy = out.argmax.empty() ? -1 : out.argmax.back();
      } else {
        in = StageInput{};
        in.hidden = std::move(out.hidden);
        in.topk = std::move(out.topk);
      }
    }
    return absl::OkStatus();
  };
  const size_t chunk = o.prefill_chunk > 0 ? o.prefill_chunk : prompt.size();
  const absl::Time t_prefill = absl::Now();
  for (size_t b = 0; b < prompt.size(); b += chunk) {
    std::vector<int32_t> part(prompt.begin() + b,
                              prompt.begin() + std::min(prompt.size(), b + chunk));
    if (auto s = step(part); !s.ok()) return s;
  }
  const absl::Duration prefill_time = absl::Now() - t_prefill;
  const int steps = forced.empty() ? o.decode : static_cast<int>(forced.size());
  std::vector<int32_t> emitted;
  const absl::Time t_decode = absl::Now();
  for (int i = 0; i < steps; ++i) {
    // Greedy: the stage's own argmax (on the GPU for a CUDA stage); remote stages do not
    // send one, so the host takes it from the logits.
    const int32_t next =
        !forced.empty() ? forced[i]
        : greedy >= 0   ? greedy
                        : static_cast<int32_t>(cpu::ArgMax(all.data() + all.size() - vocab, vocab));
    emitted.push_back(next);
    if (auto s = step({next}); !s.ok()) return s;
  }
  const absl::Duration decode_time = absl::Now() - t_decode;
  if (ring.release) ring.release();
  if (o.timing) {
    // Wall time of the steps as the caller sees them: every step returns its logits to the
    // host (all rows), so this includes the device-to-host copy of [rows, vocab] floats.
    const double p_ms = absl::ToDoubleMilliseconds(prefill_time);
    const double d_ms = absl::ToDoubleMilliseconds(decode_time);
    std::cerr << "timing: prefill " << prompt.size() << " tokens " << p_ms << " ms ("
              << (p_ms > 0 ? 1000.0 * prompt.size() / p_ms : 0) << " tok/s)";
    if (steps > 0) {
      std::cerr << ", decode " << steps << " steps " << d_ms << " ms (" << d_ms / steps
                << " ms/step, " << 1000.0 * steps / d_ms << " tok/s)";
    }
    std::cerr << "\n";
  }
  const int64_t rows = static_cast<int64_t>(all.size()) / vocab;
  if (!o.out.empty()) {
    if (auto s = WriteNpy(o.out, all, rows, vocab); !s.ok()) return s;
  }
  std::cerr << "logits: " << rows << " rows x " << vocab << " (" << ring.runners.size()
            << (o.workers.empty() ? absl::StrCat(" stage(s) on ", device->ToString(), ")")
                                  : std::string(" remote stage(s))"));
  if (!emitted.empty()) {
    std::cerr << ", decode tokens:";
    for (int32_t t : emitted) std::cerr << ' ' << t;
  }
  std::cerr << "\n";
  return absl::OkStatus();
}

Registration reg("logits", "Run the model (CPU reference engine or CUDA) and write float32 logits (.npy)",
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
                   cmd->add_option("--split", o->split,
                                   "Layer counts per stage, e.g. 2,2 (default: near-equal split)");
                   cmd->add_option("--workers", o->workers,
                                   "Run the stages on these ring-workers (ADDR,ADDR,...; --model is "
                                   "then a name under their --model-root)");
                   cmd->add_option("--step-timeout", o->step_timeout_s,
                                   "Deadline in seconds of each remote call (default 30)");
                   cmd->add_option("--backend", o->backend,
                                   "cpu (reference engine), cuda or cuda:N (in-process stages)");
                   cmd->add_option("--max-context", o->max_context,
                                   "Positions a sequence may reach (0: the model's maximum)");
                   cmd->add_option("--act", o->act, "Activation dtype: auto (checkpoint's), bf16, f32");
                   cmd->add_option("--out", o->out, "Output .npy file: float32 [rows, vocab]");
                   cmd->add_flag("--timing", o->timing,
                                 "Print the wall time of the prefill and decode steps");
                   cmd->add_option("--jitter", o->jitter,
                                   "Diagnostic (cpu): perturb every matmul output by a relative "
                                   "+-X before rounding, to measure the model's noise floor");
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
