#include "server/ring.h"

#include <algorithm>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "kernels/status.h"
#include "models/stage_runner.h"
#include "worker/frame.h"
#include "worker/stage_client.h"

namespace ring {
namespace {

namespace pb = ringserve::v1;

// Runs `tokens` through runners in order; the last one's output comes back (logits, or
// with argmax_only the greedy tokens).
absl::StatusOr<StageOutput> StepThrough(std::vector<std::unique_ptr<StageRunner>>& runners,
                                        const std::vector<int32_t>& tokens, bool argmax_only) {
  StageInput in;
  in.tokens = tokens;
  for (size_t i = 0; i < runners.size(); ++i) {
    in.argmax_only = argmax_only && i + 1 == runners.size();
    RING_ASSIGN_OR_RETURN(StageOutput out, runners[i]->Forward(in));
    if (i + 1 == runners.size()) return out;
    in = StageInput{};
    in.hidden = std::move(out.hidden);
    in.topk = std::move(out.topk);
  }
  return absl::InternalError("ring without stages");
}

// The greedy token of the last row of a last stage's argmax_only output.
absl::StatusOr<int32_t> LastToken(const StageOutput& out) {
  if (out.argmax.empty()) return absl::InternalError("last stage returned no greedy token");
  return out.argmax.back();
}

// A Stage shared by many sequences: Stage::Forward is const and safe across sequences.
class SharedStageRunner final : public StageRunner {
 public:
  explicit SharedStageRunner(std::shared_ptr<const Stage> stage)
      : stage_(std::move(stage)), seq_(stage_->NewSequence()) {}
  absl::StatusOr<StageOutput> Forward(const StageInput& in) override {
    return stage_->Forward(*seq_, in);
  }

 private:
  std::shared_ptr<const Stage> stage_;
  std::unique_ptr<Sequence> seq_;
};

class LocalSequence final : public RingSequence {
 public:
  explicit LocalSequence(std::vector<std::unique_ptr<StageRunner>> runners)
      : runners_(std::move(runners)) {}
  absl::StatusOr<std::vector<float>> Step(const std::vector<int32_t>& tokens) override {
    RING_ASSIGN_OR_RETURN(StageOutput out, StepThrough(runners_, tokens, false));
    position_ += static_cast<int64_t>(tokens.size());
    return std::move(out.logits);
  }
  absl::StatusOr<int32_t> StepGreedy(const std::vector<int32_t>& tokens) override {
    RING_ASSIGN_OR_RETURN(StageOutput out, StepThrough(runners_, tokens, true));
    position_ += static_cast<int64_t>(tokens.size());
    return LastToken(out);
  }
  int64_t position() const override { return position_; }

 private:
  std::vector<std::unique_ptr<StageRunner>> runners_;
  int64_t position_ = 0;
};

class LocalRing final : public Ring {
 public:
  static absl::StatusOr<std::unique_ptr<Ring>> Load(const RingOptions& o) {
    auto ring = std::make_unique<LocalRing>();
    LoadOptions lo;
    lo.act_dtype = o.act_dtype;
    lo.all_logits = o.all_logits;
    lo.device = o.device;
    lo.max_context = o.max_context;
    lo.TEST_jitter = o.TEST_jitter;
    RING_ASSIGN_OR_RETURN(ModelConfig cfg, LoadModelConfig(o.model));
    const int parts = o.split.empty() ? o.local_stages : static_cast<int>(o.split.size());
    RING_ASSIGN_OR_RETURN(std::vector<StageRange> ranges,
                          PlanStageRanges(o.split, cfg.num_hidden_layers, parts));
    for (size_t i = 0; i < ranges.size(); ++i) {
      lo.layers = ranges[i];
      RING_ASSIGN_OR_RETURN(std::unique_ptr<Stage> s, LoadStage(o.model, lo));
      ring->stages_info_.push_back({absl::StrCat("stage ", i, " (local)"), ranges[i], s->weight_bytes()});
      ring->stages_.push_back(std::move(s));
    }
    ring->info_ = {cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size,
                   cfg.max_position_embeddings};
    return ring;
  }

