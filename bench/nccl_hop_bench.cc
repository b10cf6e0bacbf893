// File: bench/nccl_hop_bench.cc
//
// One ring hop over the NCCL link (kernels/cuda/nccl_link.h) between GPU 0 and GPU 1 of
// this host: the same-host alternative to bench/hop_bench.cc's gRPC hop (p50 target there
// <= 50 us). Two threads in this process play the two stages, rank 0 on GPU 0 and rank 1
// on GPU 1; rank 0 sends a [rows, 6144] bf16 frame, rank 1 sends it back (ping-pong), and
// rank 0 times each round trip. One-way latency = round trip / 2. Cases:
//   nccl_device   device buffer -> NCCL -> device buffer (the relay's target path)
//   nccl_host     host vector -> device -> NCCL -> device -> host vector (what a stage
//                 whose output is a host vector pays today, both copies included)
//   memcpy_peer   cudaMemcpyPeerAsync GPU 0 <-> GPU 1 in one thread: the copy engine's
//                 floor for the same bytes, no NCCL and no second thread
// Output, one machine-readable line per case (times in microseconds, GB/s = 1e9 bytes/s of
// one-way payload at the p50):
//   nccl_hop case=nccl_device rows=1 bytes=12288 iters=3000 p50_us=... p99_us=...
//       mean_us=... gbps=...
//
//   ninja -C build-cuda nccl_hop_bench && ./build-cuda/bench/nccl_hop_bench [--iters 3000]
// NCCL comes from $RING_NCCL_LIBRARY (file or directory) or the loader path.
//
// 2x H200 (NV18), NCCL 2.28.9 (pip), 2026-11-30, --iters 2000, one-way p50 / p99 in us:
//   rows  nccl_device        nccl_host            memcpy_peer
//   1     55.4 / 246         69.0 / 266           10.1 / 15
//   16    64.5 / 209         126 / 260            10.4 / 16
//   2048  134 / 260 (188 GB/s)  5984 / 6813 (4.2 GB/s)  75.0 / 79 (336 GB/s)
// The small-frame floor is NCCL's non-blocking mode (a helper thread per operation; see
// nccl_link.h): the same ping-pong on a blocking communicator measured ~18 us. The big
// host-staged frame is two pageable 25 MB copies per hop.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/nccl_link.h"

namespace {

using ring::cuda::DeviceBuffer;
using ring::cuda::NcclLink;

constexpr size_t kWidth = 6144;
constexpr absl::Duration kOpTimeout = absl::Seconds(10);

[[noreturn]] void Die(const std::string& what, const absl::Status& st) {
  std::fprintf(stderr, "nccl_hop_bench: %s: %s\n", what.c_str(), st.ToString().c_str());
  std::exit(1);
}

void Check(const absl::Status& st, const char* what) {
  if (!st.ok()) Die(what, st);
}

template <typename T>
T Value(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) Die(what, v.status());
  return std::move(*v);
}

void CheckCuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) Die(what, absl::InternalError(cudaGetErrorString(e)));
}

void Report(const char* name, size_t rows, size_t bytes, std::vector<double> rtt_us) {
  std::vector<double> us;
  us.reserve(rtt_us.size());
  double mean = 0;
  for (double v : rtt_us) {
    us.push_back(v / 2);
    mean += v / 2;
  }
  mean /= static_cast<double>(us.size());
  std::sort(us.begin(), us.end());
  const double p50 = us[us.size() / 2];
  const double p99 = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  std::printf("nccl_hop case=%s rows=%zu bytes=%zu iters=%zu p50_us=%.2f p99_us=%.2f "
              "mean_us=%.2f gbps=%.2f\n",
              name, rows, bytes, us.size(), p50, p99, mean, bytes / (p50 * 1e3));
  std::fflush(stdout);
}

