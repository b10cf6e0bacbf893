// File: server/engine.h
//
// Token generation over a ring: admission (a fixed number of generation slots, so excess
// requests are refused with 429 instead of queueing without bound), the prefill / decode
// step loop with sampling, cancellation, and ring supervision:
//   - the ring is formed in the background (the server is live but not ready until it is);
//   - a step that fails because a stage is gone or stalled marks the ring broken; the
//     supervisor re-forms it from the configured workers, or, when some stay unreachable,
//     from the reachable ones (layers re-split evenly: "degraded"), and goes back to the
//     full ring once the missing workers answer again;
//   - the request whose step failed is not lost: it waits (bounded by failover_timeout)
//     for the re-formed ring and replays its prompt plus the tokens it already emitted,
//     then continues with the same sampler state, so the client's stream has no token
//     lost or repeated. Without a ring in time it fails with the error naming the stage.
//
//   Engine engine(ring_options, {.max_concurrent = 4}, &metrics);
//   engine.Start();
//   auto slot = engine.TryAcquire();                 // nullptr: full -> 429
//   engine.Submit([&] { engine.Generate(req, sink, &cancelled); });
#ifndef RINGSERVE_SERVER_ENGINE_H_
#define RINGSERVE_SERVER_ENGINE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/metrics.h"
#include "server/ring.h"
#include "kernels/cpu/sampling.h"

namespace ring {

struct GenerateRequest {
  std::string id;  // unique; names the sequence on every stage
  std::vector<int32_t> prompt;
  int32_t max_tokens = 16;
  SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;  // EOS and friends; the token is not returned
};

enum class FinishReason { kStop, kLength, kCancelled };

struct GenerateResult {
  FinishReason finish = FinishReason::kLength;
  int32_t completion_tokens = 0;
};

// Generate's error when a worker refused a step because its KV cache budget was full
// (RESOURCE_EXHAUSTED from the worker): the message names the worker, the bytes needed and
// the budget. True for that status only, so the HTTP layer can tell it from other 429s.
bool IsKvCacheExhausted(const absl::Status& status);

// Receives each generated token on the generation thread; returning false stops the
// generation with FinishReason::kStop (e.g. a stop string matched).
using TokenSink = std::function<bool(const SampledToken&)>;

class Engine {
 public:
  struct Options {
    int max_concurrent = 4;
    int64_t prefill_chunk = 512;
    // Context limit (prompt + generated). 0: the model's max_position_embeddings.
    int64_t max_context = 0;
    absl::Duration reform_backoff = absl::Seconds(1);
    // Replay a request on a re-formed ring after a stage failure (0: fail it instead).
    absl::Duration failover_timeout = absl::Seconds(60);
    int max_replays = 3;
    // Form a ring from the reachable workers when some stay down.
    bool degraded_rings = true;
    // How often a degraded ring checks whether the missing workers are back.
    absl::Duration rejoin_probe = absl::Seconds(2);
    // How often every configured worker is asked Describe for ring_worker_up (0: never).
    absl::Duration health_probe = absl::Seconds(5);
  };

  // How rings are formed; tests substitute a scripted ring. Default: Ring::Connect.
  using RingFactory = std::function<absl::StatusOr<std::unique_ptr<Ring>>(const RingOptions&)>;

  Engine(RingOptions ring_options, Options options, ServerMetrics* metrics,
         RingFactory factory = nullptr);
  ~Engine();  // stops the pool; callers must have finished their generations

  // Starts forming the ring in the background.
  void Start();
  // Ok when the ring is formed; otherwise Unavailable with what is missing.
  absl::Status Ready() const;
  // Waits until Ready() or the timeout (for tests and start-up scripts).
  absl::Status WaitReady(absl::Duration timeout) const;
  // Workers left out of the current ring because they did not answer ("" when none).
  std::string Degraded() const;

  // Membership (ringctl drain/undrain/join/leave through the admin service). Each change
  // re-forms the ring in the background; requests in flight replay on the new ring.
  absl::Status Drain(const std::string& address);
  absl::Status Undrain(const std::string& address);
  // Who asked for a Join / Leave: an operator (ringctl) or the worker itself
  // (ring-worker --join, and its Leave on shutdown). Only the log differs.
  enum class MembershipSource { kOperator, kWorker };
  // Join of a worker already configured changes nothing and succeeds: a worker started
  // with --join re-registers periodically, and concurrent Joins of one address add it once.
  absl::Status Join(const std::string& address, MembershipSource source = MembershipSource::kOperator);
  absl::Status Leave(const std::string& address, MembershipSource source = MembershipSource::kOperator);
  struct Membership {
    std::vector<std::string> workers;  // configured, in ring order
    std::vector<std::string> drained;
    std::vector<std::string> missing;  // unreachable, left out of the current ring
    bool ready = false;
    std::string reason;                // why not ready
  };
  Membership membership() const;

