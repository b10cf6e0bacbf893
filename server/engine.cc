#include "server/engine.h"

#include <algorithm>
#include <chrono>
#include <iostream>
#include <random>
#include <regex>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "kernels/status.h"

namespace ring {
namespace {

// Failures that say the ring itself is in trouble (a stage gone, stalled, restarted with
// another epoch), as opposed to a problem with this one request.
bool BreaksRing(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kDataLoss:  // one corrupt frame; the next step may be fine
    case absl::StatusCode::kCancelled:
      return false;
    default:
      return true;
  }
}

// "stage 1 (127.0.0.1:7001)" out of an error message, or "unknown".
std::string StageOf(const absl::Status& s) {
  static const std::regex re(R"(stage \d+ \([^)]*\))");
  std::smatch m;
  const std::string msg(s.message());
  if (std::regex_search(msg, m, re)) return m.str();
  return "unknown";
}

// Status payload that marks IsKvCacheExhausted (the message alone is for people).
constexpr absl::string_view kKvCacheExhaustedPayload = "type.ringserve/kv_cache_exhausted";

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Scopes formation numbers: a restarted coordinator starts again at 1 under a new id.
std::string NewCoordinatorId() {
  std::random_device rd;
  const uint64_t id = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return absl::StrFormat("%016x", id);
}

}  // namespace

bool IsKvCacheExhausted(const absl::Status& status) {
  return absl::IsResourceExhausted(status) && status.GetPayload(kKvCacheExhaustedPayload).has_value();
}

Engine::Engine(RingOptions ring_options, Options options, ServerMetrics* metrics, RingFactory factory)
    : ring_options_(std::move(ring_options)),
      options_(options),
      metrics_(metrics),
      factory_(factory ? std::move(factory) : RingFactory(&Ring::Connect)),
      coordinator_id_(NewCoordinatorId()) {
  if (!ring_options_.on_stage_step) {
    ring_options_.on_stage_step = [m = metrics_](const StageStep& st) {
      m->ObserveStageRoundTrip(st.stage, st.seconds);
      m->ObserveHop(st.stage, st.TransportSeconds(), st.bytes_sent, st.bytes_received);
    };
  }
  if (!ring_options_.on_closed_step) {
    ring_options_.on_closed_step = [m = metrics_](const ClosedStepTrace& t) {
      std::vector<std::pair<size_t, double>> stages;
      for (const ClosedStepTrace::Stage& s : t.stages) stages.emplace_back(s.index, s.worker_seconds);
      m->ObserveClosedStep(t.seconds, stages);
    };
  }
  for (int i = 0; i < std::max(1, options_.max_concurrent); ++i) {
    pool_.emplace_back([this] {
      while (true) {
        std::function<void()> job;
        {
          std::unique_lock<std::mutex> l(pool_mu_);
          pool_cv_.wait(l, [this] { return pool_stopping_ || !jobs_.empty(); });
          if (jobs_.empty()) return;  // stopping and drained
          job = std::move(jobs_.front());
          jobs_.pop_front();
        }
        job();
      }
    });
  }
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  {
    std::lock_guard<std::mutex> l(pool_mu_);
    pool_stopping_ = true;
  }
  pool_cv_.notify_all();
  for (auto& t : pool_) t.join();
  if (supervisor_.joinable()) supervisor_.join();
  if (health_prober_.joinable()) health_prober_.join();
}

void Engine::Start() {
  supervisor_ = std::thread([this] { SuperviseLoop(); });
  if (options_.health_probe > absl::ZeroDuration()) health_prober_ = std::thread([this] { HealthProbeLoop(); });
}

void Engine::HealthProbeLoop() {
  while (true) {
    RingOptions probe;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stopping_) return;
      probe = ring_options_;
    }
    // Outside the lock: a stalled worker holds this for the probe deadline.
    const std::vector<std::string> alive = ReachableWorkers(probe, absl::Seconds(2));
    std::unique_lock<std::mutex> l(mu_);
    for (const auto& w : probe.workers) {
      // A worker that left while we probed keeps no series.
      if (std::find(ring_options_.workers.begin(), ring_options_.workers.end(), w) == ring_options_.workers.end()) {
        continue;
      }
      metrics_->SetWorkerUp(w, std::find(alive.begin(), alive.end(), w) != alive.end());
    }
    cv_.wait_for(l, absl::ToChronoNanoseconds(options_.health_probe), [this] { return stopping_; });
    if (stopping_) return;
  }
}

