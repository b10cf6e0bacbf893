// The CUDA backend (models/backend.h): activations, caches and scratch in device memory, all
// work on one stream per stage, weights uploaded once at load and looked up by the host
// tensor's address, every op a kernel of kernels/cuda whose CPU reference is the
// corresponding CPU backend op (checked by kernels/cuda/ops_harness_test.cc).
//
// Steps of different sequences are serialised (concurrent() == false): the stage holds one
// stream, so everything on it runs in call order.
//
// Decode is launch-bound (a Qwen3-0.6B layer is ~25 small kernels), so a step is not simply
// launched op by op:
//   * Memory. Alloc hands out blocks of a host-side arena (free lists by size class, no CUDA
//     call once warm); a block freed on the host may be reused at once, since every later
//     use is queued behind every earlier one on the one stream. Blocks above kArenaMaxBlock
//     come from the stream-ordered pool and are returned to it after the step's queued work.
//   * Op graphs. Each op call of a step gets a record of its exact arguments (pointers,
//     sizes, scalars, weights). An op whose record equals the record of the op at the same
//     index of one of the last two steps is "stable" and is held back; the next op that is not
//     stable (a host copy, an op whose arguments changed) first flushes the held-back run. A
//     run of two or more ops is captured once into a CUDA graph keyed by the run's records
//     and replayed whenever the same run comes again. Equal records mean the same kernels on
//     the same buffers, so a replay does exactly what launching the ops would; scratch a
//     kernel allocates internally while captured belongs to the graph. RING_CUDA_GRAPHS=0 in
//     the environment launches every op directly.
//   * Positions on the device. An op that takes the sequence position can read it from a
//     device slot (PosSlot: one int per distinct position of the step, copied up once before
//     the first op that reads it) and is then recorded by the slot, not the value: Qwen3's
//     q/k norm + RoPE with its cache write (HeadNormRope with KvRows), MLA's cache write and
//     RoPEs (MlaKvRope), the DSA indexer's key norm + RoPE with its cache write
//     (IndexerNormRope) and its scores + top-k, and decode attention, GQA and MLA (grids
//     sized for StepBound keys, a power of two). A decode step of either family is then one
//     run of recorded ops from the token ids' upload and the embedding to the logits; only
//     copy-engine host copies and plain RoPE (several sequences' indexer) are launched
//     directly.
//   * Run lengths. A held-back run is queued (a graph launch) once it holds 4 ops, the next
//     at 8, then 16, then 32 at most (RING_CUDA_GRAPH_FIRST_OPS, RING_CUDA_GRAPH_MAX_OPS), so
//     that the GPU starts soon after the step does while the host records the rest.
//   * bf16 activations. A Linear converts its fp32 input to bf16 for the tensor-core
//     kernels into one backend buffer, unless the buffer already holds it: a Linear reading
//     the same input right after another (q/k/v, gate/up), or the output of the op just
//     before, since RmsNorm, SwiGlu and Attention write their output's bf16 bits there too;
//     an op in between that writes other floats (MlaKvRope between q_b and the indexer's
//     wq_b, both on the q latent) keeps it.
//   * Every decode kernel starts under the previous one's tail (programmatic dependent launch,
//     kernels/cuda/launch.cuh; RING_CUDA_PDL=0 turns it off); decode GEMVs of small matrices
//     also issue their first weight loads before the wait (QMatmulArgs::overlap).
//   * HeadNormRope (Qwen3's q/k norms + RoPE) is one kernel where head_dim is 64 or 128, and
//     so is MlaKvRope (MLA's cache-row copies, latent norm and both RoPEs: five launches) and
//     IndexerNormRope (the DSA indexer's key norm, both RoPEs and the weights' scale).
//   * Host copies: uploads up to 1 MB go through a mapped pinned area, as recorded ops inside
//     a step (RING_CUDA_PINNED_UPLOAD=0: straight from the caller's memory, launched
//     directly); downloads up to 64 KB go into another, and the step's positions come from
//     one. Those copies are kernels (cuda::CopyBytes) that start under PDL where a
//     copy-engine copy waits ~3-6 us (RING_CUDA_KERNEL_COPIES=0: copy-engine copies, as
//     larger ones are, through a pinned staging buffer).
// Errors of held-back ops surface at the next op that flushes them, Download or EndStep.
// RING_CUDA_STEP_STATS=1: when the backend goes, it prints per step the wall time, the time
// spent waiting for the GPU, and how many ops ran directly or in graphs (bench/gpu/
// decode_perf_h200.sh).
// RING_CUDA_LAYER_MARKS=1 (diagnostic, for a kernel trace: bench/gpu/kernel_trace.cc): at each
// BeginLayer the held-back ops are flushed (graph runs then end at layer boundaries) and a
// 4-byte memset of value layer + 2 is queued, which the trace shows as the layer's start.
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/indexer.cuh"
#include "kernels/cuda/linear.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/qgemv.cuh"
#include "kernels/cuda/sampling.cuh"
#include "kernels/status.h"
#include "models/backend.h"

namespace ring::internal {
namespace {

using cuda::DevArray;
using cuda::DevMutArray;

DevArray In(const float* p) { return DevArray{p, DType::kF32}; }
DevMutArray Out(float* p) { return DevMutArray{p, DType::kF32}; }

// Blocks up to this size are kept in the arena; larger ones (prefill logits, long KV caches)
// go back to the pool.
constexpr size_t kArenaMaxBlock = size_t{256} << 20;
// Idle arena blocks above this total are returned to the pool instead of kept.
constexpr size_t kArenaMaxIdle = size_t{2} << 30;
// Downloads up to this size go through the pinned staging buffer.
constexpr size_t kMaxStaging = size_t{64} << 20;
// Downloads up to this size are a copy kernel into a mapped area of kDownloadArea bytes.
constexpr size_t kMaxKernelDownload = size_t{64} << 10;
constexpr size_t kDownloadArea = size_t{256} << 10;
// Uploads up to this size go through Upload's pinned area of this size.
constexpr size_t kMaxPinnedUpload = size_t{1} << 20;
// A decode GEMV launch (one weight, or several on the same x) of up to this many weight
// bytes starts under the previous kernel (PDL): RING_CUDA_PDL_MAX_MB (read once) or 64 MB,
// which takes GLM-5.2's o_proj (50 MB) and dense down projection (38 MB) in and leaves
// lm_head and its dense gate_up (75 MB, slower with PDL: 26.9 / 29.6 us) out.
// gpu_gemv_bench --sweep, H200, mxfp4 M = 1, us without / with PDL: o_proj 20.9 / 20.0 and
// dense down 17.4 / 16.5 on their 5-warp splits (session 28 run 1). Launches of several
// weights had 32 MB until the staged 4-bit affine kernels prefetched under PDL: Qwen3-8B's
// joint gate/up (56 MB) under PDL, one worker's decode step 2.660 -> 2.563 ms (affine) and
// 2.583 -> 2.481 ms (mxfp4), 36 layers, the same rounds (session 30 runs 8, 9).
int64_t OverlapMaxBytes() {
  static const int64_t bytes = [] {
    const char* v = std::getenv("RING_CUDA_PDL_MAX_MB");
    const int64_t mb = v != nullptr ? std::strtoll(v, nullptr, 10) : 64;
    return std::max<int64_t>(0, mb) << 20;
  }();
  return bytes;
}
// Executable graphs kept; past this the cache is emptied at the next EndStep.
constexpr size_t kMaxGraphs = 4096;
// Distinct sequence positions a step can hand its kernels on the device (one per sequence
// of a batched step).
constexpr int kPosSlots = 64;

// The key count a launch that reads the cache length on the device is sized for: the next
// power of two of `keys`, at least 256 (the blocks past the real count find no key).
int64_t StepBound(int64_t keys) {
  return std::max<int64_t>(256, static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(keys))));
}

// Size class of an arena request: 256-byte granules up to 4 KiB, then eight classes per
// power of two (at most 1/8 wasted).
size_t ArenaClass(size_t n) {
  if (n <= 4096) return (n + 255) & ~size_t{255};
  const size_t step = std::bit_floor(n) / 8;
  return (n + step - 1) / step * step;
}

// The exact arguments of one op call, as bytes: two calls with equal records launch the same
// kernels on the same memory.
class OpRecord {
 public:
  explicit OpRecord(char op) { bytes_.push_back(op); }
  template <typename... T>
  OpRecord& Add(const T&... v) {
    (Put(v), ...);
    return *this;
  }
  std::string Take() { return std::move(bytes_); }

 private:
  template <typename T>
  void Put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T> &&
                  (std::has_unique_object_representations_v<T> || std::is_floating_point_v<T>));
    bytes_.append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  std::string bytes_;
};

struct GraphExecDeleter {
  void operator()(cudaGraphExec_t g) const { cudaGraphExecDestroy(g); }
};
using GraphExec = std::unique_ptr<std::remove_pointer_t<cudaGraphExec_t>, GraphExecDeleter>;

