// A CUDA injection library (CUDA_INJECTION64_PATH) that records every kernel, memcpy and
// memset of the process through CUPTI's activity API and writes them, one line each, to
// the file named by RING_KERNEL_TRACE ("%p" in it: the process id) when the process exits:
//   K <start_ns> <end_ns> <graph_id> <grid> <block> <correlation> <name>
//   C <start_ns> <end_ns> <copy_kind> <bytes> <correlation>
//   S <start_ns> <end_ns> <value> <bytes> <correlation>
// and, with RING_KERNEL_TRACE_API=1, every CUDA runtime call of the host:
//   R <start_ns> <end_ns> <correlation> <function>
// Timestamps are on CUPTI's one clock, so gaps between K/C/S records are GPU idle time, and
// a gap that ends with work whose runtime call (same correlation id; a graph's kernels share
// their cudaGraphLaunch's) returned only after the gap began was the host's: the GPU had
// nothing queued.
// bench/gpu/glm_slice_perf_h200.sh analyses the file (per-kernel time, idle time per step;
// the CUDA backend's RING_CUDA_LAYER_MARKS=1 memsets mark layer boundaries).
// Used where nsys cannot make a report (the device machine's Nsight Systems, KINDS.md).
//
// Build (here; libcupti.so.13 travels with it):
//   g++ -O2 -shared -fPIC -o libring_kernel_trace.so bench/gpu/kernel_trace.cc \
//       -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lcupti
#include <cupti.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include <unistd.h>

namespace {

constexpr size_t kBufferBytes = size_t{8} << 20;
std::FILE* g_out = nullptr;
std::mutex g_mu;

void Check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "kernel_trace: %s: %s\n", what, msg != nullptr ? msg : "?");
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> l(g_mu);
  CUpti_Activity* rec = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (g_out == nullptr) continue;
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
        std::fprintf(g_out, "K %llu %llu %u %dx%dx%d %dx%dx%d %u %s\n",
                     static_cast<unsigned long long>(k->start),
                     static_cast<unsigned long long>(k->end), k->graphId, k->gridX, k->gridY,
                     k->gridZ, k->blockX, k->blockY, k->blockZ, k->correlationId,
                     k->name != nullptr ? k->name : "?");
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* c = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
        std::fprintf(g_out, "C %llu %llu %u %llu %u\n", static_cast<unsigned long long>(c->start),
                     static_cast<unsigned long long>(c->end), unsigned{c->copyKind},
                     static_cast<unsigned long long>(c->bytes), c->correlationId);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* s = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
        std::fprintf(g_out, "S %llu %llu %u %llu %u\n", static_cast<unsigned long long>(s->start),
                     static_cast<unsigned long long>(s->end), s->value,
                     static_cast<unsigned long long>(s->bytes), s->correlationId);
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME: {
        const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(rec);
        const char* name = nullptr;
        if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name) != CUPTI_SUCCESS) {
          name = nullptr;
        }
        std::fprintf(g_out, "R %llu %llu %u %s\n", static_cast<unsigned long long>(a->start),
                     static_cast<unsigned long long>(a->end), a->correlationId,
                     name != nullptr ? name : "?");
        break;
      }
      default:
        break;
    }
  }
  std::free(buffer);
}

void AtExit() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> l(g_mu);
  if (g_out != nullptr) std::fclose(g_out);
  g_out = nullptr;
}

}  // namespace

extern "C" int InitializeInjection() {
  // "%p" in the name becomes the process id (one file per process of a ring).
  std::string path = std::getenv("RING_KERNEL_TRACE") != nullptr ? std::getenv("RING_KERNEL_TRACE")
                                                                  : "kernel_trace.txt";
  if (const size_t at = path.find("%p"); at != std::string::npos) {
    path.replace(at, 2, std::to_string(getpid()));
  }
  g_out = std::fopen(path.c_str(), "w");
  if (g_out == nullptr) {
    std::fprintf(stderr, "kernel_trace: cannot write %s\n", path.c_str());
    return 0;
  }
  Check(cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted), "register callbacks");
  Check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernels");
  Check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "enable memcpy");
  Check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "enable memset");
  const char* api = std::getenv("RING_KERNEL_TRACE_API");
  if (api != nullptr && api[0] == '1') {
    Check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME), "enable runtime API");
  }
  std::atexit(AtExit);
  return 1;
}
