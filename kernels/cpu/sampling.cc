#include "kernels/cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "kernels/status.h"

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

absl::Status SampleRequest::Validate(int64_t vocab) const {
  RING_RETURN_IF_ERROR(params.Validate());
  if (!(uniform >= 0.0 && uniform < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("sample uniform ", uniform, " not in [0, 1)"));
  }
  std::vector<int32_t> tokens;
  tokens.reserve(counts.size());
  for (const auto& [tok, n] : counts) {
    if (tok < 0 || tok >= vocab || n < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("sample count (", tok, ", ", n, ") outside vocab ", vocab, " or < 1"));
    }
    tokens.push_back(tok);
  }
  std::sort(tokens.begin(), tokens.end());
  if (std::adjacent_find(tokens.begin(), tokens.end()) != tokens.end()) {
    return absl::InvalidArgumentError("sample counts name a token twice");
  }
  return absl::OkStatus();
}

namespace cpu {
namespace {

// The draw among the penalized logits `adjusted` (temperature > 0).
int32_t Draw(const std::vector<float>& adjusted, const SamplingParams& params, double uniform) {
  const int32_t vocab = static_cast<int32_t>(adjusted.size());
  const float inv_t = 1.0f / params.temperature;
  float m = -std::numeric_limits<float>::infinity();
  for (float v : adjusted) m = std::max(m, v);
  // Candidates sorted by probability when a truncation needs an order; the full vocabulary
  // (unsorted) otherwise.
  const bool truncate = params.top_k > 0 || params.top_p < 1.0f || params.min_p > 0.0f;
  std::vector<int32_t> cand;
  std::vector<double> w;
  auto weight = [&](int32_t i) { return std::exp(static_cast<double>(adjusted[i] - m) * inv_t); };
  if (!truncate) {
    w.resize(vocab);
    double total = 0;
    for (int32_t i = 0; i < vocab; ++i) total += (w[i] = weight(i));
    // u * total is exactly what std::uniform_real_distribution<double>(0, total) computes
    // from the same engine state in libstdc++ (generate_canonical<double, 53>, times b - a,
    // plus a), so seeded outputs did not change when the draw moved out of this function.
    double r = uniform * total;
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
  if (params.top_k > 0) {
    // top-k first; top-p then applies to the renormalized top-k distribution (as in HF
    // transformers and vLLM).
    sorted = std::min(params.top_k, vocab);
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
      if (sorted == vocab || head >= params.top_p * total) break;
      sorted = std::min(vocab, sorted * 8);
    }
  }
  cand.resize(sorted);
  w.reserve(cand.size());
  const double pmax = weight(cand[0]);
  double cum = 0;
  for (int32_t i = 0; i < sorted; ++i) {
    const double wi = weight(cand[i]);
    if (params.min_p > 0 && wi < params.min_p * pmax) break;
    if (i > 0 && cum >= params.top_p * total) break;
    w.push_back(wi);
    cum += wi;
  }
  double r = uniform * cum;
  for (size_t i = 0; i < w.size(); ++i) {
    if ((r -= w[i]) < 0) return cand[i];
  }
  return cand[0];
}

}  // namespace

SampledToken SampleToken(absl::Span<const float> logits, const SampleRequest& req) {
  const SamplingParams& params = req.params;
  const int32_t vocab = static_cast<int32_t>(logits.size());
  std::vector<float> adj(logits.begin(), logits.end());
  for (const auto& [tok, n] : req.counts) {
    if (tok >= 0 && tok < vocab) {
      adj[tok] -= params.frequency_penalty * static_cast<float>(n) + params.presence_penalty;
    }
  }
  SampledToken out;
  if (params.temperature == 0.0f) {
    out.id = static_cast<int32_t>(std::max_element(adj.begin(), adj.end()) - adj.begin());
  } else {
    out.id = Draw(adj, params, req.uniform);
  }
  if (params.logprobs || params.top_logprobs > 0) {
    const double lse = LogSumExp(logits);
    out.logprob = static_cast<float>(logits[out.id] - lse);
    if (params.top_logprobs > 0) {
      const int32_t k = std::min(params.top_logprobs, vocab);
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
  return out;
}

}  // namespace cpu

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

double Sampler::DrawUniform() {
  used_ = true;
  // One draw per sampled token, and none for greedy: the RNG sequence of a seed is what it
  // was when the draw was std::uniform_real_distribution inside the sampler.
  return params_.temperature > 0.0f ? std::generate_canonical<double, 53>(rng_) : 0.0;
}

SampleRequest Sampler::NextRequest() {
  SampleRequest r;
  r.params = params_;
  r.uniform = DrawUniform();
  r.counts.assign(counts_.begin(), counts_.end());
  return r;
}

void Sampler::Accept(int32_t token) {
  used_ = true;
  ++counts_[token];
}

SampledToken Sampler::Sample(absl::Span<const float> logits) {
  SampledToken t = cpu::SampleToken(logits, NextRequest());
  Accept(t.id);
  return t;
}

absl::Status Sampler::Restore(const std::vector<int32_t>& generated) {
  if (used_) return absl::FailedPreconditionError("Sampler::Restore on a used sampler");
  for (int32_t tok : generated) {
    DrawUniform();
    Accept(tok);
  }
  return absl::OkStatus();
}

}  // namespace ring