uint64_t Engine::RequestReformLocked() {
  reform_requested_ = true;
  ++layout_generation_;
  cv_.notify_all();
  return layout_generation_;
}

absl::StatusOr<std::pair<std::unique_ptr<Ring>, std::vector<std::string>>> Engine::Form(uint64_t* generation) {
  RingOptions use;
  {
    std::lock_guard<std::mutex> l(mu_);
    use = ring_options_;
    reform_requested_ = false;
    *generation = layout_generation_;
    use.formation = ++formations_;
    use.coordinator_id = coordinator_id_;
    if (!drained_.empty()) {
      std::erase_if(use.workers, [this](const std::string& w) {
        return std::find(drained_.begin(), drained_.end(), w) != drained_.end();
      });
    }
    // A split is for one set of serving workers: the full ring's does not fit a drained
    // one, and one applied while a worker was drained (ringctl apply / rebalance) does not
    // fit the ring after undrain. Then the ring is planned afresh.
    if (!use.workers.empty() && use.split.size() != use.workers.size()) use.split.clear();
  }
  const size_t wanted = use.workers.size();
  std::vector<std::string> missing;
  if (options_.degraded_rings && wanted >= 2) {
    // Probe first with a short deadline: a stalled worker would otherwise hold LoadStage
    // for the whole load timeout.
    std::vector<std::string> alive = ReachableWorkers(use, absl::Seconds(2));
    if (!alive.empty() && alive.size() < wanted) {
      for (const auto& w : use.workers) {
        if (std::find(alive.begin(), alive.end(), w) == alive.end()) missing.push_back(w);
      }
      use.workers = alive;
      use.split.clear();  // a manual split was for the full ring
    }
  }
  auto ring = factory_(use);
  if (!ring.ok()) {
    if (missing.empty()) return ring.status();
    return absl::Status(ring.status().code(),
                        absl::StrCat("workers unreachable: ", absl::StrJoin(missing, ", "), "; on the ",
                                     use.workers.size(), " reachable ones: ", ring.status().message()));
  }
  return std::make_pair(std::move(*ring), std::move(missing));
}

void Engine::SuperviseLoop() {
  while (true) {
    bool probe_rejoin = false;
    {
      std::unique_lock<std::mutex> l(mu_);
      auto wake = [this] { return stopping_ || ring_ == nullptr || reform_requested_; };
      if (ring_ != nullptr && !missing_.empty()) {
        // Degraded: look for the missing workers now and then.
        probe_rejoin = !cv_.wait_for(l, absl::ToChronoNanoseconds(options_.rejoin_probe), wake);
      } else {
        cv_.wait(l, wake);
      }
      if (stopping_) return;
    }
    if (probe_rejoin) {
      RingOptions probe;
      size_t want;
      {
        std::lock_guard<std::mutex> l(mu_);
        probe = ring_options_;
        probe.workers = missing_;
        want = missing_.size();
      }
      if (ReachableWorkers(probe, absl::Seconds(2)).size() != want) continue;
      // Everyone is back: re-form (requests on the degraded ring see their stage epochs
      // change and replay on the new one).
    }
    uint64_t generation = 0;
    const absl::Time form_start = absl::Now();
    auto formed = Form(&generation);
    metrics_->formation_seconds.Observe(absl::ToDoubleSeconds(absl::Now() - form_start));
    if (!formed.ok()) metrics_->formation_failures.Increment();
    std::unique_lock<std::mutex> l(mu_);
    if (stopping_) return;
    if (generation >= formed_generation_) {
      formed_generation_ = generation;
      layout_status_ = formed.ok() ? absl::OkStatus() : formed.status();
    }
    cv_.notify_all();  // WaitForLayout
    if (formed.ok()) {
      ring_ = std::move(formed->first);
      missing_ = std::move(formed->second);
      std::cerr << "ring-server: ring formed:";
      for (const auto& st : ring_->stages()) {
        std::cerr << " [" << st.name << " layers " << st.layers.begin << ".." << st.layers.end << ")";
      }
      if (!missing_.empty()) std::cerr << " (degraded; unreachable: " << absl::StrJoin(missing_, ", ") << ")";
      std::cerr << std::endl;
      ring_status_ = absl::OkStatus();
      metrics_->ready.Set(1);
      metrics_->workers_missing.Set(static_cast<double>(missing_.size()));
      metrics_->ring_reforms.Increment();
      cv_.notify_all();
    } else if (ring_ == nullptr) {
      const std::string why(formed.status().message());
      if (why != last_form_error_) {  // once per distinct reason, not every retry
        std::cerr << "ring-server: ring not formed: " << why << " (retrying)" << std::endl;
        last_form_error_ = why;
      }
      ring_status_ = absl::UnavailableError(absl::StrCat("ring not formed: ", why, " (retrying)"));
      cv_.wait_for(l, absl::ToChronoNanoseconds(options_.reform_backoff),
                   [this] { return stopping_; });
    }
    // else: a requested re-form failed; the current ring keeps serving.
  }
}

