#include "worker/worker_service.h"

#include <limits>

#include "kernels/cpu/bandwidth.h"
#include "models/inspect.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <xxhash.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "kernels/status.h"
#include "models/config.h"
#include "models/verify.h"
#include "worker/frame.h"
#include "worker/grpc_status.h"
#include "worker/nccl_hop.h"
#include "worker/shm_hop.h"
#include "worker/stage_client.h"

#ifdef RING_HAVE_CUDA
#include "kernels/cuda/device.h"
#endif

namespace ring::worker {
namespace {

namespace fs = std::filesystem;
namespace pb = ringserve::v1;

constexpr size_t kMaxEvents = 64;

#ifndef RING_BUILD_VERSION
#define RING_BUILD_VERSION "unknown"
#endif

int64_t MemAvailableBytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024;
  }
  return -1;
}

// Free memory where this worker's KV caches live: the GPU's for a CUDA device, else the
// host's MemAvailable (-1: unknown).
int64_t CacheMemoryFreeBytes(const std::string& device) {
#ifdef RING_HAVE_CUDA
  if (absl::StatusOr<DeviceSpec> spec = ParseDevice(device);
      spec.ok() && spec->kind == DeviceSpec::Kind::kCuda) {
    absl::StatusOr<cuda::DeviceInfo> info = cuda::QueryDevice(spec->ordinal);
    return info.ok() ? info->mem_free : -1;
  }
#endif
  (void)device;
  return MemAvailableBytes();
}

// Identity of a checkpoint without reading its weights: config.json bytes plus the name
// and size of every .safetensors file, so a re-synthesized or re-quantized model differs.
uint64_t ModelHash(const std::string& dir) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  std::ifstream cfg(dir + "/config.json", std::ios::binary);
  std::stringstream ss;
  ss << cfg.rdbuf();
  const std::string text = ss.str();
  XXH3_64bits_update(st, text.data(), text.size());
  std::vector<std::pair<std::string, uintmax_t>> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".safetensors") {
      files.emplace_back(e.path().filename().string(), e.file_size(ec));
    }
  }
  std::sort(files.begin(), files.end());
  for (const auto& [name, size] : files) {
    XXH3_64bits_update(st, name.data(), name.size());
    XXH3_64bits_update(st, &size, sizeof(size));
  }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

// KV cache growth per token and layer of the CPU engine (fp32 caches): MLA keeps the
// compressed latent + rope key (and the DSA indexer its keys); GQA keeps K and V.
int64_t KvBytesPerTokenPerLayer(const ModelConfig& c) {
  int64_t floats = 0;
  if (c.kv_lora_rank > 0) {
    floats = c.kv_lora_rank + c.qk_rope_head_dim + c.index_head_dim;
  } else {
    const int64_t hd = c.head_dim > 0 ? c.head_dim : c.hidden_size / std::max<int64_t>(1, c.num_attention_heads);
    floats = 2 * c.num_key_value_heads * hd;
  }
  return floats * 4;
}

// The calibration forward: the median decode step time of stage [begin, end) of `dir` on
// `device`, one sequence at a short context (inputs are arbitrary but deterministic).
absl::StatusOr<double> TimeDecodeStep(const std::string& dir, const std::string& device, int64_t begin,
                                      int64_t end) {
  LoadOptions lo;
  lo.layers = {begin, end};
  RING_ASSIGN_OR_RETURN(lo.device, ParseDevice(device));
  lo.max_context = 64;
  lo.all_logits = false;
  RING_ASSIGN_OR_RETURN(std::unique_ptr<Stage> stage, ring::LoadStage(dir, lo));
  auto seq = stage->NewSequence();
  const int64_t hidden = stage->config().hidden_size;
  const int64_t vocab = std::max<int64_t>(2, stage->config().vocab_size);
  uint32_t lcg = 12345;
  auto input = [&](int64_t rows) {
    StageInput in;
    if (stage->is_first()) {
      for (int64_t r = 0; r < rows; ++r) in.tokens.push_back(static_cast<int32_t>(1 + (r * 37) % (vocab - 1)));
    } else {
      in.hidden.resize(rows * hidden);
      for (float& v : in.hidden) {
        lcg = lcg * 1664525u + 1013904223u;
        v = static_cast<float>(lcg >> 8) / static_cast<float>(1 << 24) * 2.f - 1.f;
      }
      // A stage that starts at an IndexShare layer needs the carry; at this context a full
      // indexer layer would have selected everything (dense) anyway.
      in.topk.source_layer = begin - 1;
      in.topk.dense = true;
    }
    in.argmax_only = stage->is_last();  // as a closed ring's last stage runs
    return in;
  };
  RING_RETURN_IF_ERROR(stage->Forward(*seq, input(4)).status());
  std::vector<double> times;
  for (int i = 0; i < 9; ++i) {
    const StageInput in = input(1);
    const absl::Time t0 = absl::Now();
    RING_RETURN_IF_ERROR(stage->Forward(*seq, in).status());
    if (i >= 2) times.push_back(absl::ToDoubleSeconds(absl::Now() - t0));  // after warm-up
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

absl::StatusOr<pb::ModelInfo> ProbeModel(const std::string& root, const std::string& model) {
  RING_ASSIGN_OR_RETURN(std::string dir, ResolveModelDir(root, model));
  RING_ASSIGN_OR_RETURN(ModelConfig cfg, LoadModelConfig(dir));
  pb::ModelInfo info;
  info.set_model(model);
  info.set_model_hash(ModelHash(dir));
  info.set_model_type(cfg.model_type);
  info.set_num_layers(cfg.num_hidden_layers);
  info.set_hidden_size(cfg.hidden_size);
  info.set_vocab_size(cfg.vocab_size);
  info.set_max_position_embeddings(cfg.max_position_embeddings);
  info.set_dtype(cfg.torch_dtype == "float32"   ? "f32"
                 : cfg.torch_dtype == "float16" ? "f16"
                                                : "bf16");
  RING_ASSIGN_OR_RETURN(InspectReport report, InspectCheckpoint(dir));
  for (const InspectLayer& l : report.layers) info.add_layer_bytes(static_cast<int64_t>(l.bytes));
  int64_t embed = 0, other = 0;
  for (const InspectGroup& g : report.groups) {
    if (!g.layers.empty()) continue;
    (g.kind.rfind("model.embed_tokens", 0) == 0 ? embed : other) += static_cast<int64_t>(g.bytes);
  }
  info.set_first_stage_extra_bytes(embed);
  // A tied LM head reads the embedding too.
  info.set_last_stage_extra_bytes(other + (cfg.tie_word_embeddings ? embed : 0));
  info.set_kv_bytes_per_token_per_layer(KvBytesPerTokenPerLayer(cfg));
  return info;
}

// The peer label of frame metrics: the sender names its role ("coordinator", "stage N
// (ADDR)"); anything else is folded so a caller cannot make label values without bound.
// A buffer reused from frame to frame keeps a decode frame's storage, not a long prompt's.
void KeepSmall(std::string* buffer) {
  constexpr size_t kKeep = size_t{1} << 20;
  if (buffer->capacity() > kKeep) std::string().swap(*buffer);
}

const std::string& PeerLabel(const pb::ActivationFrame& f) {
  static const std::string* const kOther = new std::string("other");
  if (f.sender() == "coordinator" || absl::StartsWith(f.sender(), "stage ")) return f.sender();
  return *kOther;
}

}  // namespace

int64_t DefaultKvCacheBudget(int64_t free_bytes_after_weights) {
  if (free_bytes_after_weights <= 0) return 0;
  const int64_t headroom = std::max<int64_t>(int64_t{256} << 20, free_bytes_after_weights / 10);
  return std::max<int64_t>(0, free_bytes_after_weights - headroom);
}

absl::StatusOr<std::string> ResolveModelDir(const std::string& root, const std::string& model) {
  if (model.empty()) return absl::InvalidArgumentError("model: empty path");
  const fs::path rel(model);
  if (rel.is_absolute()) {
    return absl::PermissionDeniedError(
        absl::StrCat("model '", model, "': absolute paths are refused; give a path relative to "
                     "the worker's --model-root"));
  }
  for (const fs::path& part : rel) {
    if (part == "..") {
      return absl::PermissionDeniedError(
          absl::StrCat("model '", model, "': '..' would escape the worker's --model-root"));
    }
  }
  // A symlink inside the root may still point outside it; compare canonical paths.
  std::error_code ec;
  const fs::path canon_root = fs::canonical(root, ec);
  if (ec) return absl::FailedPreconditionError(absl::StrCat("--model-root ", root, ": ", ec.message()));
  const fs::path canon = fs::canonical(canon_root / rel, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("model '", model, "' under ", root, ": ", ec.message()));
  const std::string r = canon_root.string(), c = canon.string();
  if (c != r && c.rfind(r + "/", 0) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("model '", model, "' resolves outside the worker's --model-root"));
  }
  return c;
}

absl::StatusOr<pb::DeviceAttestation> AttestDevice(const std::string& device,
                                                   bool allow_ptx_jit) {
  RING_ASSIGN_OR_RETURN(DeviceSpec spec, ParseDevice(device));
  if (spec.kind != DeviceSpec::Kind::kCuda) {
    return absl::UnimplementedError("attestation is for CUDA devices");
  }
#ifdef RING_HAVE_CUDA
  RING_ASSIGN_OR_RETURN(cuda::CodeAttestation a, cuda::Attest(spec.ordinal));
  RING_RETURN_IF_ERROR(cuda::CheckAttestation(a, allow_ptx_jit));
  pb::DeviceAttestation p;
  p.set_device_name(a.device.name);
  p.set_gpu_uuid(a.device.uuid);
  p.set_mps(a.device.mps);
  p.set_compute_capability(a.device.cc);
  p.set_driver_version(a.device.driver_version);
  p.set_runtime_version(a.device.runtime_version);
  for (const cuda::BuildArch& b : a.sass) {
    p.add_sass_archs(absl::StrCat("sm_", b.cc, b.arch_specific ? "a" : ""));
  }
  for (int cc : a.ptx) p.add_ptx_archs(absl::StrCat("compute_", cc));
  p.set_running_code_arch(a.device.binary_cc);
  p.set_running_ptx_arch(a.device.code_cc);
  p.set_sass_match(a.sass_match);
  p.set_ptx_jit_allowed(allow_ptx_jit);
  for (const std::string& v : a.kernel_variants) p.add_kernel_variants(v);
  p.set_summary(a.ToString());
  return p;
#else
  return absl::UnimplementedError("this build has no CUDA backend");
#endif
}

// RING_WORKER_STEP_STATS: the reading thread's page-fault count when it read the frame it
// is handling (-1: none, or the frame went to another thread).
thread_local int64_t t_faults_at_read = -1;

// RING_WORKER_STEP_STATS: when the reading thread finished parsing and recording the frame
// it is handling (InfinitePast: none), and when its Step began; a step computed on another
// thread finds them unset and counts its decode segment whole.
thread_local absl::Time t_parsed_at = absl::InfinitePast();
thread_local absl::Time t_step_entered_at = absl::InfinitePast();

