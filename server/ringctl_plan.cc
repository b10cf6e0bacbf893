// ringctl plan: how the layers of a model would be split over these workers, what each
// would hold and the predicted decode speed, before anything loads (dry run).
//
//   ringctl plan --workers 10.0.0.1:7001,10.0.0.2:7001 --model GLM-5.2-mxfp4
//                [--context 8192 --sequences 4] [--split 40,38] [--json]
//
// Exit 0 with the plan, 1 when no split fits (the reason says which worker and by how
// much).
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "server/ring.h"
#include "server/ringctl_command.h"
#include "worker/stage_client.h"

namespace ring::ctl {
namespace {

struct PlanFlags {
  std::string workers, model, split, auth_token_file;
  int64_t context = 4096, sequences = 1;
  bool json = false;
  bool no_calibrate = false;
};

int RunPlan(const PlanFlags& f) {
  RingOptions o;
  o.model = f.model;
  o.plan_context_tokens = f.context;
  o.plan_sequences = f.sequences;
  o.plan_calibrate = !f.no_calibrate;
  for (absl::string_view w : absl::StrSplit(f.workers, ',', absl::SkipWhitespace())) o.workers.emplace_back(w);
  for (absl::string_view s : absl::StrSplit(f.split, ',', absl::SkipWhitespace())) {
    int64_t v;
    if (!absl::SimpleAtoi(s, &v)) {
      std::cerr << "ringctl plan: --split: '" << s << "' is not a number\n";
      return 2;
    }
    o.split.push_back(v);
  }
  if (!f.auth_token_file.empty()) {
    auto t = worker::ReadSecretFile(f.auth_token_file, "--auth-token-file");
    if (!t.ok()) {
      std::cerr << "ringctl plan: " << t.status().message() << "\n";
      return 2;
    }
    o.auth_token = *t;
  }
  auto plan = PlanForWorkers(o);
  if (!plan.ok()) {
    std::cerr << "ringctl plan: " << plan.status().message() << "\n";
    return 1;
  }
  if (f.json) {
    nlohmann::json j;
    for (const auto& s : plan->stages) {
      j["stages"].push_back({{"worker", s.address}, {"layer_begin", s.layer_begin}, {"layer_end", s.layer_end},
                             {"weight_bytes", s.weight_bytes}, {"kv_bytes", s.kv_bytes},
                             {"usable_bytes", s.usable_bytes}, {"seconds_per_token", s.seconds_per_token}});
    }
    j["split"] = plan->LayerCounts();
    j["single_stream_tokens_per_s"] = plan->single_stream_tokens_per_s;
    j["pipelined_tokens_per_s"] = plan->pipelined_tokens_per_s;
    j["calibrated"] = plan->calibrated;
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << plan->ToText();
  }
  return 0;
}

Registration reg("plan", "Dry-run the split of a model over workers: memory per worker, predicted tokens/s",
                 [](CLI::App* cmd) -> Handler {
                   auto f = std::make_shared<PlanFlags>();
                   cmd->add_option("--workers", f->workers, "Worker addresses in ring order")->required();
                   cmd->add_option("--model", f->model, "Model path under the workers' --model-root")->required();
                   cmd->add_option("--context", f->context, "KV cache budget: tokens per sequence (default 4096)");
                   cmd->add_option("--sequences", f->sequences, "KV cache budget: concurrent sequences (default 1)");
                   cmd->add_option("--split", f->split, "Check this manual split (layer counts) instead");
                   cmd->add_option("--auth-token-file", f->auth_token_file, "Shared ring token");
                   cmd->add_flag("--json", f->json, "Print JSON");
                   cmd->add_flag("--no-calibrate", f->no_calibrate,
                                 "Plan by weight bytes / memory bandwidth instead of a calibration forward on "
                                 "every worker (which loads one layer and the LM head there; workers serving a "
                                 "stage answer from what they measured before)");
                   return [f] { return RunPlan(*f); };
                 });

}  // namespace
}  // namespace ring::ctl