// RING_CUDA_STEP_STATS=1: the backend prints what its steps did when it goes (diagnostic).
bool StatsEnabledByEnv() {
  const char* v = std::getenv("RING_CUDA_STEP_STATS");
  return v != nullptr && std::strcmp(v, "0") != 0;
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool LayerMarksEnabledByEnv() {
  const char* v = std::getenv("RING_CUDA_LAYER_MARKS");
  return v != nullptr && std::strcmp(v, "0") != 0;
}

// Where a MoE layer's shared expert runs (RING_CUDA_SHARED_EXPERT, read once, for A/B
// measurements): `beside` (default) on a side stream concurrent with the router and the
// routing (Backend::MoeBlock, cuda::MoeBlock), `joint` as one more problem of the routed
// experts' launches (ExpertsSwiGluShared; also where MoeBlock does not apply), `separate` in
// launches of its own after the routed experts.
enum class SharedExpertMode { kBeside, kJoint, kSeparate };
SharedExpertMode SharedExpertModeByEnv() {
  static const SharedExpertMode mode = [] {
    const char* v = std::getenv("RING_CUDA_SHARED_EXPERT");
    if (v != nullptr && std::strcmp(v, "separate") == 0) return SharedExpertMode::kSeparate;
    if (v != nullptr && std::strcmp(v, "joint") == 0) return SharedExpertMode::kJoint;
    return SharedExpertMode::kBeside;
  }();
  return mode;
}
bool SharedExpertFused() { return SharedExpertModeByEnv() != SharedExpertMode::kSeparate; }

// An op count from the environment variable `name`: `unset` when it is not set, `low` when it
// is below 2.
size_t OpCountFromEnv(const char* name, size_t unset, size_t low) {
  const char* v = std::getenv(name);
  if (v == nullptr) return unset;
  const long n = std::strtol(v, nullptr, 10);
  return n >= 2 ? static_cast<size_t>(n) : low;
}
// RING_CUDA_GRAPH_MIN_OPS=N (default 2): a run of fewer replayable ops is launched directly
// rather than as a graph (A/B: a graph launch costs more host time than a kernel launch).
size_t GraphMinOpsByEnv() { return OpCountFromEnv("RING_CUDA_GRAPH_MIN_OPS", 2, 2); }
// A held-back run is queued once it holds this many ops, so that the GPU starts on a long run
// while the host records the rest: a Qwen3-0.6B decode step held whole (243 ops, one graph)
// waited for the host to record all of it; runs of 32 were the fastest of 8, 16, 32, 64 and
// unlimited (H200, session 20). RING_CUDA_GRAPH_MAX_OPS=N overrides (0: no limit).
constexpr size_t kGraphMaxOps = 32;
size_t GraphMaxOpsByEnv() { return OpCountFromEnv("RING_CUDA_GRAPH_MAX_OPS", kGraphMaxOps, 0); }
// The first held-back run of a step is queued at this many ops, each later one at twice the
// previous cap (up to the maximum above), so that the GPU starts soon after the step does:
// GLM-5.2 slice decode at 2k context 0.837-0.839 ms/step, against 0.874-0.882 with every run
// up to 32 and 0.870 without graphs (H200, session 20; 2 and 8 in between).
// RING_CUDA_GRAPH_FIRST_OPS=N overrides (0: every run up to the maximum).
constexpr size_t kGraphFirstOps = 4;
size_t GraphFirstOpsByEnv() {
  return OpCountFromEnv("RING_CUDA_GRAPH_FIRST_OPS", kGraphFirstOps, 0);
}

// An A/B switch that is on unless the environment variable `name` is "0".
bool EnvNotZero(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// RING_CUDA_PINNED_UPLOAD=0 uploads straight from the caller's memory (A/B).
bool PinnedUploadByEnv() { return EnvNotZero("RING_CUDA_PINNED_UPLOAD"); }

// RING_CUDA_KERNEL_COPIES=0 makes the small host copies copy-engine copies (A/B).
bool KernelCopiesByEnv() { return EnvNotZero("RING_CUDA_KERNEL_COPIES"); }

bool GraphsEnabledByEnv() { return EnvNotZero("RING_CUDA_GRAPHS"); }

class CudaBackend final : public Backend, public std::enable_shared_from_this<CudaBackend> {
 public:
  explicit CudaBackend(int ordinal)
      : ordinal_(ordinal),
        graphs_enabled_(GraphsEnabledByEnv()),
        graph_min_ops_(GraphMinOpsByEnv()),
        graph_max_ops_(GraphMaxOpsByEnv()),
        graph_first_ops_(GraphFirstOpsByEnv()),
        kernel_copies_(KernelCopiesByEnv()),
        pinned_upload_(PinnedUploadByEnv()),
        stats_on_(StatsEnabledByEnv()),
        marks_on_(LayerMarksEnabledByEnv()) {}
  ~CudaBackend() override {
    if (stats_on_ && stats_.steps > 0) {
      const double n = static_cast<double>(stats_.steps);
      std::cerr << absl::StrFormat(
          "ring: %s: %d steps; per step: %.3f ms wall, %.3f ms waiting for the GPU, %.1f ops "
          "launched directly (%.3f ms of host time in their launch calls), %.1f ops in %.1f "
          "graph launches (%.3f ms in cudaGraphLaunch); %d graphs captured\n",
          name(), stats_.steps, stats_.step_ns / n / 1e6, stats_.wait_ns / n / 1e6,
          stats_.direct / n, stats_.direct_ns / n / 1e6, stats_.graphed / n,
          stats_.launches / n, stats_.graph_ns / n / 1e6, stats_.captures);
      // Why ops were not replayed: records unlike both earlier steps' (by op letter), and
      // the segments captured (op letters; '2' marks an op equal only to the record of two
      // steps back).
      std::string unstable, captured;
      for (const auto& [op, cnt] : stats_.unstable) absl::StrAppend(&unstable, " ", op, " x", cnt);
      for (const auto& [sig, cnt] : stats_.captured) absl::StrAppend(&captured, " [", sig, "] x", cnt);
      std::cerr << "ring: " << name() << ": ops run directly as their arguments changed:"
                << unstable << "; segments captured:" << captured << "\n";
    }
    if (stream_ == nullptr) return;
    cudaSetDevice(ordinal_);
    cudaStreamSynchronize(stream_);
    graphs_.clear();
    for (void* p : conv_bufs_) cudaFreeAsync(p, stream_);
    DrainFrees();
    {
      std::lock_guard<std::mutex> l(arena_mu_);
      for (auto& [cls, blocks] : idle_) {
        for (void* p : blocks) cudaFreeAsync(p, stream_);
      }
      idle_.clear();
    }
    if (mark_ != nullptr) cudaFreeAsync(mark_, stream_);
    cudaStreamSynchronize(stream_);
    if (staging_ != nullptr) cudaFreeHost(staging_);
    if (later_buf_ != nullptr) cudaFreeHost(later_buf_);
    if (up_buf_ != nullptr) cudaFreeHost(up_buf_);
    if (dl_host_ != nullptr) cudaFreeHost(dl_host_);
    if (dpos_ != nullptr) cudaFree(dpos_);
    if (hpos_ != nullptr) cudaFreeHost(hpos_);
    if (side_.fork != nullptr) cudaEventDestroy(side_.fork);
    if (side_.join != nullptr) cudaEventDestroy(side_.join);
    if (side_.stream != nullptr) cudaStreamDestroy(side_.stream);
    cudaStreamDestroy(stream_);
  }

  absl::Status Init() {
    absl::StatusOr<int> count = cuda::DeviceCount();
    if (!count.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("no CUDA device is usable: ", count.status().message()));
    }
    const int n = *count;
    if (n == 0) {
      return absl::FailedPreconditionError("no CUDA device is visible (--device cuda)");
    }
    if (ordinal_ < 0 || ordinal_ >= n) {
      return absl::FailedPreconditionError(
          absl::StrCat("cuda:", ordinal_, " requested but ", n, " CUDA device(s) are visible"));
    }
    RING_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    RING_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    // Keep freed pool memory (large blocks, kernels' internal scratch) between steps.
    cudaMemPool_t pool;
    RING_CUDA_RETURN_IF_ERROR(cudaDeviceGetDefaultMemPool(&pool, ordinal_));
    uint64_t keep = UINT64_MAX;
    RING_CUDA_RETURN_IF_ERROR(
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    RING_CUDA_RETURN_IF_ERROR(cudaMalloc(&dpos_, kPosSlots * sizeof(int32_t)));
    void* hpos = nullptr;
    RING_ASSIGN_OR_RETURN(void* pos_dev, MappedAlloc(&hpos, kPosSlots * sizeof(int32_t)));
    hpos_ = static_cast<int32_t*>(hpos);
    hpos_dev_ = static_cast<const int32_t*>(pos_dev);
    return absl::OkStatus();
  }

  std::string name() const override { return absl::StrCat("cuda:", ordinal_); }
  bool concurrent() const override { return false; }
  absl::Status BeginStep() override {
    RING_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    in_step_ = true;
    npos_ = pos_sent_ = 0;
    run_cap_ = graph_first_ops_ == 0 ? graph_max_ops_
               : graph_max_ops_ == 0 ? graph_first_ops_
                                     : std::min(graph_first_ops_, graph_max_ops_);
    step_t0_ = NowNs();
    cur_.clear();
    conv_src_ = nullptr;
    return absl::OkStatus();
  }
  absl::Status EndStep() override {
    absl::Status flushed = Flush();
    in_step_ = false;
    prev2_ = std::move(prev_);
    prev_ = std::move(cur_);
    cur_.clear();
    if (!flushed.ok()) prev_.clear();
    DrainFrees();
    RING_RETURN_IF_ERROR(Sync());
    RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    if (graphs_.size() > kMaxGraphs) graphs_.clear();  // the stream is idle
    ++stats_.steps;
    stats_.step_ns += NowNs() - step_t0_;
    return flushed;
  }

  void BeginLayer(int64_t layer) override {
    if (!marks_on_ || !in_step_) return;
    if (!Unrecorded().ok()) return;  // the error surfaces again at the next flush
    if (mark_ == nullptr) {
      absl::StatusOr<void*> p = PoolAlloc(4);
      if (!p.ok()) return;
      mark_ = *p;
    }
    cudaMemsetAsync(mark_, static_cast<int>(layer + 2), 4, stream_);
  }

  // ---- memory ----
  absl::StatusOr<Buffer> Alloc(int64_t bytes) override {
    if (bytes < 0) return absl::InvalidArgumentError("negative allocation");
    if (bytes == 0) return Buffer();
    std::shared_ptr<CudaBackend> self = shared_from_this();
    const size_t cls = ArenaClass(static_cast<size_t>(bytes));
    if (cls <= kArenaMaxBlock) {
      void* p = nullptr;
      {
        std::lock_guard<std::mutex> l(arena_mu_);
        auto it = idle_.find(cls);
        if (it != idle_.end() && !it->second.empty()) {
          p = it->second.back();
          it->second.pop_back();
          idle_bytes_ -= cls;
        }
      }
      if (p == nullptr) {
        RING_ASSIGN_OR_RETURN(p, PoolAlloc(cls));
      }
      return Buffer(p, bytes, std::shared_ptr<void>(p, [self, cls](void* q) { self->Recycle(q, cls); }));
    }
    // Queued work may still use memory freed since the last flush: queue it first.
    RING_RETURN_IF_ERROR(Flush());
    DrainFrees();
    RING_ASSIGN_OR_RETURN(void* p, PoolAlloc(static_cast<size_t>(bytes)));
    return Buffer(p, bytes, std::shared_ptr<void>(p, [self](void* q) { self->DeferFree(q); }));
  }
  // Small uploads (a stage's input rows, token ids) are copied into a mapped pinned area at
  // once, and the copy from there is a recorded op like the kernels (its area offset and
  // destination repeat from step to step): a stage's input rows reach the GPU in the step's
  // first graph run rather than by a call of their own before it. The area is reused once
  // the stream has drained (Synced).
  absl::Status Upload(const void* host, int64_t bytes, void* dst) override {
    if (bytes <= 0) return absl::OkStatus();
    const size_t n = static_cast<size_t>(bytes);
    if (!pinned_upload_ || n > kMaxPinnedUpload) {
      RING_RETURN_IF_ERROR(Unrecorded());
      RING_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, host, n, cudaMemcpyHostToDevice, stream_));
      return absl::OkStatus();
    }
    conv_src_ = nullptr;
    // The area is never reallocated: cached graphs name addresses in it.
    if (up_buf_ == nullptr) {
      RING_ASSIGN_OR_RETURN(up_dev_, MappedAlloc(&up_buf_, kMaxPinnedUpload));
    }
    if (up_used_ + n > kMaxPinnedUpload) RING_RETURN_IF_ERROR(Sync());  // resets up_used_
    char* at = static_cast<char*>(up_buf_) + up_used_;
    const char* at_dev = static_cast<const char*>(up_dev_) + up_used_;
    std::memcpy(at, host, n);
    up_used_ += (n + 255) & ~size_t{255};
    return Submit(OpRecord('u').Add(dst, at, n).Take(), [=, this]() -> absl::Status {
      // A kernel reading the mapped area starts right away under PDL, where a copy-engine
      // node costs the graph ~3 us before the first kernel (H200).
      if (kernel_copies_) return cuda::CopyBytes(at_dev, dst, static_cast<int64_t>(n), stream_);
      RING_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, at, n, cudaMemcpyHostToDevice, stream_));
      return absl::OkStatus();
    });
  }
  absl::Status Download(const void* src, int64_t bytes, void* host) override {
    if (bytes <= 0) return absl::OkStatus();
    const size_t n = static_cast<size_t>(bytes);
    RING_ASSIGN_OR_RETURN(const char* at, KernelDownload(src, n));
    if (at != nullptr) {
      RING_RETURN_IF_ERROR(Sync());
      std::memcpy(host, at, n);
      return absl::OkStatus();
    }
    RING_RETURN_IF_ERROR(Unrecorded());
    if (n <= kMaxStaging) {
      if (staging_bytes_ < n) {
        if (staging_ != nullptr) {
          RING_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
          cudaFreeHost(staging_);
          staging_ = nullptr;
          staging_bytes_ = 0;
        }
        const size_t want = std::max<size_t>(n, size_t{1} << 20);
        RING_CUDA_RETURN_IF_ERROR(cudaMallocHost(&staging_, want));
        staging_bytes_ = want;
      }
      RING_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(staging_, src, n, cudaMemcpyDeviceToHost, stream_));
      RING_RETURN_IF_ERROR(Sync());
      std::memcpy(host, staging_, n);
      return absl::OkStatus();
    }
    RING_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, src, n, cudaMemcpyDeviceToHost, stream_));
    RING_RETURN_IF_ERROR(Sync());
    return absl::OkStatus();
  }
  // Queued into a pinned area of its own (Download's staging is reused at every Download)
  // and copied out by the next Sync.
  absl::Status DownloadLater(const void* src, int64_t bytes, void* host) override {
    if (bytes <= 0) return absl::OkStatus();
    const size_t n = static_cast<size_t>(bytes);
    if (n > kMaxStaging) return Download(src, bytes, host);
    RING_ASSIGN_OR_RETURN(const char* at, KernelDownload(src, n));
    if (at != nullptr) {
      later_.push_back({at, n, host});
      return absl::OkStatus();
    }
    RING_RETURN_IF_ERROR(Unrecorded());
    if (later_used_ + n > later_bytes_) {
      // Full: the queued copies are written out (one wait), and the area grows only when
      // this copy alone does not fit. Nothing may still be writing into an area freed.
      if (later_buf_ != nullptr) RING_RETURN_IF_ERROR(Sync());
      if (n > later_bytes_) {
        if (later_buf_ != nullptr) cudaFreeHost(later_buf_);
        later_buf_ = nullptr;
        later_bytes_ = 0;
        const size_t want = std::max<size_t>(n, size_t{1} << 20);
        RING_CUDA_RETURN_IF_ERROR(cudaMallocHost(&later_buf_, want));
        later_bytes_ = want;
      }
      return DownloadLater(src, bytes, host);
    }
    char* to = static_cast<char*>(later_buf_) + later_used_;
    RING_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(to, src, n, cudaMemcpyDeviceToHost, stream_));
    later_used_ += n;
    later_.push_back({to, n, host});
    return absl::OkStatus();
  }
  // Pinned host memory the GPU can address (*host); returns its device address.
  absl::StatusOr<void*> MappedAlloc(void** host, size_t bytes) {
    void* h = nullptr;
    void* d = nullptr;
    RING_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&h, bytes, cudaHostAllocMapped));
    if (const cudaError_t e = cudaHostGetDevicePointer(&d, h, 0); e != cudaSuccess) {
      cudaFreeHost(h);
      RING_CUDA_RETURN_IF_ERROR(e);
    }
    *host = h;
    return d;
  }
  // Small downloads (a stage's output rows, a sampled token's id) are a recorded copy kernel
  // into a mapped pinned area (cuda::CopyBytes): part of the step's last graph run, and
  // written right behind the kernel that made the rows instead of by a copy engine ~6 us
  // later (H200). Returns where the bytes will be once the stream has drained, or null when
  // the copy does not fit the area (the caller then copies through its staging buffer).
  // The area is never reallocated (cached graphs name addresses in it) and is reused once
  // the stream has drained.
  absl::StatusOr<const char*> KernelDownload(const void* src, size_t n) {
    RING_ASSIGN_OR_RETURN(const MappedSpan span, ReserveDownload(n));
    if (span.host == nullptr) return nullptr;
    char* dst = span.dev;
    RING_RETURN_IF_ERROR(Submit(OpRecord('d').Add(src, dst, n).Take(), [=, this] {
      return cuda::CopyBytes(src, dst, static_cast<int64_t>(n), stream_);
    }));
    return span.host;
  }
  // n bytes of KernelDownload's mapped area (device and host addresses), for a kernel to
  // write; both null when kernel copies are off or the area is full.
  struct MappedSpan {
    char* dev = nullptr;
    const char* host = nullptr;
  };
  absl::StatusOr<MappedSpan> ReserveDownload(size_t n) {
    if (!kernel_copies_ || n > kMaxKernelDownload) return MappedSpan{};
    if (dl_host_ == nullptr) {
      RING_ASSIGN_OR_RETURN(dl_dev_, MappedAlloc(&dl_host_, kDownloadArea));
    }
    if (dl_used_ + n > kDownloadArea) return MappedSpan{};
    const size_t off = dl_used_;
    dl_used_ += (n + 255) & ~size_t{255};
    return MappedSpan{static_cast<char*>(dl_dev_) + off, static_cast<const char*>(dl_host_) + off};
  }
  absl::Status Copy2D(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows,
                      int64_t cols) override {
    if (rows <= 0 || cols <= 0) return absl::OkStatus();
    conv_src_ = nullptr;
    return Submit(OpRecord('c').Add(src, src_ld, dst, dst_ld, rows, cols).Take(),
                  [=, this]() -> absl::Status {
                    RING_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
                        dst, dst_ld * 4, src, src_ld * 4, cols * 4, rows,
                        cudaMemcpyDeviceToDevice, stream_));
                    return absl::OkStatus();
                  });
  }
  int64_t FreeBytes() const override {
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(ordinal_) != cudaSuccess || cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
      cudaGetLastError();
      return -1;
    }
    return static_cast<int64_t>(free_b);
  }

  // ---- weights ----
  absl::Status AddWeight(const QuantWeight& w) override {
    std::lock_guard<std::mutex> l(mu_);
    if (weights_.count(w.weight.data)) return absl::OkStatus();  // tied embeddings
    RING_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    absl::StatusOr<cuda::OwnedDeviceWeight> d = cuda::UploadQuantWeight(w);
    if (!d.ok()) {
      return absl::Status(d.status().code(), absl::StrCat("uploading ", w.name, " to ", name(),
                                                          ": ", d.status().message()));
    }
    copied_ += w.weight.nbytes() + (w.scales.present() ? w.scales.nbytes() : 0) +
               (w.biases.present() ? w.biases.nbytes() : 0);
    weights_.emplace(w.weight.data, *std::move(d));
    return absl::OkStatus();
  }
  absl::Status AddTensor(const TensorView& t) override {
    std::lock_guard<std::mutex> l(mu_);
    if (tensors_.count(t.data)) return absl::OkStatus();
    RING_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    // fp32 copies: the elementwise kernels read F32 exactly as the reference's at().
    RING_ASSIGN_OR_RETURN(cuda::DeviceBuffer b, cuda::DeviceBuffer::FromVector(ToFloatVector(t)));
    copied_ += t.numel() * 4;
    tensors_.emplace(t.data, std::move(b));
    return absl::OkStatus();
  }
  absl::Status AddRope(const RopeTable& r) override {
    std::lock_guard<std::mutex> l(mu_);
    RING_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    RING_ASSIGN_OR_RETURN(cuda::DeviceBuffer b, cuda::DeviceBuffer::FromVector(r.inv_freq));
    ropes_.insert_or_assign(&r, std::move(b));
    return absl::OkStatus();
  }
  int64_t copied_weight_bytes() const override { return copied_; }

  // ---- ops ----
  absl::Status Linear(const QuantWeight& w, const float* x, int64_t m, ActDType t,
                      float* y) override {
    RING_ASSIGN_OR_RETURN(const cuda::DeviceQuantWeight* d, Weight(w));
    // As cuda::LinearT: bf16 activations take the tensor-core kernels on a bf16 copy of x,
    // except affine weights at M > 8 (the GEMM would round them to bf16).
    const bool to_bf16 = t == ActDType::kBF16 && !(d->spec.mode == QuantMode::kAffine && m > 8);
    if (!to_bf16) {
      conv_src_ = nullptr;
      return Submit(OpRecord('L').Add(d, x, m, t, y).Take(), [=, this]() -> absl::Status {
        cuda::QMatmulArgs a;
        a.x = x;
        a.m = m;
        a.y = y;
        return cuda::LinearT(*d, a, t, stream_);
      });
    }
    const int64_t span = m * d->cols;
    uint16_t* xb = nullptr;
    bool reuse = false;
    RING_RETURN_IF_ERROR(Bf16Input(x, span, &xb, &reuse));
    NoteOutput(x, span, y, m * d->rows);
    const int overlap = m <= 8 && PackedBytes(*d) <= OverlapMaxBytes() ? 2 : 0;
    return Submit(OpRecord('B').Add(d, x, m, y, xb, reuse, overlap).Take(),
                  [=, this]() -> absl::Status {
      if (!reuse) RING_RETURN_IF_ERROR(cuda::ToBf16(x, span, xb, stream_));
      cuda::QMatmulArgs a = Bf16Args(xb, m, overlap);
      a.y = y;
      return cuda::QMatmulT(*d, a, stream_);
    });
  }
  // Weights on the same x whose decode GEMVs can share a launch (cuda::QMatmulTMany).
  absl::Status LinearMany(absl::Span<const QuantWeight* const> ws, const float* x, int64_t m,
                          ActDType t, absl::Span<float* const> ys) override {
    if (ws.size() < 2 || ws.size() != ys.size() || m > 8 || t != ActDType::kBF16) {
      return Backend::LinearMany(ws, x, m, t, ys);
    }
    std::vector<const cuda::DeviceQuantWeight*> ds;
    int64_t packed = 0;
    for (const QuantWeight* w : ws) {
      RING_ASSIGN_OR_RETURN(const cuda::DeviceQuantWeight* d, Weight(*w));
      if (d->cols != ws[0]->cols()) return Backend::LinearMany(ws, x, m, t, ys);
      ds.push_back(d);
      packed += PackedBytes(*d);
    }
    const int64_t span = m * ds[0]->cols;
    uint16_t* xb = nullptr;
    bool reuse = false;
    RING_RETURN_IF_ERROR(Bf16Input(x, span, &xb, &reuse));
    OpRecord rec('M');
    rec.Add(x, m, xb, reuse);
    for (size_t i = 0; i < ds.size(); ++i) {
      NoteOutput(x, span, ys[i], m * ds[i]->rows);
      rec.Add(ds[i], ys[i]);
    }
    const int overlap = packed <= OverlapMaxBytes() ? 2 : 0;
    rec.Add(overlap);
    std::vector<float*> yv(ys.begin(), ys.end());
    return Submit(rec.Take(), [=, this]() -> absl::Status {
      if (!reuse) RING_RETURN_IF_ERROR(cuda::ToBf16(x, span, xb, stream_));
      return cuda::QMatmulTMany(ds, yv, Bf16Args(xb, m, overlap), stream_);
    });
  }
  // The MLP's gate and up as one decode GEMV that writes SwiGLU's output and its bf16 copy
  // (cuda::QMatmulTSwiGlu: LinearMany's and SwiGlu's bits, one launch and no gate/up outputs
  // instead of two launches). The down projection's Linear then reuses that copy.
  absl::StatusOr<bool> LinearSwiGlu(const QuantWeight& gate, const QuantWeight& up, const float* x,
                                    int64_t m, ActDType t, float* out) override {
    if (m > 8 || t != ActDType::kBF16 || !cuda::FusedSwiGluEnabled()) return false;
    RING_ASSIGN_OR_RETURN(const cuda::DeviceQuantWeight* g, Weight(gate));
    RING_ASSIGN_OR_RETURN(const cuda::DeviceQuantWeight* u, Weight(up));
    const int overlap = PackedBytes(*g) + PackedBytes(*u) <= OverlapMaxBytes() ? 2 : 0;
    // Refused (FailedPrecondition) where the launch would not take the column split; asked
    // once per weight pair and row count, not at every step.
    const auto key = std::make_tuple(g, u, m);
    auto fits = swiglu_fits_.find(key);
    if (fits == swiglu_fits_.end()) {
      cuda::QMatmulArgs probe = Bf16Args(nullptr, m, overlap);
      alignas(16) static float dummy_y[4];
      probe.y = dummy_y;
      fits = swiglu_fits_.emplace(key, cuda::DescribeQmmSwiGlu(*g, *u, probe).ok()).first;
    }
    if (!fits->second) return false;
    const int64_t span = m * g->cols, n = m * g->rows;
    uint16_t* xb = nullptr;
    bool reuse = false;
    RING_RETURN_IF_ERROR(Bf16Input(x, span, &xb, &reuse));
    RING_ASSIGN_OR_RETURN(uint16_t* ob, ConvertedOutputBeside(out, n));
    RING_RETURN_IF_ERROR(Submit(OpRecord('W').Add(g, u, x, m, xb, reuse, out, ob, overlap).Take(),
                                [=, this]() -> absl::Status {
                                  if (!reuse) RING_RETURN_IF_ERROR(cuda::ToBf16(x, span, xb, stream_));
                                  cuda::QMatmulArgs a = Bf16Args(xb, m, overlap);
                                  a.y = out;
                                  a.y_bf16 = ob;
                                  return cuda::QMatmulTSwiGlu(*g, *u, a, stream_);
                                }));
    return true;
  }
  absl::Status Embed(const QuantWeight& w, const int32_t* host_ids, int64_t n, ActDType t,
                     float* out) override {
    RING_ASSIGN_OR_RETURN(const cuda::DeviceQuantWeight* d, Weight(w));
    RING_ASSIGN_OR_RETURN(Buffer ids, Alloc(n * 4));
    RING_RETURN_IF_ERROR(Upload(host_ids, n * 4, ids.data()));
    // Recorded like the kernels: the ids' upload (a recorded copy from the same place of the
    // mapped area each step) and the gather then join the step's first graph run, where
    // launching them directly kept the GPU idle for two launch calls and a flush at the
    // start of every decode step.
    conv_src_ = nullptr;
    const int32_t* dids = ids.i();
    return Submit(OpRecord('e').Add(d, dids, n, t, out).Take(), [=, this]() -> absl::Status {
      constexpr int64_t kMaxIds = 65535;
      for (int64_t i = 0; i < n; i += kMaxIds) {
        const int64_t c = std::min(kMaxIds, n - i);
        RING_RETURN_IF_ERROR(
            cuda::EmbedRows(*d, dids + i, c, out + i * d->cols, DType::kF32, stream_, t));
      }
      return absl::OkStatus();
    });
  }
  absl::Status RmsNorm(const float* x, int64_t rows, int64_t dim, const TensorView& w, float eps,
                       ActDType t, float* out) override {
    RING_ASSIGN_OR_RETURN(const DevArray dw, Tensor(w));
    RING_ASSIGN_OR_RETURN(uint16_t* xb, ConvertedOutput(out, rows * dim, t));
    return Submit(OpRecord('N').Add(x, rows, dim, dw.data, eps, t, out, xb).Take(), [=, this] {
      return cuda::RmsNorm(In(x), rows, dim, dw, eps, t, Out(out), stream_, xb);
    });
  }
  absl::Status AddRmsNorm(const float* a, const float* b, int64_t rows, int64_t dim,
                          const TensorView& w, float eps, ActDType t, float* sum,
                          float* out) override {
    RING_ASSIGN_OR_RETURN(const DevArray dw, Tensor(w));
    RING_ASSIGN_OR_RETURN(uint16_t* xb, ConvertedOutput(out, rows * dim, t));
    return Submit(OpRecord('+').Add(a, b, rows, dim, dw.data, eps, t, sum, out, xb).Take(),
                  [=, this] {
                    return cuda::AddRmsNorm(In(a), In(b), rows, dim, dw, eps, t, Out(sum),
                                            Out(out), stream_, xb);
                  });
  }
  absl::Status LayerNorm(const float* x, int64_t rows, int64_t dim, const TensorView& w,
                         const TensorView& b, float eps, ActDType t, float* out) override {
    RING_ASSIGN_OR_RETURN(const DevArray dw, Tensor(w));
    RING_ASSIGN_OR_RETURN(const DevArray db, Tensor(b));
    conv_src_ = nullptr;
    return Submit(OpRecord('n').Add(x, rows, dim, dw.data, db.data, eps, t, out).Take(),
                  [=, this] {
                    return cuda::LayerNorm(In(x), rows, dim, dw, db, eps, t, Out(out), stream_);
                  });
  }
  absl::Status Rope(const RopeTable& r, float* x, int64_t tokens, int64_t heads, int64_t head_dim,
                    int64_t stride, int64_t offset, ActDType t) override {
    auto it = ropes_.find(&r);
    if (it == ropes_.end()) return absl::InternalError("RoPE table was not registered (AddRope)");
    RING_RETURN_IF_ERROR(Unrecorded());  // the position changes every step
    if (r.pre_scale != 1.f) {
      RING_RETURN_IF_ERROR(cuda::ScaleRound(Out(x), tokens, heads, head_dim, stride, r.dims,
                                            r.pre_scale, t, stream_));
    }
    return cuda::Rope(Out(x), tokens, heads, head_dim, stride, r.dims, r.traditional,
                      it->second.as<float>(), offset, t, stream_);
  }
  absl::Status HeadNormRope(const RopeTable& r, float* q, int64_t q_heads,
                            const TensorView& q_norm, float* k, int64_t k_heads,
                            const TensorView& k_norm, int64_t tokens, int64_t head_dim, float eps,
                            int64_t offset, ActDType t, const KvRows* kv) override {
    auto it = ropes_.find(&r);
    if (r.traditional || r.dims != head_dim || !cuda::HeadNormRopeSupports(head_dim) ||
        it == ropes_.end()) {
      return Backend::HeadNormRope(r, q, q_heads, q_norm, k, k_heads, k_norm, tokens, head_dim,
                                   eps, offset, t, kv);
    }
    RING_ASSIGN_OR_RETURN(const DevArray qw, Tensor(q_norm));
    RING_ASSIGN_OR_RETURN(const DevArray kw, Tensor(k_norm));
    const auto* qwp = static_cast<const float*>(qw.data);
    const auto* kwp = static_cast<const float*>(kw.data);
    const float* inv = it->second.as<float>();
    // With the cache write: the cache rows by their row 0, the position by its device slot
    // (null: the host's value), so that the record is the same at every position.
    const int32_t* pos_at = kv != nullptr ? PosSlot(offset) : nullptr;
    const int64_t row0 = kv != nullptr ? offset * k_heads * head_dim : 0;
    float* kc = kv != nullptr ? kv->k_rows - row0 : nullptr;
    float* vc = kv != nullptr ? kv->v_rows - row0 : nullptr;
    const float* v = kv != nullptr ? kv->v : nullptr;
    const int64_t host_pos = pos_at != nullptr ? 0 : offset;
    const float pre = r.pre_scale;
    auto work = [=, this] {
      return cuda::HeadNormRope(q, q_heads, qwp, k, k_heads, kwp, tokens, head_dim, eps, pre,
                                inv, host_pos, t, stream_, pos_at, kc, v, vc);
    };
    if (pos_at == nullptr) {
      RING_RETURN_IF_ERROR(Unrecorded());  // the position changes every step
      return work();
    }
    conv_src_ = nullptr;
    return Submit(OpRecord('H')
                      .Add(q, q_heads, qwp, k, k_heads, kwp, tokens, head_dim, eps, pre, inv,
                           pos_at, kc, v, vc, t)
                      .Take(),
                  work);
  }
  absl::Status MlaKvRope(const RopeTable& r, const float* ckv, int64_t T, int64_t kvl, int64_t rope,
                         const TensorView& kv_norm, float eps, float* latent, float* k_pe, float* q,
                         int64_t H, int64_t qd, int64_t offset, ActDType t) override {
    auto it = ropes_.find(&r);
    if (r.dims != rope || it == ropes_.end()) {
      return Backend::MlaKvRope(r, ckv, T, kvl, rope, kv_norm, eps, latent, k_pe, q, H, qd, offset, t);
    }
    RING_ASSIGN_OR_RETURN(const DevArray dw, Tensor(kv_norm));
    // The cache rows by their row 0 and the position by its device slot (null: the host's
    // value, the rows as given), so that the record is the same at every position.
    const int32_t* pos_at = PosSlot(offset);
    float* lat = pos_at != nullptr ? latent - offset * kvl : latent;
    float* kpe = pos_at != nullptr ? k_pe - offset * rope : k_pe;
    const float pre = r.pre_scale;
    const bool trad = r.traditional;
    const float* inv = it->second.as<float>();
    auto work = [=, this] {
      return cuda::MlaKvRope(ckv, T, kvl, rope, dw, eps, lat, kpe, q, H, qd, pre, trad, inv, offset, t,
                             stream_, pos_at);
    };
    // The q latent's conversion (q_b read it) stays: the indexer's wq_b reads it next.
    if (pos_at == nullptr) {
      RING_RETURN_IF_ERROR(UnrecordedWriting({{latent, T * kvl}, {k_pe, T * rope}, {q, T * H * qd}}));
      return work();
    }
    KeepConversionPast({{latent, T * kvl}, {k_pe, T * rope}, {q, T * H * qd}});
    return Submit(OpRecord('K')
                      .Add(ckv, T, kvl, rope, dw.data, eps, lat, kpe, q, H, qd, pre, trad, inv, pos_at, t)
                      .Take(),
                  work);
  }
  absl::Status IndexerNormRope(const RopeTable& r, float* q, int64_t T, int64_t heads, int64_t d, float* k,
                               const TensorView& norm_w, const TensorView& norm_b, float eps, int64_t offset,
                               float* w, int64_t n_w, float wscale, ActDType t, float* k_rows) override {
    auto it = ropes_.find(&r);
    if (r.dims > d || it == ropes_.end()) {
      return Backend::IndexerNormRope(r, q, T, heads, d, k, norm_w, norm_b, eps, offset, w, n_w, wscale, t,
                                      k_rows);
    }
    RING_ASSIGN_OR_RETURN(const DevArray dw, Tensor(norm_w));
    RING_ASSIGN_OR_RETURN(const DevArray db, Tensor(norm_b));
    // With the cache write: the key cache by its row 0 and the position by its device slot.
    const int32_t* pos_at = k_rows != nullptr ? PosSlot(offset) : nullptr;
    float* kc = k_rows != nullptr ? k_rows - offset * d : nullptr;
    const int64_t host_pos = pos_at != nullptr ? 0 : offset;
    const int64_t dims = r.dims;
    const float pre = r.pre_scale;
    const bool trad = r.traditional;
    const float* inv = it->second.as<float>();
    const int64_t nw = w != nullptr ? n_w : 0;
    auto work = [=, this] {
      return cuda::IndexerNormRope(q, T, heads, d, k, dw, db, eps, dims, pre, trad, inv, host_pos, w, nw,
                                   wscale, t, stream_, pos_at, kc);
    };
    if (pos_at == nullptr) {
      RING_RETURN_IF_ERROR(Unrecorded());  // the cache row and the position change every step
      return work();
    }
    conv_src_ = nullptr;
    return Submit(OpRecord('I')
                      .Add(q, T, heads, d, k, dw.data, db.data, eps, dims, pre, trad, inv, pos_at, kc, w,
                           nw, wscale, t)
                      .Take(),
                  work);
  }
  absl::Status SwiGlu(const float* gate, const float* up, int64_t n, ActDType t,
                      float* out) override {
    RING_ASSIGN_OR_RETURN(uint16_t* xb, ConvertedOutput(out, n, t));
    return Submit(OpRecord('S').Add(gate, up, n, t, out, xb).Take(), [=, this] {
      return cuda::SwiGlu(In(gate), In(up), n, t, Out(out), stream_, xb);
    });
  }
  absl::Status Add(const float* a, const float* b, int64_t n, ActDType t, float* out) override {
    conv_src_ = nullptr;
    return Submit(OpRecord('A').Add(a, b, n, t, out).Take(),
                  [=, this] { return cuda::Add(In(a), In(b), n, t, Out(out), stream_); });
  }
  absl::Status ScaleRound(float* x, int64_t n, float s, ActDType t) override {
    conv_src_ = nullptr;
    return Submit(OpRecord('s').Add(x, n, s, t).Take(),
                  [=, this] { return cuda::ScaleRound(Out(x), n, s, t, stream_); });
  }
  // Attention, MLA attention and the indexer read this step's cache length: a decode row
  // takes it from its position's device slot, with the grid sized for StepBound keys, so its
  // record changes only when the cache crosses a power of two; other calls are not recorded.
  absl::Status Attention(const cpu::AttentionArgs& a, ActDType t, float* out) override {
    const int32_t* pos_at = cuda::AttentionTakesDevicePos(a) ? PosSlot(a.S - a.L) : nullptr;
    if (pos_at == nullptr) {
      RING_RETURN_IF_ERROR(Unrecorded());
      RING_ASSIGN_OR_RETURN(uint16_t* xb, ConvertedOutput(out, a.L * a.hq * a.dv, t));
      return cuda::Attention(a, t, out, stream_, xb);
    }
    RING_ASSIGN_OR_RETURN(uint16_t* xb, ConvertedOutput(out, a.L * a.hq * a.dv, t));
    cpu::AttentionArgs g = a;
    g.S = StepBound(a.S);
    return Submit(OpRecord('a')
                      .Add(g.q, g.q_stride, g.k, g.k_stride, g.v, g.v_stride, g.L, g.S, g.hq,
                           g.hkv, g.dk, g.dv, g.scale, pos_at, t, out, xb)
                      .Take(),
                  [=, this] { return cuda::Attention(g, t, out, stream_, xb, pos_at); });
  }
  absl::Status MlaAttention(const cpu::MlaAttentionArgs& a, const QuantWeight& embed_q,
                            const QuantWeight& unembed_out, ActDType t, float* out) override {
    RING_ASSIGN_OR_RETURN(const cuda::DeviceQuantWeight* eq, Weight(embed_q));
    RING_ASSIGN_OR_RETURN(const cuda::DeviceQuantWeight* uo, Weight(unembed_out));
    const int32_t* pos_at =
        cuda::MlaAttentionTakesDevicePos(a) ? PosSlot(a.S - a.T) : nullptr;
    if (pos_at == nullptr) {
      RING_RETURN_IF_ERROR(Unrecorded());
      RING_ASSIGN_OR_RETURN(uint16_t* xb, ConvertedOutput(out, a.T * a.H * a.vd, t));
      return cuda::MlaAttention(a, *eq, *uo, t, out, stream_, xb);
    }
    RING_ASSIGN_OR_RETURN(uint16_t* xb, ConvertedOutput(out, a.T * a.H * a.vd, t));
    cpu::MlaAttentionArgs g = a;
    g.S = StepBound(a.S);
    g.offset = g.S - g.T;
    RING_ASSIGN_OR_RETURN(Buffer scratch, DecodeScratch(cuda::MlaAttentionScratchBytes(g, t)));
    void* const sp = scratch.data();
    return Submit(OpRecord('m')
                      .Add(g.q, g.latent, g.k_pe, g.topk, g.T, g.S, g.K, g.H, g.nope, g.rope,
                           g.vd, g.kvl, g.scale, eq, uo, pos_at, t, out, xb, sp)
                      .Take(),
                  [=, this] {
                    return cuda::MlaAttention(g, *eq, *uo, t, out, stream_, xb, pos_at, sp);
                  });
  }
  absl::Status IndexerTopK(const cpu::IndexerArgs& a, ActDType t, int32_t* topk) override {
    const int32_t* pos_at = cuda::IndexerTakesDevicePos(a) ? PosSlot(a.S - a.T) : nullptr;
    if (pos_at == nullptr) {
      RING_RETURN_IF_ERROR(Unrecorded());
      return cuda::IndexerTopK(a, t, topk, stream_);
    }
    conv_src_ = nullptr;
    cpu::IndexerArgs g = a;
    g.S = StepBound(a.S);
    g.offset = g.S - g.T;
    RING_ASSIGN_OR_RETURN(Buffer scratch, DecodeScratch(cuda::IndexerTopKScratchBytes(g)));
    void* const sp = scratch.data();
    return Submit(OpRecord('X')
                      .Add(g.q, g.keys, g.w, g.T, g.S, g.heads, g.dim, g.K, pos_at, t, topk, sp)
                      .Take(),
                  [=, this] { return cuda::IndexerTopK(g, t, topk, stream_, pos_at, sp); });
  }
  // A decode row's indexer and MLA (both recorded by their position slot) as one op, MLA's
  // query projection on the side stream beside the indexer's scores and top-k
  // (cuda::IndexedMlaDecode). RING_CUDA_MLA_BESIDE=0 (read once, A/B runs) refuses it: the
  // layer program then runs the two ops.
  absl::StatusOr<bool> IndexedMlaAttention(const cpu::IndexerArgs& ix, int32_t* topk,
                                           const cpu::MlaAttentionArgs& a, const QuantWeight& embed_q,
                                           const QuantWeight& unembed_out, ActDType t,
                                           float* out) override {
    static const bool on = EnvNotZero("RING_CUDA_MLA_BESIDE");
    if (!on || a.topk != topk || !cuda::IndexerTakesDevicePos(ix) || !cuda::MlaAttentionTakesDevicePos(a) ||
        !cuda::IndexedMlaDecodeApplies(a) || ix.S != a.S || ix.T != 1) {
      return false;
    }
    RING_ASSIGN_OR_RETURN(const cuda::DeviceQuantWeight* eq, Weight(embed_q));
    RING_ASSIGN_OR_RETURN(const cuda::DeviceQuantWeight* uo, Weight(unembed_out));
    const int32_t* pos_at = PosSlot(a.S - a.T);
    RING_ASSIGN_OR_RETURN(uint16_t* xb, ConvertedOutput(out, a.T * a.H * a.vd, t));
    cpu::IndexerArgs gi = ix;
    gi.S = StepBound(ix.S);
    gi.offset = gi.S - gi.T;
    cpu::MlaAttentionArgs g = a;
    g.S = gi.S;
    g.offset = gi.offset;
    RING_ASSIGN_OR_RETURN(Buffer ix_scratch, Alloc(cuda::IndexerTopKScratchBytes(gi)));
    RING_ASSIGN_OR_RETURN(Buffer mla_scratch, Alloc(cuda::MlaAttentionScratchBytes(g, t)));
    RING_RETURN_IF_ERROR(EnsureSideStream());
    void* const isp = ix_scratch.data();
    void* const msp = mla_scratch.data();
    const cuda::SideStream side = side_;
    RING_RETURN_IF_ERROR(Submit(
        OpRecord('Y')
            .Add(gi.q, gi.keys, gi.w, gi.heads, gi.dim, g.q, g.latent, g.k_pe, g.topk, g.S, g.K, g.H,
                 g.nope, g.rope, g.vd, g.kvl, g.scale, eq, uo, pos_at, t, out, xb, isp, msp)
            .Take(),
        [=, this] {
          return cuda::IndexedMlaDecode(gi, topk, isp, g, *eq, *uo, t, out, stream_, xb, pos_at, msp,
                                        side);
        }));
    return true;
  }
  absl::Status RouteSigmoid(const float* logits, const TensorView& bias, int64_t T,
                            const cpu::SigmoidRouting& r, int32_t* ids, float* weights) override {
    RING_ASSIGN_OR_RETURN(const DevArray db, Tensor(bias));
    KeepConversionPast({{weights, T * r.k}, {reinterpret_cast<const float*>(ids), T * r.k}});
    const float* dbias = static_cast<const float*>(db.data);
    return Submit(OpRecord('R').Add(logits, dbias, T, r.E, r.k, r.n_group, r.topk_group,
                                    r.norm_topk_prob, r.routed_scaling_factor, ids, weights)
                      .Take(),
                  [=, this] { return cuda::RouteSigmoid(logits, dbias, T, r, ids, weights, stream_); });
  }
  absl::Status RouteSoftmax(const float* gates, int64_t T, int64_t E, int64_t k,
                            bool norm_topk_prob, ActDType t, int32_t* ids,
                            float* scores) override {
    KeepConversionPast({{scores, T * k}, {reinterpret_cast<const float*>(ids), T * k}});
    return Submit(OpRecord('r').Add(gates, T, E, k, norm_topk_prob, t, ids, scores).Take(),
                  [=, this] {
                    return cuda::RouteSoftmax(gates, T, E, k, norm_topk_prob, t, ids, scores,
                                              stream_);
                  });
  }
  absl::Status ExpertsSwiGlu(const QuantWeight& gate, const QuantWeight& up,
                             const QuantWeight& down, const float* x, int64_t T,
                             const int32_t* ids, int64_t k, ActDType t, float* y) override {
    RING_ASSIGN_OR_RETURN(const cuda::DeviceQuantWeight* g, Weight(gate));
    RING_ASSIGN_OR_RETURN(const cuda::DeviceQuantWeight* u, Weight(up));
    RING_ASSIGN_OR_RETURN(const cuda::DeviceQuantWeight* d, Weight(down));
    const uint16_t* xb = HeldBf16Copy(x, T * g->cols, t);
    RING_ASSIGN_OR_RETURN(Buffer scratch, ExpertsScratch(*g, *u, *d, T, k, t, false));
    void* const sp = scratch.data();
    KeepConversionPast({{y, T * k * d->rows}});
    return Submit(OpRecord('E').Add(g, u, d, x, T, ids, k, t, y, xb, sp).Take(), [=, this] {
      return cuda::ExpertsSwiGlu(*g, *u, *d, x, T, ids, k, t, y, stream_,
                                 cuda::ExpertsPath::kAuto, xb, nullptr, sp);
    });
  }
  absl::StatusOr<bool> ExpertsSwiGluShared(const QuantWeight& gate, const QuantWeight& up,
                                           const QuantWeight& down, const QuantWeight& shared_gate,
                                           const QuantWeight& shared_up,
                                           const QuantWeight& shared_down, const float* x,
                                           int64_t T, const int32_t* ids, int64_t k, ActDType t,
                                           float* y) override {
    RING_ASSIGN_OR_RETURN(const cuda::DeviceQuantWeight* g, Weight(gate));
    RING_ASSIGN_OR_RETURN(const cuda::DeviceQuantWeight* u, Weight(up));
    RING_ASSIGN_OR_RETURN(const cuda::DeviceQuantWeight* d, Weight(down));
    cuda::SharedExpertWeights sh;
    RING_ASSIGN_OR_RETURN(sh.gate, Weight(shared_gate));
    RING_ASSIGN_OR_RETURN(sh.up, Weight(shared_up));
    RING_ASSIGN_OR_RETURN(sh.down, Weight(shared_down));
    if (!SharedExpertFused() || !cuda::ExpertsTakeShared(*g, *u, *d, sh, T, k, t)) return false;
    const uint16_t* xb = HeldBf16Copy(x, T * g->cols, t);
    RING_ASSIGN_OR_RETURN(Buffer scratch, ExpertsScratch(*g, *u, *d, T, k, t, true));
    void* const sp = scratch.data();
    KeepConversionPast({{y, T * (k + 1) * d->rows}});
    RING_RETURN_IF_ERROR(Submit(
        OpRecord('S').Add(g, u, d, sh.gate, sh.up, sh.down, x, T, ids, k, t, y, xb, sp).Take(),
        [=, this] {
          return cuda::ExpertsSwiGlu(*g, *u, *d, x, T, ids, k, t, y, stream_,
                                     cuda::ExpertsPath::kAuto, xb, &sh, sp);
        }));
    return true;
  }
  // The per-slot expert launches' scratch from the step's arena (cuda::ExpertsSwiGlu), an
  // empty buffer where they do not run per slot. RING_CUDA_EXPERT_SCRATCH=0 (read once, A/B
  // runs) leaves them their stream-ordered allocations.
  absl::StatusOr<Buffer> ExpertsScratch(const cuda::DeviceQuantWeight& g,
                                        const cuda::DeviceQuantWeight& u,
                                        const cuda::DeviceQuantWeight& d, int64_t T, int64_t k,
                                        ActDType t, bool with_shared) {
    static const bool on = EnvNotZero("RING_CUDA_EXPERT_SCRATCH");
    if (!on) return Buffer();
    return Alloc(static_cast<int64_t>(
        cuda::ExpertsScratchBytes(g, u, d, T, k, t, cuda::ExpertsPath::kAuto, with_shared)));
  }
  // The scratch of a decode op recorded by its position slot (MLA decode, the indexer's
  // scores) from the step's arena, for the same reason; RING_CUDA_DECODE_SCRATCH=0 (read
  // once, A/B runs) leaves the ops their stream-ordered allocations.
  absl::StatusOr<Buffer> DecodeScratch(int64_t bytes) {
    static const bool on = EnvNotZero("RING_CUDA_DECODE_SCRATCH");
    if (!on) return Buffer();
    return Alloc(bytes);
  }
  absl::StatusOr<bool> MoeBlock(const MoeBlockWeights& w, const cpu::SigmoidRouting& r,
                                const float* x, int64_t T, ActDType t, float* out) override {
    if (SharedExpertModeByEnv() != SharedExpertMode::kBeside || t != ActDType::kBF16 || T < 1 ||
        w.router == nullptr || w.score_bias == nullptr || w.shared_gate == nullptr) {
      return false;
    }
    cuda::MoeBlockArgs a;
    RING_ASSIGN_OR_RETURN(a.router, Weight(*w.router));
    RING_ASSIGN_OR_RETURN(a.gate, Weight(*w.gate));
    RING_ASSIGN_OR_RETURN(a.up, Weight(*w.up));
    RING_ASSIGN_OR_RETURN(a.down, Weight(*w.down));
    RING_ASSIGN_OR_RETURN(a.shared.gate, Weight(*w.shared_gate));
    RING_ASSIGN_OR_RETURN(a.shared.up, Weight(*w.shared_up));
    RING_ASSIGN_OR_RETURN(a.shared.down, Weight(*w.shared_down));
    RING_ASSIGN_OR_RETURN(const DevArray db, Tensor(*w.score_bias));
    a.bias = static_cast<const float*>(db.data);
    a.routing = r;
    a.T = T;
    a.router_overlap = PackedBytes(*a.router) <= OverlapMaxBytes() ? 2 : 0;
    a.x = x;
    a.out = out;
    a.x_bf16 = reinterpret_cast<const uint16_t*>(x);  // non-null for the checks; set below
    // RING_CUDA_FUSED_ROUTER=0 (read once, A/B runs): the router GEMV and the routing apart.
    static const bool fused_router = EnvNotZero("RING_CUDA_FUSED_ROUTER");
    // Asked once per router and row count (only shapes and formats decide).
    const auto key = std::make_pair(a.router, T);
    auto fits = moe_block_fits_.find(key);
    if (fits == moe_block_fits_.end()) {
      fits = moe_block_fits_.emplace(key, cuda::MoeBlockApplies(a)).first;
    }
    if (!fits->second) return false;
    RING_RETURN_IF_ERROR(EnsureSideStream());
    if (fused_router) a.router_ticket = router_ticket_;
    RING_ASSIGN_OR_RETURN(Buffer scratch, Alloc(static_cast<int64_t>(cuda::MoeBlockScratchBytes(a))));
    void* const sp = scratch.data();
    const int64_t span = T * a.gate->cols;
    uint16_t* xb = nullptr;
    bool reuse = false;
    RING_RETURN_IF_ERROR(Bf16Input(x, span, &xb, &reuse));
    NoteOutput(x, span, out, T * a.down->rows);
    a.x_bf16 = xb;
    const cuda::SideStream side = side_;
    RING_RETURN_IF_ERROR(Submit(OpRecord('O')
                                    .Add(a.router, a.bias, r.E, r.k, r.n_group, r.topk_group,
                                         r.norm_topk_prob, r.routed_scaling_factor, a.gate, a.up,
                                         a.down, a.shared.gate, a.shared.up, a.shared.down, x, T,
                                         xb, reuse, a.router_overlap, out, sp)
                                    .Take(),
                                [=, this]() -> absl::Status {
                                  if (!reuse) RING_RETURN_IF_ERROR(cuda::ToBf16(x, span, xb, stream_));
                                  return cuda::MoeBlock(a, sp, stream_, &side);
                                }));
    return true;
  }
  absl::Status MoeCombine(const float* y, const float* w, const float* shared, int64_t T,
                          int64_t k, int64_t hidden, cpu::CombineMode mode, ActDType t,
                          float* out) override {
    conv_src_ = nullptr;
    return Submit(OpRecord('C').Add(y, w, shared, T, k, hidden, mode, t, out).Take(), [=, this] {
      return cuda::MoeCombine(y, w, shared, T, k, hidden, mode, t, out, stream_);
    });
  }
  absl::Status ArgMax(const float* x, int64_t rows, int64_t n, int32_t* host_out) override {
    // The ids straight into the mapped download area: no copy kernel after the arg-max,
    // whose result is the last thing a greedy step waits for.
    RING_ASSIGN_OR_RETURN(const MappedSpan span, ReserveDownload(static_cast<size_t>(rows) * 4));
    if (span.host != nullptr) {
      RING_RETURN_IF_ERROR(Unrecorded());
      RING_RETURN_IF_ERROR(
          cuda::ArgMaxRows(x, rows, n, reinterpret_cast<int32_t*>(span.dev), stream_));
      RING_RETURN_IF_ERROR(Sync());
      std::memcpy(host_out, span.host, static_cast<size_t>(rows) * 4);
      return absl::OkStatus();
    }
    RING_ASSIGN_OR_RETURN(Buffer ids, Alloc(rows * 4));
    RING_RETURN_IF_ERROR(Unrecorded());
    RING_RETURN_IF_ERROR(cuda::ArgMaxRows(x, rows, n, ids.i(), stream_));
    return Download(ids.data(), rows * 4, host_out);
  }
  absl::Status Sample(const float* logits_row, int64_t vocab, const SampleRequest& req,
                      SampledToken* host_out) override {
    RING_RETURN_IF_ERROR(Unrecorded());
    const int64_t t0 = NowNs();
    absl::Status s = cuda::SampleRow(logits_row, vocab, req, host_out, stream_);
    stats_.wait_ns += NowNs() - t0;  // it waits for its small result, as Download does
    Synced(s.ok());
    return s;
  }

 private:
  using Work = std::function<absl::Status()>;
  struct HeldOp {
    size_t index;  // into cur_
    Work work;
  };

  // The bf16 copy of x[0, span) that an earlier op made (the router's Linear, or the norm
  // that wrote x), if there is one: the experts' gate/up GEMV reads it, one conversion launch
  // fewer. Null when there is none (the experts then convert x themselves).
  const uint16_t* HeldBf16Copy(const float* x, int64_t span, ActDType t) const {
    return conv_src_ == x && conv_elems_ >= span && t == ActDType::kBF16
               ? static_cast<const uint16_t*>(conv_[cur_conv_].p)
               : nullptr;
  }
  // An op that may be held back and replayed from a graph (file comment).
  // The bf16 copy of x[0, span) that the tensor-core matmuls read: the previous Linear's
  // when it converted the same x (*reuse), else a fresh buffer the op converts into.
  absl::Status Bf16Input(const float* x, int64_t span, uint16_t** xb, bool* reuse) {
    *reuse = conv_src_ == x && conv_elems_ >= span;
    if (!*reuse) {
      RING_RETURN_IF_ERROR(ReserveConversion(span));
      conv_src_ = x;
      conv_elems_ = span;
    }
    *xb = static_cast<uint16_t*>(conv_[cur_conv_].p);
    return absl::OkStatus();
  }
  // An output y[0, n) over x's floats makes the conversion stale for the next Linear.
  void NoteOutput(const float* x, int64_t span, const float* y, int64_t n) {
    const auto addr = [](const float* p) { return reinterpret_cast<uintptr_t>(p); };
    if (addr(y) < addr(x + span) && addr(x) < addr(y + n)) conv_src_ = nullptr;
  }
  // A matmul on the bf16 copy xb of m activation rows, outputs rounded to bf16.
  static cuda::QMatmulArgs Bf16Args(const uint16_t* xb, int64_t m, int overlap) {
    cuda::QMatmulArgs a;
    a.x = xb;
    a.x_dtype = DType::kBF16;
    a.m = m;
    a.round_bf16 = true;
    a.overlap = overlap;
    return a;
  }
  // Decode GEMVs of small matrices overlap their start with the previous kernel's tail
  // (programmatic dependent launch; weights are never written while a step runs).
  static int64_t PackedBytes(const cuda::DeviceQuantWeight& d) {
    return d.batch * d.rows * d.cols * std::max(d.spec.bits, 4) / 8;
  }
  // work() of an op launched directly, timed for RING_CUDA_STEP_STATS.
  absl::Status RunDirect(const Work& work) {
    RING_RETURN_IF_ERROR(SendPositions());
    ++stats_.direct;
    if (!stats_on_) return work();
    const int64_t t0 = NowNs();
    absl::Status s = work();
    stats_.direct_ns += NowNs() - t0;
    return s;
  }
  absl::Status Submit(std::string record, Work work) {
    if (!in_step_ || !graphs_enabled_) {
      RING_RETURN_IF_ERROR(Flush());
      return RunDirect(work);
    }
    const size_t i = cur_.size();
    // Against the last two steps: buffers handed out in alternating order still match.
    const bool stable = (i < prev_.size() && prev_[i] == record) ||
                        (i < prev2_.size() && prev2_[i] == record);
    if (!stable && stats_on_) ++stats_.unstable[record.substr(0, 1)];
    cur_.push_back(std::move(record));
    if (!stable) {
      RING_RETURN_IF_ERROR(Flush());
      return RunDirect(work);
    }
    held_.push_back({i, std::move(work)});
    if (run_cap_ > 0 && held_.size() >= run_cap_) {
      run_cap_ = std::min(2 * run_cap_, graph_max_ops_ > 0 ? graph_max_ops_ : 2 * run_cap_);
      return Flush();
    }
    return absl::OkStatus();
  }
  // Before an op that is launched directly (never part of a graph).
  absl::Status Unrecorded() {
    conv_src_ = nullptr;
    if (in_step_) cur_.emplace_back();
    ++stats_.direct;
    return Flush();
  }
  // For a recorded op that writes only the (4-byte element) ranges `writes`: the bf16
  // conversion of other floats stays valid.
  void KeepConversionPast(std::initializer_list<std::pair<const float*, int64_t>> writes) {
    for (const auto& [y, n] : writes) {
      if (conv_src_ != nullptr) NoteOutput(conv_src_, conv_elems_, y, n);
    }
  }
  // Unrecorded() for an op that writes only the float ranges `writes`: a conversion of other
  // floats stays valid.
  absl::Status UnrecordedWriting(std::initializer_list<std::pair<const float*, int64_t>> writes) {
    const float* src = conv_src_;
    RING_RETURN_IF_ERROR(Unrecorded());
    conv_src_ = src;
    KeepConversionPast(writes);
    return absl::OkStatus();
  }
  // A device copy of `pos` for this step's kernels, or null (outside a step, or past
  // kPosSlots distinct positions in one): the op then launches with the host value, unrecorded.
  // Slots go to positions in order of first use, so a step of the same ops gets the same
  // slots; their values reach the device (SendPositions) before any op that reads them runs.
  const int32_t* PosSlot(int64_t pos) {
    if (!in_step_ || dpos_ == nullptr || pos < 0 || pos > INT32_MAX) return nullptr;
    for (int i = 0; i < npos_; ++i) {
      if (hpos_[i] == pos) return dpos_ + i;
    }
    if (npos_ == kPosSlots) return nullptr;
    hpos_[npos_] = static_cast<int32_t>(pos);
    return dpos_ + npos_++;
  }
  // Queues the copy of the slots assigned since the last one. The pinned values are never
  // rewritten while a copy may still read them: a step only appends, and EndStep waits for
  // the stream before the next step starts over.
  absl::Status SendPositions() {
    if (pos_sent_ == npos_) return absl::OkStatus();
    RING_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dpos_ + pos_sent_, hpos_ + pos_sent_,
                                              (npos_ - pos_sent_) * sizeof(int32_t),
                                              cudaMemcpyHostToDevice, stream_));
    pos_sent_ = npos_;
    return absl::OkStatus();
  }
  // Queues the held-back ops: a replay of the graph of this run, else its capture.
  // The positions assigned since the last copy (SendPositions) travel as the graph's first
  // node: the same slots every step, so the key names them and the node reads the pinned
  // values at each replay.
  absl::Status Flush() {
    if (held_.empty()) return absl::OkStatus();
    std::vector<HeldOp> ops = std::move(held_);
    held_.clear();
    if (ops.size() < graph_min_ops_) {
      for (HeldOp& op : ops) RING_RETURN_IF_ERROR(RunDirect(op.work));
      return absl::OkStatus();
    }
    const int pos_from = pos_sent_, pos_to = npos_;
    std::string key = OpRecord('p').Add(pos_from, pos_to).Take();
    for (const HeldOp& op : ops) {
      const std::string& r = cur_[op.index];
      const uint32_t len = static_cast<uint32_t>(r.size());
      key.append(reinterpret_cast<const char*>(&len), sizeof(len));
      key.append(r);
    }
    auto it = graphs_.find(key);
    if (it == graphs_.end()) {
      absl::StatusOr<GraphExec> exec = Capture(ops, pos_from, pos_to);
      if (!exec.ok()) {
        // Nothing captured has run: launch the ops directly from now on.
        std::cerr << "ring: " << name() << ": CUDA graph capture failed, launching ops "
                  << "directly: " << exec.status().message() << "\n";
        graphs_enabled_ = false;
        RING_RETURN_IF_ERROR(SendPositions());
        for (HeldOp& op : ops) RING_RETURN_IF_ERROR(op.work());
        return absl::OkStatus();
      }
      it = graphs_.emplace(std::move(key), *std::move(exec)).first;
      ++stats_.captures;
      if (stats_on_) {
        std::string sig;
        for (const HeldOp& op : ops) {
          const std::string& r = cur_[op.index];
          sig += r.substr(0, 1);
          if (!(op.index < prev_.size() && prev_[op.index] == r)) sig += '2';
        }
        ++stats_.captured[sig];
      }
    }
    ++stats_.launches;
    stats_.graphed += static_cast<int64_t>(ops.size());
    const int64_t t0 = stats_on_ ? NowNs() : 0;
    RING_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(it->second.get(), stream_));
    pos_sent_ = pos_to;
    if (stats_on_) stats_.graph_ns += NowNs() - t0;
    return absl::OkStatus();
  }
  absl::StatusOr<GraphExec> Capture(std::vector<HeldOp>& ops, int pos_from, int pos_to) {
    RING_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    absl::Status s;
    if (pos_to > pos_from) {
      const size_t bytes = (pos_to - pos_from) * sizeof(int32_t);
      if (kernel_copies_) {
        s = cuda::CopyBytes(hpos_dev_ + pos_from, dpos_ + pos_from, static_cast<int64_t>(bytes), stream_);
      } else if (const cudaError_t e = cudaMemcpyAsync(dpos_ + pos_from, hpos_ + pos_from, bytes,
                                                       cudaMemcpyHostToDevice, stream_);
                 e != cudaSuccess) {
        s = absl::InternalError(absl::StrCat("position copy: ", cudaGetErrorString(e)));
      }
    }
    for (HeldOp& op : ops) {
      if (!s.ok()) break;
      s = op.work();
    }
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
    std::unique_ptr<std::remove_pointer_t<cudaGraph_t>, cudaError_t (*)(cudaGraph_t)> owned(
        graph, cudaGraphDestroy);
    if (!s.ok() || end != cudaSuccess || graph == nullptr) {
      cudaGetLastError();
      if (!s.ok()) return s;
      return absl::InternalError(absl::StrCat("cudaStreamEndCapture: ", cudaGetErrorString(end)));
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
    if (inst != cudaSuccess) {
      cudaGetLastError();
      return absl::InternalError(absl::StrCat("cudaGraphInstantiate: ", cudaGetErrorString(inst)));
    }
    return GraphExec(exec);
  }

  // For an op writing `n` fp32 values at `out` (already rounded to t): where the next Linear
  // could read them as bf16, the conversion buffer to write their bf16 bits to as well (the
  // op then stands for the conversion), else null.
  absl::StatusOr<uint16_t*> ConvertedOutput(const float* out, int64_t n, ActDType t) {
    conv_src_ = nullptr;
    if (t != ActDType::kBF16 || n <= 0) return nullptr;
    RING_RETURN_IF_ERROR(ReserveConversion(n));
    conv_src_ = out;
    conv_elems_ = n;
    return static_cast<uint16_t*>(conv_[cur_conv_].p);
  }
  // ConvertedOutput for an op that also reads the current copy (LinearSwiGlu): its output's
  // copy goes to the other buffer, which becomes the current one.
  absl::StatusOr<uint16_t*> ConvertedOutputBeside(const float* out, int64_t n) {
    RING_RETURN_IF_ERROR(ReserveConversion(n, 1 - cur_conv_));
    cur_conv_ = 1 - cur_conv_;
    conv_src_ = out;
    conv_elems_ = n;
    return static_cast<uint16_t*>(conv_[cur_conv_].p);
  }

  // Conversion buffer `slot` (default: the current one) holds at least `elems` values.
  // Earlier buffers stay alive (graphs may name them) until the backend goes.
  absl::Status ReserveConversion(int64_t elems, int slot = -1) {
    ConvSlot& c = conv_[slot < 0 ? cur_conv_ : slot];
    if (c.cap >= elems) return absl::OkStatus();
    const int64_t want = std::max<int64_t>({elems, 2 * c.cap, 1 << 16});
    RING_ASSIGN_OR_RETURN(void* p, PoolAlloc(static_cast<size_t>(want) * 2));
    conv_bufs_.push_back(p);
    c = ConvSlot{p, want};
    return absl::OkStatus();
  }

  absl::Status EnsureSideStream() {
    if (side_.stream != nullptr) return absl::OkStatus();
    cuda::SideStream s;
    RING_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
    RING_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&s.fork, cudaEventDisableTiming));
    RING_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&s.join, cudaEventDisableTiming));
    // MoeBlock's fused router counts its blocks here (zero between launches).
    RING_ASSIGN_OR_RETURN(void* ticket, PoolAlloc(sizeof(unsigned)));
    conv_bufs_.push_back(ticket);
    RING_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(ticket, 0, sizeof(unsigned), stream_));
    router_ticket_ = static_cast<unsigned*>(ticket);
    side_ = s;
    return absl::OkStatus();
  }
  // Waits for everything queued, held-back ops included.
  absl::Status Sync() {
    RING_RETURN_IF_ERROR(Flush());
    const int64_t t0 = NowNs();
    const cudaError_t e = cudaStreamSynchronize(stream_);
    stats_.wait_ns += NowNs() - t0;
    Synced(e == cudaSuccess);
    RING_CUDA_RETURN_IF_ERROR(e);
    return absl::OkStatus();
  }
  // The stream has drained (ok) or failed: DownloadLater's copies are written out, or
  // dropped with the error.
  void Synced(bool ok) {
    if (ok) {
      for (const LaterCopy& c : later_) std::memcpy(c.host, c.from, c.bytes);
      later_used_ = 0;
      if (held_.empty()) up_used_ = dl_used_ = 0;  // held ops still name their part of the areas
    }
    later_.clear();
  }

  absl::StatusOr<void*> PoolAlloc(size_t bytes) {
    void* p = nullptr;
    const cudaError_t e = cudaMallocAsync(&p, bytes, stream_);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return absl::Status(cuda::CudaCodeToStatusCode(e),
                          absl::StrCat("cudaMallocAsync of ", bytes, " bytes on ", name(), ": ",
                                       cudaGetErrorString(e)));
    }
    return p;
  }
  // Buffer deleters; may run on any thread.
  void Recycle(void* p, size_t cls) {
    {
      std::lock_guard<std::mutex> l(arena_mu_);
      if (idle_bytes_ + cls <= kArenaMaxIdle) {
        idle_[cls].push_back(p);
        idle_bytes_ += cls;
        return;
      }
    }
    DeferFree(p);
  }
  void DeferFree(void* p) {
    std::lock_guard<std::mutex> l(arena_mu_);
    to_free_.push_back(p);
  }
  // Returns deferred frees to the pool behind all queued work (never while capturing).
  void DrainFrees() {
    std::vector<void*> frees;
    {
      std::lock_guard<std::mutex> l(arena_mu_);
      frees.swap(to_free_);
    }
    if (frees.empty()) return;
    cudaSetDevice(ordinal_);
    for (void* p : frees) cudaFreeAsync(p, stream_);
  }

  absl::StatusOr<const cuda::DeviceQuantWeight*> Weight(const QuantWeight& w) const {
    auto it = weights_.find(w.weight.data);
    if (it == weights_.end()) {
      return absl::InternalError(absl::StrCat("weight ", w.name, " is not on ", name(),
                                              " (not loaded through WeightLoader)"));
    }
    return &it->second.view;
  }
  absl::StatusOr<DevArray> Tensor(const TensorView& t) const {
    if (!t.present()) return DevArray{};
    auto it = tensors_.find(t.data);
    if (it == tensors_.end()) {
      return absl::InternalError(absl::StrCat("a ", ShapeToString(t.shape), " tensor is not on ",
                                              name(), " (not loaded through WeightLoader)"));
    }
    return DevArray{it->second.data(), DType::kF32};
  }

  const int ordinal_;
  cudaStream_t stream_ = nullptr;
  std::mutex mu_;  // the weight maps during load
  std::unordered_map<const void*, cuda::OwnedDeviceWeight> weights_;
  std::unordered_map<const void*, cuda::DeviceBuffer> tensors_;
  std::unordered_map<const RopeTable*, cuda::DeviceBuffer> ropes_;
  int64_t copied_ = 0;

  // Arena (Buffer deleters run on any thread).
  std::mutex arena_mu_;
  std::unordered_map<size_t, std::vector<void*>> idle_;  // GUARDED_BY(arena_mu_)
  size_t idle_bytes_ = 0;                                // GUARDED_BY(arena_mu_)
  std::vector<void*> to_free_;                           // GUARDED_BY(arena_mu_)

  // Step state, touched only by the thread running the step.
  bool graphs_enabled_;
  const size_t graph_min_ops_;
  const size_t graph_max_ops_;
  const size_t graph_first_ops_;
  size_t run_cap_ = 0;  // ops at which this step's held-back run is queued (0: no cap)
  bool in_step_ = false;
  std::vector<std::string> prev2_, prev_, cur_;  // op records of the last two steps and this one
  std::vector<HeldOp> held_;
  std::unordered_map<std::string, GraphExec> graphs_;
  // MoeBlock: the side stream the shared expert runs on and its fork / join events (made at
  // the first MoeBlock), and whether the block takes a router at T rows.
  cuda::SideStream side_;
  unsigned* router_ticket_ = nullptr;  // with side_ (EnsureSideStream)
  std::map<std::pair<const cuda::DeviceQuantWeight*, int64_t>, bool> moe_block_fits_;
  // LinearSwiGlu: whether the fused launch takes (gate, up) at m rows.
  std::map<std::tuple<const cuda::DeviceQuantWeight*, const cuda::DeviceQuantWeight*, int64_t>, bool>
      swiglu_fits_;
  // bf16 copies of Linear inputs: two buffers (LinearSwiGlu reads x's copy from one and
  // writes its output's to the other), conv_[cur_conv_] the current one.
  struct ConvSlot {
    void* p = nullptr;
    int64_t cap = 0;  // values it holds
  };
  std::vector<void*> conv_bufs_;  // every conversion buffer made and the router ticket, for the destructor
  ConvSlot conv_[2];
  int cur_conv_ = 0;
  const float* conv_src_ = nullptr;  // the fp32 input the current copy holds (null: none)
  int64_t conv_elems_ = 0;
  void* staging_ = nullptr;  // pinned, for Download
  size_t staging_bytes_ = 0;
  // DownloadLater's copies in flight: where in later_buf_ (pinned) and where they go.
  struct LaterCopy {
    const void* from;  // in later_buf_ or in the download area
    size_t bytes;
    void* host;
  };
  std::vector<LaterCopy> later_;
  void* later_buf_ = nullptr;
  size_t later_bytes_ = 0, later_used_ = 0;
  // KernelDownload's mapped pinned area (kDownloadArea bytes; its device address), dl_used_
  // bytes of it queued since the stream last drained.
  const bool kernel_copies_;
  void* dl_host_ = nullptr;
  void* dl_dev_ = nullptr;
  size_t dl_used_ = 0;
  // Upload's pinned area: up_used_ bytes of it queued since the stream last drained.
  const bool pinned_upload_;
  void* up_buf_ = nullptr;  // kMaxPinnedUpload bytes, mapped
  const void* up_dev_ = nullptr;
  size_t up_used_ = 0;
  // Positions of this step's ops on the device (PosSlot): kPosSlots ints, and their pinned
  // host values; npos_ assigned, pos_sent_ of them queued to the device.
  int32_t* dpos_ = nullptr;
  int32_t* hpos_ = nullptr;  // mapped
  const int32_t* hpos_dev_ = nullptr;
  int npos_ = 0, pos_sent_ = 0;

  // RING_CUDA_STEP_STATS.
  const bool stats_on_;
  // RING_CUDA_LAYER_MARKS: the 4 bytes the layer marks are written to.
  const bool marks_on_;
  void* mark_ = nullptr;
  int64_t step_t0_ = 0;
  struct {
    int64_t steps = 0, direct = 0, graphed = 0, launches = 0, captures = 0;
    // Host time inside the direct ops' launch calls and inside graph launches (captures
    // excluded): with step_ns - wait_ns, where a step's host time goes.
    double step_ns = 0, wait_ns = 0, direct_ns = 0, graph_ns = 0;
    std::map<std::string, int64_t> unstable, captured;
  } stats_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<Backend>> NewCudaBackend(int ordinal) {
  auto b = std::make_shared<CudaBackend>(ordinal);
  RING_RETURN_IF_ERROR(b->Init());
  return std::shared_ptr<Backend>(std::move(b));
}

}  // namespace ring::internal