  const RingModelInfo& model() const override { return info_; }
  const std::vector<RingStageInfo>& stages() const override { return stages_info_; }
  absl::StatusOr<std::unique_ptr<RingSequence>> NewSequence(const std::string&) override {
    std::vector<std::unique_ptr<StageRunner>> runners;
    for (const auto& s : stages_) runners.push_back(std::make_unique<SharedStageRunner>(s));
    return std::make_unique<LocalSequence>(std::move(runners));
  }
  uint64_t checksum_failures() const override { return 0; }
  std::string Diagnose() override { return "in-process stages"; }
  std::vector<ActivationStats> activation_stats() const override { return {}; }

 private:
  std::vector<std::shared_ptr<const Stage>> stages_;
  std::vector<RingStageInfo> stages_info_;
  RingModelInfo info_;
};

class RemoteRing;

class RemoteSequence final : public RingSequence {
 public:
  RemoteSequence(RemoteRing* ring, std::string id,
                 std::vector<std::unique_ptr<worker::RemoteStageRunner>> runners)
      : ring_(ring), id_(std::move(id)), runners_(std::move(runners)) {}
  ~RemoteSequence() override;
  absl::StatusOr<std::vector<float>> Step(const std::vector<int32_t>& tokens) override {
    RING_ASSIGN_OR_RETURN(StageOutput out, Run(tokens, false));
    return std::move(out.logits);
  }
  absl::StatusOr<int32_t> StepGreedy(const std::vector<int32_t>& tokens) override {
    RING_ASSIGN_OR_RETURN(StageOutput out, Run(tokens, true));
    return LastToken(out);
  }
  int64_t position() const override { return position_; }
  bool closed_loop() const override;
  absl::Status Generate(const ClosedLoopRequest& req,
                        const std::function<bool(const SampledToken&)>& on_token) override;

 private:
  absl::StatusOr<StageOutput> Run(const std::vector<int32_t>& tokens, bool argmax_only);

  RemoteRing* ring_;
  const std::string id_;
  std::vector<std::unique_ptr<worker::RemoteStageRunner>> runners_;
  int64_t position_ = 0;
};

class RemoteRing final : public Ring {
 public:
  static absl::StatusOr<std::unique_ptr<Ring>> Load(const RingOptions& o) {
    auto ring = std::make_unique<RemoteRing>();
    worker::StageClientOptions co = ClientOptions(o, o.step_timeout);
    for (const std::string& addr : o.workers) {
      ring->clients_.push_back(std::make_unique<worker::StageClient>(
          addr, static_cast<int>(ring->clients_.size()), co));
    }
    RING_ASSIGN_OR_RETURN(pb::DescribeResponse d, ring->clients_.front()->Describe(o.model));
    const pb::ModelInfo& info = d.probed();
    std::vector<int64_t> split = o.split;
    if (split.empty() && o.auto_plan && ring->clients_.size() > 1) {
      RING_ASSIGN_OR_RETURN(RingPlan plan, PlanForWorkers(o));
      split = plan.LayerCounts();
    }
    RING_ASSIGN_OR_RETURN(std::vector<StageRange> ranges,
                          PlanStageRanges(split, info.num_layers(),
                                          static_cast<int>(ring->clients_.size())));
    // fp32 on the wire when asked for (bit-exact); otherwise the model's activation dtype.
    pb::DType act = pb::DTYPE_UNSPECIFIED;
    if (o.act_dtype) act = *o.act_dtype == cpu::ActDType::kF32 ? pb::DTYPE_F32 : pb::DTYPE_BF16;
    ring->on_stage_step_ = o.on_stage_step;
    ring->wire_ = act != pb::DTYPE_UNSPECIFIED ? act
                  : info.dtype() == "bf16"     ? pb::DTYPE_BF16
                                               : pb::DTYPE_F32;
    auto stage_request = [&](size_t i) {
      pb::LoadStageRequest req;
      req.set_model(o.model);
      req.set_layer_begin(ranges[i].begin);
      req.set_layer_end(ranges[i].end);
      req.set_act_dtype(act);
      req.set_all_logits(o.all_logits);
      req.set_formation(o.formation);
      req.set_coordinator_id(o.coordinator_id);
      return req;
    };
    ring->info_ = {info.model_type(), info.num_layers(), info.hidden_size(), info.vocab_size(),
                   info.max_position_embeddings()};
    if (!o.admission_tokens.empty()) {
      RING_RETURN_IF_ERROR(ring->Admit(o, stage_request));
    }
    for (size_t i = 0; i < ring->clients_.size(); ++i) {
      const pb::LoadStageRequest req = stage_request(i);
      RING_ASSIGN_OR_RETURN(pb::LoadStageResponse loaded, ring->clients_[i]->LoadStage(req));
      if (loaded.model().model_hash() != info.model_hash()) {
        return absl::FailedPreconditionError(
            absl::StrCat(ring->clients_[i]->name(), " holds a different '", o.model, "' than ",
                         ring->clients_.front()->name()));
      }
      ring->epochs_.push_back(loaded.epoch());
      ring->stages_info_.push_back({ring->clients_[i]->name(), ranges[i], loaded.weight_bytes()});
    }
    ring->info_ = {info.model_type(), info.num_layers(), info.hidden_size(), info.vocab_size(),
                   info.max_position_embeddings()};
    ring->step_timeout_ = o.step_timeout;
    ring->on_closed_step_ = o.on_closed_step;
    if (o.closed_loop) RING_RETURN_IF_ERROR(ring->Close(o));
    return ring;
  }