// RING_WORKER_STEP_STATS: sums of each segment's time over the relayed steps, decode steps
// (one row after the first position) apart from prefill ones.
struct WorkerService::StepStats {
  // The k*Part segments split the one before them (a decode segment only when the frame was
  // read on the thread that stepped it); they are not added to the total again.
  enum Segment {
    kDecode, kParsePart, kToStepPart, kLookupPart, kCodecPart,
    kPrepare, kForward,
    kEncode, kEncodeCodecPart, kEncodeChecksPart,
    kHandOff, kPushPrep, kSerialize, kSend, kCount
  };
  static constexpr const char* kNames[kCount] = {
      "frame read to input decoded (parse, recorder, hand-over, checksum, decode)",
      "[of which: parse, recorder, frame metrics", "to Step", "stage and sequence lookup",
      "checksum and decode]",
      "checks, cache reservation", "forward", "encode, fingerprint, metrics",
      "[of which: encode and fingerprint", "activation checks and metrics]", "to the push",
      "push: recorder, metrics", "push: serialize", "push: transport send"};
  static bool DecodeStep(const pb::ActivationFrame& f) {
    return f.rows() <= 1 && f.first_position() > 0;
  }
  // Minor page faults of the calling thread so far.
  static int64_t ThreadFaults() {
    struct rusage u {};
    return getrusage(RUSAGE_THREAD, &u) == 0 ? u.ru_minflt : 0;
  }
  std::atomic<int64_t> ns[2][kCount] = {};
  std::atomic<int64_t> steps[2] = {};
  // Page faults of the thread that read a frame from shared memory and computed and pushed
  // its step (the usual path of a lone sequence), from the read to the push's end.
  std::atomic<int64_t> faults[2] = {}, faulted_steps[2] = {};
  // Steps whose decode segment is split into its parts (read on the stepping thread).
  std::atomic<int64_t> split_steps[2] = {};
  void Count(const pb::ActivationFrame& f) {
    steps[DecodeStep(f)].fetch_add(1, std::memory_order_relaxed);
  }
  void Add(const pb::ActivationFrame& f, Segment s, absl::Time from, absl::Time to) {
    ns[DecodeStep(f)][s].fetch_add(absl::ToInt64Nanoseconds(to - from), std::memory_order_relaxed);
  }
  bool empty() const { return steps[0].load() + steps[1].load() == 0; }
  std::string Report(const std::string& who) const {
    std::string r = absl::StrCat("ring-worker: ", who, ":");
    for (int d : {1, 0}) {
      const int64_t n = steps[d].load();
      absl::StrAppend(&r, d == 1 ? "" : "\n  ", " ", n, d == 1 ? " relayed decode steps" : " relayed prefill steps",
                      "; per step (us):");
      for (int i = 0; i < kCount; ++i) {
        const int64_t of = i == kParsePart || i == kToStepPart || i == kLookupPart || i == kCodecPart
                               ? split_steps[d].load()
                               : n;
        absl::StrAppend(&r, " ", kNames[i], " ",
                        absl::StrFormat("%.1f", of > 0 ? ns[d][i].load() / 1e3 / of : 0.0),
                        i == kCodecPart && of != n ? absl::StrCat(" (", of, " steps read here)") : "", ";");
      }
      if (const int64_t f = faulted_steps[d].load(); f > 0) {
        absl::StrAppend(&r, " minor page faults from the shared-memory read to the push's end ",
                        absl::StrFormat("%.2f", static_cast<double>(faults[d].load()) / f), " (", f, " steps);");
      }
    }
    return r;
  }
};

WorkerService::WorkerService(WorkerOptions options)
    : options_(std::move(options)),
      step_stats_([] {
        const char* v = std::getenv("RING_WORKER_STEP_STATS");
        return v != nullptr && std::strcmp(v, "0") != 0 ? std::make_unique<StepStats>() : nullptr;
      }()),
      owned_metrics_(options_.metrics ? nullptr : std::make_unique<WorkerMetrics>(options_.device)),
      metrics_(options_.metrics ? options_.metrics : owned_metrics_.get()),
      listen_address_(options_.listen_address) {
  metrics_->SetMemoryFree(MemAvailableBytes());
  if (absl::StatusOr<pb::DeviceAttestation> a = AttestDevice(options_.device, options_.allow_ptx_jit);
      a.ok()) {
    attestation_ = *std::move(a);
  }
  // As many as a batch has sequences: each waits in the batcher with its step.
  if (options_.max_batch_rows > 1) {
    for (int64_t i = 0; i < std::min<int64_t>(options_.max_batch_rows, 32); ++i) {
      relay_threads_.emplace_back([this] { RelayLoop(); });
    }
  }
}

void WorkerService::SetMetricsAddress(std::string address) {
  absl::MutexLock l(&mu_);
  metrics_address_ = std::move(address);
}

void WorkerService::SetRegistrationSource(std::function<pb::CoordinatorRegistration()> source) {
  absl::MutexLock l(&mu_);
  registration_ = std::move(source);
}

void WorkerService::SetLastError(const absl::Status& status) {
  absl::MutexLock l(&mu_);
  last_error_ = std::string(status.message());
  last_error_unix_seconds_ = absl::ToUnixSeconds(absl::Now());
}

void WorkerService::AccountCache(const Loaded* loaded, SequenceState* state, int64_t cache_bytes) {
  absl::MutexLock l(&mu_);
  // A LoadStage since this step dropped every sequence and zeroed the total.
  if (loaded_.get() != loaded) return;
  kv_bytes_ += cache_bytes - state->accounted_bytes;
  state->accounted_bytes = cache_bytes;
  metrics_->SetKvCache(kv_bytes_, static_cast<int64_t>(sequences_.size()));
}

absl::Status WorkerService::ReserveCache(const Loaded* loaded, SequenceState* state, int64_t bytes,
                                         absl::FunctionRef<std::string()> hop, const pb::ActivationFrame& in) {
  int64_t held = 0, holders = 0;  // holders: sequences with cache (a new one has a slot but holds nothing)
  {
    absl::MutexLock l(&mu_);
    if (loaded_.get() != loaded) return absl::OkStatus();  // replaced: AccountCache ignores it too
    // Reserved under mu_, so concurrent steps of different sequences cannot both take the
    // last free bytes.
    if (kv_bytes_ + bytes <= loaded->kv_budget) {
      kv_bytes_ += bytes;
      state->accounted_bytes += bytes;
      metrics_->SetKvCache(kv_bytes_, static_cast<int64_t>(sequences_.size()));
      return absl::OkStatus();
    }
    held = kv_bytes_;
    for (const auto& [id, s] : sequences_) holders += s->accounted_bytes > 0 ? 1 : 0;
  }
  // hop() takes mu_ itself.
  return absl::ResourceExhaustedError(absl::StrCat(
      hop(), ": KV cache budget exceeded: sequence ", in.sequence_id(), " step ", in.step(), " needs ", bytes,
      " bytes (", in.rows(), " tokens at position ", in.first_position(), "), but ", held, " of the budget of ",
      loaded->kv_budget, " bytes are held by ", holders, " sequence(s) (",
      std::max<int64_t>(0, loaded->kv_budget - held),
      " free); retry when sequences finish, or give the worker a larger --kv-cache-bytes"));
}

std::string WorkerService::DegradedReason() const {
  std::shared_ptr<const Loaded> loaded;
  {
    absl::MutexLock l(&mu_);
    if (!degraded_.empty()) return degraded_;
    loaded = loaded_;
  }
  return loaded && loaded->shadow ? loaded->shadow->degraded_reason() : std::string();
}

WorkerService::~WorkerService() {
  if (step_stats_ != nullptr && !step_stats_->empty()) {
    std::cerr << step_stats_->Report(HopName()) << "\n";
  }
  std::vector<std::shared_ptr<InboundShm>> shm;
  {
    absl::MutexLock l(&mu_);
    shm = std::move(retired_shm_);
    if (inbound_shm_ != nullptr) shm.push_back(std::move(inbound_shm_));
  }
  for (const auto& in : shm) in->hop->Close();
  shm.clear();  // joins their readers, which may still hand a frame to the relay threads
  {
    absl::MutexLock l(&relay_mu_);
    relay_stop_ = true;
  }
  // Each finishes the frame in hand (a step and a push, both under deadlines).
  for (std::thread& t : relay_threads_) t.join();
  std::shared_ptr<const Loaded> loaded;
  {
    absl::MutexLock l(&mu_);
    loaded = std::move(loaded_);
  }
  loaded.reset();  // joins the shadow checker's thread while metrics_ is alive
  std::vector<std::pair<std::thread, std::shared_ptr<InboundNccl>>> joins;
  {
    absl::MutexLock l(&mu_);
    joins = std::move(accept_threads_);
  }
  // Each ends by its NcclAccept deadline (NcclLink::Connect gives up then).
  for (auto& [thread, inbound] : joins) thread.join();
}

double WorkerService::MeasuredBandwidth() {
  // Measured once, on first use: 64 MiB is well above any last-level cache yet quick.
  absl::MutexLock l(&bandwidth_mu_);
  if (bandwidth_ == 0) {
    cpu::BandwidthProbe probe(64 << 20);
    bandwidth_ = probe.Measure(3);
  }
  return bandwidth_;
}

grpc::Status WorkerService::CheckAuth(const grpc::ServerContext* ctx) const {
  if (options_.auth_token.empty()) return grpc::Status::OK;
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  const std::string want = "Bearer " + options_.auth_token;
  bool ok = false;
  if (it != md.end() && it->second.size() == want.size()) {
    unsigned char d = 0;  // constant time: no early exit on the first wrong byte
    for (size_t i = 0; i < want.size(); ++i) d |= static_cast<unsigned char>(it->second.data()[i] ^ want[i]);
    ok = d == 0;
  }
  if (ok) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      absl::StrCat(HopName(), ": caller ", ctx->peer(),
                                   it == md.end() ? " sent no ring auth token" : " sent a wrong ring auth token"));
}

void WorkerService::SetListenAddress(std::string address) {
  absl::MutexLock l(&mu_);
  listen_address_ = std::move(address);
}

std::string WorkerService::HopName() const {
  absl::MutexLock l(&mu_);
  return HopNameLocked();
}

std::string WorkerService::HopNameLocked() const {
  const int idx = loaded_ ? loaded_->request.stage_index() : -1;
  return absl::StrCat("stage ", idx, " (", listen_address_, ")");
}

void WorkerService::MaybeCorrupt(pb::ActivationFrame* f) {
  if (options_.TEST_corrupt_frame == 0) return;
  bool corrupt = false;
  {
    absl::MutexLock l(&mu_);
    corrupt = ++frames_sent_ == options_.TEST_corrupt_frame;
  }
  // Flip a bit after the checksum was computed, as a bad NIC or memory would.
  if (corrupt && !f->payload().empty()) (*f->mutable_payload())[0] ^= 0x01;
}

void WorkerService::Record(bool sent, const pb::ActivationFrame& f, const std::string& peer) {
  const int64_t micros = absl::ToUnixMicros(absl::Now());
  absl::MutexLock l(&mu_);
  if (events_.empty()) events_.resize(kMaxEvents);
  EventSlot& e = events_[events_recorded_++ % static_cast<int64_t>(events_.size())];
  e.sent = sent;
  e.sequence_id = f.sequence_id();
  e.step = f.step();
  e.payload_bytes = static_cast<int64_t>(f.payload().size());
  e.peer = peer;
  e.unix_micros = micros;
}

grpc::Status WorkerService::Describe(grpc::ServerContext* ctx, const pb::DescribeRequest* req,
                                     pb::DescribeResponse* resp) {
  if (auto a = CheckAuth(ctx); !a.ok()) return a;
  resp->set_backend(options_.device);
  resp->add_devices(options_.device);
  // Where a stage would go: the GPU's memory for a CUDA worker.
  const int64_t mem_free = CacheMemoryFreeBytes(options_.device);
  resp->set_memory_free_bytes(mem_free);
  metrics_->SetMemoryFree(mem_free);
  resp->set_tokens_per_second(metrics_->TokensPerSecond());
  resp->set_memory_bandwidth_bytes_per_s(MeasuredBandwidth());
  resp->set_build_version(RING_BUILD_VERSION);
  resp->set_host_id(HostId());
  {
    auto [next, prev] = Transports();
    resp->set_next_transport(std::move(next));
    resp->set_prev_transport(std::move(prev));
  }
  if (attestation_) *resp->mutable_attestation() = *attestation_;
  {
    std::shared_ptr<const Loaded> loaded;
    {
      absl::MutexLock l(&mu_);
      loaded = loaded_;
    }
    if (loaded && loaded->shadow) *resp->mutable_shadow() = loaded->shadow->Stats();
    resp->set_degraded_reason(DegradedReason());
  }
#if defined(__x86_64__)
  resp->add_compiled_archs("x86_64");
#elif defined(__aarch64__)
  resp->add_compiled_archs("aarch64");
#endif
  std::function<pb::CoordinatorRegistration()> registration;
  {
    absl::MutexLock l(&mu_);
    resp->set_checksum_failures(checksum_failures_);
    resp->set_last_error(last_error_);
    resp->set_last_error_unix_seconds(last_error_unix_seconds_);
    resp->set_metrics_address(metrics_address_);
    if (loaded_) {
      resp->set_loaded(true);
      *resp->mutable_model() = loaded_->info;
      resp->set_layer_begin(loaded_->stage->range().begin);
      resp->set_layer_end(loaded_->stage->range().end);
      resp->set_epoch(loaded_->epoch);
      resp->set_kv_cache_bytes(kv_bytes_);
      resp->set_kv_cache_budget_bytes(loaded_->kv_budget);
      resp->set_kv_cache_free_bytes(std::max<int64_t>(0, loaded_->kv_budget - kv_bytes_));
    }
    registration = registration_;
  }
  // Outside mu_: the source takes the registration's own lock.
  if (registration) *resp->mutable_registration() = registration();
  if (!req->probe_model().empty()) {
    auto info = ProbeModel(options_.model_root, req->probe_model());
    if (!info.ok()) return ToGrpcStatus(info.status());
    *resp->mutable_probed() = *info;
    if (req->calibrate()) *resp->mutable_calibration() = Calibrate(req->probe_model(), *info);
  }
  return grpc::Status::OK;
}

