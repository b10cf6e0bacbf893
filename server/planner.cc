#include "server/planner.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ring {
namespace {

std::string GiB(int64_t b) { return HumanBytes(b); }

}  // namespace

std::string HumanBytes(int64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrCat(b, " B") : absl::StrFormat("%.1f %s", v, units[u]);
}

std::vector<int64_t> RingPlan::LayerCounts() const {
  std::vector<int64_t> out;
  for (const auto& s : stages) out.push_back(s.layer_end - s.layer_begin);
  return out;
}

std::string RingPlan::ToText() const {
  std::string out = absl::StrFormat("%-22s %-9s %-11s %-11s %-11s %-9s %s\n", "WORKER", "LAYERS", "WEIGHTS",
                                    "KV BUDGET", "USABLE", "MEM USE", "ms/token");
  for (const auto& s : stages) {
    absl::StrAppend(&out, absl::StrFormat("%-22s %-9s %-11s %-11s %-11s %-9s %.3f\n", s.address,
                                          absl::StrCat(s.layer_begin, "-", s.layer_end - 1), GiB(s.weight_bytes),
                                          GiB(s.kv_bytes), GiB(s.usable_bytes),
                                          absl::StrFormat("%.0f%%", 100.0 * (s.weight_bytes + s.kv_bytes) /
                                                                        std::max<int64_t>(1, s.usable_bytes)),
                                          1e3 * s.seconds_per_token));
  }
  absl::StrAppend(&out, absl::StrFormat(
                            "predicted decode (%s, hops not counted): "
                            "%.1f tokens/s single stream, %.1f tokens/s with >= %d sequences in flight\n",
                            calibrated ? "calibration forward per worker" : "weight bytes / measured bandwidth",
                            single_stream_tokens_per_s, pipelined_tokens_per_s, stages.size()));
  return out;
}

