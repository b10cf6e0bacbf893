// File: kernels/cuda/device.h
//
// What GPU we are on, what code this binary carries for it, and the single place where a
// kernel variant is chosen by compute capability.
//
//   RING_ASSIGN_OR_RETURN(DeviceInfo dev, QueryDevice(0));
//   auto path = SelectArchVariant<GemmPath>(dev, {{80, kAnyCc, GemmPath::kMma}},
//                                           GemmPath::kSimt);
//
// Dispatch rule (SelectArchVariant): a variant {min_cc, max_cc, value} is taken when
//   (1) the device's compute capability lies in [min_cc, max_cc], and
//   (2) the device code that was actually loaded for this device was compiled for an
//       architecture >= min_cc, i.e. the `#if __CUDA_ARCH__ >= min_cc*10` branch holding the
//       variant exists in it. The loaded code's architecture is read from a probe kernel
//       (cudaFuncGetAttributes().ptxVersion), so a device served by JIT from older PTX
//       (e.g. a future GPU running compute_90 PTX) correctly falls back.
// Variants are tried in order (list the most specific first); if none qualifies the
// portable value is returned. Every op with more than one kernel routes through this.
//
// Thread-safety: all functions are thread-safe. Compute capabilities are written as
// 10*major + minor (H200 = 90, B200 = 100, RTX 5090 = 120, GB10 = 121).
#ifndef RINGSERVE_KERNELS_CUDA_DEVICE_H_
#define RINGSERVE_KERNELS_CUDA_DEVICE_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ring::cuda {

inline constexpr int kAnyCc = 1 << 20;

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  std::string uuid;  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints it
  int cc = 0;                 // 10*major + minor
  int sm_count = 0;
  int64_t mem_total = 0;      // bytes
  int64_t mem_free = 0;       // bytes, at query time
  int64_t l2_bytes = 0;
  // The most dynamic shared memory a block may opt into: the device's, or less where
  // RING_CUDA_SMEM_PER_BLOCK caps it (bytes) so that a GPU with more runs the kernels a
  // smaller one would choose (an H200's 227 KB as sm_120's 99 KB: 101376). Every kernel
  // choice that depends on shared memory reads this field.
  int64_t smem_per_block_optin = 0;
  int64_t smem_per_block_hw = 0;  // the device's own limit where capped, else 0
  int clock_khz = 0;          // SM clock; 0 where the driver does not report it
  int mem_clock_khz = 0;
  int mem_bus_bits = 0;
  int driver_version = 0;     // e.g. 13000
  int runtime_version = 0;
  // Architecture of the device code loaded for this device (10*major+minor of the PTX it
  // was compiled from) and of the machine code actually running (after any JIT).
  int code_cc = 0;
  int binary_cc = 0;
  // Whether the bf16 tensor-core MMA keeps subnormal inputs (probed once by a kernel): the
  // scale-free mxfp4 decode GEMV feeds it E2M1 values scaled by 2^-126, half of which are
  // bf16 subnormals, and is only chosen where they survive.
  bool mma_bf16_subnormals = false;
  // Whether the image loaded for this device has Hopper's warpgroup MMA (built for sm_90a;
  // probed once by a kernel): the prefill GEMM then runs on it. RING_CUDA_WGMMA=0 turns it
  // off (A/B runs of one binary).
  bool wgmma = false;
  // Whether this process's context on the device is shared through CUDA MPS (several
  // workers' stages on one GPU then run without context switches between them).
  bool mps = false;

  std::string ToString() const;
};

namespace internal {
// Applies RING_CUDA_SMEM_PER_BLOCK's value `env` (null or empty: no cap) to d.
absl::Status ApplySmemCap(const char* env, DeviceInfo* d);
}  // namespace internal

// Number of visible devices. OK(0) when the machine simply has none; FailedPrecondition
// with the driver and runtime versions when a driver is present but too old.
absl::StatusOr<int> DeviceCount();

// Properties of device `ordinal` (also probes which code the binary runs on it).
absl::StatusOr<DeviceInfo> QueryDevice(int ordinal);

// Architectures this binary was compiled for (nvcc's __CUDA_ARCH_LIST__, as 10*major+minor).
std::vector<int> CompiledArchs();
std::string CompiledArchsString();  // e.g. "90,120"

template <typename T>
struct ArchVariant {
  int min_cc;
  int max_cc;
  T value;
};

// The dispatch helper described in the file comment.
template <typename T>
T SelectArchVariant(const DeviceInfo& dev, std::initializer_list<ArchVariant<T>> variants,
                    T portable) {
  for (const ArchVariant<T>& v : variants) {
    if (dev.cc >= v.min_cc && dev.cc <= v.max_cc && dev.code_cc >= v.min_cc) return v.value;
  }
  return portable;
}

// The matmul kernel family for `dev`: tensor-core mma.sync kernels (sm_80+ code loaded) or
// the portable SIMT kernels. The one rule qgemv.cu dispatches on and Attest reports.
bool UseTensorCoreMatmul(const DeviceInfo& dev);

// ---- capability attestation: what code a device runs, for the worker to prove ----
struct BuildArch {
  int cc = 0;
  bool arch_specific = false;  // "a" variant (sm_120a): runs on exactly that cc
};
// The CUDA architectures of a CMake spec such as "90;120a" ("NN": SASS + PTX, "NN-real":
// SASS only, "NN-virtual": PTX only).
void ParseArchSpec(const std::string& spec, std::vector<BuildArch>* sass, std::vector<int>* ptx);
// SASS for `a` runs natively on compute capability `cc`: same major and a.cc <= cc, or
// exactly cc for arch-specific code.
bool SassRunsOn(const BuildArch& a, int cc);

struct CodeAttestation {
  DeviceInfo device;
  std::vector<BuildArch> sass;  // machine code this binary carries (from the build)
  std::vector<int> ptx;         // PTX it carries (JIT-compiled for devices without SASS)
  bool sass_match = false;      // some SASS of this binary runs natively on the device
  std::vector<std::string> kernel_variants;  // "matmul: tensor-core mma.sync (sm_80+)", ...
  std::string SassString() const;  // "sm_90,sm_120a"
  std::string PtxString() const;   // "compute_90,compute_120a"
  std::string ToString() const;    // one paragraph for logs and reports
};
// Attestation of device `ordinal` for this binary (QueryDevice + the build's arch list).
absl::StatusOr<CodeAttestation> Attest(int ordinal);
// OK when the device runs SASS from this binary. Otherwise its code would be JIT-compiled
// from PTX by the driver — numerics no test of ours has seen on that arch — so this is
// FailedPrecondition naming the device, its compute capability and the binary's archs,
// unless allow_ptx_jit (then OK; the caller logs a warning).
absl::Status CheckAttestation(const CodeAttestation& a, bool allow_ptx_jit);

// Cached QueryDevice of the current device (cudaGetDevice), refreshed when the current
// device changes. Cheap enough to call on every op launch.
absl::StatusOr<const DeviceInfo*> CurrentDevice();

}  // namespace ring::cuda

#endif  // RINGSERVE_KERNELS_CUDA_DEVICE_H_
