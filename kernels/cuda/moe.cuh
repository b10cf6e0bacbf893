// File: kernels/cuda/moe.cuh
//
// Mixture-of-experts on the GPU, mirroring kernels/cpu/model_ops.h:
//   RouteSigmoid   DeepSeek/GLM router: sigmoid + e_score_correction_bias, group-limited
//                  top-k (n_group / topk_group), weights normalised and scaled by
//                  routed_scaling_factor (cpu::RouteSigmoid).
//   RouteSoftmax   Qwen3-MoE router: softmax top-k with optional renormalisation
//                  (cpu::RouteSoftmax).
//   ExpertsSwiGlu  the selected experts of every token over the stacked quantized experts,
//                  SwiGLU between gate/up and down (cpu::ExpertsSwiGlu). Two ways:
//                  per slot (decode): gate, up and down are each ONE gathered launch of
//                  tokens x k one-row problems (QMatmulT with expert ids, the decode GEMV);
//                  grouped (prefill): the slots are sorted by expert on the device (stable:
//                  slot order within an expert, so results do not depend on timing), the
//                  token rows gathered in that order, and each matrix is ONE prefill-GEMM
//                  launch over the experts' row ranges (QMatmulArgs::row_offsets); down
//                  writes each result row straight to its slot of y.
//   MoeCombine     the weighted sum over slots (+ shared expert) (cpu::MoeCombine).
// Routing runs one thread per token and follows the reference's arithmetic and selection
// order exactly (ties: lower expert id; ids ascending), so the chosen experts agree unless
// an fp32 sigmoid/exp differs in its last ulp at a tie.
#ifndef RINGSERVE_KERNELS_CUDA_MOE_CUH_
#define RINGSERVE_KERNELS_CUDA_MOE_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/model_ops.h"
#include "kernels/cuda/qgemv.cuh"
#include "kernels/cuda/side_stream.cuh"