absl::StatusOr<RingPlan> PlanRing(const std::vector<PlanWorker>& workers, const PlanModel& model,
                                  const PlanOptions& options) {
  const int w = static_cast<int>(workers.size());
  const int l = static_cast<int>(model.layer_bytes.size());
  if (w == 0) return absl::InvalidArgumentError("plan: no workers");
  if (l == 0) return absl::InvalidArgumentError("plan: the model has no layers");
  if (w > l) {
    return absl::InvalidArgumentError(absl::StrCat("plan: ", w, " workers for ", l,
                                                   " layers; every worker needs at least one layer"));
  }
  std::vector<int64_t> prefix(l + 1, 0);
  for (int i = 0; i < l; ++i) prefix[i + 1] = prefix[i] + model.layer_bytes[i];
  double known_min_bw = std::numeric_limits<double>::infinity();
  for (const auto& x : workers) {
    if (x.bandwidth_bytes_per_s > 0) known_min_bw = std::min(known_min_bw, x.bandwidth_bytes_per_s);
  }
  if (!std::isfinite(known_min_bw)) known_min_bw = 1e9;
  // Calibrated times are used only when every worker has them: a mix of measured step times
  // and bandwidth estimates would not compare.
  bool calibrated = true;
  for (const auto& x : workers) calibrated = calibrated && x.layer_seconds > 0;
  if (options.context_tokens < 0 || options.sequences < 0) {
    return absl::InvalidArgumentError("plan: context and sequences must be >= 0");
  }
  // Saturate rather than overflow: an absurd budget must read as "does not fit".
  const double kv_d = static_cast<double>(model.kv_bytes_per_token_per_layer) *
                      static_cast<double>(options.context_tokens) * static_cast<double>(options.sequences);
  const int64_t kv_per_layer = kv_d > 1e17 ? int64_t{100'000'000'000'000'000} : static_cast<int64_t>(kv_d);

  auto stage = [&](int k, int a, int b) {
    PlanStage s;
    s.address = workers[k].address;
    s.layer_begin = a;
    s.layer_end = b;
    s.weight_bytes = prefix[b] - prefix[a] + (a == 0 ? model.first_stage_extra_bytes : 0) +
                     (b == l ? model.last_stage_extra_bytes : 0);
    s.kv_bytes = kv_per_layer * (b - a);
    const int64_t free = workers[k].memory_free_bytes;
    const int64_t headroom = std::max<int64_t>(options.headroom_min_bytes,
                                               static_cast<int64_t>(free * options.headroom_fraction));
    s.usable_bytes = std::max<int64_t>(0, free - headroom);
    const double bw = workers[k].bandwidth_bytes_per_s > 0 ? workers[k].bandwidth_bytes_per_s : known_min_bw;
    // Time per token: the bytes a decode step reads. The embedding table is memory the
    // first stage holds, but a step reads one row of it, not the table.
    const int64_t read_bytes = s.weight_bytes - (a == 0 ? model.first_stage_extra_bytes : 0);
    s.seconds_per_token = calibrated ? (b - a) * workers[k].layer_seconds + (b == l ? workers[k].head_seconds : 0)
                                     : static_cast<double>(read_bytes) / bw;
    return s;
  };
  auto fits = [](const PlanStage& s) { return s.weight_bytes + s.kv_bytes <= s.usable_bytes; };
  auto finish = [&](std::vector<PlanStage> stages) {
    RingPlan p;
    double total = 0, worst = 0;
    for (const auto& s : stages) {
      total += s.seconds_per_token;
      worst = std::max(worst, s.seconds_per_token);
    }
    p.stages = std::move(stages);
    p.calibrated = calibrated;
    p.single_stream_tokens_per_s = total > 0 ? 1.0 / total : 0;
    p.pipelined_tokens_per_s = worst > 0 ? 1.0 / worst : 0;
    return p;
  };

  if (!options.split.empty()) {
    if (static_cast<int>(options.split.size()) != w) {
      return absl::InvalidArgumentError(absl::StrCat("plan: split has ", options.split.size(),
                                                     " entries for ", w, " workers"));
    }
    std::vector<PlanStage> stages;
    int a = 0;
    for (int k = 0; k < w; ++k) {
      if (options.split[k] < 1) return absl::InvalidArgumentError("plan: every split entry must be >= 1");
      const int b = a + static_cast<int>(options.split[k]);
      if (b > l) break;
      stages.push_back(stage(k, a, b));
      a = b;
    }
    if (a != l || static_cast<int>(stages.size()) != w) {
      return absl::InvalidArgumentError(absl::StrCat("plan: the split does not sum to ", l, " layers"));
    }
    for (const auto& s : stages) {
      if (!fits(s)) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "plan: worker ", s.address, " cannot hold layers ", s.layer_begin, "..", s.layer_end - 1, ": needs ",
            GiB(s.weight_bytes + s.kv_bytes), " (weights ", GiB(s.weight_bytes), " + KV ", GiB(s.kv_bytes),
            "), has ", GiB(s.usable_bytes), " usable"));
      }
    }
    return finish(std::move(stages));
  }

  // best[k][b]: the smallest possible slowest-stage time for layers [0, b) on workers
  // 0..k, each holding >= 1 layer; from[k][b]: where worker k's range starts.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(w, std::vector<double>(l + 1, inf));
  std::vector<std::vector<int>> from(w, std::vector<int>(l + 1, -1));
  for (int b = 1; b <= l; ++b) {
    PlanStage s = stage(0, 0, b);
    if (fits(s)) best[0][b] = s.seconds_per_token;
  }
  for (int k = 1; k < w; ++k) {
    for (int b = k + 1; b <= l; ++b) {
      for (int a = k; a < b; ++a) {
        if (best[k - 1][a] == inf) continue;
        PlanStage s = stage(k, a, b);
        if (!fits(s)) continue;
        // Ties: prefer the more even split (smaller sum of squares is overkill; prefer the
        // later start so earlier workers take slightly more, like SplitLayers).
        const double v = std::max(best[k - 1][a], s.seconds_per_token);
        if (v < best[k][b] || (v == best[k][b] && a > from[k][b])) {
          best[k][b] = v;
          from[k][b] = a;
        }
      }
    }
  }
  if (best[w - 1][l] == inf) {
    int64_t need = prefix[l] + model.first_stage_extra_bytes + model.last_stage_extra_bytes + kv_per_layer * l;
    int64_t have = 0;
    for (int k = 0; k < w; ++k) have += stage(k, 0, 1).usable_bytes;
    return absl::ResourceExhaustedError(absl::StrCat(
        "plan: no split of ", l, " layers fits these ", w, " workers: the model needs ", GiB(need),
        " (weights + KV budget for ", options.context_tokens, " tokens x ", options.sequences,
        " sequences), the workers have ", GiB(have), " usable in total",
        need <= have ? " (enough in total, but not in contiguous pieces: a layer or the head is too large for a worker)"
                     : ""));
  }
  std::vector<PlanStage> stages(w);
  int b = l;
  for (int k = w - 1; k >= 0; --k) {
    const int a = k == 0 ? 0 : from[k][b];
    stages[k] = stage(k, a, b);
    b = a;
  }
  return finish(std::move(stages));
}

}  // namespace ring