pb::Calibration WorkerService::Calibrate(const std::string& model, const pb::ModelInfo& info) {
  {
    absl::MutexLock l(&calibration_mu_);
    if (auto it = calibrations_.find(info.model_hash()); it != calibrations_.end()) return it->second;
  }
  pb::Calibration c;
  // One at a time, and never beside a stage load: both take device memory.
  absl::MutexLock load_lock(&load_mu_);
  {
    absl::MutexLock l(&mu_);
    if (loaded_) {
      c.set_error(absl::StrCat("not measured: ", HopNameLocked(),
                               " is serving a stage (it calibrates before its first load)"));
      return c;
    }
  }
  auto dir = ResolveModelDir(options_.model_root, model);
  const int64_t layers = info.num_layers();
  const int64_t mid = (layers - 1) / 2;
  absl::StatusOr<double> layer = dir.ok() ? TimeDecodeStep(*dir, options_.device, mid, mid + 1) : dir.status();
  absl::StatusOr<double> last = layer;
  if (layer.ok() && mid != layers - 1) last = TimeDecodeStep(*dir, options_.device, layers - 1, layers);
  if (!layer.ok() || !last.ok()) {
    c.set_error(absl::StrCat("calibration forward failed: ", (layer.ok() ? last : layer).status().message()));
    SetLastError(absl::Status(absl::StatusCode::kInternal, c.error()));
    return c;  // not cached: a later Describe may succeed (e.g. once memory is free)
  }
  c.set_layer(mid);
  c.set_layer_seconds(*layer);
  c.set_head_seconds(mid == layers - 1 ? 0.0 : std::max(0.0, *last - *layer));
  std::cerr << "ring-worker: calibration forward of " << model << " on " << options_.device << ": layer " << mid
            << " " << 1e3 * c.layer_seconds() << " ms, LM head " << 1e3 * c.head_seconds() << " ms per decode step\n";
  absl::MutexLock l(&calibration_mu_);
  calibrations_[info.model_hash()] = c;
  return c;
}

grpc::Status WorkerService::LoadStage(grpc::ServerContext* ctx, const pb::LoadStageRequest* req,
                                      pb::LoadStageResponse* resp) {
  if (auto a = CheckAuth(ctx); !a.ok()) return a;
  absl::MutexLock load_lock(&load_mu_);
  if (req->formation() != 0) {
    if (req->coordinator_id() == formation_coordinator_ && req->formation() < formation_) {
      return grpc::Status(
          grpc::StatusCode::ABORTED,
          absl::StrCat("LoadStage of formation ", req->formation(), " from coordinator ",
                       req->coordinator_id(), " arrived after formation ", formation_,
                       ": a late message of an abandoned formation is refused"));
    }
    formation_coordinator_ = req->coordinator_id();
    formation_ = req->formation();
  }
  auto fill = [resp, req](const Loaded& l, bool reused) {
    resp->set_formation(req->formation());
    resp->set_epoch(l.epoch);
    resp->set_reused(reused);
    *resp->mutable_model() = l.info;
    resp->set_layer_begin(l.stage->range().begin);
    resp->set_layer_end(l.stage->range().end);
    resp->set_weight_bytes(l.stage->weight_bytes());
  };
  {
    absl::MutexLock l(&mu_);
    // The same stage under a new formation number is the same stage: keep it and its epoch.
    auto layout = [](pb::LoadStageRequest r) {
      r.clear_formation();
      r.clear_coordinator_id();
      return r.SerializeAsString();
    };
    if (loaded_ && layout(loaded_->request) == layout(*req)) {
      fill(*loaded_, /*reused=*/true);
      return grpc::Status::OK;
    }
  }
  auto dir = ResolveModelDir(options_.model_root, req->model());
  if (!dir.ok()) return ToGrpcStatus(dir.status());
  auto info = ProbeModel(options_.model_root, req->model());
  if (!info.ok()) return ToGrpcStatus(info.status());
  LoadOptions lo;
  lo.layers = {req->layer_begin(), req->layer_end()};
  {
    absl::StatusOr<DeviceSpec> device = ParseDevice(options_.device);
    if (!device.ok()) return ToGrpcStatus(device.status());
    lo.device = *device;
  }
  lo.all_logits = req->all_logits();
  lo.TEST_fault = options_.TEST_fault;
  {
    // Progress of the load, in the worker's status (FlightRecorder waiting_on, shown by
    // `ringctl status`) and as a bar when stderr is a terminal.
    const int64_t end = req->layer_end() < 0 ? info->num_layers() : req->layer_end();
    int64_t total = 0;
    for (int64_t l = req->layer_begin(); l < end && l < info->layer_bytes_size(); ++l) {
      total += info->layer_bytes(l);
    }
    if (req->layer_begin() == 0) total += info->first_stage_extra_bytes();
    if (end == info->num_layers()) total += info->last_stage_extra_bytes();
    const std::string what = absl::StrCat("loading ", req->model(), " layers [",
                                          req->layer_begin(), ", ", end, ")");
    const bool tty = isatty(STDERR_FILENO) == 1;
    auto last_percent = std::make_shared<int>(-1);
    lo.progress = [this, what, total, tty, last_percent](int64_t done) {
      const int percent = total > 0 ? static_cast<int>(std::min<int64_t>(100, done * 100 / total)) : 0;
      if (percent == *last_percent) return;
      *last_percent = percent;
      const std::string line = absl::StrFormat("%s: %d%% (%.2f of %.2f GiB)", what, percent,
                                               done / 1073741824.0, total / 1073741824.0);
      SetWaitingOn(line);
      if (tty) {
        const int filled = percent / 4;
        std::cerr << "\rring-worker: [" << std::string(filled, '#') << std::string(25 - filled, ' ')
                  << "] " << line << (percent >= 100 ? "\n" : "") << std::flush;
      }
    };
  }
  switch (req->act_dtype()) {
    case pb::DTYPE_UNSPECIFIED: break;
    case pb::DTYPE_F32: lo.act_dtype = cpu::ActDType::kF32; break;
    case pb::DTYPE_BF16: lo.act_dtype = cpu::ActDType::kBF16; break;
    default: return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "act_dtype: unknown value");
  }
  SetWaitingOn("loading ", req->model(), " layers [", req->layer_begin(), ", ", req->layer_end(), ")");
  auto stage = ring::LoadStage(*dir, lo);
  if (!stage.ok()) {
    SetWaitingOn("idle: last LoadStage failed");
    SetLastError(stage.status());
    return ToGrpcStatus(stage.status());
  }
  if (ctx->IsCancelled()) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "LoadStage cancelled or past its deadline");
  }
  auto loaded = std::make_shared<Loaded>();
  if (options_.shadow.rate > 0) {
    // The reference: the same layers on the CPU engine, which reads the memory-mapped
    // checkpoint in place, so it costs KV caches of mirrored sequences, not weights.
    LoadOptions ro = lo;
    ro.device = DeviceSpec{};
    ro.TEST_fault.clear();
    ro.progress = nullptr;  // the reference reads the same mapped file: nothing to report
    auto reference = ring::LoadStage(*dir, ro);
    if (!reference.ok()) {
      SetWaitingOn("idle: last LoadStage failed");
      return ToGrpcStatus(absl::Status(reference.status().code(),
                                       absl::StrCat("shadow reference on the CPU: ",
                                                    reference.status().message())));
    }
    std::unique_ptr<Stage> floor_reference;
    if (options_.shadow.noise_floor) {
      // Same mapped weights again, every matmul output jittered: the reference's distance
      // to itself, which a correct device cannot beat (shadow_checker.h).
      ro.TEST_jitter = options_.shadow.noise_jitter;
      auto f = ring::LoadStage(*dir, ro);
      if (!f.ok()) {
        SetWaitingOn("idle: last LoadStage failed");
        return ToGrpcStatus(absl::Status(
            f.status().code(), absl::StrCat("shadow noise-floor reference on the CPU: ",
                                            f.status().message())));
      }
      floor_reference = *std::move(f);
    }
    std::string name;
    {
      absl::MutexLock l(&mu_);
      name = absl::StrCat("stage ", req->stage_index(), " (", listen_address_, ")");
    }
    WorkerMetrics* metrics = metrics_;
    const bool degrade = options_.shadow.degrade;
    ShadowOptions so = options_.shadow;
    // On a GPU the CPU pool serves only reference work: keep it off the cores the serving
    // path needs (measured: +37% decode step time at rate 1 without this).
    so.idle_priority = so.idle_priority || lo.device.kind != DeviceSpec::Kind::kCpu;
    loaded->shadow = std::make_shared<ShadowChecker>(
        *std::move(reference), std::move(floor_reference), so, std::move(name),
        [metrics, degrade](int64_t layer, double rel, bool diverged) {
          metrics->ObserveShadow(layer, rel, diverged);
          if (diverged && degrade) metrics->SetDegraded(true);
        });
  }
  loaded->stage = std::shared_ptr<const Stage>(std::move(*stage));
  {
    WorkerMetrics* metrics = metrics_;
    loaded->batcher = std::make_unique<StepBatcher>(
        *loaded->stage, options_.max_batch_rows, options_.batch_gather,
        [metrics](int64_t steps, int64_t /*rows*/) { metrics->ObserveBatch(steps); });
  }
  loaded->request = *req;
  loaded->info = *info;
  if (options_.kv_cache_bytes > 0) {
    loaded->kv_budget = options_.kv_cache_bytes;
  } else {
    // Measured now that the weights are on the device. A previous stage, if any, is still
    // loaded (it goes once this one is in place), so the budget errs low by up to its size;
    // --kv-cache-bytes avoids that, and the CPU's MemAvailable counting the mapped
    // checkpoint's page cache as free.
    const int64_t free = CacheMemoryFreeBytes(options_.device);
    loaded->kv_budget = DefaultKvCacheBudget(free);
    std::cerr << "ring-worker: KV cache budget " << loaded->kv_budget << " bytes: " << free
              << " bytes free after the weights, less headroom (--kv-cache-bytes sets it)\n";
  }
  // Declared before the lock so that they go after it is released: dropping a link closes
  // its Relay stream and aborts its NCCL communicators.
  std::shared_ptr<LinkState> old_link;
  std::shared_ptr<InboundNccl> old_inbound;
  absl::MutexLock l(&mu_);
  // Degraded is sticky: a new stage on the same device does not make it trustworthy.
  if (loaded_ && loaded_->shadow && degraded_.empty()) degraded_ = loaded_->shadow->degraded_reason();
  loaded->epoch = next_epoch_++;
  loaded_ = loaded;
  old_link = std::move(link_);  // a closed ring is re-linked for the new epoch
  old_inbound = std::move(inbound_);
  sequences_.clear();  // caches of the old stage are meaningless for the new one
  kv_bytes_ = 0;
  waiting_on_ = "idle: waiting for Forward frames";
  metrics_->SetStage(req->model(), req->stage_index(),
                     loaded->stage->range().end - loaded->stage->range().begin, loaded->epoch);
  metrics_->SetKvCacheBudget(loaded->kv_budget);
  metrics_->SetKvCache(0, 0);
  metrics_->SetMemoryFree(MemAvailableBytes());
  fill(*loaded_, /*reused=*/false);
  return grpc::Status::OK;
}

