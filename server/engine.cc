#include "server/engine.h"

#include <algorithm>
#include <chrono>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

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

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

Engine::Engine(RingOptions ring_options, Options options, ServerMetrics* metrics)
    : ring_options_(std::move(ring_options)), options_(options), metrics_(metrics) {
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
}

void Engine::Start() { supervisor_ = std::thread([this] { SuperviseLoop(); }); }

void Engine::SuperviseLoop() {
  while (true) {
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [this] { return stopping_ || ring_ == nullptr; });
      if (stopping_) return;
    }
    auto formed = Ring::Connect(ring_options_);
    std::unique_lock<std::mutex> l(mu_);
    if (stopping_) return;
    if (formed.ok()) {
      ring_ = std::move(*formed);
      ring_status_ = absl::OkStatus();
      metrics_->ready.Set(1);
      metrics_->ring_reforms.Increment();
      cv_.notify_all();
    } else {
      ring_status_ = absl::UnavailableError(
          absl::StrCat("ring not formed: ", formed.status().message(), " (retrying)"));
      cv_.wait_for(l, absl::ToChronoNanoseconds(options_.reform_backoff),
                   [this] { return stopping_; });
    }
  }
}

void Engine::MarkBroken(const absl::Status& why) {
  std::lock_guard<std::mutex> l(mu_);
  if (ring_ == nullptr) return;
  ring_.reset();
  ring_status_ = absl::UnavailableError(absl::StrCat("ring broken (", why.message(), "); re-forming"));
  metrics_->ready.Set(0);
  cv_.notify_all();
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
  auto fail = [&](const absl::Status& s) -> absl::Status {
    metrics_->requests_failed.Increment();
    metrics_->CountStageError(StageOf(s));
    metrics_->checksum_failures.Set(static_cast<double>(ring->checksum_failures()));
    absl::Status out = s;
    if (absl::IsDeadlineExceeded(s)) {
      out = absl::DeadlineExceededError(absl::StrCat(s.message(), " | ring state: ", ring->Diagnose()));
    }
    if (BreaksRing(s)) MarkBroken(out);
    return out;
  };

  const auto t0 = std::chrono::steady_clock::now();
  GenerateResult result;
  metrics_->sequences_live.Increment();
  struct LiveGuard {
    ServerMetrics* m;
    ~LiveGuard() { m->sequences_live.Decrement(); }
  } live{metrics_};
  auto seq_or = ring->NewSequence(req.id);
  if (!seq_or.ok()) return fail(seq_or.status());
  std::unique_ptr<RingSequence> seq = std::move(*seq_or);
  Sampler sampler(req.sampling);

  std::vector<float> logits;
  const size_t chunk = options_.prefill_chunk > 0 ? options_.prefill_chunk : req.prompt.size();
  for (size_t b = 0; b < req.prompt.size(); b += chunk) {
    if (cancelled != nullptr && cancelled->load()) {
      result.finish = FinishReason::kCancelled;
      metrics_->requests_cancelled.Increment();
      return result;
    }
    std::vector<int32_t> part(req.prompt.begin() + b,
                              req.prompt.begin() + std::min(req.prompt.size(), b + chunk));
    const auto s0 = std::chrono::steady_clock::now();
    auto out = seq->Step(part);
    if (!out.ok()) return fail(out.status());
    metrics_->prefill_step_seconds.Observe(Seconds(s0, std::chrono::steady_clock::now()));
    logits = std::move(*out);
  }
  metrics_->prompt_tokens.Increment(static_cast<double>(req.prompt.size()));

  auto last = std::chrono::steady_clock::now();
  while (true) {
    if (static_cast<int64_t>(logits.size()) != vocab) {
      return fail(absl::InternalError(absl::StrCat("last stage returned ", logits.size(),
                                                   " logits, expected ", vocab)));
    }
    const SampledToken tok = sampler.Sample(logits);
    const auto now = std::chrono::steady_clock::now();
    (result.completion_tokens == 0 ? metrics_->ttft_seconds : metrics_->inter_token_seconds)
        .Observe(Seconds(result.completion_tokens == 0 ? t0 : last, now));
    last = now;
    if (std::find(req.stop_token_ids.begin(), req.stop_token_ids.end(), tok.id) !=
        req.stop_token_ids.end()) {
      result.finish = FinishReason::kStop;
      break;
    }
    ++result.completion_tokens;
    metrics_->generated_tokens.Increment();
    if (!sink(tok)) {
      result.finish = FinishReason::kStop;
      break;
    }
    if (result.completion_tokens >= req.max_tokens) {
      result.finish = FinishReason::kLength;
      break;
    }
    if (cancelled != nullptr && cancelled->load()) {
      result.finish = FinishReason::kCancelled;
      break;
    }
    const auto s0 = std::chrono::steady_clock::now();
    auto out = seq->Step({tok.id});
    if (!out.ok()) return fail(out.status());
    metrics_->decode_step_seconds.Observe(Seconds(s0, std::chrono::steady_clock::now()));
    logits = std::move(*out);
  }
  if (result.finish == FinishReason::kCancelled) metrics_->requests_cancelled.Increment();
  metrics_->request_seconds.Observe(Seconds(t0, std::chrono::steady_clock::now()));
  metrics_->checksum_failures.Set(static_cast<double>(ring->checksum_failures()));
  return result;
}

}  // namespace ring