  // Links every stage to the next (the last to stage 0): the second half of the formation
  // barrier, under the same formation number.
  absl::Status Close(const RingOptions& o) {
    const int n = static_cast<int>(clients_.size());
    // What each worker runs on and where, for the choice of every hop's transport and the
    // shared-GPU warning. A worker that does not answer here gets gRPC hops (its Link will
    // say whether it is gone).
    std::vector<pb::DescribeResponse> described(n);
    if (n > 1) {
      std::vector<std::string> names;
      for (int i = 0; i < n; ++i) {
        absl::StatusOr<pb::DescribeResponse> d = clients_[i]->Describe();
        if (d.ok()) described[i] = *std::move(d);
        names.push_back(clients_[i]->name());
      }
      for (const std::string& w : SharedGpuWarnings(described, names)) std::cerr << "ring: warning: " << w << "\n";
    }
    for (int i = 0; i < n; ++i) {
      pb::LinkRequest req;
      req.set_formation(o.formation);
      req.set_coordinator_id(o.coordinator_id);
      req.set_epoch(epochs_[i]);
      req.set_stage_index(i);
      req.set_ring_size(n);
      req.set_next_address(clients_[(i + 1) % n]->address());
      req.set_next_epoch(epochs_[(i + 1) % n]);
      const HopTransportChoice choice = ChooseHopTransport(described[i], described[(i + 1) % n], o.transport,
                                                           /*closing=*/i == n - 1);
      req.set_nccl(choice.nccl);
      req.set_shm(choice.shm);
      req.set_transport_reason(choice.reason);
      RING_ASSIGN_OR_RETURN(pb::LinkResponse linked, clients_[i]->Link(req));
      if (n > 1) {
        std::cerr << "ring: " << clients_[i]->name() << " -> " << clients_[(i + 1) % n]->name() << ": "
                  << linked.next_transport() << "\n";
      }
    }
    closed_ = true;
    return absl::OkStatus();
  }
  bool closed() const { return closed_; }
  worker::StageClient& first() { return *clients_.front(); }
  uint64_t first_epoch() const { return epochs_.front(); }
  pb::DType wire() const { return wire_; }
  absl::Duration step_timeout() const { return step_timeout_; }

