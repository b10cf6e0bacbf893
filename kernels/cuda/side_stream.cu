// kernels/cuda/side_stream.cuh's test delay.
#include "kernels/cuda/side_stream.cuh"

#include <atomic>

#include "kernels/cuda/cuda_status.h"

namespace ring::cuda {
namespace {

std::atomic<int64_t> g_side_delay_ns{0};

__global__ void SpinKernel(int64_t ns) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (static_cast<int64_t>(t - t0) < ns);
}

}  // namespace

void TEST_SetSideStreamDelayNs(int64_t ns) { g_side_delay_ns.store(ns); }

absl::Status SideStreamTestDelay(cudaStream_t side) {
  const int64_t ns = g_side_delay_ns.load();
  if (ns <= 0) return absl::OkStatus();
  SpinKernel<<<1, 1, 0, side>>>(ns);
  RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace ring::cuda
