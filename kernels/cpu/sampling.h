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
//   Sampler s(params);
//   SampledToken t = s.Sample(logits);   // also remembers t.id for the penalties
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

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // `logits`: one row [vocab]. Not thread-safe.
  SampledToken Sample(absl::Span<const float> logits);
  // Counts `id` as generated (for the penalties) when it was picked elsewhere (the argmax
  // of a greedy request taken where the logits are).
  void Accept(int32_t id) { ++counts_[id]; }
  // Puts a fresh sampler in the state it would be in after sampling `generated`: their
  // penalty counts and one random draw each (a replay of a request on another ring
  // continues the same random stream).
  void Restore(const std::vector<int32_t>& generated);
  const SamplingParams& params() const { return params_; }

 private:
  int32_t Draw(const std::vector<float>& adjusted);

  const SamplingParams params_;
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int32_t> counts_;  // generated token -> occurrences
};

}  // namespace ring

#endif  // RINGSERVE_KERNELS_CPU_SAMPLING_H_