absl::Status Engine::Drain(const std::string& address) {
  std::lock_guard<std::mutex> l(mu_);
  const auto& w = ring_options_.workers;
  if (std::find(w.begin(), w.end(), address) == w.end()) {
    return absl::NotFoundError(absl::StrCat("worker ", address, " is not in the ring"));
  }
  if (std::find(drained_.begin(), drained_.end(), address) != drained_.end()) return absl::OkStatus();
  if (drained_.size() + 1 >= w.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("draining ", address, " would leave no worker to serve; join another first"));
  }
  drained_.push_back(address);
  RequestReformLocked();
  return absl::OkStatus();
}

absl::Status Engine::Undrain(const std::string& address) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = std::find(drained_.begin(), drained_.end(), address);
  if (it == drained_.end()) return absl::NotFoundError(absl::StrCat("worker ", address, " is not drained"));
  drained_.erase(it);
  RequestReformLocked();
  return absl::OkStatus();
}

namespace {

const char* Who(Engine::MembershipSource source) {
  return source == Engine::MembershipSource::kWorker ? "by itself (ring-worker --join)" : "by an operator (ringctl)";
}

}  // namespace

absl::Status Engine::Join(const std::string& address, MembershipSource source) {
  if (address.empty() || address.find(':') == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("worker address '", address, "': want HOST:PORT"));
  }
  if (ring_options_.workers.empty()) {
    return absl::FailedPreconditionError("this server runs its stages in-process; it has no ring to join");
  }
  RingOptions probe;
  {
    std::lock_guard<std::mutex> l(mu_);
    const auto& w = ring_options_.workers;
    if (std::find(w.begin(), w.end(), address) != w.end()) return absl::OkStatus();
    probe = ring_options_;
  }
  probe.workers = {address};
  if (ReachableWorkers(probe, absl::Seconds(5)).empty()) {
    return absl::UnavailableError(absl::StrCat("worker ", address, " does not answer Describe"));
  }
  std::lock_guard<std::mutex> l(mu_);
  // Another Join of this address may have added it while we probed without the lock.
  if (std::find(ring_options_.workers.begin(), ring_options_.workers.end(), address) != ring_options_.workers.end()) {
    return absl::OkStatus();
  }
  ring_options_.workers.push_back(address);
  ring_options_.split.clear();
  std::cerr << "ring-server: worker " << address << " joined " << Who(source) << "; re-forming the ring"
            << std::endl;
  RequestReformLocked();
  return absl::OkStatus();
}

