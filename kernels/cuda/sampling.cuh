// File: kernels/cuda/sampling.cuh
//
// Token selection from logits that stay on the GPU: greedy rows (cpu::ArgMax: the first
// maximal index of each row) and one sampled row with cpu::SampleToken's semantics
// (penalties, temperature, top-k, min-p, top-p, logprobs), so a last stage hands back a
// token instead of a 600 KB row of logits.
#ifndef RINGSERVE_KERNELS_CUDA_SAMPLING_CUH_
#define RINGSERVE_KERNELS_CUDA_SAMPLING_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/sampling.h"

namespace ring::cuda {

// out[r] = argmax of x[r, 0..n) (lowest index among equal maxima); device pointers.
absl::Status ArgMaxRows(const float* x, int64_t rows, int64_t n, int32_t* out,
                        cudaStream_t stream);

// The next token of one row of fp32 logits [vocab] in device memory for `req`, as
// cpu::SampleToken(logits, req) computes it; `out` is host memory. InvalidArgument when the
// request does not Validate(vocab). Synchronizes `stream`: the result crosses to the host in
// one small copy (two when the top-p/min-p set is wider than the on-chip candidate list and
// the row is sorted in full, see sampling.cu).
//
// Agreement with the CPU oracle. Greedy ids, top_logprobs ids and the top-k set are exact
// (order keys, ties to the lower id, no arithmetic). The weights exp((l - max) / T) are
// computed in double as on the CPU but summed in a different order (and CUDA's exp may
// differ from glibc's by an ulp), so the cumulative sums that the draw and the top-p cut
// compare against differ from the CPU's by a relative ~1e-16 * (terms), i.e. below 1e-10 of
// the kept mass for a 155k vocabulary. A sampled id equals the CPU's unless the draw
// u * mass lies within that distance of a bucket boundary (or the top-p / min-p cut is that
// close to a weight): the GPU then picks a neighbour of the CPU's token in candidate order,
// which the same CPU sampler gives for a uniform within 1e-9 of u. Logprobs are the same
// float up to the last bits of the double log-sum-exp (|diff| < 1e-5).
absl::Status SampleRow(const float* logits, int64_t vocab, const SampleRequest& req,
                       SampledToken* out, cudaStream_t stream);

// Candidates the sampler sorts on chip; a kept set larger than this (top-k above it, or a
// top-p / min-p set that does not fit) takes the full-sort path. Exposed for tests.
inline constexpr int kSampleCandidates = 4096;

}  // namespace ring::cuda

#endif  // RINGSERVE_KERNELS_CUDA_SAMPLING_CUH_