grpc::Status WorkerService::VerifyStage(grpc::ServerContext* ctx, const pb::VerifyStageRequest* req,
                                        pb::VerifyStageResponse* resp) {
  if (auto a = CheckAuth(ctx); !a.ok()) return a;
  // One verify or load at a time: both hold a copy of layers on the device.
  absl::MutexLock load_lock(&load_mu_);
  const pb::LoadStageRequest& st = req->stage();
  auto dir = ResolveModelDir(options_.model_root, st.model());
  if (!dir.ok()) return ToGrpcStatus(dir.status());
  VerifyOptions vo;
  vo.model_dir = *dir;
  vo.layers = {st.layer_begin(), st.layer_end()};
  {
    absl::StatusOr<DeviceSpec> device = ParseDevice(options_.device);
    if (!device.ok()) return ToGrpcStatus(device.status());
    vo.device = *device;
  }
  switch (st.act_dtype()) {
    case pb::DTYPE_UNSPECIFIED: break;
    case pb::DTYPE_F32: vo.act_dtype = cpu::ActDType::kF32; break;
    case pb::DTYPE_BF16: vo.act_dtype = cpu::ActDType::kBF16; break;
    default: return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "act_dtype: unknown value");
  }
  vo.tolerance = req->tolerance() > 0 ? req->tolerance() : 0.01;
  vo.TEST_fault = options_.TEST_fault;
  for (const pb::ActivationFrame& f : req->inputs()) {
    absl::StatusOr<StageInput> in = DecodeStageInput(f);
    if (!in.ok()) return ToGrpcStatus(in.status());
    vo.inputs.push_back(*std::move(in));
  }
  if (vo.inputs.empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "VerifyStage: no input steps");
  }
  std::string name;
  {
    absl::MutexLock l(&mu_);
    name = absl::StrCat("stage ", st.stage_index(), " (", listen_address_, ")");
  }
  SetWaitingOn("admission verify of layers [", st.layer_begin(), ", ", st.layer_end(), ")");
  absl::StatusOr<VerifyReport> r = Verify(vo);
  SetWaitingOn("idle: waiting for Forward frames");
  if (!r.ok()) return ToGrpcStatus(r.status());
  resp->set_ok(r->ok);
  resp->set_diagnosis(r->diagnosis);
  resp->set_output_relative_difference(r->output.rel);
  double worst = 0;
  for (const LayerCheck& l : r->layers) worst = std::max(worst, l.diff.rel);
  resp->set_worst_layer_relative_difference(worst);
  resp->set_report(FormatVerifyReport(*r, /*all_ops=*/false));
  const pb::DType wire = st.act_dtype() == pb::DTYPE_UNSPECIFIED ? pb::DTYPE_F32 : st.act_dtype();
  for (size_t i = 0; i < r->outputs.size(); ++i) {
    pb::ActivationFrame* f = resp->add_outputs();
    f->set_step(i);
    f->set_sender(name);
    if (absl::Status e = EncodeStageOutput(r->outputs[i], wire, false, f); !e.ok()) {
      return ToGrpcStatus(e);
    }
  }
  if (!r->ok) {
    absl::MutexLock l(&mu_);
    if (degraded_.empty()) degraded_ = absl::StrCat(name, ": admission verify failed: ", r->diagnosis);
    metrics_->SetDegraded(true);
    std::cerr << "ring-worker: " << degraded_ << "\n";
  }
  return grpc::Status::OK;
}

absl::StatusOr<pb::ActivationFrame> WorkerService::Step(const pb::ActivationFrame& in,
                                                        const std::string& peer, absl::Time received) {
  if (step_stats_ != nullptr) t_step_entered_at = absl::Now();
  // Names the hop in errors; made only when one is returned (hop() takes mu_, hop_locked
  // is for under it).
  const std::string& from = in.sender().empty() ? peer : in.sender();
  auto hop = [&] { return absl::StrCat(HopName(), " <- ", from); };
  std::shared_ptr<const Loaded> loaded;
  std::shared_ptr<SequenceState> state;
  {
    absl::MutexLock l(&mu_);
    auto hop_locked = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return absl::StrCat(HopNameLocked(), " <- ", from); };
    loaded = loaded_;
    if (!loaded) return absl::FailedPreconditionError(absl::StrCat(hop_locked(), ": no stage loaded"));
    if (in.epoch() != loaded->epoch) {
      return absl::FailedPreconditionError(absl::StrCat(
          hop_locked(), ": frame is for epoch ", in.epoch(), " but the loaded stage is epoch ", loaded->epoch));
    }
    if (in.nccl_payload_bytes() != 0) {
      // Only Relay receives NCCL payloads; elsewhere the checksum would blame the wire.
      return absl::InvalidArgumentError(absl::StrCat(
          hop_locked(), ": frame's payload was sent over NCCL, which only a closed ring's Relay receives"));
    }
    auto it = sequences_.find(in.sequence_id());
    if (it == sequences_.end() && in.relay() != pb::RELAY_ACTION_UNSPECIFIED && in.step() != 0) {
      // A closed-ring frame still going round for a sequence that was released (cancelled
      // or finished): nothing to compute it for.
      return absl::NotFoundError(absl::StrCat(hop_locked(), ": sequence ", in.sequence_id(), " step ",
                                              in.step(), " is not live here (released)"));
    }
    auto& slot = it != sequences_.end() ? it->second : sequences_[in.sequence_id()];
    if (!slot) slot = std::make_shared<SequenceState>();
    state = slot;
  }
  const absl::Time looked_up = step_stats_ != nullptr ? absl::Now() : absl::InfinitePast();
  auto input = DecodeStageInput(in);
  const absl::Time decoded = step_stats_ != nullptr ? absl::Now() : absl::InfinitePast();
  if (!input.ok()) {
    if (absl::IsDataLoss(input.status())) {
      metrics_->CountChecksumFailure(PeerLabel(in));
      absl::MutexLock l(&mu_);
      ++checksum_failures_;
    }
    return absl::Status(input.status().code(), absl::StrCat(hop(), ": ", input.status().message()));
  }
  absl::MutexLock seq_lock(&state->mu);
  if (!state->seq) {
    if (std::string why = DegradedReason(); !why.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(hop(), ": worker is degraded and takes no new sequences: ", why));
    }
  }
  if (!state->seq) state->seq = loaded->stage->NewSequence();
  if (static_cast<int64_t>(in.step()) != state->next_step ||
      in.first_position() != state->seq->position()) {
    return absl::FailedPreconditionError(absl::StrCat(
        hop(), ": sequence ", in.sequence_id(), " expected step ", state->next_step, " at position ",
        state->seq->position(), ", got step ", in.step(), " at position ", in.first_position()));
  }
  const int64_t rows = std::max<int64_t>(1, in.rows());
  // Every cache of the stage grows by one row per token: refuse a step that would not fit
  // the budget before it runs, rather than fail an allocation (or the machine) mid-step.
  RING_RETURN_IF_ERROR(ReserveCache(loaded.get(), state.get(),
                                    rows * state->seq->cache_bytes_per_token(), hop, in));
  // The last stage of a closed ring samples (RELAY_ACTION_SAMPLE) with the sequence's
  // sampler, made from the first frame that carried the request's sampling.
  const bool relay_last = in.relay() != pb::RELAY_ACTION_UNSPECIFIED && loaded->stage->is_last();
  if (relay_last) {
    if (in.has_sampling()) {
      state->sampler = std::make_unique<Sampler>(FromSamplingSpec(in.sampling()));
      RING_RETURN_IF_ERROR(
          state->sampler->Restore({in.sampling().generated().begin(), in.sampling().generated().end()}));
    }
    if (state->sampler == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          hop(), ": sequence ", in.sequence_id(), " has no sampling (its first frame carried none)"));
    }
    // Where the logits are (the GPU of a CUDA stage): the argmax, or the whole sampling
    // with the uniform drawn here; only the token leaves the device.
    if (in.relay() == pb::RELAY_ACTION_ACK || state->sampler->params().ArgmaxOnly()) {
      input->argmax_only = true;
    } else {
      input->sample = state->sampler->NextRequest();
    }
  }
  SetWaitingOn("computing sequence ", in.sequence_id(), " step ", in.step());
  input->capture_layers = loaded->shadow && loaded->shadow->Sampled(in.sequence_id());
  const absl::Time step_start = absl::Now();
  int64_t batch_steps = 1;
  auto out = loaded->batcher->Run(*state->seq, *input, in.batch_size(), &batch_steps);
  const absl::Time step_end = absl::Now();
  const double step_seconds = absl::ToDoubleSeconds(step_end - step_start);
  SetWaitingOn("idle: waiting for Forward frames");
  // Settles the reservation: the actual growth on success, none after a failed step.
  AccountCache(loaded.get(), state.get(), state->seq->cache_bytes());
  if (!out.ok()) return absl::Status(out.status().code(), absl::StrCat(hop(), ": ", out.status().message()));
  if (input->capture_layers) {
    loaded->shadow->Observe(in.sequence_id(), *input, std::move(out->layer_hidden));
  }
  ++state->next_step;
  // One row after the first position is a decode step; anything else is (chunked) prefill.
  metrics_->ObserveStep(rows == 1 && in.first_position() > 0 ? WorkerMetrics::Phase::kDecode
                                                             : WorkerMetrics::Phase::kPrefill,
                        step_seconds, rows);
  {
    absl::MutexLock l(&mu_);
    if (++steps_computed_ == options_.TEST_nan_at_step) {
      std::vector<float>& v = out->logits.empty() ? out->hidden : out->logits;
      if (!v.empty()) v[v.size() / 2] = std::numeric_limits<float>::quiet_NaN();
    }
  }

  pb::ActivationFrame reply;
  reply.set_sequence_id(in.sequence_id());
  reply.set_step(in.step());
  reply.set_epoch(in.epoch());
  reply.set_first_position(in.first_position());
  reply.set_sender(HopName());
  const pb::DType wire = in.reply_dtype() == pb::DTYPE_UNSPECIFIED ? pb::DTYPE_F32 : in.reply_dtype();
  if (relay_last) {
    std::optional<SampledToken> token;
    // The final-normed rows the head read: fingerprinted so NaN/Inf still fail here.
    const std::vector<float>& checked = out->hidden;
    const int64_t checked_rows = static_cast<int64_t>(checked.size()) / loaded->stage->config().hidden_size;
    if (in.relay() == pb::RELAY_ACTION_SAMPLE) {
      if (input->sample) {
        if (!out->sampled) return absl::InternalError(absl::StrCat(hop(), ": no sampled token from the head"));
        token = std::move(out->sampled);
      } else {
        if (out->argmax.empty()) return absl::InternalError(absl::StrCat(hop(), ": no token from the head"));
        token.emplace();
        token->id = out->argmax.back();
      }
      state->sampler->Accept(token->id);
    }
    RING_RETURN_IF_ERROR(EncodeSampled(token, checked, std::max<int64_t>(1, checked_rows), &reply));
  } else {
    RING_RETURN_IF_ERROR(EncodeStageOutput(*out, wire, loaded->request.all_logits(), &reply));
    if (in.relay() != pb::RELAY_ACTION_UNSPECIFIED) {
      // Passed on round the ring: the last stage needs both.
      reply.set_relay(in.relay());
      if (in.has_sampling()) *reply.mutable_sampling() = in.sampling();
      reply.set_reply_dtype(in.reply_dtype());
    }
  }
  const absl::Time encoded = step_stats_ != nullptr ? absl::Now() : absl::InfinitePast();
  // NaN/Inf never leave the stage that made them: the step fails here, naming the stage and
  // its layers, instead of turning into "!!!!" three machines later.
  const pb::Fingerprint& fp = reply.fingerprint();
  int64_t values = reply.shape_size() > 0 ? 1 : 0;
  for (int64_t d : reply.shape()) values *= d;
  const int64_t finite = values - fp.nan_count() - fp.inf_count();
  metrics_->ObserveActivation(finite > 0 ? fp.l2() / std::sqrt(static_cast<double>(finite)) : 0,
                              fp.absmax(), fp.nan_count(), fp.inf_count());
  if (fp.nan_count() > 0 || fp.inf_count() > 0) {
    return absl::DataLossError(absl::StrCat(
        HopName(), " (layers ", loaded->stage->range().begin, "..", loaded->stage->range().end,
        ") produced ", fp.nan_count(), " NaN and ", fp.inf_count(), " Inf values in its ",
        out->logits.empty() ? "hidden-state" : "logits", " output (sequence ", in.sequence_id(),
        " step ", in.step(), ")"));
  }
  if (in.relay() != pb::RELAY_ACTION_UNSPECIFIED) {
    reply.set_batch_size(static_cast<uint32_t>(batch_steps));
    *reply.mutable_trace() = in.trace();
    pb::StageTrace* t = reply.add_trace();
    t->set_stage(loaded->request.stage_index());
    const absl::Time now = absl::Now();
    t->set_worker_seconds(absl::ToDoubleSeconds(now - received));
    t->set_compute_seconds(step_seconds);
    t->set_received_unix_nanos(absl::ToUnixNanos(received));
    t->set_sent_unix_nanos(absl::ToUnixNanos(now));
    t->set_rms(finite > 0 ? fp.l2() / std::sqrt(static_cast<double>(finite)) : 0);
    t->set_absmax(fp.absmax());
    if (step_stats_ != nullptr) {
      step_stats_->Count(in);
      step_stats_->Add(in, StepStats::kDecode, received, decoded);
      step_stats_->Add(in, StepStats::kPrepare, decoded, step_start);
      step_stats_->Add(in, StepStats::kForward, step_start, step_end);
      step_stats_->Add(in, StepStats::kEncode, step_end, now);
      step_stats_->Add(in, StepStats::kEncodeCodecPart, step_end, encoded);
      step_stats_->Add(in, StepStats::kEncodeChecksPart, encoded, now);
      // The parts of the decode segment, when this thread also read the frame.
      if (t_parsed_at >= received && t_parsed_at <= t_step_entered_at) {
        step_stats_->split_steps[StepStats::DecodeStep(in)].fetch_add(1, std::memory_order_relaxed);
        step_stats_->Add(in, StepStats::kParsePart, received, t_parsed_at);
        step_stats_->Add(in, StepStats::kToStepPart, t_parsed_at, t_step_entered_at);
        step_stats_->Add(in, StepStats::kLookupPart, t_step_entered_at, looked_up);
        step_stats_->Add(in, StepStats::kCodecPart, looked_up, decoded);
      }
      t_parsed_at = absl::InfinitePast();
    }
  }
  return reply;
}