  // Layout changes (ringctl apply / rebalance through the admin service). A layout is the
  // configured worker order plus the layer split of the serving (not drained) workers.
  struct Layout {
    std::vector<std::string> workers;  // configured order, drained ones included
    RingPlan plan;                     // stages of the serving workers
  };
  // Checks a layout against the workers as they are now (server/planner.h: every worker
  // answers, layers sum up, weights + KV budget fit): `workers` empty keeps the configured
  // ones; `split` empty plans the split by free memory and measured bandwidth.
  absl::StatusOr<Layout> PlanLayout(std::vector<std::string> workers,
                                    std::vector<int64_t> split) const;
  // True when the formed ring already has exactly this layout (nothing would move).
  bool IsCurrentLayout(const Layout& layout) const;
  // Makes `layout` the configuration and re-forms the ring in the background, as a
  // membership change does (requests in flight replay); returns the change's generation.
  uint64_t ApplyLayout(const Layout& layout);
  // Waits until a ring formation that included change `generation` finished (or
  // `deadline`): its status, DeadlineExceeded when still forming.
  absl::Status WaitForLayout(uint64_t generation, absl::Time deadline) const;
  const RingOptions& ring_options() const { return ring_options_; }  // auth/TLS for probes

  // A generation slot; released when destroyed. nullptr when all are taken.
  class Slot {
   public:
    explicit Slot(Engine* e) : engine_(e) {}
    ~Slot();
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;

   private:
    Engine* engine_;
  };
  std::unique_ptr<Slot> TryAcquire();
  int64_t active() const { return active_.load(); }

  // Runs `job` on the generation pool (one thread per slot, so an admitted job starts at
  // once).
  void Submit(std::function<void()> job);

  // Blocking: prefill + decode of one request on the calling thread. Checks `cancelled`
  // between steps. Errors name the stage that failed.
  absl::StatusOr<GenerateResult> Generate(const GenerateRequest& req, const TokenSink& sink,
                                          const std::atomic<bool>* cancelled);

  // Model facts; valid once Ready().
  RingModelInfo model() const;
  std::vector<RingStageInfo> stages() const;
  int64_t max_context() const;

 private:
  std::shared_ptr<Ring> CurrentRing() const;
  // The current ring, waiting up to `deadline` for one to form; null on timeout or cancel.
  std::shared_ptr<Ring> WaitForRing(absl::Time deadline, const std::atomic<bool>* cancelled) const;
  void SuperviseLoop();
  // Forms the ring (full, else degraded); returns the ring and the workers left out.
  // `generation` receives the layout generation the attempt used.
  absl::StatusOr<std::pair<std::unique_ptr<Ring>, std::vector<std::string>>> Form(uint64_t* generation);
  // Asks the supervisor to re-form with the current configuration; mu_ held.
  uint64_t RequestReformLocked();
  // Sets ring_worker_up for every configured worker, every options_.health_probe.
  void HealthProbeLoop();
  // Drops `failed` if it is still the current ring (a stale ring's failure is ignored).
  void MarkBroken(const Ring* failed, const absl::Status& why);

  RingOptions ring_options_;  // .workers guarded by mu_ (membership changes)
  const Options options_;
  ServerMetrics* metrics_;
  const RingFactory factory_;

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::shared_ptr<Ring> ring_;      // null until formed / while broken
  absl::Status ring_status_ = absl::UnavailableError("ring not formed yet");
  std::vector<std::string> missing_;  // workers left out of a degraded ring
  std::vector<std::string> drained_;
  bool reform_requested_ = false;
  uint64_t layout_generation_ = 0;  // bumped by every membership / layout change
  uint64_t formed_generation_ = 0;  // generation of the last finished formation attempt
  // The formation barrier (RingOptions::formation): every attempt gets the next number,
  // scoped by this process's random id, so workers refuse LoadStage calls of an
  // abandoned attempt that arrive late.
  uint64_t formations_ = 0;
  const std::string coordinator_id_;
  absl::Status layout_status_;      // ... and its result
  std::string last_form_error_;
  bool stopping_ = false;
  std::thread supervisor_;
  std::thread health_prober_;

  std::atomic<int64_t> active_{0};
  std::mutex pool_mu_;
  std::condition_variable pool_cv_;
  std::deque<std::function<void()>> jobs_;
  bool pool_stopping_ = false;  // guarded by pool_mu_
  std::vector<std::thread> pool_;
};

}  // namespace ring

#endif  // RINGSERVE_SERVER_ENGINE_H_