absl::Status Engine::Leave(const std::string& address, MembershipSource source) {
  std::lock_guard<std::mutex> l(mu_);
  auto& w = ring_options_.workers;
  auto it = std::find(w.begin(), w.end(), address);
  if (it == w.end()) return absl::NotFoundError(absl::StrCat("worker ", address, " is not in the ring"));
  if (w.size() == 1) return absl::FailedPreconditionError("cannot remove the last worker");
  w.erase(it);
  ring_options_.split.clear();
  std::erase(drained_, address);
  std::erase(missing_, address);
  metrics_->ForgetWorker(address);
  // The requests in flight replay on the re-formed ring (Generate: the old ring's steps
  // fail on the reloaded stages and the request waits for the new ring).
  std::cerr << "ring-server: worker " << address << " left " << Who(source) << "; re-forming the ring"
            << std::endl;
  RequestReformLocked();
  return absl::OkStatus();
}

absl::StatusOr<Engine::Layout> Engine::PlanLayout(std::vector<std::string> workers,
                                                  std::vector<int64_t> split) const {
  RingOptions o;
  std::vector<std::string> drained;
  {
    std::lock_guard<std::mutex> l(mu_);
    o = ring_options_;
    drained = drained_;
  }
  if (o.workers.empty()) {
    return absl::FailedPreconditionError("this server runs its stages in-process; it has no ring layout");
  }
  if (!workers.empty()) {
    for (size_t i = 0; i < workers.size(); ++i) {
      if (workers[i].find(':') == std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat("worker address '", workers[i], "': want HOST:PORT"));
      }
      if (std::find(workers.begin(), workers.begin() + i, workers[i]) != workers.begin() + i) {
        return absl::InvalidArgumentError(absl::StrCat("worker ", workers[i], " is listed twice"));
      }
    }
    o.workers = std::move(workers);
  }
  Layout layout;
  layout.workers = o.workers;
  std::erase_if(o.workers, [&](const std::string& w) {
    return std::find(drained.begin(), drained.end(), w) != drained.end();
  });
  if (o.workers.empty()) return absl::FailedPreconditionError("every worker of the layout is drained");
  o.split = std::move(split);
  RING_ASSIGN_OR_RETURN(layout.plan, PlanForWorkers(o));
  return layout;
}

bool Engine::IsCurrentLayout(const Layout& layout) const {
  std::shared_ptr<Ring> ring;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (layout.workers != ring_options_.workers || !missing_.empty()) return false;
    ring = ring_;
  }
  if (ring == nullptr || ring->stages().size() != layout.plan.stages.size()) return false;
  for (size_t i = 0; i < layout.plan.stages.size(); ++i) {
    const RingStageInfo& have = ring->stages()[i];
    const PlanStage& want = layout.plan.stages[i];
    if (have.name.find("(" + want.address + ")") == std::string::npos || have.layers.begin != want.layer_begin ||
        have.layers.end != want.layer_end) {
      return false;
    }
  }
  return true;
}

uint64_t Engine::ApplyLayout(const Layout& layout) {
  std::lock_guard<std::mutex> l(mu_);
  for (const auto& w : ring_options_.workers) {
    if (std::find(layout.workers.begin(), layout.workers.end(), w) == layout.workers.end()) {
      std::erase(drained_, w);
      std::erase(missing_, w);
      metrics_->ForgetWorker(w);
    }
  }
  ring_options_.workers = layout.workers;
  ring_options_.split = layout.plan.LayerCounts();
  return RequestReformLocked();
}

absl::Status Engine::WaitForLayout(uint64_t generation, absl::Time deadline) const {
  std::unique_lock<std::mutex> l(mu_);
  while (formed_generation_ < generation && !stopping_ && absl::Now() < deadline) {
    cv_.wait_for(l, std::chrono::milliseconds(100));
  }
  if (formed_generation_ < generation) {
    return absl::DeadlineExceededError(
        "the new layout is still forming (loading stages); `ringctl status` shows when it is done");
  }
  return layout_status_;
}

Engine::Membership Engine::membership() const {
  std::lock_guard<std::mutex> l(mu_);
  return {ring_options_.workers, drained_, missing_, ring_status_.ok(), std::string(ring_status_.message())};
}