grpc::Status WorkerService::Forward(
    grpc::ServerContext* ctx,
    grpc::ServerReaderWriter<pb::ActivationFrame, pb::ActivationFrame>* stream) {
  if (auto a = CheckAuth(ctx); !a.ok()) return a;
  const std::string peer = ctx->peer();
  pb::ActivationFrame in;
  while (stream->Read(&in)) {
    // From here to the reply's Write is this worker's time on the frame; the coordinator
    // takes it out of its round trip to see the time in transport.
    const auto received = std::chrono::steady_clock::now();
    Record(/*sent=*/false, in, peer);
    const std::string peer_label = PeerLabel(in);
    metrics_->CountFrame(/*sent=*/false, peer_label, static_cast<int64_t>(in.ByteSizeLong()));
    if (ctx->IsCancelled()) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "Forward cancelled or past its deadline");
    }
    auto reply = Step(in, peer);
    if (!reply.ok()) {
      SetLastError(reply.status());
      return ToGrpcStatus(reply.status());
    }
    MaybeCorrupt(&*reply);
    Record(/*sent=*/true, *reply, peer);
    reply->set_worker_seconds(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - received).count());
    metrics_->CountFrame(/*sent=*/true, peer_label, static_cast<int64_t>(reply->ByteSizeLong()));
    if (!stream->Write(*reply)) break;  // the client went away; its status says why
  }
  return grpc::Status::OK;
}

grpc::Status WorkerService::Release(grpc::ServerContext* ctx, const pb::ReleaseRequest* req,
                                    pb::ReleaseResponse* resp) {
  if (auto a = CheckAuth(ctx); !a.ok()) return a;
  std::shared_ptr<SequenceState> state;
  {
    absl::MutexLock l(&mu_);
    if (loaded_ && loaded_->shadow) loaded_->shadow->Release(req->sequence_id());
    auto it = sequences_.find(req->sequence_id());
    if (it == sequences_.end()) return grpc::Status::OK;
    state = std::move(it->second);
    sequences_.erase(it);
    kv_bytes_ -= state->accounted_bytes;
    state->accounted_bytes = 0;
    metrics_->SetKvCache(kv_bytes_, static_cast<int64_t>(sequences_.size()));
  }
  absl::MutexLock seq_lock(&state->mu);
  resp->set_existed(true);
  resp->set_freed_bytes(state->seq ? state->seq->cache_bytes() : 0);
  state->seq.reset();
  return grpc::Status::OK;
}

grpc::Status WorkerService::FlightRecorder(grpc::ServerContext* ctx, const pb::FlightRecorderRequest*,
                                           pb::FlightRecorderResponse* resp) {
  if (auto a = CheckAuth(ctx); !a.ok()) return a;
  std::map<std::string, std::shared_ptr<SequenceState>> seqs;
  {
    absl::MutexLock l(&mu_);
    const int64_t n = static_cast<int64_t>(events_.size());
    for (int64_t i = std::max<int64_t>(0, events_recorded_ - n); i < events_recorded_; ++i) {
      const EventSlot& slot = events_[i % n];
      pb::FrameEvent* e = resp->add_events();
      e->set_sent(slot.sent);
      e->set_sequence_id(slot.sequence_id);
      e->set_step(slot.step);
      e->set_payload_bytes(slot.payload_bytes);
      e->set_peer(slot.peer);
      e->set_unix_micros(slot.unix_micros);
    }
    resp->set_waiting_on(waiting_on_);
    resp->set_checksum_failures(checksum_failures_);
    seqs = sequences_;
  }
  {
    auto [next, prev] = Transports();
    resp->set_next_transport(std::move(next));
    resp->set_prev_transport(std::move(prev));
  }
  for (const auto& [id, state] : seqs) {
    // A sequence mid-step is reported without its cache rather than waiting for it.
    pb::SequenceProgress* p = resp->add_sequences();
    p->set_sequence_id(id);
    if (state->mu.TryLock()) {
      p->set_last_step(state->next_step > 0 ? state->next_step - 1 : 0);
      if (state->seq) {
        p->set_position(state->seq->position());
        p->set_cache_bytes(state->seq->cache_bytes());
      }
      state->mu.Unlock();
    }
  }
  return grpc::Status::OK;
}

WorkerService::LinkState::~LinkState() = default;

WorkerService::InboundShm::~InboundShm() {
  if (hop != nullptr) hop->Close();
  if (reader.joinable()) reader.join();
}

std::shared_ptr<WorkerService::LinkState> WorkerService::CurrentLink() const {
  absl::MutexLock l(&mu_);
  return link_;
}

grpc::Status WorkerService::Link(grpc::ServerContext* ctx, const pb::LinkRequest* req,
                                 pb::LinkResponse* resp) {
  if (auto a = CheckAuth(ctx); !a.ok()) return a;
  absl::MutexLock load_lock(&load_mu_);
  // Link is the second half of the formation barrier: the same numbering as LoadStage.
  if (req->formation() != 0 && req->coordinator_id() == formation_coordinator_ &&
      req->formation() < formation_) {
    return grpc::Status(grpc::StatusCode::ABORTED,
                        absl::StrCat("Link of formation ", req->formation(), " arrived after formation ",
                                     formation_, ": a late message of an abandoned formation is refused"));
  }
  if (req->ring_size() < 1 || req->stage_index() < 0 || req->stage_index() >= req->ring_size()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("Link: stage ", req->stage_index(), " of a ring of ", req->ring_size()));
  }
  if (req->ring_size() > 1 && req->next_address().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "Link: no next_address");
  }
  auto stale = [this, req]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> grpc::Status {
    if (loaded_ && loaded_->epoch == req->epoch()) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat(HopNameLocked(), ": Link for epoch ", req->epoch(), " but the loaded stage is ",
                                     loaded_ ? absl::StrCat("epoch ", loaded_->epoch) : "none"));
  };
  {
    // Checked before the NCCL set-up too, which is not worth doing for a refused Link.
    absl::MutexLock l(&mu_);
    if (grpc::Status s = stale(); !s.ok()) return s;
  }
  auto link = std::make_shared<LinkState>();
  link->epoch = req->epoch();
  link->stage_index = req->stage_index();
  link->ring_size = req->ring_size();
  link->next_epoch = req->next_epoch();
  std::string transport;
  if (req->ring_size() > 1) {
    StageClientOptions co;
    co.call_timeout = options_.relay_timeout;
    co.auth_token = options_.auth_token;
    co.tls_ca = options_.peer_tls_ca;
    co.tls_cert = options_.peer_tls_cert;
    co.tls_key = options_.peer_tls_key;
    const int next_index = (req->stage_index() + 1) % req->ring_size();
    link->next_client = std::make_unique<StageClient>(req->next_address(), next_index, co);
    link->next_name = link->next_client->name();
    link->next = link->next_client->OpenRelay();
    // Both ends must have joined well before the coordinator gives up on this call.
    absl::Time deadline = absl::Now() + options_.nccl_connect_timeout;
    if (ctx->deadline() != std::chrono::system_clock::time_point::max()) {
      deadline = std::min(deadline, absl::FromChrono(ctx->deadline()) - absl::Seconds(1));
    }
    const std::string frames = req->shm() ? LinkShm(*req, link.get()) : "";
    transport = LinkNccl(*req, deadline, link.get());
    if (!frames.empty()) transport = req->nccl() ? absl::StrCat(frames, "; large payloads: ", transport) : frames;
    std::cerr << "ring-worker: stage " << req->stage_index() << " -> " << link->next_name
              << ": next: " << transport << "\n";
    absl::MutexLock l(&link->transport_mu);
    link->transport = transport;
  }
  absl::MutexLock l(&mu_);
  if (grpc::Status s = stale(); !s.ok()) return s;
  link_.swap(link);  // the old link (its Relay stream, its NCCL hop) goes after the lock is released
  resp->set_next_transport(std::move(transport));
  return grpc::Status::OK;
}

std::string WorkerService::LinkNccl(const pb::LinkRequest& req, absl::Time deadline, LinkState* link) {
  if (!req.nccl()) {
    return req.transport_reason().empty() ? "grpc" : absl::StrCat("grpc (", req.transport_reason(), ")");
  }
  if (!options_.nccl) return "grpc (this worker was started with --no-nccl)";
  absl::StatusOr<DeviceSpec> device = ParseDevice(options_.device);
  if (!device.ok() || device->kind != DeviceSpec::Kind::kCuda) {
    return absl::StrCat("grpc (this worker runs on ", options_.device, ", NCCL needs a CUDA device)");
  }
  absl::StatusOr<std::string> id = NcclHop::NewId();
  if (!id.ok()) return absl::StrCat("grpc (NCCL unavailable: ", id.status().message(), ")");
  pb::NcclAcceptRequest accept;
  accept.set_id(*id);
  accept.set_sender_stage(req.stage_index());
  accept.set_sender(HopName());
  accept.set_sender_device(options_.device);
  accept.set_sender_host_id(HostId());
  accept.set_epoch(req.next_epoch());
  accept.set_timeout_ms(std::max<int64_t>(1, absl::ToInt64Milliseconds(deadline - absl::Now())));
  absl::StatusOr<pb::NcclAcceptResponse> accepted = link->next_client->NcclAccept(accept);
  if (!accepted.ok()) {
    return absl::StrCat("grpc (the next stage refused NCCL: ", accepted.status().message(), ")");
  }
  absl::StatusOr<std::unique_ptr<NcclHop>> hop =
      NcclHop::Connect(*id, {.device = device->ordinal, .rank = 0, .peer = link->next_name}, deadline);
  if (!hop.ok()) return absl::StrCat("grpc (NCCL link failed: ", hop.status().message(), ")");
  link->nccl = *std::move(hop);
  return absl::StrCat("nccl (", options_.device, " -> ", accepted->device(), ")");
}