  // The admission gate (RingOptions::admission_tokens): golden inputs through every stage in
  // ring order, each verified on its worker's device against the CPU reference.
  absl::Status Admit(const RingOptions& o,
                     const std::function<pb::LoadStageRequest(size_t)>& stage_request) {
    std::vector<StageInput> steps(2);
    steps[0].tokens.assign(o.admission_tokens.begin(), o.admission_tokens.end() - 1);
    steps[1].tokens = {o.admission_tokens.back()};
    if (steps[0].tokens.empty()) steps.erase(steps.begin());
    for (size_t i = 0; i < clients_.size(); ++i) {
      pb::VerifyStageRequest req;
      *req.mutable_stage() = stage_request(i);
      req.set_tolerance(o.admission_tolerance);
      for (const StageInput& in : steps) {
        const int64_t rows = in.tokens.empty()
                                 ? static_cast<int64_t>(in.hidden.size()) / std::max<int64_t>(1, info_.hidden_size)
                                 : static_cast<int64_t>(in.tokens.size());
        RING_RETURN_IF_ERROR(worker::EncodeStageInput(in, rows, pb::DTYPE_F32, req.add_inputs()));
      }
      RING_ASSIGN_OR_RETURN(pb::VerifyStageResponse v, clients_[i]->VerifyStage(req));
      if (!v.ok()) {
        std::cerr << "ring: " << clients_[i]->name() << " failed the admission verify:\n"
                  << v.report();
        return absl::FailedPreconditionError(
            absl::StrCat(clients_[i]->name(), " failed the admission verify of layers [",
                         req.stage().layer_begin(), ", ", req.stage().layer_end(),
                         ") and is refused: ", v.diagnosis()));
      }
      std::vector<StageInput> next;
      for (const pb::ActivationFrame& f : v.outputs()) {
        RING_ASSIGN_OR_RETURN(StageOutput out, worker::DecodeStageOutput(f));
        StageInput in;
        in.hidden = std::move(out.hidden);
        in.topk = std::move(out.topk);
        next.push_back(std::move(in));
      }
      steps = std::move(next);
    }
    return absl::OkStatus();
  }

  const RingModelInfo& model() const override { return info_; }
  const std::vector<RingStageInfo>& stages() const override { return stages_info_; }
  absl::StatusOr<std::unique_ptr<RingSequence>> NewSequence(const std::string& id) override {
    std::vector<std::unique_ptr<worker::RemoteStageRunner>> runners;
    for (size_t i = 0; i < clients_.size(); ++i) {
      runners.push_back(std::make_unique<worker::RemoteStageRunner>(
          clients_[i].get(), id, epochs_[i], info_.hidden_size, wire_));
    }
    return std::make_unique<RemoteSequence>(this, id, std::move(runners));
  }
  uint64_t checksum_failures() const override { return checksum_failures_.load(); }

  std::string Diagnose() override {
    std::string out;
    for (auto& c : clients_) {
      if (!out.empty()) out += "; ";
      worker::StageClientOptions quick = c->options();
      quick.call_timeout = absl::Seconds(2);
      worker::StageClient probe(c->address(), c->stage_index(), quick);
      auto fr = probe.FlightRecorder();
      if (!fr.ok()) {
        absl::StrAppend(&out, c->name(), ": no answer (", fr.status().message(), ")");
      } else {
        absl::StrAppend(&out, c->name(), ": ", fr->waiting_on());
      }
    }
    return out;
  }

  void Release(const std::string& id) {
    // Best effort: a worker that is gone has no cache to free; the error is not the
    // request's (it already finished or failed).
    for (auto& c : clients_) (void)c->Release(id, absl::Seconds(1));
  }
  void CountChecksumFailures(uint64_t n) { checksum_failures_ += n; }
  void NoteActivation(size_t stage, double rms, float absmax) {
    absl::MutexLock l(&stats_mu_);
    if (stats_.size() < clients_.size()) stats_.resize(clients_.size());
    stats_[stage] = {rms, absmax};
  }
  std::vector<ActivationStats> activation_stats() const override {
    absl::MutexLock l(&stats_mu_);
    return stats_;
  }
  void NoteStageStep(const StageStep& step) const {
    if (on_stage_step_) on_stage_step_(step);
  }
  // A closed-ring step's trace (GenerateEvent): activation stats and timing per stage.
  void NoteClosedStep(const pb::GenerateEvent& e, bool prefill) {
    ClosedStepTrace trace;
    trace.seconds = e.step_seconds();
    trace.prefill = prefill;
    trace.started_unix_nanos = e.started_unix_nanos();
    trace.returned_unix_nanos = e.returned_unix_nanos();
    for (const pb::StageTrace& t : e.trace()) {
      if (t.stage() < 0 || static_cast<size_t>(t.stage()) >= clients_.size()) continue;
      NoteActivation(static_cast<size_t>(t.stage()), t.rms(), t.absmax());
      trace.stages.push_back({static_cast<size_t>(t.stage()), t.worker_seconds(), t.compute_seconds(),
                              t.received_unix_nanos(), t.sent_unix_nanos()});
    }
    if (on_closed_step_) on_closed_step_(trace);
  }

