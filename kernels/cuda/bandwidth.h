// File: kernels/cuda/bandwidth.h
//
// Device memory read bandwidth as a streaming kernel achieves it: the roofline a
// bandwidth-bound decode step (and every "fraction of bandwidth" figure) is measured
// against. CPU counterpart: kernels/cpu/bandwidth.h.
#ifndef RINGSERVE_KERNELS_CUDA_BANDWIDTH_H_
#define RINGSERVE_KERNELS_CUDA_BANDWIDTH_H_

#include <cstdint>

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ring::cuda {

// Bytes/s of a read-only pass (16-byte streaming loads, every byte read once) over a
// `bytes` buffer on device `ordinal`: best over grid sizes of 4, 8 and 16 blocks per SM and
// `reps` timed launches each. Allocates the buffer for the call (fails with the CUDA error
// when it does not fit).
absl::StatusOr<double> ReadBandwidth(int ordinal, int64_t bytes = int64_t{2} << 30, int reps = 5);

// Enqueues one read-only pass of the same streaming kernel over `bytes` (a multiple of 16)
// at `data` (16-byte aligned) on `stream`, `grid` blocks of 512 threads; `sink` (4 device
// bytes) keeps the loads live. For timing a pass of a given size (benchmarks).
absl::Status LaunchReadPass(const void* data, int64_t bytes, uint32_t* sink, int grid,
                            cudaStream_t stream);

}  // namespace ring::cuda

#endif  // RINGSERVE_KERNELS_CUDA_BANDWIDTH_H_