std::string WorkerService::LinkShm(const pb::LinkRequest& req, LinkState* link) {
  if (!options_.shm) return "grpc (this worker was started with --no-shm)";
  absl::StatusOr<std::unique_ptr<ShmHop>> hop = ShmHop::Create(
      {.capacity = options_.shm_capacity, .spin = options_.shm_poll, .peer = link->next_name});
  if (!hop.ok()) return absl::StrCat("grpc (shared memory unavailable: ", hop.status().message(), ")");
  pb::ShmAcceptRequest accept;
  accept.set_name((*hop)->name());
  accept.set_sender_stage(req.stage_index());
  accept.set_sender(HopName());
  accept.set_sender_host_id(HostId());
  accept.set_epoch(req.next_epoch());
  const absl::Status accepted = link->next_client->ShmAccept(accept);
  (*hop)->Unlink();  // mapped by both ends now, or refused: the name is not needed either way
  if (!accepted.ok()) {
    return absl::StrCat("grpc (the next stage refused shared memory: ", accepted.message(), ")");
  }
  link->shm = *std::move(hop);
  return "shm";
}

grpc::Status WorkerService::ShmAccept(grpc::ServerContext* ctx, const pb::ShmAcceptRequest* req,
                                      pb::ShmAcceptResponse* resp) {
  if (auto a = CheckAuth(ctx); !a.ok()) return a;
  // No load_mu_, as in NcclAccept: the sender calls this from inside its Link.
  const std::string hop = absl::StrCat(HopName(), ": shared-memory hop from ", req->sender());
  auto refuse = [&hop](grpc::StatusCode code, absl::string_view why) {
    return grpc::Status(code, absl::StrCat(hop, " refused: ", why));
  };
  if (!options_.shm) return refuse(grpc::StatusCode::FAILED_PRECONDITION, "started with --no-shm");
  if (req->sender_host_id() != HostId()) {
    return refuse(grpc::StatusCode::FAILED_PRECONDITION,
                  absl::StrCat("the sender is on host '", req->sender_host_id(), "', this worker on '",
                               HostId(), "'"));
  }
  auto stale = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> std::optional<grpc::Status> {
    if (loaded_ && loaded_->epoch == req->epoch()) return std::nullopt;
    return refuse(grpc::StatusCode::FAILED_PRECONDITION,
                  absl::StrCat("it is for epoch ", req->epoch(), " but the loaded stage is ",
                               loaded_ ? absl::StrCat("epoch ", loaded_->epoch) : "none"));
  };
  {
    absl::MutexLock l(&mu_);
    if (std::optional<grpc::Status> s = stale()) return *s;
  }
  absl::StatusOr<std::unique_ptr<ShmHop>> opened =
      ShmHop::Open(req->name(), {.spin = options_.shm_poll, .peer = req->sender()});
  if (!opened.ok()) {
    return refuse(static_cast<grpc::StatusCode>(opened.status().code()), opened.status().message());
  }
  auto in = std::make_shared<InboundShm>();
  in->epoch = req->epoch();
  in->sender = req->sender();
  in->hop = *std::move(opened);
  std::vector<std::shared_ptr<InboundShm>> finished;  // joined after the lock is released
  {
    absl::MutexLock l(&mu_);
    if (std::optional<grpc::Status> s = stale()) return *s;  // a LoadStage meanwhile
    if (inbound_shm_ != nullptr) {
      inbound_shm_->hop->Close();  // its reader ends after the frame in hand
      retired_shm_.push_back(std::move(inbound_shm_));
    }
    inbound_shm_ = in;
    in->reader = std::thread([this, p = in.get()] { ShmReadLoop(p); });
    for (auto it = retired_shm_.begin(); it != retired_shm_.end();) {
      if ((*it)->done.load()) {
        finished.push_back(std::move(*it));
        it = retired_shm_.erase(it);
      } else {
        ++it;
      }
    }
  }
  return grpc::Status::OK;
}

void WorkerService::ShmReadLoop(InboundShm* in) {
  const std::string peer = absl::StrCat("shm:", in->sender);
  std::string bytes;  // one buffer for every message of the hop
  while (true) {
    // No idle deadline: the hop's waits are sliced and end on Close (a replaced hop, the
    // destructor), on the sender closing its end, and when its process exits.
    if (absl::Status s = in->hop->ReceiveInto(&bytes, absl::InfiniteFuture(), options_.relay_timeout); !s.ok()) {
      // Closed by either end is how a hop ends; anything else is worth reporting.
      if (!absl::IsCancelled(s) && !absl::IsFailedPrecondition(s)) {
        SetLastError(absl::Status(s.code(), absl::StrCat(HopName(), ": ", s.message())));
      }
      break;
    }
    const absl::Time received = absl::Now();
    if (step_stats_ != nullptr) t_faults_at_read = StepStats::ThreadFaults();
    pb::ActivationFrame f;
    if (!f.ParseFromString(bytes)) {
      SetLastError(absl::DataLossError(absl::StrCat(HopName(), ": a ", bytes.size(), "-byte message from ",
                                                    in->sender, " over shared memory is not a frame")));
      break;
    }
    Record(/*sent=*/false, f, peer);
    metrics_->CountFrame(/*sent=*/false, PeerLabel(f), static_cast<int64_t>(bytes.size()));
    if (step_stats_ != nullptr) t_parsed_at = absl::Now();
    KeepSmall(&bytes);
    HandleRelayed(std::move(f), peer, received);
  }
  in->hop->Close();  // the sender's next frame then fails over to the Relay stream
  in->done.store(true);
}

grpc::Status WorkerService::NcclAccept(grpc::ServerContext* ctx, const pb::NcclAcceptRequest* req,
                                       pb::NcclAcceptResponse* resp) {
  if (auto a = CheckAuth(ctx); !a.ok()) return a;
  // No load_mu_: the sender calls this from inside its own Link, which holds its load_mu_,
  // and this worker may at the same time be in its Link calling that sender's NcclAccept.
  const std::string hop = absl::StrCat(HopName(), ": NCCL link from ", req->sender());
  auto refuse = [&hop](grpc::StatusCode code, absl::string_view why) {
    return grpc::Status(code, absl::StrCat(hop, " refused: ", why));
  };
  if (!options_.nccl) return refuse(grpc::StatusCode::FAILED_PRECONDITION, "started with --no-nccl");
  absl::StatusOr<DeviceSpec> device = ParseDevice(options_.device);
  if (!device.ok() || device->kind != DeviceSpec::Kind::kCuda) {
    return refuse(grpc::StatusCode::FAILED_PRECONDITION, absl::StrCat("this worker runs on ", options_.device));
  }
  if (req->sender_host_id() != HostId()) {
    return refuse(grpc::StatusCode::FAILED_PRECONDITION,
                  absl::StrCat("the sender is on host '", req->sender_host_id(), "', this worker on '",
                               HostId(), "'"));
  }
  if (req->timeout_ms() <= 0 || req->id().empty()) {
    return refuse(grpc::StatusCode::INVALID_ARGUMENT, "no link id or no timeout");
  }
  if (absl::Status nccl = NcclHop::Available(); !nccl.ok()) {
    return refuse(grpc::StatusCode::UNAVAILABLE, nccl.message());
  }
  const absl::Time deadline = absl::Now() + absl::Milliseconds(req->timeout_ms());
  auto inbound = std::make_shared<InboundNccl>();
  inbound->epoch = req->epoch();
  inbound->sender = req->sender();
  inbound->sender_device = req->sender_device();
  std::shared_ptr<InboundNccl> replaced;  // aborted after the lock is released
  std::vector<std::thread> finished;
  {
    absl::MutexLock l(&mu_);
    if (!loaded_ || loaded_->epoch != req->epoch()) {
      return refuse(grpc::StatusCode::FAILED_PRECONDITION,
                    absl::StrCat("it is for epoch ", req->epoch(), " but the loaded stage is ",
                                 loaded_ ? absl::StrCat("epoch ", loaded_->epoch) : "none"));
    }
    replaced = std::move(inbound_);
    inbound_ = inbound;
    for (auto it = accept_threads_.begin(); it != accept_threads_.end();) {
      absl::MutexLock il(&it->second->mu);
      if (it->second->pending) {
        ++it;
      } else {
        finished.push_back(std::move(it->first));
        it = accept_threads_.erase(it);
      }
    }
    NcclHopOptions o{.device = device->ordinal, .rank = 1, .peer = req->sender()};
    accept_threads_.emplace_back(
        std::thread([inbound, id = req->id(), o, deadline] {
          absl::StatusOr<std::unique_ptr<NcclHop>> joined = NcclHop::Connect(id, o, deadline);
          if (!joined.ok()) {
            std::cerr << "ring-worker: NCCL link from " << o.peer << " failed: " << joined.status() << "\n";
          }
          absl::MutexLock il(&inbound->mu);
          inbound->pending = false;
          if (joined.ok()) {
            inbound->hop = *std::move(joined);
          } else {
            inbound->status = joined.status();
          }
        }),
        inbound);
  }
  for (std::thread& t : finished) t.join();  // past their last statement already
  resp->set_device(options_.device);
  return grpc::Status::OK;
}

void WorkerService::SetHopTransport(const LinkState& link, bool frames, const std::string& what) {
  // The string is "FRAMES[; large payloads: PAYLOADS]" (DescribeResponse.next_transport);
  // without the second part, one transport carries both.
  constexpr char kPayloads[] = "; large payloads: ";
  absl::MutexLock l(&link.transport_mu);
  const size_t split = link.transport.find(kPayloads);
  if (split == std::string::npos) {
    link.transport = what;
  } else if (frames) {
    link.transport = absl::StrCat(what, link.transport.substr(split));
  } else {
    link.transport = absl::StrCat(link.transport.substr(0, split), kPayloads, what);
  }
}

std::pair<std::string, std::string> WorkerService::Transports() const {
  std::shared_ptr<LinkState> link;
  std::shared_ptr<InboundNccl> inbound;
  std::shared_ptr<InboundShm> shm;
  {
    absl::MutexLock l(&mu_);
    link = link_;
    inbound = inbound_;
    shm = inbound_shm_;
  }
  std::string next, prev;
  if (link != nullptr && link->ring_size > 1) {
    absl::MutexLock l(&link->transport_mu);
    next = link->transport;
  }
  if (inbound != nullptr) {
    absl::MutexLock l(&inbound->mu);
    const std::string devices = absl::StrCat(inbound->sender_device, " -> ", options_.device);
    if (inbound->pending) {
      prev = absl::StrCat("nccl connecting (", devices, ") from ", inbound->sender);
    } else if (inbound->hop != nullptr && inbound->hop->status().ok()) {
      prev = absl::StrCat("nccl (", devices, ") from ", inbound->sender);
    } else {
      const absl::Status why = inbound->hop != nullptr ? inbound->hop->status() : inbound->status;
      prev = absl::StrCat("grpc (NCCL link from ", inbound->sender, " failed: ", why.message(), ")");
    }
  }
  if (shm != nullptr) {
    const absl::Status st = shm->hop->status();
    const std::string frames = st.ok() ? absl::StrCat("shm from ", shm->sender)
                                       : absl::StrCat("grpc (shared-memory hop from ", shm->sender,
                                                      " failed: ", st.message(), ")");
    prev = prev.empty() ? frames : absl::StrCat(frames, "; large payloads: ", prev);
  }
  return {next, prev};
}