// Runs `warmup + iters` ping-pongs: rank 0 calls there_and_back() and times it, rank 1
// calls echo() as often. Each rank on its own thread with its GPU current.
std::vector<double> PingPong(int warmup, int iters, const std::function<void()>& there_and_back,
                             const std::function<void()>& echo) {
  std::vector<double> rtt_us;
  rtt_us.reserve(iters);
  std::thread peer([&] {
    CheckCuda(cudaSetDevice(1), "cudaSetDevice(1)");
    for (int i = 0; i < warmup + iters; ++i) echo();
  });
  CheckCuda(cudaSetDevice(0), "cudaSetDevice(0)");
  for (int i = 0; i < warmup + iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    there_and_back();
    const auto t1 = std::chrono::steady_clock::now();
    if (i >= warmup) rtt_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  peer.join();
  return rtt_us;
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 3000;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0) iters = std::max(10, std::atoi(argv[i + 1]));
  }
  // NVLink multicast (NVLS) must stay off on our GPU hosts; set before NCCL initializes
  // anything, without overriding an explicit setting.
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);

  const ring::cuda::NcclLibrary* nccl = Value(ring::cuda::NcclLibrary::Get(), "load NCCL");
  const int devices = Value(ring::cuda::DeviceCount(), "count CUDA devices");
  if (devices < 2) Die("needs 2 GPUs", absl::FailedPreconditionError("fewer than 2 devices"));
  std::printf("# NCCL %s from %s; GPU 0: %s; GPU 1: %s\n", nccl->VersionString().c_str(),
              nccl->path().c_str(), Value(ring::cuda::QueryDevice(0), "query 0").name.c_str(),
              Value(ring::cuda::QueryDevice(1), "query 1").name.c_str());

  const size_t max_bytes = 2048 * kWidth * 2;
  const std::string id = Value(NcclLink::NewId(*nccl), "NcclLink::NewId");
  std::unique_ptr<NcclLink> links[2];
  {
    std::thread t[2];
    for (int r = 0; r < 2; ++r) {
      t[r] = std::thread([&, r] {
        ring::cuda::NcclLinkOptions o;
        o.device = r;
        o.rank = r;
        o.peer = r == 0 ? "bench rank 1" : "bench rank 0";
        o.staging_bytes = max_bytes;
        links[r] = Value(NcclLink::Connect(id, o, absl::Now() + absl::Seconds(60)), "connect");
      });
    }
    for (auto& th : t) th.join();
  }

  for (size_t rows : {size_t{1}, size_t{16}, size_t{2048}}) {
    const size_t bytes = rows * kWidth * 2;
    // The big frame is ~25 MB: fewer samples keep the run short.
    const int n = rows >= 1024 ? std::max(20, iters / 20) : iters;
    const int warmup = std::max(5, n / 10);
    DeviceBuffer dev[2];
    for (int r = 0; r < 2; ++r) {
      CheckCuda(cudaSetDevice(r), "cudaSetDevice");
      dev[r] = Value(DeviceBuffer::Allocate(bytes), "allocate");
      Check(dev[r].Zero(), "zero");
    }
    auto deadline = [] { return absl::Now() + kOpTimeout; };

    // The device and host-staged cases differ only in the pair of link calls.
    using SendFn = absl::Status (NcclLink::*)(const void*, size_t, absl::Time);
    using RecvFn = absl::Status (NcclLink::*)(void*, size_t, absl::Time);
    auto nccl_case = [&](const char* name, SendFn send, RecvFn recv, void* buf0, void* buf1) {
      NcclLink& l0 = *links[0];
      NcclLink& l1 = *links[1];
      Report(name, rows, bytes,
             PingPong(warmup, n,
                      [&] {
                        Check((l0.*send)(buf0, bytes, deadline()), "rank 0 send");
                        Check((l0.*recv)(buf0, bytes, deadline()), "rank 0 recv");
                      },
                      [&] {
                        Check((l1.*recv)(buf1, bytes, deadline()), "rank 1 recv");
                        Check((l1.*send)(buf1, bytes, deadline()), "rank 1 send");
                      }));
    };
    nccl_case("nccl_device", &NcclLink::Send, &NcclLink::Recv, dev[0].data(), dev[1].data());
    std::vector<uint8_t> host[2] = {std::vector<uint8_t>(bytes, 1),
                                    std::vector<uint8_t>(bytes, 0)};
    nccl_case("nccl_host", &NcclLink::SendHost, &NcclLink::RecvHost, host[0].data(),
              host[1].data());
    if (host[1] != host[0]) Die("nccl_host", absl::DataLossError("echoed bytes differ"));

    // Copy-engine floor: both copies issued from one thread on GPU 0's stream. A bench-only
    // synchronous wait: a local peer copy has no remote party that could stall it.
    CheckCuda(cudaSetDevice(0), "cudaSetDevice(0)");
    const cudaError_t peer_access = cudaDeviceEnablePeerAccess(1, 0);
    if (peer_access != cudaErrorPeerAccessAlreadyEnabled) CheckCuda(peer_access, "peer access");
    cudaGetLastError();
    cudaStream_t stream;
    CheckCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    std::vector<double> rtt_us;
    for (int i = 0; i < warmup + n; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      CheckCuda(cudaMemcpyPeerAsync(dev[1].data(), 1, dev[0].data(), 0, bytes, stream), "peer");
      CheckCuda(cudaStreamSynchronize(stream), "sync");
      CheckCuda(cudaMemcpyPeerAsync(dev[0].data(), 0, dev[1].data(), 1, bytes, stream), "peer");
      CheckCuda(cudaStreamSynchronize(stream), "sync");
      const auto t1 = std::chrono::steady_clock::now();
      if (i >= warmup) rtt_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    CheckCuda(cudaStreamDestroy(stream), "stream destroy");
    Report("memcpy_peer", rows, bytes, std::move(rtt_us));
  }
  // Both at once: finalizing quiesces with the peer, so one side alone would wait for it.
  std::thread closer([&] { Check(links[1]->Close(absl::Now() + absl::Seconds(10)), "close 1"); });
  Check(links[0]->Close(absl::Now() + absl::Seconds(10)), "close 0");
  closer.join();
  return 0;
}
