// File: kernels/cuda/attention.cuh
//
// Attention on the GPU, mirroring the CPU reference (kernels/cpu/ops.h cpu::Attention,
// kernels/cpu/model_ops.h cpu::MlaAttention) operation for operation: fp32 scores, additive
// mask and softmax, one rounding of the output to the activation dtype; every intermediate
// the reference rounds (MLA's scaled rope query, pe_scores, expanded keys/values, latent
// queries) is rounded at the same point. Differences are fp32 summation order (the softmax
// is computed online, keys split over warps, and over blocks for long decode rows) and
// expf's last ulp.
//
//   Attention      GQA / MHA / MQA over strided q, k, v: a causal offset and/or an additive
//                  [Hq, L, S] mask (Qwen3 GQA, and the core of both MLA forms).
//   MlaAttention   MLA after the projections: expanded form for prefill chunks (T > 1),
//                  absorbed form over the compressed latent cache + rope key for decode
//                  (T == 1), dense or over DSA-selected keys (sparse prefill as a mask,
//                  sparse decode as a gather of the selected cache rows); with bf16
//                  activations at GLM-5's widths, sparse prefill rows run absorbed, each as
//                  its decode step would (MlaAttentionAbsorbsRows).
//   IndexedMlaDecode  a decode row's DSA selection and its MLA in one call, MLA's query
//                  projection beside the indexer on a side stream.
//
// All pointers are device memory; work is queued on `stream` (op temporaries are
// stream-ordered allocations).
#ifndef RINGSERVE_KERNELS_CUDA_ATTENTION_CUH_
#define RINGSERVE_KERNELS_CUDA_ATTENTION_CUH_

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "kernels/cpu/model_ops.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/qgemv.cuh"
#include "kernels/cuda/side_stream.cuh"