absl::Status WorkerService::PushNext(const LinkState& link, pb::ActivationFrame f, absl::Duration timeout) {
  if (link.next == nullptr) return absl::InternalError("closed ring of one stage has no next hop");
  const absl::Time entered = step_stats_ != nullptr ? absl::Now() : absl::InfinitePast();
  f.set_epoch(link.next_epoch);
  f.set_sender(HopName());
  MaybeCorrupt(&f);
  Record(/*sent=*/true, f, link.next_name);
  timeout = std::min(timeout, options_.relay_timeout);
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock push_lock(&link.push_mu);
  // Only hidden states (the large frames) take the NCCL channel; tokens and errors are
  // small, and an error must reach stage 0 even when the NCCL link is what failed.
  std::string nccl_payload;
  if (link.nccl != nullptr && f.kind() == pb::PAYLOAD_KIND_HIDDEN &&
      static_cast<int64_t>(f.payload().size()) >= options_.nccl_min_bytes && link.nccl->status().ok()) {
    nccl_payload = std::move(*f.mutable_payload());
    f.clear_payload();
    f.set_nccl_payload_bytes(static_cast<int64_t>(nccl_payload.size()));
  }
  metrics_->CountFrame(/*sent=*/true, link.next_name, static_cast<int64_t>(f.ByteSizeLong()));
  SetWaitingOn("pushing sequence ", f.sequence_id(), " step ", f.step(), " to ", link.next_name,
               nccl_payload.empty() ? "" : " (payload over NCCL)");
  absl::Status s;
  if (link.shm != nullptr && link.shm->status().ok()) {
    const absl::Time t0 = step_stats_ != nullptr ? absl::Now() : absl::InfinitePast();
    // One buffer a pushing thread, reused from frame to frame (KeepSmall: not a prefill
    // frame's size for good).
    thread_local std::string bytes;
    f.SerializeToString(&bytes);
    const absl::Time t1 = step_stats_ != nullptr ? absl::Now() : absl::InfinitePast();
    s = link.shm->Send(bytes, deadline);
    KeepSmall(&bytes);
    if (step_stats_ != nullptr) {
      step_stats_->Add(f, StepStats::kPushPrep, entered, t0);
      step_stats_->Add(f, StepStats::kSerialize, t0, t1);
      step_stats_->Add(f, StepStats::kSend, t1, absl::Now());
    }
    if (!s.ok()) {
      // Broken for good (the receiver closed or exited, or stopped reading): later frames
      // take the Relay stream, which stays open for this.
      s = absl::Status(s.code(), absl::StrCat(HopName(), " -> ", link.next_name, ": sequence ", f.sequence_id(),
                                              " step ", f.step(), ": over shared memory: ", s.message()));
      SetHopTransport(link, /*frames=*/true, absl::StrCat("grpc (shared-memory hop failed: ", s.message(), ")"));
    }
  } else {
    s = link.next->Push(f, timeout);
  }
  if (s.ok() && !nccl_payload.empty()) {
    s = link.nccl->Send(nccl_payload, deadline);
    if (s.ok()) {
      metrics_->CountNcclBytes(/*sent=*/true, static_cast<int64_t>(nccl_payload.size()));
    } else {
      // The link is dead (NcclLink aborts on any failure): later frames go over gRPC.
      s = absl::Status(s.code(), absl::StrCat(HopName(), " -> ", link.next_name, ": sequence ", f.sequence_id(),
                                              " step ", f.step(), ": payload over NCCL: ", s.message()));
      SetHopTransport(link, /*frames=*/false, absl::StrCat("grpc (NCCL link failed: ", s.message(), ")"));
    }
  }
  SetWaitingOn("idle: waiting for Relay frames");
  if (!s.ok()) SetLastError(s);
  return s;
}

absl::Status WorkerService::ReceiveNcclPayload(pb::ActivationFrame* f) {
  if (f->nccl_payload_bytes() <= 0) return absl::OkStatus();
  const std::string what = absl::StrCat(HopName(), " <- ", f->sender(), ": sequence ", f->sequence_id(), " step ",
                                        f->step(), ": payload of ", f->nccl_payload_bytes(), " bytes over NCCL");
  std::shared_ptr<InboundNccl> inbound;
  {
    absl::MutexLock l(&mu_);
    inbound = inbound_;
  }
  if (inbound == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ", but this worker has no NCCL link from the previous stage"));
  }
  const absl::Time deadline = absl::Now() + options_.relay_timeout;
  std::shared_ptr<NcclHop> hop;
  {
    absl::MutexLock l(&inbound->mu);
    auto joined = [&inbound]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(inbound->mu) { return !inbound->pending; };
    // The sender's Link returns when its end joined; this end may finish a moment later.
    inbound->mu.AwaitWithDeadline(absl::Condition(&joined), deadline);
    if (inbound->pending) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": the NCCL link from ", inbound->sender,
                                                      " is still connecting"));
    }
    if (inbound->hop == nullptr) {
      return absl::UnavailableError(absl::StrCat(what, ": the NCCL link from ", inbound->sender,
                                                 " failed to connect: ", inbound->status.message()));
    }
    hop = inbound->hop;
  }
  SetWaitingOn("receiving ", what);
  absl::StatusOr<std::string> bytes = hop->Receive(f->nccl_payload_bytes(), deadline);
  SetWaitingOn("idle: waiting for Relay frames");
  if (!bytes.ok()) return absl::Status(bytes.status().code(), absl::StrCat(what, ": ", bytes.status().message()));
  metrics_->CountNcclBytes(/*sent=*/false, f->nccl_payload_bytes());
  *f->mutable_payload() = *std::move(bytes);
  f->clear_nccl_payload_bytes();
  return absl::OkStatus();
}

namespace {

// A step's failure as the frame that carries it on round the ring to stage 0.
pb::ActivationFrame RelayErrorFrame(const pb::ActivationFrame& in, const absl::Status& error) {
  pb::ActivationFrame err;
  err.set_sequence_id(in.sequence_id());
  err.set_step(in.step());
  err.set_relay(in.relay());
  EncodeStepError(error, &err);
  return err;
}

}  // namespace

void WorkerService::HandleRelayed(pb::ActivationFrame in, const std::string& peer, absl::Time received) {
  // Before anything else looks at the frame (even to drop it): the sender's bytes are in
  // flight on the link, and the next frame's would be mistaken for them.
  const absl::Status payload = ReceiveNcclPayload(&in);
  if (!payload.ok()) SetLastError(payload);
  std::shared_ptr<LinkState> link = CurrentLink();
  if (link == nullptr) {
    SetLastError(absl::FailedPreconditionError(absl::StrCat(
        HopName(), ": relayed frame of sequence ", in.sequence_id(), " dropped: this worker is not linked into a ring")));
    return;
  }
  if (!payload.ok()) in = RelayErrorFrame(in, payload);  // travels on to stage 0 like any step error
  // Every frame counts here, batched or not, so that interleaving sequences are noticed.
  const bool lone_sequence = lone_.Note(in.sequence_id(), absl::Now());
  if (link->stage_index == 0) {
    // Round the ring: a token (or an error) for one of this worker's generations.
    std::shared_ptr<Generation> gen;
    bool alone = false;
    {
      absl::MutexLock l(&mu_);
      auto it = generations_.find(in.sequence_id());
      if (it != generations_.end()) gen = it->second;
      alone = generations_.size() == 1;
    }
    if (gen == nullptr) return;  // the generation ended (cancelled): a late frame
    // The token of the only generation here starts its next step right on this thread (see
    // Generation). With several in flight their tokens go to their Generate threads: this
    // thread must go on reading the stream, or the others' tokens would wait behind this
    // step and reach the stage one at a time, never in a batch.
    const bool may_advance = in.kind() != pb::PAYLOAD_KIND_ERROR && alone && lone_sequence &&
                             (relay_threads_.empty() || (in.batch_size() <= 1 && StageIdle()));
    DecodeCursor c;
    {
      absl::MutexLock l(&gen->mu);
      if (!may_advance || !gen->decoding || gen->claimed || gen->closed || !gen->arrived.empty() ||
          in.step() != gen->cursor.step) {
            gen->arrived.push_back(std::move(in));
        return;
      }
      gen->claimed = true;
      c = gen->cursor;
    }
    Advanced a = AdvanceGeneration(*gen, &c, in, /*start_next=*/true);
    absl::MutexLock l(&gen->mu);
    gen->cursor = c;
    gen->claimed = false;
    gen->advanced.push_back(std::move(a));
    return;
  }
  if (in.kind() == pb::PAYLOAD_KIND_ERROR) {
    (void)PushNext(*link, std::move(in), options_.relay_timeout);  // on towards stage 0, untouched
    return;
  }
  // A frame that comes alone (its previous stage ran it in a batch of one) to an idle stage
  // is computed right here: handing it to a relay thread would add a thread wake-up to the
  // hop, tens of microseconds on an idle server core. Frames of a batch, or arriving while
  // the stage is busy, go to the relay threads, so that this stream keeps being read and
  // they can go through the stage together.
  // Only while this is the one sequence in flight, though: with several, a frame computed
  // here holds up reading the next, which then finds the stage idle again, so steps would
  // reach the stage one at a time and never meet in a batch.
  if (relay_threads_.empty() || (in.batch_size() <= 1 && lone_sequence && StageIdle())) {
    ComputeRelayed(in, peer, received);
    return;
  }
  absl::MutexLock l(&relay_mu_);
  relay_queue_.push_back(RelayWork{std::move(in), peer, received});
}

void WorkerService::ComputeRelayed(const pb::ActivationFrame& in, const std::string& peer,
                                   absl::Time received) {
  absl::StatusOr<pb::ActivationFrame> reply = Step(in, peer, received);
  const absl::Time stepped = step_stats_ != nullptr ? absl::Now() : absl::InfinitePast();
  if (!reply.ok()) {
    if (absl::IsNotFound(reply.status())) return;  // released: nobody waits for it
    SetLastError(reply.status());
    reply = RelayErrorFrame(in, reply.status());
  }
  // The ring as it is now (a re-link while the step ran sends the result to the new next
  // stage, which refuses it by epoch).
  std::shared_ptr<LinkState> link = CurrentLink();
  if (link == nullptr) {
    SetLastError(absl::FailedPreconditionError(absl::StrCat(
        HopName(), ": result of sequence ", in.sequence_id(), " dropped: this worker is no longer linked")));
    return;
  }
  if (step_stats_ != nullptr) step_stats_->Add(in, StepStats::kHandOff, stepped, absl::Now());
  (void)PushNext(*link, *std::move(reply), options_.relay_timeout);
  if (step_stats_ != nullptr && t_faults_at_read >= 0) {
    const bool decode = StepStats::DecodeStep(in);
    step_stats_->faults[decode].fetch_add(StepStats::ThreadFaults() - t_faults_at_read);
    step_stats_->faulted_steps[decode].fetch_add(1);
    t_faults_at_read = -1;
  }
}

bool WorkerService::StageIdle() {
  std::shared_ptr<const Loaded> loaded;
  {
    absl::MutexLock l(&mu_);
    loaded = loaded_;
  }
  {
    absl::MutexLock l(&relay_mu_);
    if (!relay_queue_.empty()) return false;
  }
  return loaded == nullptr || loaded->batcher->idle();
}

