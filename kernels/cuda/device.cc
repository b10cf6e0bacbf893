#include "kernels/cuda/device.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "kernels/status.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/status.h"

namespace ring::cuda {
namespace internal {
absl::Status ProbeLoadedCode(int* ptx_cc, int* binary_cc);  // arch_probe.cu
absl::Status ProbeMmaSubnormals(bool* kept);                 // arch_probe.cu
absl::Status ProbeWgmma(bool* available);                    // arch_probe.cu
std::vector<int> CompiledArchList();                         // arch_probe.cu
}  // namespace internal

namespace {
std::string VersionString(int v) { return absl::StrFormat("%d.%d", v / 1000, (v % 1000) / 10); }
}  // namespace

std::string DeviceInfo::ToString() const {
  return absl::StrFormat(
      "GPU %d: %s, sm_%d, %d SMs, %.1f GiB total / %.1f GiB free, L2 %.0f MiB, "
      "mem bus %d bit @ %d MHz, driver %s, runtime %s, loaded code sm_%d (from compute_%d), "
      "binary archs [%s], bf16 MMA subnormal inputs %s, wgmma %s, MPS %s, shared memory a "
      "block %d B%s",
      ordinal, name, cc, sm_count, mem_total / 1073741824.0, mem_free / 1073741824.0,
      l2_bytes / 1048576.0, mem_bus_bits, mem_clock_khz / 1000, VersionString(driver_version),
      VersionString(runtime_version), binary_cc, code_cc, CompiledArchsString(),
      mma_bf16_subnormals ? "kept" : "flushed", wgmma ? "yes" : "no", mps ? "on" : "off",
      smem_per_block_optin,
      smem_per_block_hw > 0
          ? absl::StrFormat(" (capped by RING_CUDA_SMEM_PER_BLOCK; the device has %d)", smem_per_block_hw)
          : std::string());
}

absl::StatusOr<int> DeviceCount() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaErrorNoDevice) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return 0;
  }
  if (e == cudaErrorInsufficientDriver) {
    cudaGetLastError();
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    return absl::FailedPreconditionError(absl::StrFormat(
        "CUDA driver too old or missing: driver supports CUDA %s, this binary needs runtime %s",
        driver == 0 ? std::string("none") : VersionString(driver), VersionString(runtime)));
  }
  RING_CUDA_RETURN_IF_ERROR(e);
  return n;
}

namespace internal {
absl::Status ApplySmemCap(const char* env, DeviceInfo* d) {
  if (env == nullptr || *env == '\0') return absl::OkStatus();
  int64_t cap = 0;
  if (!absl::SimpleAtoi(env, &cap) || cap < 16 * 1024) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "RING_CUDA_SMEM_PER_BLOCK=%s: want a byte count of at least 16384 (e.g. 101376, the "
        "99 KB a block of sm_86/89/120/121 may opt into)", env));
  }
  if (cap < d->smem_per_block_optin) {
    d->smem_per_block_hw = d->smem_per_block_optin;
    d->smem_per_block_optin = cap;
  }
  return absl::OkStatus();
}
}  // namespace internal

absl::StatusOr<DeviceInfo> QueryDevice(int ordinal) {
  absl::StatusOr<int> count = DeviceCount();
  if (!count.ok()) return count.status();
  if (*count == 0) return absl::FailedPreconditionError("no CUDA device visible");
  if (ordinal < 0 || ordinal >= *count) {
    return absl::InvalidArgumentError(
        absl::StrFormat("GPU ordinal %d out of range (%d visible)", ordinal, *count));
  }
  DeviceInfo d;
  d.ordinal = ordinal;
  cudaDeviceProp prop{};
  RING_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, ordinal));
  d.name = prop.name;
  const auto* u = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  d.uuid = absl::StrFormat("GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                           u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10],
                           u[11], u[12], u[13], u[14], u[15]);
  d.cc = prop.major * 10 + prop.minor;
  d.sm_count = prop.multiProcessorCount;
  d.l2_bytes = prop.l2CacheSize;
  d.smem_per_block_optin = static_cast<int64_t>(prop.sharedMemPerBlockOptin);
  d.mem_bus_bits = prop.memoryBusWidth;
  int mps = 0;
  if (cudaDeviceGetAttribute(&mps, cudaDevAttrMpsEnabled, ordinal) != cudaSuccess) mps = 0;
  cudaGetLastError();
  d.mps = mps != 0;
  // CUDA 13 dropped the clock fields from cudaDeviceProp; the attributes still exist.
  if (cudaDeviceGetAttribute(&d.clock_khz, cudaDevAttrClockRate, ordinal) != cudaSuccess) {
    d.clock_khz = 0;
  }
  if (cudaDeviceGetAttribute(&d.mem_clock_khz, cudaDevAttrMemoryClockRate, ordinal) !=
      cudaSuccess) {
    d.mem_clock_khz = 0;
  }
  cudaGetLastError();
  RING_CUDA_RETURN_IF_ERROR(cudaDriverGetVersion(&d.driver_version));
  RING_CUDA_RETURN_IF_ERROR(cudaRuntimeGetVersion(&d.runtime_version));

  int prev = 0;
  RING_CUDA_RETURN_IF_ERROR(cudaGetDevice(&prev));
  RING_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  size_t free_b = 0, total_b = 0;
  absl::Status st = [&]() -> absl::Status {
    RING_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_b, &total_b));
    RING_RETURN_IF_ERROR(internal::ProbeLoadedCode(&d.code_cc, &d.binary_cc));
    RING_RETURN_IF_ERROR(internal::ProbeMmaSubnormals(&d.mma_bf16_subnormals));
    RING_RETURN_IF_ERROR(internal::ProbeWgmma(&d.wgmma));
    const char* env = std::getenv("RING_CUDA_WGMMA");
    if (env != nullptr && std::string_view(env) == "0") d.wgmma = false;
    RING_RETURN_IF_ERROR(internal::ApplySmemCap(std::getenv("RING_CUDA_SMEM_PER_BLOCK"), &d));
    return absl::OkStatus();
  }();
  RING_CUDA_RETURN_IF_ERROR(cudaSetDevice(prev));
  if (!st.ok()) {
    if (st.code() == absl::StatusCode::kFailedPrecondition) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "this binary has no code for %s (sm_%d); it was built for [%s]: %s", d.name, d.cc,
          CompiledArchsString(), st.message()));
    }
    return st;
  }
  d.mem_free = static_cast<int64_t>(free_b);
  d.mem_total = static_cast<int64_t>(total_b);
  return d;
}

