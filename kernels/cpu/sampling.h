// File: kernels/cpu/sampling.h
//
// Picks the next token from one row of logits, the way OpenAI-style parameters ask:
// frequency/presence penalties over the tokens generated so far, temperature, top-k,
// top-p, min-p, and a seeded RNG so that the same seed and the same logits give the
// same tokens. temperature 0 is greedy (lowest id on ties, like cpu::ArgMax).
//
// Log-probabilities reported with a token are those of the model's distribution (log
// softmax of the raw logits, before penalties, temperature and truncation), which is
// what "how likely did the model find this token" means to a client.
//
// The choice itself is a pure function, cpu::SampleToken(logits, SampleRequest): the
// request carries the one uniform draw and the penalty counts, so the same request gives
// the same token wherever it runs. That makes it the oracle of the GPU sampler
// (kernels/cuda/sampling.cuh) and lets a stage sample next to its logits while the RNG
// stays with the request's owner. Sampler is the stateful owner: RNG and counts.
//
//   Sampler s(params);
//   SampledToken t = s.Sample(logits);   // also remembers t.id for the penalties
//   // or, with the logits elsewhere:
//   SampleRequest r = s.NextRequest();   // draws the uniform
//   SampledToken t = SampleSomewhere(logits, r);
//   s.Accept(t.id);
#ifndef RINGSERVE_KERNELS_CPU_SAMPLING_H_
#define RINGSERVE_KERNELS_CPU_SAMPLING_H_

#include <cstdint>
#include <random>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace ring {

struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy
  float top_p = 1.0f;        // (0, 1]
  int32_t top_k = 0;         // 0: no limit
  float min_p = 0.0f;        // [0, 1]: drop tokens below min_p * p(max)
  float presence_penalty = 0.0f;   // [-2, 2]
  float frequency_penalty = 0.0f;  // [-2, 2]
  uint64_t seed = 0;
  int32_t top_logprobs = 0;  // 0..20 alternatives to report
  bool logprobs = false;

  // InvalidArgument naming the parameter when out of range.
  absl::Status Validate() const;
  // Greedy with nothing that needs the distribution: the argmax of the logits is the
  // token, so it can be picked where the logits are and nothing else need leave.
  bool ArgmaxOnly() const {
    return temperature == 0.0f && !logprobs && top_logprobs == 0 && presence_penalty == 0.0f &&
           frequency_penalty == 0.0f;
  }
};

struct SampledToken {
  int32_t id = 0;
  float logprob = 0.0f;                                 // when logprobs
  std::vector<std::pair<int32_t, float>> top_logprobs;  // best first
};

// Everything that decides one token besides the logits.
struct SampleRequest {
  SamplingParams params;
  // The draw, in [0, 1): the token is the first (in candidate order) whose cumulative
  // weight exceeds uniform * (kept mass). Unused when params.temperature is 0.
  double uniform = 0.0;
  // Generated token -> occurrences, for the penalties; tokens distinct, order irrelevant.
  std::vector<std::pair<int32_t, int32_t>> counts;

  // InvalidArgument when the params are out of range, the uniform is outside [0, 1), or a
  // count names a token outside [0, vocab), a token twice, or a count < 1.
  absl::Status Validate(int64_t vocab) const;
};

namespace cpu {

// The next token of one row of logits [vocab] for `req` (which must Validate). Greedy
// (temperature 0) is the lowest id among the maxima of the penalized logits. Otherwise the
// weights exp((l - max) / T) of the penalized logits l are truncated (top-k first, then
// min-p and top-p, in order of decreasing logit, ties by lower id) and the draw picks
// within what is kept; without truncation it walks the vocabulary in id order.
SampledToken SampleToken(absl::Span<const float> logits, const SampleRequest& req);

}  // namespace cpu

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // `logits`: one row [vocab]. Equivalent to Accept(cpu::SampleToken(logits,
  // NextRequest()).id). Not thread-safe (nor is anything else here).
  SampledToken Sample(absl::Span<const float> logits);
  const SamplingParams& params() const { return params_; }

  // The request for the next token: draws the uniform from the RNG (only when the
  // temperature is above 0, so greedy requests consume nothing) and snapshots the counts.
  SampleRequest NextRequest();
  // Records the token that was chosen for the last NextRequest (for the penalties).
  void Accept(int32_t token);
  // Puts a freshly constructed Sampler in the state it would have after having sampled
  // `generated` (counts and the same number of RNG draws), e.g. when a request is replayed
  // on another ring. FailedPrecondition if this Sampler has been used already.
  absl::Status Restore(const std::vector<int32_t>& generated);

 private:
  double DrawUniform();

  const SamplingParams params_;
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int32_t> counts_;  // generated token -> occurrences
  bool used_ = false;
};

}  // namespace ring

#endif  // RINGSERVE_KERNELS_CPU_SAMPLING_H_