namespace ring::cuda {

inline constexpr int64_t kMaxRoutedExperts = 512;
// Decode tokens a MoeBlock (and RouterRoute) takes at most.
inline constexpr int kMoeBlockMaxTokens = 8;

// logits [T, E], bias [E] fp32, ids [T, k], weights [T, k]: device memory.
absl::Status RouteSigmoid(const float* logits, const float* bias, int64_t T,
                          const cpu::SigmoidRouting& r, int32_t* ids, float* weights,
                          cudaStream_t stream);
// The router GEMV of T decode tokens and the sigmoid routing in one launch (MoeBlock's
// router where it applies): logits[t, e] = round_bf16(x_bf16[t] . router[e]) (fp32 products
// and sums, in another order than the GEMV's, so last bits may differ from Linear's), then
// RouteSigmoid's ids and weights from those logits, bit for bit. The router's blocks read
// their weights before waiting for the previous kernel (PDL) and the last block to finish
// routes, so the routing costs no launch of its own (H200, GLM-5.2: ~5 us less a MoE layer,
// docs/benchmarks.md, session 37). ticket: a device counter that is zero before the call
// and is left zero (each launch counts its blocks on it); one per stream. Applies to bf16
// router weights [E, hidden] (hidden % 8 == 0 and at most 32 * max(32, E rounded up to 32)),
// no expert groups, 1 <= T <= kMoeBlockMaxTokens; InvalidArgument otherwise.
bool RouterRouteApplies(const DeviceQuantWeight& router, const cpu::SigmoidRouting& r, int64_t T);
absl::Status RouterRoute(const DeviceQuantWeight& router, const uint16_t* x_bf16, int64_t T,
                         const float* bias, const cpu::SigmoidRouting& r, float* logits, int32_t* ids,
                         float* weights, unsigned* ticket, cudaStream_t stream);
absl::Status RouteSoftmax(const float* gates, int64_t T, int64_t E, int64_t k,
                          bool norm_topk_prob, cpu::ActDType round, int32_t* ids, float* scores,
                          cudaStream_t stream);
// Which way ExpertsSwiGlu runs. kAuto: grouped when the activations are bf16, the format
// is one LinearT runs on the prefill GEMM (exact bf16 values; affine keeps the exact
// per-slot kernels, as LinearT keeps it on SIMT at M > 8) and there are at least
// kGroupedMinSlotsPerExpert slots per expert on average; per slot otherwise. kGrouped
// forces the grouped GEMM where it applies at all (affine included: weights rounded to bf16
// as the GEMM does; InvalidArgument elsewhere); kPerSlot forces the per-slot launches.
enum class ExpertsPath : uint8_t { kAuto, kPerSlot, kGrouped };
// A grouped tile of 128 expert rows x 64 tokens costs about as much as three one-row GEMVs
// of that expert (gpu_gemm_bench's expert rows against the decode GEMV rate), so grouping
// pays from ~3 slots per expert; 4 leaves a margin for the sort and the gather.
inline constexpr int64_t kGroupedMinSlotsPerExpert = 4;

// gate/up [E, inter, hidden], down [E, hidden, inter]; x [T, hidden], ids [T, k],
// y [T, k, hidden] (device). An id outside [0, E) gives a NaN row in y. x_bf16, when given
// with bf16 activations, is x's bf16 copy (the bits ToBf16 gives) and the per-slot launches
// read it instead of converting x again.
//
// shared: the shared expert's gate/up/down (one slice of gate/up/down each), run as T more
// problems of the routed launches (QMatmulArgs::alt) where ExpertsTakeShared says so;
// InvalidArgument elsewhere. Its outputs follow the routed ones: y [T, k + 1, hidden]
// in the order [T * k routed rows][T shared rows]. One decode token's MoE block saves the
// shared expert's three launches (gpu_gemv_bench --moe).
struct SharedExpertWeights {
  const DeviceQuantWeight* gate = nullptr;
  const DeviceQuantWeight* up = nullptr;
  const DeviceQuantWeight* down = nullptr;
};
//
// scratch: device memory of ExpertsScratchBytes(...) for the per-slot launches' gate/up and
// SwiGLU rows, or null (they are then stream-ordered allocations). Inside a CUDA graph such
// an allocation is a node between the routing and the gate/up GEMV, which then cannot start
// under the routing kernel (PDL) as it does after a kernel.
absl::Status ExpertsSwiGlu(const DeviceQuantWeight& gate, const DeviceQuantWeight& up,
                           const DeviceQuantWeight& down, const float* x, int64_t T,
                           const int32_t* ids, int64_t k, cpu::ActDType round, float* y,
                           cudaStream_t stream, ExpertsPath path = ExpertsPath::kAuto,
                           const uint16_t* x_bf16 = nullptr,
                           const SharedExpertWeights* shared = nullptr, void* scratch = nullptr);
// Bytes of ExpertsSwiGlu's scratch for these arguments (with_shared: with `shared`): 0 where
// it takes the grouped GEMM (which allocates its own, larger, buffers).
size_t ExpertsScratchBytes(const DeviceQuantWeight& gate, const DeviceQuantWeight& up,
                           const DeviceQuantWeight& down, int64_t T, int64_t k,
                           cpu::ActDType round, ExpertsPath path = ExpertsPath::kAuto,
                           bool with_shared = false);
// Whether ExpertsSwiGlu runs `shared` with the routed experts for these arguments: the
// per-slot launches (not the grouped GEMM) with bf16 activations, all T * (k + 1) problems
// in one launch, shared matrices laid out as one expert slice.
bool ExpertsTakeShared(const DeviceQuantWeight& gate, const DeviceQuantWeight& up,
                       const DeviceQuantWeight& down, const SharedExpertWeights& shared,
                       int64_t T, int64_t k, cpu::ActDType round,
                       ExpertsPath path = ExpertsPath::kAuto);
absl::Status MoeCombine(const float* y, const float* w, const float* shared, int64_t T,
                        int64_t k, int64_t hidden, cpu::CombineMode mode, cpu::ActDType round,
                        float* out, cudaStream_t stream);

// One sigmoid-routed MoE block of a few decode tokens with a shared expert, as the layer
// program composes it (models/deepseek.cc, MlaStage::Moe): the router GEMV on x's bf16
// copy and RouteSigmoid (one RouterRoute launch where router_ticket is set and it applies),
// the routed experts (ExpertsSwiGlu's per-slot launches), the shared
// expert's SwiGLU MLP (the launches the CUDA backend's LinearSwiGlu and Linear make),
// MoeCombine (fp32 sum); bf16 activations. With a side stream, the shared expert runs
// there: forked after the work queued on `stream` before the call (x is ready) and joined
// before the combine, so that its weights (20 MB of GLM-5.2's 184 MB block) stream in while
// the router GEMV and the routing, which leave the DRAM mostly idle, run, and the routed
// launches carry 8 problems a token, not 9. The router is launched ahead of the shared
// expert (a shared-expert launch queued first would hold the SMs the router's clusters
// need). Without a side stream the same launches run on `stream`. Either way the result is
// the same bits, and the call returns with every launch joined into `stream` (so it may run
// inside a stream capture). H200, GLM-5.2 dims: a MoE layer of a traced decode step ~75 ->
// ~70 us; replayed alone the block is ~1.5 us slower (docs/benchmarks.md, session 35).
struct MoeBlockArgs {
  const DeviceQuantWeight* router = nullptr;  // [E, hidden], any format the GEMV takes
  const float* bias = nullptr;                // [E] fp32, e_score_correction_bias
  cpu::SigmoidRouting routing;
  const DeviceQuantWeight* gate = nullptr;  // routed experts, as ExpertsSwiGlu
  const DeviceQuantWeight* up = nullptr;
  const DeviceQuantWeight* down = nullptr;
  SharedExpertWeights shared;  // one slice each (batch 1)
  const float* x = nullptr;          // [T, hidden] fp32
  const uint16_t* x_bf16 = nullptr;  // x's bf16 copy (ToBf16's bits)
  int64_t T = 0;
  int router_overlap = 0;  // QMatmulArgs::overlap of the router GEMV
  float* out = nullptr;    // [T, hidden]
  // RouterRoute's ticket (zero, left zero): where set and RouterRouteApplies, the router and
  // the routing are one launch; null: the router GEMV, then RouteSigmoid.
  unsigned* router_ticket = nullptr;
};
// Whether MoeBlock takes these arguments: 1 <= T <= 8, shapes that match, the routed and
// shared experts on the per-slot decode GEMV (ExpertsTakeShared's conditions) and a router
// the bf16 GEMV takes.
bool MoeBlockApplies(const MoeBlockArgs& a);
// Device scratch MoeBlock needs for `a` (0 where it does not apply): the router's logits,
// the routing, the experts' rows and outputs. The caller's (not stream-ordered allocations:
// graph nodes that would cost the router and the experts' GEMVs their PDL starts).
size_t MoeBlockScratchBytes(const MoeBlockArgs& a);
// InvalidArgument (nothing launched) where MoeBlockApplies is false or scratch is null.
absl::Status MoeBlock(const MoeBlockArgs& a, void* scratch, cudaStream_t stream,
                      const SideStream* side = nullptr);

}  // namespace ring::cuda

#endif  // RINGSERVE_KERNELS_CUDA_MOE_CUH_