namespace ring::cuda {

// Operands with explicit element strides between tokens and between heads.
struct AttentionParams {
  const float* q = nullptr;
  int64_t q_tok = 0, q_head = 0;
  const float* k = nullptr;
  int64_t k_tok = 0, k_head = 0;
  const float* v = nullptr;
  int64_t v_tok = 0, v_head = 0;
  int64_t L = 0, S = 0, hq = 0, hkv = 0, dk = 0, dv = 0;
  float scale = 1.f;
  const float* add_mask = nullptr;  // [hq, L, S]
  int64_t causal_offset = -1;       // >= 0: key j visible to query i iff j <= offset + i
  float* out = nullptr;             // [L, hq, dv]
  uint16_t* out_bf16 = nullptr;     // optional: also the output's bf16 bits, [L, hq, dv]
  // MLA prefill's rope scores in the kernel instead of an add_mask (AttentionTakesPe says
  // when): score(i, j) += round(sum_d round(q_pe[i, d] * scale) * k_pe[j, d]) over d < rope
  // (cpu::MlaAttention's pe term, fp32 sums in the tensor cores' order); keys j with
  // allowed[i * S + j] == 0 (null: all allowed) are masked.
  const float* q_pe = nullptr;
  int64_t q_pe_tok = 0, q_pe_head = 0;
  const float* k_pe = nullptr;  // [S, rope]: one head for all
  int64_t rope = 0;
  const uint8_t* allowed = nullptr;  // [L, S]
  // Decode with the key count on the device (AttentionTakesDevicePos says where): the rows
  // see keys [0, *pos_at + L), read by the kernel, so that a launch captured into a graph
  // stays valid as the cache grows; S is then an upper bound on that count and fixes the
  // grid and the key split (AttentionVecKeySplit) alone.
  const int32_t* pos_at = nullptr;
};
inline constexpr int64_t kMaxAttentionDv = 1024;
absl::Status Attention(const AttentionParams& p, cpu::ActDType round, cudaStream_t stream);
// Whether Attention computes p's rope scores itself (p.q_pe / k_pe / rope set): the
// tensor-core prefill kernel for bf16 activations, rope 64, dk 128 or 192. Attention fails
// with InvalidArgument for rope scores it would not take.
bool AttentionTakesPe(const AttentionParams& p, cpu::ActDType round);
// Whether Attention takes p with p.pos_at set: one query row (L == 1), no mask or causal
// offset or rope scores, dk = dv in {64, 128, 256} with 16-byte aligned K/V rows (the
// batched-key decode kernel). Attention refuses pos_at elsewhere (InvalidArgument).
bool AttentionTakesDevicePos(const AttentionParams& p);

// How Attention splits the keys of each (query, head) row over blocks on the batched-key
// decode kernel (dk = dv in {64, 128, 256}, 16-byte aligned K/V rows, fewer than 16 queries):
// when the L * hq rows are at most one per SM of a GPU of `sm_count` SMs and at least 512
// keys long, block s of a row takes keys [s * keys_per_split, (s + 1) * keys_per_split)
// (the last split may be shorter; at most two blocks per SM in all) and a combine merges the
// splits in order. splits == 1 (keys_per_split == S) is the single pass. A function of the
// shapes (L, hq, S, causal_offset) and sm_count only, so a shape gives the same result bits
// on every run; exposed for tests and benchmarks to know which path a shape takes.
struct AttentionKeySplit {
  int64_t splits = 1;
  int64_t keys_per_split = 0;
};
AttentionKeySplit AttentionVecKeySplit(const AttentionParams& p, int sm_count);

// cpu::Attention's argument layout (heads contiguous inside a token row).
// out_bf16 (optional): also the bf16 bits of out (exact when round is bf16), for a matmul
// that reads out next. pos_at (optional): AttentionParams::pos_at, a.S the upper bound.
absl::Status Attention(const cpu::AttentionArgs& a, cpu::ActDType round, float* out,
                       cudaStream_t stream, uint16_t* out_bf16 = nullptr,
                       const int32_t* pos_at = nullptr);
bool AttentionTakesDevicePos(const cpu::AttentionArgs& a);

// cpu::MlaAttention: a's pointers (q, latent, k_pe, topk) are device memory.
// out_bf16 (optional, bf16 activations): also the bf16 bits of out, for o_proj; decode
// writes them from its last GEMV, other paths with a conversion launch.
// pos_at (optional; MlaAttentionTakesDevicePos says where): the decode row's key count is
// *pos_at + 1, read on the device, so that a launch captured into a graph stays valid as the
// cache grows; a.S (and a.offset = a.S - 1) is then an upper bound that sizes the grid (dense)
// and the top-k indices' range check uses the count.
// scratch (optional): MlaAttentionScratchBytes(a, round) bytes of device memory, untouched by
// others until the stream has run this call's work, that the decode path uses instead of a
// stream-ordered allocation (which, captured into a graph, is a node between two kernels
// and costs the second its programmatic early start).
absl::Status MlaAttention(const cpu::MlaAttentionArgs& a, const DeviceQuantWeight& embed_q,
                          const DeviceQuantWeight& unembed_out, cpu::ActDType round, float* out,
                          cudaStream_t stream, uint16_t* out_bf16 = nullptr,
                          const int32_t* pos_at = nullptr, void* scratch = nullptr);
// One query row on the split decode kernels (the latent width, rope and alignment they take).
bool MlaAttentionTakesDevicePos(const cpu::MlaAttentionArgs& a);
// Bytes of scratch the decode path (one row on the split kernels) takes from MlaAttention's
// `scratch`; 0 where a takes another path (which then allocates its own, and ignores it).
int64_t MlaAttentionScratchBytes(const cpu::MlaAttentionArgs& a, cpu::ActDType round);
// The DSA indexer's selection of one decode row (IndexerTopK: ix -> topk) and the MLA
// attention that reads it (MlaAttention with a.topk == topk) in one call, with MLA's query
// projection (q_nope's bf16 copy and q_lat = round(q_nope @ W_UK_h^T), which read neither the
// cache nor the selection) on side.stream (side_stream.cuh), forked once the indexer's
// scores are queued and joined before the attention kernel, so that it runs beside the top-k
// instead of after it. The same kernels on the same data as the two calls, so the
// same bits. pos_at: both ops' key count (as theirs); ix_scratch: IndexerTopKScratchBytes(ix),
// scratch: MlaAttentionScratchBytes(a, round), both required, neither touched by others until
// `stream` has run this call's work. InvalidArgument (nothing launched) where
// IndexedMlaDecodeApplies(a) is false or ix does not match a (one row, same bound and K).
// H200, GLM-5.2 dims: up to ~7 us off a full-indexer layer's decode (docs/benchmarks.md,
// session 37).
bool IndexedMlaDecodeApplies(const cpu::MlaAttentionArgs& a);
absl::Status IndexedMlaDecode(const cpu::IndexerArgs& ix, int32_t* topk, void* ix_scratch,
                              const cpu::MlaAttentionArgs& a, const DeviceQuantWeight& embed_q,
                              const DeviceQuantWeight& unembed_out, cpu::ActDType round, float* out,
                              cudaStream_t stream, uint16_t* out_bf16, const int32_t* pos_at,
                              void* scratch, const SideStream& side);
// Whether a prefill chunk (T > 1) with top-k rows runs each row in the absorbed form, as
// cpu::MlaAttention computes a decode row (T = 1, offset + i, that row's top-k, or dense over
// its offset + i + 1 keys when they are at most K), instead of the reference's expanded
// form: bf16 activations at kvl 512 / rope 64 on sm_80+, unless RING_MLA_SPARSE_PREFILL=0.
bool MlaAttentionAbsorbsRows(const cpu::MlaAttentionArgs& a, cpu::ActDType round);

// The tensor-core MLA kernels `dev` runs with bf16 activations at kvl 512 / rope 64, by its
// shared memory a block (DeviceInfo::smem_per_block_optin): decode on the tensor cores where
// a block may have 58 KB; sparse prefill rows 64 heads a block where it may have 174 KB, 32
// where 79 KB (sm_120 / sm_121: ~99 KB). The A/B switches (RING_ATTN_MMA,
// RING_MLA_SPARSE_PREFILL) count too.
enum class MlaDecodeForm { kSimt, kTensorCore };
MlaDecodeForm ChooseMlaDecodeForm(const DeviceInfo& dev);
int MlaSparsePrefillHeadsPerBlock(const DeviceInfo& dev);  // 64, 32, or 0 (the expanded form)
// The dense prefill attention (rows that see at most index_topk keys) at qk_nope `nope`
// (128 or 192), rope 64 and value width `vd`: the tensor-core kernel with the rope scores
// inside computes the value dims in slices of `value_slice` over key tiles of `key_tile`:
// 128 / 64 where its block fits (111 KB at GLM-5's 192 / 256), 128 / 32 on a ~99 KB GPU
// (60 KB), 64 / 64 below that; {0, 0} where none fits (the rope scores then go through an
// additive mask of heads x rows x keys fp32).
struct MlaPrefillForm {
  int value_slice = 0, key_tile = 0;
};
MlaPrefillForm ChooseMlaPrefillForm(const DeviceInfo& dev, int64_t nope, int64_t vd);
// The choices above as one line of the worker's attestation.
std::string MlaKernelForms(const DeviceInfo& dev);

}  // namespace ring::cuda

#endif  // RINGSERVE_KERNELS_CUDA_ATTENTION_CUH_