void Engine::MarkBroken(const Ring* failed, const absl::Status& why) {
  std::lock_guard<std::mutex> l(mu_);
  if (ring_ == nullptr || ring_.get() != failed) return;
  std::cerr << "ring-server: ring broken: " << why.message() << "; re-forming" << std::endl;
  ring_.reset();
  ring_status_ = absl::UnavailableError(absl::StrCat("ring broken (", why.message(), "); re-forming"));
  metrics_->ready.Set(0);
  cv_.notify_all();
}

std::string Engine::Degraded() const {
  std::lock_guard<std::mutex> l(mu_);
  std::string out;
  for (const auto& w : missing_) out += (out.empty() ? "" : ", ") + w;
  return out;
}

std::shared_ptr<Ring> Engine::WaitForRing(absl::Time deadline, const std::atomic<bool>* cancelled) const {
  std::unique_lock<std::mutex> l(mu_);
  while (ring_ == nullptr && !stopping_ && absl::Now() < deadline) {
    if (cancelled != nullptr && cancelled->load()) return nullptr;
    cv_.wait_for(l, std::chrono::milliseconds(100));
  }
  return ring_;
}

absl::Status Engine::Ready() const {
  std::lock_guard<std::mutex> l(mu_);
  return ring_status_;
}

absl::Status Engine::WaitReady(absl::Duration timeout) const {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait_for(l, absl::ToChronoNanoseconds(timeout), [this] { return ring_status_.ok() || stopping_; });
  return ring_status_;
}

std::shared_ptr<Ring> Engine::CurrentRing() const {
  std::lock_guard<std::mutex> l(mu_);
  return ring_;
}

RingModelInfo Engine::model() const {
  auto r = CurrentRing();
  return r ? r->model() : RingModelInfo{};
}

std::vector<RingStageInfo> Engine::stages() const {
  auto r = CurrentRing();
  return r ? r->stages() : std::vector<RingStageInfo>{};
}

int64_t Engine::max_context() const {
  if (options_.max_context > 0) return options_.max_context;
  return model().max_position_embeddings;
}

Engine::Slot::~Slot() {
  engine_->active_.fetch_sub(1);
  engine_->metrics_->requests_in_flight.Decrement();
}

std::unique_ptr<Engine::Slot> Engine::TryAcquire() {
  int64_t cur = active_.load();
  while (cur < options_.max_concurrent) {
    if (active_.compare_exchange_weak(cur, cur + 1)) {
      metrics_->requests_in_flight.Increment();
      return std::make_unique<Slot>(this);
    }
  }
  return nullptr;
}

void Engine::Submit(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> l(pool_mu_);
    jobs_.push_back(std::move(job));
  }
  pool_cv_.notify_one();
}