void WorkerService::RelayLoop() {
  while (true) {
    RelayWork work;
    {
      absl::MutexLock l(&relay_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(relay_mu_) {
        return relay_stop_ || !relay_queue_.empty();
      };
      relay_mu_.Await(absl::Condition(&ready));
      if (relay_queue_.empty()) return;  // stopping, nothing left
      work = std::move(relay_queue_.front());
      relay_queue_.pop_front();
    }
    ComputeRelayed(work.frame, work.peer, work.received);
  }
}

grpc::Status WorkerService::Relay(grpc::ServerContext* ctx, grpc::ServerReader<pb::ActivationFrame>* reader,
                                  pb::RelaySummary* resp) {
  if (auto a = CheckAuth(ctx); !a.ok()) return a;
  // Accepted: the sender waits for these headers before its first frame (RelayStream).
  reader->SendInitialMetadata();
  const std::string peer = ctx->peer();
  pb::ActivationFrame in;
  int64_t frames = 0;
  while (reader->Read(&in)) {
    const absl::Time received = absl::Now();
    ++frames;
    Record(/*sent=*/false, in, peer);
    metrics_->CountFrame(/*sent=*/false, PeerLabel(in), static_cast<int64_t>(in.ByteSizeLong()));
    if (step_stats_ != nullptr) t_parsed_at = absl::Now();
    HandleRelayed(std::move(in), peer, received);
    in.Clear();
  }
  resp->set_frames(frames);
  return grpc::Status::OK;
}

grpc::Status WorkerService::Generate(grpc::ServerContext* ctx, const pb::GenerateRequest* req,
                                     grpc::ServerWriter<pb::GenerateEvent>* writer) {
  if (auto a = CheckAuth(ctx); !a.ok()) return a;
  const std::string hop = HopName();
  std::shared_ptr<LinkState> link = CurrentLink();
  auto fail = [&](absl::Status s) {
    SetLastError(s);
    return ToGrpcStatus(s);
  };
  absl::Status stale;
  {
    absl::MutexLock l(&mu_);
    if (!loaded_ || loaded_->epoch != req->epoch()) {
      stale = absl::FailedPreconditionError(absl::StrCat(
          HopNameLocked(), ": Generate for epoch ", req->epoch(), " but the loaded stage is ",
          loaded_ ? absl::StrCat("epoch ", loaded_->epoch) : "none"));
    }
  }
  if (!stale.ok()) return fail(stale);
  if (link == nullptr || link->stage_index != 0) {
    return fail(absl::FailedPreconditionError(
        absl::StrCat(hop, ": Generate needs stage 0 of a linked ring")));
  }
  if (req->tokens().empty() || req->max_new_tokens() < 1) {
    return fail(absl::InvalidArgumentError(absl::StrCat(hop, ": Generate needs tokens and max_new_tokens >= 1")));
  }
  auto gen = std::make_shared<Generation>();
  gen->sequence_id = req->sequence_id();
  gen->link = link;
  gen->wire = req->wire_dtype() == pb::DTYPE_UNSPECIFIED ? pb::DTYPE_F32 : req->wire_dtype();
  gen->step_timeout = absl::Milliseconds(req->step_timeout_ms() > 0 ? req->step_timeout_ms() : 30000);
  gen->max_new_tokens = req->max_new_tokens();
  gen->stop_ids.assign(req->stop_token_ids().begin(), req->stop_token_ids().end());
  gen->peer = ctx->peer();
  {
    absl::MutexLock l(&mu_);
    if (sequences_.count(req->sequence_id()) > 0 || generations_.count(req->sequence_id()) > 0) {
      stale = absl::AlreadyExistsError(
          absl::StrCat(hop, ": sequence ", req->sequence_id(), " already exists; Generate starts a new one"));
    } else {
      generations_[req->sequence_id()] = gen;
    }
  }
  if (!stale.ok()) return fail(stale);
  bool holding = true;  // this thread holds gen's claim (until it first waits)
  // On every return: no Relay thread may start a step of this generation afterwards, and
  // one that is starting one is waited for (bounded: its push has the step's deadline).
  struct Unregister {
    WorkerService* self;
    Generation& gen;
    bool& holding;
    ~Unregister() {
      {
        absl::MutexLock l(&self->mu_);
        self->generations_.erase(gen.sequence_id);
      }
      absl::MutexLock l(&gen.mu);
      gen.closed = true;
      if (holding) gen.claimed = false;
      auto free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(gen.mu) { return !gen.claimed; };
      gen.mu.AwaitWithDeadline(absl::Condition(&free), absl::Now() + gen.step_timeout);
    }
  } unregister{this, *gen, holding};
  auto write = [&](const pb::GenerateEvent& ev) {
    return writer->Write(ev) ? grpc::Status::OK
                             : grpc::Status(grpc::StatusCode::CANCELLED,
                                            absl::StrCat(hop, ": the coordinator went away"));
  };
  const std::vector<int32_t> prompt(req->tokens().begin(), req->tokens().end());
  const size_t chunk = req->prefill_chunk() > 0 ? static_cast<size_t>(req->prefill_chunk()) : prompt.size();
  size_t fed = 0;  // prompt tokens started so far
  DecodeCursor c;
  auto start_chunk = [&]() {
    const size_t e = std::min(prompt.size(), fed + chunk);
    std::vector<int32_t> tokens(prompt.begin() + static_cast<std::ptrdiff_t>(fed),
                                prompt.begin() + static_cast<std::ptrdiff_t>(e));
    const bool first = fed == 0;
    fed = e;
    return StartStep(*gen, &c, std::move(tokens), /*sample=*/e == prompt.size(),
                     first ? &req->sampling() : nullptr);
  };
  absl::StatusOr<std::optional<pb::ActivationFrame>> started = start_chunk();
  if (!started.ok()) return fail(started.status());
  std::optional<pb::ActivationFrame> back = *std::move(started);  // a ring of one: the reply
  const bool ring = link->ring_size > 1;
  while (true) {
    if (!back.has_value()) {
      // Hand the claim over while the step goes round: a Relay thread may advance the
      // generation (once the prompt is in) or queue the frame that comes back for us.
      if (holding) {
        absl::MutexLock l(&gen->mu);
        gen->cursor = c;
        gen->decoding = ring && fed == prompt.size();
        gen->claimed = false;
        holding = false;
      }
      std::deque<Advanced> done;
      absl::Status s = AwaitRound(*gen, ctx, &c, &done, &back);
      holding = back.has_value();
      if (!s.ok()) return absl::IsCancelled(s) ? ToGrpcStatus(s) : fail(s);
      for (const Advanced& a : done) {
        if (!a.status.ok()) return fail(a.status);
        if (grpc::Status w = write(a.event); !w.ok()) return w;
        if (a.last) return grpc::Status::OK;
      }
      if (!back.has_value()) continue;
    }
    // This thread holds the claim: advance by the frame that came back.
    const bool prompt_left = fed < prompt.size();
    Advanced a = AdvanceGeneration(*gen, &c, *back, /*start_next=*/ring && !prompt_left);
    back.reset();
    if (!a.status.ok()) return fail(a.status);
    if (a.ack) {
      if (!prompt_left) {
        return fail(absl::InternalError(absl::StrCat(hop, ": an ack came back for the prompt's last chunk")));
      }
      started = start_chunk();
      if (!started.ok()) return fail(started.status());
      back = *std::move(started);
      continue;
    }
    if (prompt_left) {
      return fail(absl::InternalError(absl::StrCat(hop, ": a token came back for a prompt chunk")));
    }
    // In a ring the next step is already on its way: the token goes out while it computes.
    if (grpc::Status w = write(a.event); !w.ok()) return w;
    if (a.last) return grpc::Status::OK;
    if (!ring) {
      started = StartStep(*gen, &c, {a.token}, /*sample=*/true, nullptr);
      if (!started.ok()) return fail(started.status());
      back = *std::move(started);
    }
  }
}

absl::StatusOr<std::optional<pb::ActivationFrame>> WorkerService::StartStep(
    Generation& g, DecodeCursor* c, std::vector<int32_t> tokens, bool sample,
    const pb::SamplingSpec* sampling) {
  pb::ActivationFrame f;
  f.set_sequence_id(g.sequence_id);
  f.set_step(c->step);
  f.set_epoch(g.link->epoch);
  f.set_first_position(c->position);
  f.set_sender("coordinator");
  f.set_reply_dtype(g.wire);
  f.set_batch_size(c->came_back_with);
  f.set_relay(sample ? pb::RELAY_ACTION_SAMPLE : pb::RELAY_ACTION_ACK);
  if (sampling != nullptr) *f.mutable_sampling() = *sampling;
  c->rows = static_cast<int64_t>(tokens.size());
  c->sample = sample;
  StageInput in;
  in.tokens = std::move(tokens);
  RING_RETURN_IF_ERROR(EncodeStageInput(in, c->rows, g.wire, &f));
  c->started = absl::Now();
  RING_ASSIGN_OR_RETURN(pb::ActivationFrame out, Step(f, g.peer, c->started));
  if (g.link->ring_size == 1) return std::optional<pb::ActivationFrame>(std::move(out));
  // Within the step's deadline: a next stage that takes nothing (stalled) must not hold
  // this past the time the coordinator waits for the token.
  if (absl::Status s = PushNext(*g.link, std::move(out), g.step_timeout); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(HopName(), ": sequence ", g.sequence_id, " step ", c->step, ": ",
                                               s.message()));
  }
  return std::optional<pb::ActivationFrame>();
}

WorkerService::Advanced WorkerService::AdvanceGeneration(Generation& g, DecodeCursor* c,
                                                         const pb::ActivationFrame& back, bool start_next) {
  Advanced r;
  if (back.kind() == pb::PAYLOAD_KIND_ERROR) {
    r.status = DecodeStepError(back);
    return r;
  }
  c->came_back_with = back.batch_size();
  absl::StatusOr<std::optional<SampledToken>> token = DecodeSampled(back);
  if (!token.ok()) {
    if (absl::IsDataLoss(token.status())) {
      metrics_->CountChecksumFailure(PeerLabel(back));
      absl::MutexLock l(&mu_);
      ++checksum_failures_;
    }
    r.status = absl::Status(token.status().code(),
                            absl::StrCat(HopName(), " <- ", back.sender(), ": ", token.status().message()));
    return r;
  }
  const uint64_t step = c->step;
  c->position += c->rows;
  ++c->step;
  if (!c->sample) {
    r.ack = true;  // a prefill chunk went through
    return r;
  }
  if (!token->has_value()) {
    r.status = absl::InternalError(absl::StrCat(HopName(), " <- ", back.sender(), ": no token for step ", step));
    return r;
  }
  const SampledToken& t = **token;
  pb::GenerateEvent& ev = r.event;
  ev.set_step(step);
  const absl::Time returned = absl::Now();
  ev.set_step_seconds(absl::ToDoubleSeconds(returned - c->started));
  ev.set_started_unix_nanos(absl::ToUnixNanos(c->started));
  ev.set_returned_unix_nanos(absl::ToUnixNanos(returned));
  *ev.mutable_trace() = back.trace();
  ev.mutable_token()->set_id(t.id);
  ev.mutable_token()->set_logprob(t.logprob);
  for (const auto& [id, lp] : t.top_logprobs) {
    ev.mutable_token()->add_top_ids(id);
    ev.mutable_token()->add_top_logprobs(lp);
  }
  ++c->emitted;
  r.token = t.id;
  r.last = std::find(g.stop_ids.begin(), g.stop_ids.end(), t.id) != g.stop_ids.end() ||
           c->emitted >= g.max_new_tokens;
  if (!r.last && start_next) {
    absl::StatusOr<std::optional<pb::ActivationFrame>> s = StartStep(g, c, {t.id}, /*sample=*/true, nullptr);
    if (!s.ok()) r.status = s.status();
  }
  return r;
}

absl::Status WorkerService::AwaitRound(Generation& g, grpc::ServerContext* ctx, DecodeCursor* c,
                                       std::deque<Advanced>* done, std::optional<pb::ActivationFrame>* back) {
  const std::string next = g.link->next_name;
  uint64_t step;
  {
    absl::MutexLock l(&g.mu);
    step = g.cursor.step;
  }
  SetWaitingOn("waiting for sequence ", g.sequence_id, " step ", step, " to come round the ring from ", next);
  while (true) {
    bool claimed;
    bool advanced = false;
    absl::Time deadline;
    {
      absl::MutexLock l(&g.mu);
      auto ready = [&g]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(g.mu) {
        return !g.advanced.empty() || (!g.claimed && !g.arrived.empty());
      };
      // Wait in short slices so a cancelled call ends soon.
      g.mu.AwaitWithDeadline(absl::Condition(&ready),
                             std::min(g.cursor.started + g.step_timeout, absl::Now() + absl::Milliseconds(100)));
      while (!g.advanced.empty()) {
        done->push_back(std::move(g.advanced.front()));
        g.advanced.pop_front();
      }
      advanced = !done->empty();
      while (!advanced && !g.claimed && !g.arrived.empty()) {
        pb::ActivationFrame a = std::move(g.arrived.front());
        g.arrived.pop_front();
        if (a.step() == g.cursor.step || a.kind() == pb::PAYLOAD_KIND_ERROR) {
          *back = std::move(a);
          g.claimed = true;
          *c = g.cursor;
          break;
        }  // else: a stale frame of an earlier step; dropped
      }
      claimed = g.claimed;
      step = g.cursor.step;
      deadline = g.cursor.started + g.step_timeout;
    }
    // Said here, outside g.mu: the status text has a lock of its own. (A generation that
    // ended on a token computed by the reading thread left stage 0 "waiting" for a step
    // that never comes.)
    if (advanced || back->has_value()) {
      SetWaitingOn("idle: waiting for Relay frames");
      return absl::OkStatus();
    }
    if (ctx->IsCancelled()) {
      SetWaitingOn("idle: waiting for Relay frames");
      return absl::CancelledError(absl::StrCat(HopName(), ": Generate cancelled"));
    }
    // A Relay thread that holds the claim is starting the next step: its push has the
    // step's deadline of its own, so it gets one more step_timeout before this gives up.
    if (absl::Now() >= (claimed ? deadline + g.step_timeout : deadline)) {
      SetWaitingOn("idle: waiting for Relay frames");
      return absl::DeadlineExceededError(absl::StrCat(
          HopName(), ": sequence ", g.sequence_id, " step ", step,
          claimed ? " came round the ring, but starting the next step on the Relay thread did not finish within "
                  : " did not come round the ring within ",
          absl::FormatDuration(g.step_timeout), " (pushed to ", next, ")"));
    }
  }
}

}  // namespace ring::worker
