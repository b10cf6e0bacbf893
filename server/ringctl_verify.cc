// ringctl verify: run layers of a real checkpoint on a device and on the CPU reference with
// identical inputs, print per layer and per op how far the device is, and bisect a
// divergence down to the op that causes it (models/verify.h).
//
//   ringctl verify --model /m/glm-5.2-mxfp4 --layers 0-3 --device cuda:0 --prompt-len 32
//   ringctl verify --model /m/tiny --layers 2 --tokens 5,6,7 --json
//
// Exit status: 0 every layer and op within tolerance, 1 over tolerance (or the run failed),
// 2 usage error.
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kernels/status.h"
#include "models/model.h"
#include "models/verify.h"
#include "nlohmann/json.hpp"
#include "server/ringctl_command.h"
#include "server/ringctl_flags.h"
#include "worker/worker_service.h"

namespace ring::ctl {
namespace {

struct Flags {
  std::string model, layers, device, against = "cpu", tokens, act = "auto", test_fault;
  int64_t prompt_len = 16;
  int decode_steps = 2;
  uint64_t seed = 1;
  double tolerance = 0.01, op_tolerance_scale = 1.0;
  bool json = false, all_ops = false, noise_floor = false;
  double floor_factor = 2.0;
};

// "A-B" (inclusive) or "A".
absl::StatusOr<StageRange> ParseLayers(const std::string& s) {
  std::vector<std::string> parts = absl::StrSplit(s, '-');
  int64_t a = 0, b = 0;
  if (parts.size() == 1 && absl::SimpleAtoi(parts[0], &a) && a >= 0) return StageRange{a, a + 1};
  if (parts.size() == 2 && absl::SimpleAtoi(parts[0], &a) && absl::SimpleAtoi(parts[1], &b) &&
      a >= 0 && b >= a) {
    return StageRange{a, b + 1};
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--layers '", s, "': expected A-B (first and last layer, inclusive) or A"));
}

nlohmann::ordered_json DiffJson(const TensorDiff& d) {
  nlohmann::ordered_json j;
  j["n"] = d.n;
  if (d.is_int) {
    j["mismatch_fraction"] = d.mismatch;
    return j;
  }
  // JSON has no Inf: a diff that is infinite (device NaN) is written as null.
  auto num = [](double v) { return std::isfinite(v) ? nlohmann::ordered_json(v) : nullptr; };
  j["rel"] = num(d.rel);
  j["nmse"] = num(d.nmse);
  j["max_abs"] = num(d.max_abs);
  j["nan"] = d.nan;
  j["inf"] = d.inf;
  if (d.mismatch > 0) j["index_mismatch_fraction"] = d.mismatch;
  return j;
}

nlohmann::ordered_json ReportJson(const VerifyReport& r) {
  nlohmann::ordered_json j;
  j["model"] = r.model_dir;
  j["layers"] = {r.layer_begin, r.layer_end};
  j["device"] = r.device;
  j["reference"] = r.reference;
  j["tolerance"] = r.tolerance;
  j["ok"] = r.ok;
  j["diagnosis"] = r.diagnosis;
  j["output"] = DiffJson(r.output);
  for (const VerifyStep& s : r.steps) {
    j["steps"].push_back({{"step", s.step}, {"kind", s.kind}, {"rows", s.rows},
                          {"first_position", s.first_position}, {"sparse", s.sparse}});
  }
  for (const LayerCheck& l : r.layers) {
    j["layer_checks"].push_back(
        {{"step", l.step}, {"layer", l.layer}, {"ok", l.ok}, {"diff", DiffJson(l.diff)},
         {"floor_rel", l.floor_rel >= 0 ? nlohmann::ordered_json(l.floor_rel) : nullptr}});
  }
  for (const OpCheck& o : r.ops) {
    j["ops"].push_back({{"step", o.step}, {"layer", o.layer}, {"index", o.index},
                        {"op", o.op}, {"detail", o.detail},
                        {"composed", DiffJson(o.composed)}, {"isolated", DiffJson(o.isolated)},
                        {"tolerance", o.tolerance}, {"isolated_ok", o.isolated_ok}});
  }
  j["first_bad_layer_check"] = r.first_bad_layer;
  if (r.culprit_op >= 0) {
    const OpCheck& c = r.ops[r.culprit_op];
    j["culprit"] = {{"op_index", r.culprit_op}, {"step", c.step}, {"layer", c.layer},
                    {"op", c.op}, {"detail", c.detail}};
  } else {
    j["culprit"] = nullptr;
  }
  return j;
}

int Run(const Flags& f) {
  auto fail = [](const absl::Status& s) {
    std::cerr << "ringctl verify: " << s << "\n";
    return 1;
  };
  VerifyOptions o;
  o.model_dir = f.model;
  if (f.against != "cpu") {
    std::cerr << "ringctl verify: --against: only the CPU reference engine (cpu) is an oracle\n";
    return 2;
  }
  absl::StatusOr<StageRange> layers = ParseLayers(f.layers);
  if (!layers.ok()) {
    std::cerr << "ringctl verify: " << layers.status().message() << "\n";
    return 2;
  }
  o.layers = *layers;
  std::string device = f.device;
  if (device.empty()) {
    // Default: the first GPU when there is one, else the CPU engine against itself.
    device = CheckDevice(DeviceSpec{DeviceSpec::Kind::kCuda, 0}).ok() ? "cuda:0" : "cpu";
  }
  absl::StatusOr<DeviceSpec> dev = ParseDevice(device);
  if (!dev.ok()) return fail(dev.status());
  o.device = *dev;
  absl::StatusOr<std::vector<int32_t>> toks = ParseTokenList(f.tokens, "--tokens");
  if (!toks.ok()) return fail(toks.status());
  o.tokens = *toks;
  o.prompt_len = f.prompt_len;
  o.decode_steps = f.decode_steps;
  o.seed = f.seed;
  o.tolerance = f.tolerance;
  o.op_tolerance_scale = f.op_tolerance_scale;
  absl::StatusOr<std::optional<cpu::ActDType>> act = ParseActFlag(f.act);
  if (!act.ok()) return fail(act.status());
  o.act_dtype = *act;
  o.TEST_fault = f.test_fault;
  o.noise_floor = f.noise_floor;
  o.floor_factor = f.floor_factor;
  // What runs on the device: a report from new hardware is only useful with this.
  std::string attestation;
  if (o.device.kind == DeviceSpec::Kind::kCuda) {
    absl::StatusOr<ringserve::v1::DeviceAttestation> a =
        worker::AttestDevice(o.device.ToString(), /*allow_ptx_jit=*/true);
    attestation = a.ok() ? a->summary() : std::string(a.status().message());
  }
  absl::StatusOr<VerifyReport> r = Verify(o);
  if (!r.ok()) return fail(r.status());
  if (f.json) {
    nlohmann::ordered_json j = ReportJson(*r);
    if (!attestation.empty()) j["attestation"] = attestation;
    std::cout << j.dump(1) << "\n";
  } else {
    if (!attestation.empty()) std::cout << "device: " << attestation << "\n";
    std::cout << FormatVerifyReport(*r, f.all_ops);
  }
  return r->ok ? 0 : 1;
}

Registration reg(
    "verify",
    "Compare a device's forward of real layers with the CPU reference, per layer and per op, "
    "and name the op that diverges",
    [](CLI::App* cmd) -> Handler {
      auto f = std::make_shared<Flags>();
      cmd->add_option("--model", f->model, "Model directory (MLX checkpoint)")->required();
      cmd->add_option("--layers", f->layers,
                      "Layers to verify: A-B (first and last, inclusive) or A")
          ->required();
      cmd->add_option("--device", f->device,
                      "Device under test: cuda:N or cpu (default: cuda:0 when present, else cpu)");
      cmd->add_option("--against", f->against, "Reference engine (only: cpu)");
      cmd->add_option("--tokens", f->tokens, "Prompt token ids, comma-separated");
      cmd->add_option("--prompt-len", f->prompt_len,
                      "Random prompt length when --tokens is not given (longer than the "
                      "model's index_topk exercises DSA sparse attention)");
      cmd->add_option("--decode-steps", f->decode_steps,
                      "Single-token steps after the prompt (absorbed MLA decode path)");
      cmd->add_option("--seed", f->seed, "Seed of the random tokens");
      cmd->add_option("--tolerance", f->tolerance,
                      "Largest relative difference ||dev-cpu||/||cpu|| of a layer's output");
      cmd->add_option("--op-tolerance-scale", f->op_tolerance_scale,
                      "Multiplies every op's isolated tolerance");
      cmd->add_option("--act", f->act, "Activation dtype: auto (the checkpoint's), bf16, f32");
      cmd->add_flag("--all-ops", f->all_ops, "Print every op of every layer, not only the bisection");
      cmd->add_flag("--noise-floor", f->noise_floor,
                    "Also run the CPU reference against itself with 1e-6 relative noise on every "
                    "matmul; a layer over --tolerance passes when within --floor-factor x that");
      cmd->add_option("--floor-factor", f->floor_factor, "See --noise-floor");
      cmd->add_flag("--json", f->json, "Print the report as JSON");
      cmd->add_option("--test-fault", f->test_fault,
                      "TEST ONLY: make one kernel of the device under test wrong "
                      "(scale:WEIGHT_NAME[:GROUP] or bf16-accum:rms_norm)");
      return [f] { return Run(*f); };
    });

}  // namespace
}  // namespace ring::ctl