absl::StatusOr<GenerateResult> Engine::Generate(const GenerateRequest& req, const TokenSink& sink,
                                                const std::atomic<bool>* cancelled) {
  std::shared_ptr<Ring> ring = CurrentRing();
  if (ring == nullptr) return Ready();
  if (req.prompt.empty()) return absl::InvalidArgumentError("empty prompt");
  const int64_t vocab = ring->model().vocab_size;
  for (int32_t t : req.prompt) {
    if (t < 0 || t >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", t, " outside the vocabulary [0, ", vocab, ")"));
    }
  }
  const int64_t limit = max_context();
  if (limit > 0 && static_cast<int64_t>(req.prompt.size()) + req.max_tokens > limit) {
    return absl::InvalidArgumentError(absl::StrCat("prompt (", req.prompt.size(), " tokens) + max_tokens (",
                                                   req.max_tokens, ") exceeds the context length ", limit));
  }
  const auto t0 = std::chrono::steady_clock::now();
  metrics_->sequences_live.Increment();
  struct LiveGuard {
    ServerMetrics* m;
    ~LiveGuard() { m->sequences_live.Decrement(); }
  } live{metrics_};
  auto is_cancelled = [&] { return cancelled != nullptr && cancelled->load(); };

  GenerateResult result;
  Sampler sampler(req.sampling);
  // Greedy with nothing that needs the distribution: the last stage picks the token where
  // its logits are and only the token crosses back (RingSequence::StepGreedy).
  const SamplingParams& sp = req.sampling;
  const bool greedy_token = sp.ArgmaxOnly();
  int32_t greedy = -1;
  // Prompt + every token handed to the sink: what a replay must feed to get back here.
  std::vector<int32_t> history = req.prompt;
  std::vector<float> logits;
  absl::Time failover_deadline = absl::InfiniteFuture();
  int attempt = 0;
  auto last = std::chrono::steady_clock::now();

  // One step: the next token's logits, or with greedy_token only the token.
  auto step = [&](RingSequence& seq, const std::vector<int32_t>& tokens) -> absl::Status {
    if (greedy_token) {
      RING_ASSIGN_OR_RETURN(greedy, seq.StepGreedy(tokens));
    } else {
      RING_ASSIGN_OR_RETURN(logits, seq.Step(tokens));
    }
    return absl::OkStatus();
  };
  // A sampled token: metrics, stop tokens, the sink, the length limit. False when the
  // generation is finished (result.finish says why).
  auto accept = [&](const SampledToken& tok) -> bool {
    const auto now = std::chrono::steady_clock::now();
    (result.completion_tokens == 0 ? metrics_->ttft_seconds : metrics_->inter_token_seconds)
        .Observe(Seconds(result.completion_tokens == 0 ? t0 : last, now));
    last = now;
    if (std::find(req.stop_token_ids.begin(), req.stop_token_ids.end(), tok.id) != req.stop_token_ids.end()) {
      result.finish = FinishReason::kStop;
      return false;
    }
    ++result.completion_tokens;
    metrics_->generated_tokens.Increment();
    history.push_back(tok.id);
    if (!sink(tok)) {
      result.finish = FinishReason::kStop;
      return false;
    }
    if (result.completion_tokens >= req.max_tokens) {
      result.finish = FinishReason::kLength;
      return false;
    }
    if (is_cancelled()) {
      result.finish = FinishReason::kCancelled;
      return false;
    }
    return true;
  };
  // One attempt on `ring`: feeds history[fed..] (all of it on a fresh sequence), then
  // decodes. Returns OK when the generation is finished, or the step error.
  auto run = [&](Ring& ring) -> absl::Status {
    RING_ASSIGN_OR_RETURN(std::unique_ptr<RingSequence> seq,
                          ring.NewSequence(attempt == 0 ? req.id : absl::StrCat(req.id, "-replay", attempt)));
    if (seq->closed_loop()) {
      // The ring runs the generation itself; the coordinator streams and stops it.
      ClosedLoopRequest cl;
      cl.tokens = history;
      cl.prefill_chunk = options_.prefill_chunk;
      cl.sampling = req.sampling;
      cl.generated.assign(history.begin() + static_cast<int64_t>(req.prompt.size()), history.end());
      cl.max_new_tokens = static_cast<int32_t>(req.max_tokens - result.completion_tokens);
      cl.stop_token_ids = req.stop_token_ids;
      if (is_cancelled()) {
        result.finish = FinishReason::kCancelled;
        return absl::OkStatus();
      }
      bool finished = false;
      RING_RETURN_IF_ERROR(seq->Generate(cl, [&](const SampledToken& tok) {
        finished = !accept(tok);
        return !finished;
      }));
      if (attempt == 0) metrics_->prompt_tokens.Increment(static_cast<double>(req.prompt.size()));
      if (!finished) {
        // Stage 0 ends the stream at a stop token or max_new_tokens, both of which
        // finished us first; anything else is a stage 0 that broke the protocol.
        return absl::InternalError(absl::StrCat("stage 0 ended generation ", req.id, " after ",
                                                result.completion_tokens, " tokens without a reason"));
      }
      return absl::OkStatus();
    }
    const size_t chunk = options_.prefill_chunk > 0 ? options_.prefill_chunk : history.size();
    for (size_t b = 0; b < history.size(); b += chunk) {
      if (is_cancelled()) {
        result.finish = FinishReason::kCancelled;
        return absl::OkStatus();
      }
      std::vector<int32_t> part(history.begin() + b, history.begin() + std::min(history.size(), b + chunk));
      const auto s0 = std::chrono::steady_clock::now();
      RING_RETURN_IF_ERROR(step(*seq, part));
      metrics_->prefill_step_seconds.Observe(Seconds(s0, std::chrono::steady_clock::now()));
    }
    if (attempt == 0) metrics_->prompt_tokens.Increment(static_cast<double>(req.prompt.size()));
    while (true) {
      SampledToken tok;
      if (greedy_token) {
        if (greedy < 0 || greedy >= vocab) {
          return absl::InternalError(absl::StrCat("last stage returned token ", greedy, ", vocabulary ", vocab));
        }
        tok.id = greedy;
      } else {
        if (static_cast<int64_t>(logits.size()) != vocab) {
          return absl::InternalError(absl::StrCat("last stage returned ", logits.size(), " logits, expected ", vocab));
        }
        tok = sampler.Sample(logits);
      }
      if (!accept(tok)) return absl::OkStatus();
      const auto s0 = std::chrono::steady_clock::now();
      RING_RETURN_IF_ERROR(step(*seq, {tok.id}));
      metrics_->decode_step_seconds.Observe(Seconds(s0, std::chrono::steady_clock::now()));
    }
  };

  while (true) {
    absl::Status s = run(*ring);
    metrics_->checksum_failures.Set(static_cast<double>(ring->checksum_failures()));
    const auto stats = ring->activation_stats();
    for (size_t i = 0; i < stats.size(); ++i) metrics_->SetStageActivation(static_cast<int>(i), stats[i].rms, stats[i].absmax);
    if (s.ok()) break;
    metrics_->CountStageError(StageOf(s));
    if (absl::IsDeadlineExceeded(s)) {
      s = absl::DeadlineExceededError(absl::StrCat(s.message(), " | ring state: ", ring->Diagnose()));
    }
    if (absl::IsResourceExhausted(s)) {
      // A worker's KV budget is full (other sequences hold it, or this request alone is
      // too long for it): the ring is fine, so no replay; the client learns which worker.
      s = absl::ResourceExhaustedError(
          absl::StrCat("the ring has no KV cache room for this request: ", s.message()));
      s.SetPayload(kKvCacheExhaustedPayload, absl::Cord());
    }
    if (!BreaksRing(s)) {
      metrics_->requests_failed.Increment();
      return s;
    }
    MarkBroken(ring.get(), s);
    // Replay on the re-formed ring, within the failover budget.
    if (failover_deadline == absl::InfiniteFuture()) failover_deadline = absl::Now() + options_.failover_timeout;
    if (++attempt > options_.max_replays || options_.failover_timeout <= absl::ZeroDuration()) {
      metrics_->requests_failed.Increment();
      return s;
    }
    const absl::Time wait_start = absl::Now();
    std::shared_ptr<Ring> next = WaitForRing(failover_deadline, cancelled);
    metrics_->failover_wait_seconds.Observe(absl::ToDoubleSeconds(absl::Now() - wait_start));
    if (is_cancelled()) {
      result.finish = FinishReason::kCancelled;
      break;
    }
    if (next == nullptr) {
      metrics_->failover_timeouts.Increment();
      metrics_->requests_failed.Increment();
      return absl::Status(s.code(), absl::StrCat(s.message(), " (no ring re-formed within the failover timeout)"));
    }
    metrics_->requests_replayed.Increment();
    std::cerr << "ring-server: request " << req.id << " replays " << history.size()
              << " tokens on the re-formed ring (attempt " << attempt << ")" << std::endl;
    ring = std::move(next);
  }
  if (result.finish == FinishReason::kCancelled) metrics_->requests_cancelled.Increment();
  metrics_->request_seconds.Observe(Seconds(t0, std::chrono::steady_clock::now()));
  return result;
}

}  // namespace ring
