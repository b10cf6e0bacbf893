// File: kernels/cuda/indexer.cuh
//
// The DSA lightning indexer's selection on the GPU (cpu::IndexerTopK, kernels/cpu/
// model_ops.h): per query row the head-weighted relu scores over every cached key, with the
// reference's rounding points and head summation order, then the top-k positions. With bf16
// activations and 128-dim heads (16, 32, 64 or 128 of them: GLM-5, DeepSeek-V3.2) the dot
// products run on the tensor cores (exact products of bf16 values, fp32 sums), for prefill
// rows and the decode row alike; otherwise on the CUDA cores. RING_CUDA_INDEXER_MMA=0 keeps
// the CUDA-core kernels (A/B runs).
//
//   TopKRows: per row of scores [rows, n] the k largest values (ties: lower index), written
//   in ascending index order (the set cpu::TopKIndices returns). A radix select over the
//   order-preserving integer image of the floats (4 passes of 8 bits, one block per row; a
//   pass is skipped where all keys share the byte, as bf16 scores do in the last two; a
//   row's keys stay in shared memory when they fit, ~56k of them on an H200) finds the k-th
//   largest value; a block-wide ordered compaction then writes every index above it and the
//   lowest-indexed ties. Rows of 4096 keys or more, when few (decode), run on a thread-block
//   cluster of 8 blocks a row (sm_90+), each holding a slice (RING_CUDA_TOPK_CLUSTER=0: one
//   block). -0.0 and +0.0 are the same value; NaN is not expected (masked keys are -inf).
#ifndef RINGSERVE_KERNELS_CUDA_INDEXER_CUH_
#define RINGSERVE_KERNELS_CUDA_INDEXER_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/model_ops.h"

namespace ring::cuda {

// pos_at (optional, one row): the row holds *pos_at + 1 scores, read on the device; n is
// then an upper bound that sizes the launch.
absl::Status TopKRows(const float* scores, int64_t rows, int64_t n, int64_t k, int32_t* out,
                      cudaStream_t stream, const int32_t* pos_at = nullptr);

// cpu::IndexerTopK; a's pointers and `topk` [T, K] are device memory.
// pos_at (optional; IndexerTakesDevicePos says where): the decode row's key count is
// *pos_at + 1, read on the device, so that a launch captured into a graph stays valid as the
// cache grows; a.S (and a.offset = a.S - 1) is then an upper bound that sizes the grid.
// scratch (optional): IndexerTopKScratchBytes(a) bytes of device memory for the scores,
// untouched by others until the stream has run this call's work, in place of a
// stream-ordered allocation (captured into a graph, an allocation node between two kernels
// costs the second its programmatic early start).
// scores_done (optional): recorded on `stream` once the scores are queued, before the
// selection (IndexedMlaDecode forks its side branch there).
absl::Status IndexerTopK(const cpu::IndexerArgs& a, cpu::ActDType round, int32_t* topk,
                         cudaStream_t stream, const int32_t* pos_at = nullptr,
                         void* scratch = nullptr, cudaEvent_t scores_done = nullptr);
int64_t IndexerTopKScratchBytes(const cpu::IndexerArgs& a);
// One query row on the lane-per-key decode kernel: dim % 4 == 0, 16-byte aligned q and keys,
// its shared memory within the device's limit.
bool IndexerTakesDevicePos(const cpu::IndexerArgs& a);

}  // namespace ring::cuda

#endif  // RINGSERVE_KERNELS_CUDA_INDEXER_CUH_
