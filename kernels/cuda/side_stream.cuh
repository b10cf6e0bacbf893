// File: kernels/cuda/side_stream.cuh
//
// A second stream for the part of one op that is off the op's critical path: MoeBlock's
// shared expert (beside the router and the routing), IndexedMlaDecode's query projection
// (beside the DSA indexer). The op records `fork` on its stream, queues the side work on
// `stream` after it, records `join` there and makes its stream wait for `join` before it
// returns, whatever failed on the way: a graph capture of the op therefore always sees the
// fork joined, and a replay runs both branches.
#ifndef RINGSERVE_KERNELS_CUDA_SIDE_STREAM_CUH_
#define RINGSERVE_KERNELS_CUDA_SIDE_STREAM_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"

namespace ring::cuda {

struct SideStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr;  // two events owned by the caller, reusable across calls
  cudaEvent_t join = nullptr;
};

// Tests: every op's side branch first spins for `ns` on the side stream (0: none), so that a
// missing join shows as a wrong result rather than as a rare race.
void TEST_SetSideStreamDelayNs(int64_t ns);
// Queues that spin on `side` when a test set one; nothing otherwise.
absl::Status SideStreamTestDelay(cudaStream_t side);

}  // namespace ring::cuda

#endif  // RINGSERVE_KERNELS_CUDA_SIDE_STREAM_CUH_