std::vector<int> CompiledArchs() { return internal::CompiledArchList(); }

std::string CompiledArchsString() { return absl::StrJoin(CompiledArchs(), ","); }

bool UseTensorCoreMatmul(const DeviceInfo& dev) {
  return SelectArchVariant<bool>(dev, {{80, kAnyCc, true}}, false);
}

void ParseArchSpec(const std::string& spec, std::vector<BuildArch>* sass, std::vector<int>* ptx) {
  for (absl::string_view e : absl::StrSplit(spec, absl::ByAnyChar(";,"), absl::SkipWhitespace())) {
    bool real = true, virt = true;
    if (absl::ConsumeSuffix(&e, "-real")) virt = false;
    else if (absl::ConsumeSuffix(&e, "-virtual")) real = false;
    BuildArch a;
    a.arch_specific = absl::ConsumeSuffix(&e, "a");
    if (!absl::SimpleAtoi(e, &a.cc)) continue;
    if (real) sass->push_back(a);
    if (virt) ptx->push_back(a.cc);
  }
}

bool SassRunsOn(const BuildArch& a, int cc) {
  if (a.arch_specific) return a.cc == cc;
  return a.cc / 10 == cc / 10 && a.cc <= cc;
}

std::string CodeAttestation::SassString() const {
  return absl::StrJoin(sass, ",", [](std::string* out, const BuildArch& a) {
    absl::StrAppend(out, "sm_", a.cc, a.arch_specific ? "a" : "");
  });
}

std::string CodeAttestation::PtxString() const {
  return absl::StrJoin(ptx, ",", [](std::string* out, int cc) { absl::StrAppend(out, "compute_", cc); });
}

std::string CodeAttestation::ToString() const {
  return absl::StrFormat(
      "%s (sm_%d), driver %s, runtime %s; binary SASS [%s], PTX [%s]; running sm_%d code "
      "compiled from compute_%d%s; %s; kernels: %s",
      device.name, device.cc, VersionString(device.driver_version),
      VersionString(device.runtime_version), SassString(), PtxString(), device.binary_cc,
      device.code_cc, sass_match ? "" : " (JIT from PTX: no SASS for this device)",
      device.mps ? "MPS client (GPU context shared with other processes)" : "no MPS",
      absl::StrJoin(kernel_variants, "; "));
}

absl::StatusOr<CodeAttestation> Attest(int ordinal) {
  CodeAttestation a;
  RING_ASSIGN_OR_RETURN(a.device, QueryDevice(ordinal));
#ifdef RING_CUDA_ARCH_SPEC
  ParseArchSpec(RING_CUDA_ARCH_SPEC, &a.sass, &a.ptx);
#else
  for (int cc : CompiledArchs()) {
    a.sass.push_back({cc, false});
    a.ptx.push_back(cc);
  }
#endif
  for (const BuildArch& b : a.sass) a.sass_match = a.sass_match || SassRunsOn(b, a.device.cc);
  a.kernel_variants.push_back(UseTensorCoreMatmul(a.device)
                                  ? (a.device.wgmma
                                         ? "matmul: tensor-core mma.sync GEMV, wgmma prefill GEMM (sm_90a)"
                                         : "matmul: tensor-core mma.sync GEMV/GEMM (sm_80+)")
                                  : "matmul: portable SIMT");
  a.kernel_variants.push_back(UseTensorCoreMatmul(a.device)
                                  ? "attention: tensor-core prefill, split decode; indexer, MoE, norms: SIMT"
                                  : "attention, indexer, MoE, norms: portable SIMT");
  a.kernel_variants.push_back(MlaKernelForms(a.device));
  return a;
}

absl::Status CheckAttestation(const CodeAttestation& a, bool allow_ptx_jit) {
  if (a.sass_match || allow_ptx_jit) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "%s is sm_%d, but this binary carries SASS only for [%s]; the driver would JIT-compile "
      "it from PTX [%s], code whose numerics were never checked on this device. Rebuild with "
      "RING_CUDA_ARCHS including %d (or pass --allow-ptx-jit to run anyway and verify with "
      "`ringctl verify`)",
      a.device.name, a.device.cc, a.SassString(), a.PtxString(), a.device.cc));
}

absl::StatusOr<const DeviceInfo*> CurrentDevice() {
  static absl::Mutex mu(absl::kConstInit);
  static auto* cache = new std::map<int, std::unique_ptr<DeviceInfo>>();
  int ordinal = 0;
  RING_CUDA_RETURN_IF_ERROR(cudaGetDevice(&ordinal));
  absl::MutexLock lock(&mu);
  auto it = cache->find(ordinal);
  if (it != cache->end()) return it->second.get();
  absl::StatusOr<DeviceInfo> info = QueryDevice(ordinal);
  if (!info.ok()) return info.status();
  auto [pos, inserted] = cache->emplace(ordinal, std::make_unique<DeviceInfo>(*std::move(info)));
  return pos->second.get();
}

}  // namespace ring::cuda