 private:
  std::function<void(const StageStep&)> on_stage_step_;
  std::function<void(const ClosedStepTrace&)> on_closed_step_;
  std::vector<std::unique_ptr<worker::StageClient>> clients_;
  std::vector<uint64_t> epochs_;
  std::vector<RingStageInfo> stages_info_;
  RingModelInfo info_;
  pb::DType wire_ = pb::DTYPE_F32;
  bool closed_ = false;
  absl::Duration step_timeout_ = absl::Seconds(30);
  std::atomic<uint64_t> checksum_failures_{0};
  mutable absl::Mutex stats_mu_;
  std::vector<ActivationStats> stats_;
};

RemoteSequence::~RemoteSequence() {
  runners_.clear();  // closes the Forward streams before their sequence's caches go
  ring_->Release(id_);
}

bool RemoteSequence::closed_loop() const { return ring_->closed(); }

absl::Status RemoteSequence::Generate(const ClosedLoopRequest& req,
                                      const std::function<bool(const SampledToken&)>& on_token) {
  if (!ring_->closed()) return absl::FailedPreconditionError("the ring is not closed (closed_loop off)");
  pb::GenerateRequest g;
  g.set_sequence_id(id_);
  g.set_epoch(ring_->first_epoch());
  g.mutable_tokens()->Assign(req.tokens.begin(), req.tokens.end());
  g.set_prefill_chunk(req.prefill_chunk);
  *g.mutable_sampling() = worker::ToSamplingSpec(req.sampling);
  g.mutable_sampling()->mutable_generated()->Assign(req.generated.begin(), req.generated.end());
  g.set_max_new_tokens(req.max_new_tokens);
  g.mutable_stop_token_ids()->Assign(req.stop_token_ids.begin(), req.stop_token_ids.end());
  g.set_step_timeout_ms(absl::ToInt64Milliseconds(ring_->step_timeout()));
  g.set_wire_dtype(ring_->wire());
  std::unique_ptr<worker::GenerateCall> call = ring_->first().Generate(g);
  // Stage 0 gives up on a step after step_timeout and says so; wait a little longer so its
  // own error (naming where the step was lost) arrives rather than ours.
  const absl::Duration wait = ring_->step_timeout() + absl::Seconds(2);
  // The prompt is one long step (or a few chunks) before the first token.
  const int64_t prefill_steps =
      req.prefill_chunk > 0 ? (static_cast<int64_t>(req.tokens.size()) + req.prefill_chunk - 1) / req.prefill_chunk : 1;
  bool first = true;
  while (true) {
    absl::StatusOr<std::optional<pb::GenerateEvent>> e = call->Next(first ? wait * prefill_steps : wait);
    if (!e.ok()) return e.status();
    if (!e->has_value()) break;
    ring_->NoteClosedStep(**e, first);
    first = false;
    const pb::TokenChoice& c = (*e)->token();
    SampledToken t;
    t.id = c.id();
    t.logprob = c.logprob();
    for (int i = 0; i < c.top_ids_size() && i < c.top_logprobs_size(); ++i) {
      t.top_logprobs.emplace_back(c.top_ids(i), c.top_logprobs(i));
    }
    position_ = static_cast<int64_t>(req.tokens.size()) + static_cast<int64_t>((*e)->step()) + 1 -
                prefill_steps;
    if (!on_token(t)) {
      call->Cancel();
      break;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StageOutput> RemoteSequence::Run(const std::vector<int32_t>& tokens, bool argmax_only) {
  StageInput in;
  in.tokens = tokens;
  for (size_t i = 0; i < runners_.size(); ++i) {
    in.argmax_only = argmax_only && i + 1 == runners_.size();
    const uint64_t before = runners_[i]->checksum_failures();
    const absl::Time t0 = absl::Now();
    auto out = runners_[i]->Forward(in);
    ring_->CountChecksumFailures(runners_[i]->checksum_failures() - before);
    if (!out.ok()) return out.status();
    const worker::RemoteStageRunner::Exchange& x = runners_[i]->last_exchange();
    ring_->NoteStageStep({.stage = i,
                          .seconds = absl::ToDoubleSeconds(absl::Now() - t0),
                          .round_trip_seconds = x.round_trip_seconds,
                          .worker_seconds = x.worker_seconds,
                          .bytes_sent = x.bytes_sent,
                          .bytes_received = x.bytes_received});
    ring_->NoteActivation(i, runners_[i]->last_rms(), runners_[i]->last_absmax());
    if (i + 1 == runners_.size()) {
      position_ += static_cast<int64_t>(tokens.size());
      return std::move(*out);
    }
    in = StageInput{};
    in.hidden = std::move(out->hidden);
    in.topk = std::move(out->topk);
  }
  return absl::InternalError("ring without stages");
}

}  // namespace

absl::Status RingSequence::Generate(const ClosedLoopRequest&,
                                    const std::function<bool(const SampledToken&)>&) {
  return absl::FailedPreconditionError("this ring is not closed: the coordinator drives its steps");
}

absl::StatusOr<int32_t> RingSequence::StepGreedy(const std::vector<int32_t>& tokens) {
  RING_ASSIGN_OR_RETURN(std::vector<float> logits, Step(tokens));
  if (logits.empty()) return absl::InternalError("last stage returned no logits");
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

absl::StatusOr<std::vector<StageRange>> PlanStageRanges(const std::vector<int64_t>& split,
                                                        int64_t num_layers, int stages) {
  if (split.empty()) {
    if (stages < 1 || stages > num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat(stages, " stages for ", num_layers, " layers: need 1..", num_layers));
    }
    return SplitLayers(num_layers, stages);
  }
  if (static_cast<int>(split.size()) != stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("split has ", split.size(), " entries for ", stages, " stages"));
  }
  std::vector<StageRange> out;
  int64_t begin = 0;
  for (int64_t len : split) {
    if (len < 1) return absl::InvalidArgumentError(absl::StrCat("split: layer count ", len, " < 1"));
    out.push_back({begin, begin + len});
    begin += len;
  }
  if (begin != num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("split sums to ", begin, " layers; the model has ", num_layers));
  }
  return out;
}

HopTransportChoice ChooseHopTransport(const pb::DescribeResponse& from, const pb::DescribeResponse& to,
                                      RingTransport transport, bool closing) {
  if (transport == RingTransport::kGrpc) return {false, false, "ring.transport = \"grpc\""};
  const bool same_host = !from.host_id().empty() && from.host_id() == to.host_id();
  if (!same_host) return {false, false, "the next stage is on another host"};
  if (closing) return {false, true, "the last stage sends stage 0 tokens, not hidden states"};
  auto cuda = [](const pb::DescribeResponse& d) { return absl::StartsWith(d.backend(), "cuda"); };
  if (!cuda(from) || !cuda(to)) {
    return {false, true,
            absl::StrCat("NCCL needs CUDA workers: ", from.backend().empty() ? "unknown" : from.backend(), " -> ",
                         to.backend().empty() ? "unknown" : to.backend())};
  }
  const std::string& gpu = from.attestation().gpu_uuid();
  if (!gpu.empty() && gpu == to.attestation().gpu_uuid()) {
    return {false, true, absl::StrCat("both stages run on one GPU (", gpu, "); NCCL needs a device per stage")};
  }
  return {true, true, ""};
}

std::vector<std::string> SharedGpuWarnings(const std::vector<pb::DescribeResponse>& described,
                                           const std::vector<std::string>& names) {
  std::map<std::pair<std::string, std::string>, std::vector<size_t>> by_gpu;
  for (size_t i = 0; i < described.size(); ++i) {
    const pb::DescribeResponse& d = described[i];
    if (d.host_id().empty() || d.attestation().gpu_uuid().empty()) continue;
    by_gpu[{d.host_id(), d.attestation().gpu_uuid()}].push_back(i);
  }
  std::vector<std::string> out;
  for (const auto& [key, workers] : by_gpu) {
    if (workers.size() < 2) continue;
    bool all_mps = true;
    std::vector<std::string> who;
    for (size_t i : workers) {
      all_mps = all_mps && described[i].attestation().mps();
      who.push_back(absl::StrCat(i < names.size() ? names[i] : absl::StrCat("worker ", i),
                                 described[i].attestation().mps() ? "" : " (no MPS)"));
    }
    if (all_mps) continue;
    out.push_back(absl::StrCat(
        absl::StrJoin(who, ", "), " share GPU ", key.second, " (", described[workers[0]].attestation().device_name(),
        ") on ", key.first,
        " without CUDA MPS: the GPU switches between their contexts at every hop, which costs each token "
        "compute time; start `nvidia-cuda-mps-control -d` (same CUDA_MPS_PIPE_DIRECTORY for the daemon "
        "and the workers) before the workers"));
  }
  return out;
}

worker::StageClientOptions ClientOptions(const RingOptions& o, absl::Duration call_timeout) {
  worker::StageClientOptions co;
  co.call_timeout = call_timeout;
  co.load_timeout = o.load_timeout;
  co.auth_token = o.auth_token;
  co.tls_ca = o.tls_ca;
  co.tls_cert = o.tls_cert;
  co.tls_key = o.tls_key;
  return co;
}

absl::StatusOr<RingPlan> PlanForWorkers(const RingOptions& o) {
  worker::StageClientOptions co = ClientOptions(o, o.step_timeout);
  std::vector<PlanWorker> workers;
  PlanModel model;
  for (size_t i = 0; i < o.workers.size(); ++i) {
    worker::StageClient c(o.workers[i], static_cast<int>(i), co);
    // Every worker probes the model: each must have it, and it must be the same one.
    RING_ASSIGN_OR_RETURN(pb::DescribeResponse d, c.Describe(o.model, o.plan_calibrate));
    if (i == 0) {
      model.layer_bytes.assign(d.probed().layer_bytes().begin(), d.probed().layer_bytes().end());
      model.first_stage_extra_bytes = d.probed().first_stage_extra_bytes();
      model.last_stage_extra_bytes = d.probed().last_stage_extra_bytes();
      model.kv_bytes_per_token_per_layer = d.probed().kv_bytes_per_token_per_layer();
    } else if (static_cast<int64_t>(model.layer_bytes.size()) != d.probed().layer_bytes_size()) {
      return absl::FailedPreconditionError(absl::StrCat(c.name(), " holds a different '", o.model, "'"));
    }
    // A worker that already holds a stage counts that memory as available to the plan.
    int64_t free = d.memory_free_bytes();
    if (d.loaded()) {
      for (int64_t l = d.layer_begin(); l < d.layer_end() && l < static_cast<int64_t>(model.layer_bytes.size()); ++l) {
        free += model.layer_bytes[l];
      }
    }
    PlanWorker pw{o.workers[i], free, d.memory_bandwidth_bytes_per_s()};
    if (o.plan_calibrate) {
      if (d.calibration().error().empty()) {
        pw.layer_seconds = d.calibration().layer_seconds();
        pw.head_seconds = d.calibration().head_seconds();
      } else {
        std::cerr << "ring: " << c.name() << ": " << d.calibration().error()
                  << "; the plan goes by weight bytes / memory bandwidth\n";
      }
    }
    workers.push_back(pw);
  }
  PlanOptions po;
  po.context_tokens = o.plan_context_tokens;
  po.sequences = o.plan_sequences;
  po.split = o.split;
  return PlanRing(workers, model, po);
}

std::vector<int32_t> AdmissionTokens(int64_t n) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((i * 7919 + 13) % 997 + 1));
  return t;
}

std::vector<std::string> ReachableWorkers(const RingOptions& o, absl::Duration timeout) {
  std::vector<std::string> alive;
  worker::StageClientOptions co = ClientOptions(o, timeout);
  for (size_t i = 0; i < o.workers.size(); ++i) {
    worker::StageClient c(o.workers[i], static_cast<int>(i), co);
    // A degraded worker (its shadow checks diverged) answers but must not be planned in.
    absl::StatusOr<pb::DescribeResponse> d = c.Describe();
    if (d.ok() && d->degraded_reason().empty()) alive.push_back(o.workers[i]);
  }
  return alive;
}

absl::StatusOr<std::unique_ptr<Ring>> Ring::Connect(const RingOptions& options) {
  if (options.model.empty()) return absl::InvalidArgumentError("ring: no model given");
  if (options.workers.empty()) return LocalRing::Load(options);
  return RemoteRing::Load(options);
}

}  // namespace ring
