#include "kernels/cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace ring {
namespace {

// log-sum-exp of a row, for log-softmax.
double LogSumExp(absl::Span<const float> x) {
  float m = -std::numeric_limits<float>::infinity();
  for (float v : x) m = std::max(m, v);
  if (!std::isfinite(m)) return m;
  double s = 0;
  for (float v : x) s += std::exp(static_cast<double>(v) - m);
  return m + std::log(s);
}

}  // namespace

absl::Status SamplingParams::Validate() const {
  auto bad = [](absl::string_view name, absl::string_view want) {
    return absl::InvalidArgumentError(absl::StrCat(name, " must be ", want));
  };
  if (!(temperature >= 0 && temperature <= 2)) return bad("temperature", "in [0, 2]");
  if (!(top_p > 0 && top_p <= 1)) return bad("top_p", "in (0, 1]");
  if (top_k < 0) return bad("top_k", ">= 0");
  if (!(min_p >= 0 && min_p <= 1)) return bad("min_p", "in [0, 1]");
  if (!(presence_penalty >= -2 && presence_penalty <= 2)) return bad("presence_penalty", "in [-2, 2]");
  if (!(frequency_penalty >= -2 && frequency_penalty <= 2)) return bad("frequency_penalty", "in [-2, 2]");
  if (top_logprobs < 0 || top_logprobs > 20) return bad("top_logprobs", "in [0, 20]");
  return absl::OkStatus();
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

SampledToken Sampler::Sample(absl::Span<const float> logits) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  std::vector<float> adj(logits.begin(), logits.end());
  for (const auto& [tok, n] : counts_) {
    if (tok >= 0 && tok < vocab) {
      adj[tok] -= params_.frequency_penalty * static_cast<float>(n) + params_.presence_penalty;
    }
  }
  SampledToken out;
  if (params_.temperature == 0.0f) {
    out.id = static_cast<int32_t>(std::max_element(adj.begin(), adj.end()) - adj.begin());
  } else {
    out.id = Draw(adj);
  }
  if (params_.logprobs || params_.top_logprobs > 0) {
    const double lse = LogSumExp(logits);
    out.logprob = static_cast<float>(logits[out.id] - lse);
    if (params_.top_logprobs > 0) {
      const int32_t k = std::min(params_.top_logprobs, vocab);
      std::vector<int32_t> idx(vocab);
      std::iota(idx.begin(), idx.end(), 0);
      std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
      });
      for (int32_t i = 0; i < k; ++i) {
        out.top_logprobs.emplace_back(idx[i], static_cast<float>(logits[idx[i]] - lse));
      }
    }
  }
  ++counts_[out.id];
  return out;
}

void Sampler::Restore(const std::vector<int32_t>& generated) {
  for (int32_t id : generated) {
    // Draw takes exactly one 64-bit word per token (generate_canonical<double, 53> from
    // mt19937_64), and only when not greedy.
    if (params_.temperature != 0.0f) rng_.discard(1);
    ++counts_[id];
  }
}

int32_t Sampler::Draw(const std::vector<float>& adjusted) {
  const int32_t vocab = static_cast<int32_t>(adjusted.size());
  const float inv_t = 1.0f / params_.temperature;
  float m = -std::numeric_limits<float>::infinity();
  for (float v : adjusted) m = std::max(m, v);
  // Candidates sorted by probability when a truncation needs an order; the full vocabulary
  // (unsorted) otherwise.
  const bool truncate = params_.top_k > 0 || params_.top_p < 1.0f || params_.min_p > 0.0f;
  std::vector<int32_t> cand;
  std::vector<double> w;
  auto weight = [&](int32_t i) { return std::exp(static_cast<double>(adjusted[i] - m) * inv_t); };
  if (!truncate) {
    w.resize(vocab);
    double total = 0;
    for (int32_t i = 0; i < vocab; ++i) total += (w[i] = weight(i));
    std::uniform_real_distribution<double> u(0.0, total);
    double r = u(rng_);
    for (int32_t i = 0; i < vocab; ++i) {
      if ((r -= w[i]) < 0) return i;
    }
    return static_cast<int32_t>(std::max_element(w.begin(), w.end()) - w.begin());
  }
  auto better = [&](int32_t a, int32_t b) {
    return adjusted[a] > adjusted[b] || (adjusted[a] == adjusted[b] && a < b);
  };
  cand.resize(vocab);
  std::iota(cand.begin(), cand.end(), 0);
  int32_t sorted;
  double total = 0;
  if (params_.top_k > 0) {
    // top-k first; top-p then applies to the renormalized top-k distribution (as in HF
    // transformers and vLLM).
    sorted = std::min(params_.top_k, vocab);
    std::partial_sort(cand.begin(), cand.begin() + sorted, cand.end(), better);
    for (int32_t i = 0; i < sorted; ++i) total += weight(cand[i]);
  } else {
    // Sorting a 150k vocabulary per token is slow; the head usually holds the top-p mass,
    // so sort a prefix first and widen only when it does not.
    for (int32_t i = 0; i < vocab; ++i) total += weight(i);
    sorted = std::min<int32_t>(vocab, 1024);
    while (true) {
      std::partial_sort(cand.begin(), cand.begin() + sorted, cand.end(), better);
      double head = 0;
      for (int32_t i = 0; i < sorted; ++i) head += weight(cand[i]);
      if (sorted == vocab || head >= params_.top_p * total) break;
      sorted = std::min(vocab, sorted * 8);
    }
  }
  cand.resize(sorted);
  w.reserve(cand.size());
  const double pmax = weight(cand[0]);
  double cum = 0;
  for (int32_t i = 0; i < sorted; ++i) {
    const double wi = weight(cand[i]);
    if (params_.min_p > 0 && wi < params_.min_p * pmax) break;
    if (i > 0 && cum >= params_.top_p * total) break;
    w.push_back(wi);
    cum += wi;
  }
  std::uniform_real_distribution<double> u(0.0, cum);
  double r = u(rng_);
  for (size_t i = 0; i < w.size(); ++i) {
    if ((r -= w[i]) < 0) return cand[i];
  }
  return cand[0];
}

}  // namespace ring
