// ringctl logits: run a model on the CPU reference engine (optionally split into stages)
// and write float32 logits for every prompt position and every decode step as .npy.
// With --workers the stages run on ring-worker processes instead (the coordinator sends
// each step through them in order); the step loop is the same, so in-process and remote
// results are comparable bit for bit.
//
//   ringctl logits --model /m/tiny --tokens 1,2,3 --stages 2 --out a.npy
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
#include "absl/time/clock.h"
#include "models/model.h"
#include "server/ring.h"
#include "worker/stage_client.h"
#include "server/ringctl_command.h"
#include "server/ringctl_flags.h"

namespace ring::ctl {
namespace {

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
  std::string workers, split, auth_token_file, tls_ca, tls_cert, tls_key;
  int decode = 0, stages = 1, prefill_chunk = 0;
  int64_t max_context = 0;
  int64_t admission_prompt_len = 0;
  bool timing = false;
  double jitter = 0;
  double step_timeout_s = 30;
};

// --split 2,1,1: explicit layer counts per stage, e.g. to put a boundary right before a
// GLM IndexShare "shared" layer.
absl::StatusOr<std::vector<int64_t>> ParseSplit(const std::string& split) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(split, ',', absl::SkipWhitespace())) {
    int64_t len;
    if (!absl::SimpleAtoi(part, &len) || len < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--split: '", part, "' is not a layer count >= 1"));
    }
    out.push_back(len);
  }
  return out;
}

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
  RingOptions ro;
  ro.model = o.model;
  ro.all_logits = true;
  ro.local_stages = o.stages;
  ro.step_timeout = absl::Seconds(o.step_timeout_s);
  ro.device = *device;
  ro.max_context = o.max_context;
  ro.admission_tokens = AdmissionTokens(o.admission_prompt_len);
  ro.TEST_jitter = o.jitter;
  RING_ASSIGN_OR_RETURN(ro.act_dtype, ParseActFlag(o.act));
  RING_ASSIGN_OR_RETURN(ro.split, ParseSplit(o.split));
  if (!o.auth_token_file.empty()) {
    RING_ASSIGN_OR_RETURN(ro.auth_token, worker::ReadSecretFile(o.auth_token_file, "--auth-token-file"));
  }
  if (!o.tls_ca.empty()) {
    RING_ASSIGN_OR_RETURN(ro.tls_ca, worker::ReadSecretFile(o.tls_ca, "--tls-ca"));
  }
  if (!o.tls_cert.empty()) {
    RING_ASSIGN_OR_RETURN(ro.tls_cert, worker::ReadSecretFile(o.tls_cert, "--tls-cert"));
  }
  if (!o.tls_key.empty()) {
    RING_ASSIGN_OR_RETURN(ro.tls_key, worker::ReadSecretFile(o.tls_key, "--tls-key"));
  }
  for (absl::string_view addr : absl::StrSplit(o.workers, ',', absl::SkipWhitespace())) {
    ro.workers.emplace_back(addr);
  }
  if (!ro.workers.empty() && !ro.split.empty() && ro.split.size() != ro.workers.size()) {
    return absl::InvalidArgumentError("--split must give one layer count per worker");
  }
  RING_ASSIGN_OR_RETURN(std::unique_ptr<Ring> ring, Ring::Connect(ro));
  const int64_t vocab = ring->model().vocab_size;
  const std::string seq_id = absl::StrCat("ringctl-", getpid(), "-", absl::ToUnixMicros(absl::Now()));
  std::vector<float> all;
  std::vector<int32_t> emitted;
  // Every row's logits come back; reserve them all so growing the buffer never copies
  // (at 150k vocab and 2k rows that is a 1.3 GB copy inside a timed decode step).
  all.reserve((prompt.size() + (forced.empty() ? o.decode : forced.size())) * vocab);
  absl::Duration prefill_time, decode_time;
  {
  RING_ASSIGN_OR_RETURN(std::unique_ptr<RingSequence> seq, ring->NewSequence(seq_id));
  auto step = [&](const std::vector<int32_t>& toks) -> absl::Status {
    RING_ASSIGN_OR_RETURN(std::vector<float> logits, seq->Step(toks));
    all.insert(all.end(), logits.begin(), logits.end());
    return absl::OkStatus();
  };
  const size_t chunk = o.prefill_chunk > 0 ? o.prefill_chunk : prompt.size();
  const absl::Time t_prefill = absl::Now();
  for (size_t b = 0; b < prompt.size(); b += chunk) {
    std::vector<int32_t> part(prompt.begin() + b,
                              prompt.begin() + std::min(prompt.size(), b + chunk));
    if (auto s = step(part); !s.ok()) return s;
  }
  prefill_time = absl::Now() - t_prefill;
  const absl::Time t_decode = absl::Now();
  const int steps = forced.empty() ? o.decode : static_cast<int>(forced.size());
  for (int i = 0; i < steps; ++i) {
    const int32_t next =
        forced.empty() ? static_cast<int32_t>(cpu::ArgMax(all.data() + all.size() - vocab, vocab))
                       : forced[i];
    emitted.push_back(next);
    if (auto s = step({next}); !s.ok()) return s;
  }
  decode_time = absl::Now() - t_decode;
  }  // the sequence frees its KV caches on every stage here
  if (o.timing) {
    // Wall time of the steps as the caller sees them: every step returns its logits to the
    // host (all rows), so this includes the device-to-host copy of [rows, vocab] floats.
    const double p_ms = absl::ToDoubleMilliseconds(prefill_time);
    const double d_ms = absl::ToDoubleMilliseconds(decode_time);
    const int steps = static_cast<int>(emitted.size());
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
  std::cerr << "logits: " << rows << " rows x " << vocab << " (" << ring->stages().size()
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
                   cmd->add_option("--auth-token-file", o->auth_token_file,
                                   "Shared ring token the workers require");
                   cmd->add_option("--tls-ca", o->tls_ca, "CA of the workers' TLS certificates (PEM)");
                   cmd->add_option("--tls-cert", o->tls_cert, "Client certificate for mutual TLS (PEM)");
                   cmd->add_option("--tls-key", o->tls_key, "Key of --tls-cert (PEM)");
                   cmd->add_option("--admission-prompt-len", o->admission_prompt_len,
                                   "With --workers: each worker first verifies its layers on "
                                   "its device against the CPU reference (admission gate)");
                   cmd->add_option("--step-timeout", o->step_timeout_s,
                                   "Deadline in seconds of each remote call (default 30)");
                   cmd->add_option("--backend", o->backend,
                                   "cpu (reference engine), cuda or cuda:N (in-process stages)");
                   cmd->add_option("--max-context", o->max_context,
                                   "Positions a sequence may reach (0: the model's maximum)");
                   cmd->add_flag("--timing", o->timing,
                                 "Print the wall time of the prefill and decode steps");
                   cmd->add_option("--jitter", o->jitter,
                                   "Diagnostic (cpu): perturb every matmul output by a relative "
                                   "+-X before rounding, to measure the model's noise floor");
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
