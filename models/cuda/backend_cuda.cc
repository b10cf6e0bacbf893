// The CUDA backend (models/backend.h): activations, caches and scratch in stream-ordered
// device memory (cudaMallocAsync from the device's pool, kept cached between steps), all
// work on one stream per stage, weights uploaded once at load and looked up by the host
// tensor's address, every op a kernel of kernels/cuda whose CPU reference is the
// corresponding CPU backend op (checked by kernels/cuda/ops_harness_test.cc).
//
// Steps of different sequences are serialised (concurrent() == false): the stage holds one
// stream and the ops' scratch is stream-ordered.
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

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

class CudaBackend final : public Backend, public std::enable_shared_from_this<CudaBackend> {
 public:
  explicit CudaBackend(int ordinal) : ordinal_(ordinal) {}
  ~CudaBackend() override {
    if (stream_ != nullptr) {
      cudaSetDevice(ordinal_);
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
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
    // Keep freed activation memory in the pool between steps instead of returning it.
    cudaMemPool_t pool;
    RING_CUDA_RETURN_IF_ERROR(cudaDeviceGetDefaultMemPool(&pool, ordinal_));
    uint64_t keep = UINT64_MAX;
    RING_CUDA_RETURN_IF_ERROR(
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    return absl::OkStatus();
  }

  std::string name() const override { return absl::StrCat("cuda:", ordinal_); }
  bool concurrent() const override { return false; }
  absl::Status BeginStep() override {
    RING_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    return absl::OkStatus();
  }
  absl::Status EndStep() override {
    RING_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    RING_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  }

  // ---- memory ----
  absl::StatusOr<Buffer> Alloc(int64_t bytes) override {
    if (bytes < 0) return absl::InvalidArgumentError("negative allocation");
    if (bytes == 0) return Buffer();
    void* p = nullptr;
    const cudaError_t e = cudaMallocAsync(&p, static_cast<size_t>(bytes), stream_);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return absl::Status(cuda::CudaCodeToStatusCode(e),
                          absl::StrCat("cudaMallocAsync of ", bytes, " bytes on ", name(), ": ",
                                       cudaGetErrorString(e)));
    }
    std::shared_ptr<CudaBackend> self = shared_from_this();
    return Buffer(p, bytes, std::shared_ptr<void>(p, [self](void* q) {
                    cudaSetDevice(self->ordinal_);
                    cudaFreeAsync(q, self->stream_);
                  }));
  }
  absl::Status Upload(const void* host, int64_t bytes, void* dst) override {
    if (bytes <= 0) return absl::OkStatus();
    RING_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream_));
    return absl::OkStatus();
  }
  absl::Status Download(const void* src, int64_t bytes, void* host) override {
    if (bytes <= 0) return absl::OkStatus();
    RING_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream_));
    RING_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }
  absl::Status Copy2D(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows,
                      int64_t cols) override {
    if (rows <= 0 || cols <= 0) return absl::OkStatus();
    RING_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(dst, dst_ld * 4, src, src_ld * 4, cols * 4, rows,
                                                cudaMemcpyDeviceToDevice, stream_));
    return absl::OkStatus();
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
    cuda::QMatmulArgs a;
    a.x = x;
    a.m = m;
    a.y = y;
    return cuda::LinearT(*d, a, t, stream_);
  }
  absl::Status Embed(const QuantWeight& w, const int32_t* host_ids, int64_t n, ActDType t,
                     float* out) override {
    RING_ASSIGN_OR_RETURN(const cuda::DeviceQuantWeight* d, Weight(w));
    RING_ASSIGN_OR_RETURN(Buffer ids, Alloc(n * 4));
    RING_RETURN_IF_ERROR(Upload(host_ids, n * 4, ids.data()));
    constexpr int64_t kMaxIds = 65535;
    for (int64_t i = 0; i < n; i += kMaxIds) {
      const int64_t c = std::min(kMaxIds, n - i);
      RING_RETURN_IF_ERROR(cuda::EmbedRows(*d, ids.i() + i, c, out + i * d->cols, DType::kF32,
                                           stream_));
    }
    if (t != ActDType::kF32) {
      RING_RETURN_IF_ERROR(cuda::ScaleRound(Out(out), n * d->cols, 1.f, t, stream_));
    }
    return absl::OkStatus();
  }
  absl::Status RmsNorm(const float* x, int64_t rows, int64_t dim, const TensorView& w, float eps,
                       ActDType t, float* out) override {
    RING_ASSIGN_OR_RETURN(const DevArray dw, Tensor(w));
    return cuda::RmsNorm(In(x), rows, dim, dw, eps, t, Out(out), stream_);
  }
  absl::Status LayerNorm(const float* x, int64_t rows, int64_t dim, const TensorView& w,
                         const TensorView& b, float eps, ActDType t, float* out) override {
    RING_ASSIGN_OR_RETURN(const DevArray dw, Tensor(w));
    RING_ASSIGN_OR_RETURN(const DevArray db, Tensor(b));
    return cuda::LayerNorm(In(x), rows, dim, dw, db, eps, t, Out(out), stream_);
  }
  absl::Status Rope(const RopeTable& r, float* x, int64_t tokens, int64_t heads, int64_t head_dim,
                    int64_t stride, int64_t offset, ActDType t) override {
    auto it = ropes_.find(&r);
    if (it == ropes_.end()) return absl::InternalError("RoPE table was not registered (AddRope)");
    if (r.pre_scale != 1.f) {
      RING_RETURN_IF_ERROR(cuda::ScaleRound(Out(x), tokens, heads, head_dim, stride, r.dims,
                                            r.pre_scale, t, stream_));
    }
    return cuda::Rope(Out(x), tokens, heads, head_dim, stride, r.dims, r.traditional,
                      it->second.as<float>(), offset, t, stream_);
  }
  absl::Status SwiGlu(const float* gate, const float* up, int64_t n, ActDType t,
                      float* out) override {
    return cuda::SwiGlu(In(gate), In(up), n, t, Out(out), stream_);
  }
  absl::Status Add(const float* a, const float* b, int64_t n, ActDType t, float* out) override {
    return cuda::Add(In(a), In(b), n, t, Out(out), stream_);
  }
  absl::Status ScaleRound(float* x, int64_t n, float s, ActDType t) override {
    return cuda::ScaleRound(Out(x), n, s, t, stream_);
  }
  absl::Status Attention(const cpu::AttentionArgs& a, ActDType t, float* out) override {
    return cuda::Attention(a, t, out, stream_);
  }
  absl::Status MlaAttention(const cpu::MlaAttentionArgs& a, const QuantWeight& embed_q,
                            const QuantWeight& unembed_out, ActDType t, float* out) override {
    RING_ASSIGN_OR_RETURN(const cuda::DeviceQuantWeight* eq, Weight(embed_q));
    RING_ASSIGN_OR_RETURN(const cuda::DeviceQuantWeight* uo, Weight(unembed_out));
    return cuda::MlaAttention(a, *eq, *uo, t, out, stream_);
  }
  absl::Status IndexerTopK(const cpu::IndexerArgs& a, ActDType t, int32_t* topk) override {
    return cuda::IndexerTopK(a, t, topk, stream_);
  }
  absl::Status RouteSigmoid(const float* logits, const TensorView& bias, int64_t T,
                            const cpu::SigmoidRouting& r, int32_t* ids, float* weights) override {
    RING_ASSIGN_OR_RETURN(const DevArray db, Tensor(bias));
    return cuda::RouteSigmoid(logits, static_cast<const float*>(db.data), T, r, ids, weights,
                              stream_);
  }
  absl::Status RouteSoftmax(const float* gates, int64_t T, int64_t E, int64_t k,
                            bool norm_topk_prob, ActDType t, int32_t* ids,
                            float* scores) override {
    return cuda::RouteSoftmax(gates, T, E, k, norm_topk_prob, t, ids, scores, stream_);
  }
  absl::Status ExpertsSwiGlu(const QuantWeight& gate, const QuantWeight& up,
                             const QuantWeight& down, const float* x, int64_t T,
                             const int32_t* ids, int64_t k, ActDType t, float* y) override {
    RING_ASSIGN_OR_RETURN(const cuda::DeviceQuantWeight* g, Weight(gate));
    RING_ASSIGN_OR_RETURN(const cuda::DeviceQuantWeight* u, Weight(up));
    RING_ASSIGN_OR_RETURN(const cuda::DeviceQuantWeight* d, Weight(down));
    return cuda::ExpertsSwiGlu(*g, *u, *d, x, T, ids, k, t, y, stream_);
  }
  absl::Status MoeCombine(const float* y, const float* w, const float* shared, int64_t T,
                          int64_t k, int64_t hidden, cpu::CombineMode mode, ActDType t,
                          float* out) override {
    return cuda::MoeCombine(y, w, shared, T, k, hidden, mode, t, out, stream_);
  }
  absl::Status ArgMax(const float* x, int64_t rows, int64_t n, int32_t* host_out) override {
    RING_ASSIGN_OR_RETURN(Buffer ids, Alloc(rows * 4));
    RING_RETURN_IF_ERROR(cuda::ArgMaxRows(x, rows, n, ids.i(), stream_));
    return Download(ids.data(), rows * 4, host_out);
  }

 private:
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
};

}  // namespace

absl::StatusOr<std::shared_ptr<Backend>> NewCudaBackend(int ordinal) {
  auto b = std::make_shared<CudaBackend>(ordinal);
  RING_RETURN_IF_ERROR(b->Init());
  return std::shared_ptr<Backend>(std::move(b));
}

}  // namespace ring::internal
