#include "worker/shadow_checker.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/cpu/thread_pool.h"
#include "models/verify.h"

namespace ring::worker {
namespace pb = ringserve::v1;

namespace {

// The q-quantile (0 <= q <= 1) of v: the element of rank floor(q * (n - 1)); 0 for none.
double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  const size_t k = static_cast<size_t>(q * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + k, v.end());
  return v[k];
}

constexpr double kFloorQuantile = 0.75;  // see shadow_checker.h

}  // namespace


ShadowChecker::ShadowChecker(std::unique_ptr<Stage> reference,
                             std::unique_ptr<Stage> floor_reference, ShadowOptions options,
                             std::string stage_name, LayerObserver on_layer)
    : reference_(std::move(reference)),
      floor_reference_(options.noise_floor ? std::move(floor_reference) : nullptr),
      options_(options),
      stage_name_(std::move(stage_name)),
      on_layer_(std::move(on_layer)) {
  stats_.set_noise_floor(floor_reference_ != nullptr);
  if (floor_reference_) stats_.set_floor_factor(options_.floor_factor);
  stats_.set_rate(options_.rate);
  stats_.set_threshold(options_.threshold);
  for (int64_t l = reference_->range().begin; l < reference_->range().end; ++l) {
    stats_.add_layers()->set_layer(l);
  }
  recent_.resize(stats_.layers_size());
  thread_ = std::thread([this] { Run(); });
}

ShadowChecker::~ShadowChecker() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  thread_.join();
}

bool ShadowChecker::Sampled(const std::string& sequence_id) const {
  if (options_.rate <= 0) return false;
  if (options_.rate >= 1) return true;
  const uint64_t h = XXH3_64bits_withSeed(sequence_id.data(), sequence_id.size(), 0x5eed);
  return static_cast<double>(h >> 11) * 0x1.0p-53 < options_.rate;
}

void ShadowChecker::Observe(const std::string& sequence_id, const StageInput& in,
                            std::vector<std::vector<float>> device_layers) {
  absl::MutexLock l(&mu_);
  if (dropped_.count(sequence_id)) return;
  if (queue_.size() >= options_.max_queue) {
    // The CPU is behind: stop mirroring this sequence (its reference cache would miss this
    // step) instead of making the device wait.
    dropped_[sequence_id] = true;
    stats_.set_sequences_dropped(stats_.sequences_dropped() + 1);
    Item rel;
    rel.sequence_id = sequence_id;
    rel.release = true;
    queue_.push_back(std::move(rel));
    return;
  }
  Item item;
  item.sequence_id = sequence_id;
  item.in = in;
  item.in.capture_layers = true;
  item.device_layers = std::move(device_layers);
  queue_.push_back(std::move(item));
}

void ShadowChecker::Release(const std::string& sequence_id) {
  absl::MutexLock l(&mu_);
  dropped_.erase(sequence_id);
  Item rel;
  rel.sequence_id = sequence_id;
  rel.release = true;
  queue_.push_back(std::move(rel));
}

std::string ShadowChecker::degraded_reason() const {
  absl::MutexLock l(&mu_);
  return degraded_;
}

pb::ShadowStats ShadowChecker::Stats() const {
  absl::MutexLock l(&mu_);
  return stats_;
}

void ShadowChecker::Drain() {
  absl::MutexLock l(&mu_);
  auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return queue_.empty() && !busy_; };
  mu_.Await(absl::Condition(&idle));
}

void ShadowChecker::Run() {
  if (options_.idle_priority) cpu::SetIdlePriority();
  for (;;) {
    Item item;
    {
      absl::MutexLock l(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
      // A bounded wait keeps the loop honest about stop_ even without a notification.
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(1));
      if (stop_) return;
      if (queue_.empty()) continue;
      item = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    if (item.release) {
      sequences_.erase(item.sequence_id);
    } else {
      Check(item);
    }
    absl::MutexLock l(&mu_);
    busy_ = false;
  }
}

void ShadowChecker::Check(Item& item) {
  Mirror& m = sequences_[item.sequence_id];
  const bool first = m.ref == nullptr;
  if (first) {
    m.ref = reference_->NewSequence();
    if (floor_reference_) m.floor = floor_reference_->NewSequence();
  }
  absl::StatusOr<StageOutput> out = reference_->Forward(*m.ref, item.in);
  absl::StatusOr<StageOutput> floor_out = absl::UnavailableError("no floor");
  if (out.ok() && m.floor) floor_out = floor_reference_->Forward(*m.floor, item.in);
  absl::MutexLock l(&mu_);
  if (first) stats_.set_sequences_sampled(stats_.sequences_sampled() + 1);
  if (!out.ok() || out->layer_hidden.size() != item.device_layers.size() ||
      (m.floor && (!floor_out.ok() || floor_out->layer_hidden.size() != item.device_layers.size()))) {
    // The mirror lost step with the device (e.g. it started mid-sequence): stop mirroring.
    dropped_[item.sequence_id] = true;
    stats_.set_sequences_dropped(stats_.sequences_dropped() + 1);
    sequences_.erase(item.sequence_id);
    return;
  }
  double worst = 0;
  int64_t worst_layer = -1;
  bool diverged = false;
  int64_t first_diverged = -1;
  double first_rel = 0, first_median = 0, first_floor = -1;
  int first_n = 0;
  for (size_t i = 0; i < out->layer_hidden.size(); ++i) {
    const TensorDiff d = DiffTensors(item.device_layers[i], out->layer_hidden[i]);
    const double floor =
        m.floor ? DiffTensors(floor_out->layer_hidden[i], out->layer_hidden[i]).rel : -1;
    auto& recent = recent_[i];
    recent.emplace_back(d.rel, floor);
    while (static_cast<int>(recent.size()) > std::max(1, options_.window)) recent.pop_front();
    std::vector<double> rels, floors;
    for (const auto& [r, f] : recent) {
      rels.push_back(r);
      floors.push_back(f);
    }
    TensorDiff typical = d;
    typical.rel = Quantile(rels, 0.5);
    const double floor_q = floor >= 0 ? Quantile(floors, kFloorQuantile) : -1;
    const bool judged = static_cast<int>(recent.size()) >= std::max(1, options_.min_checks);
    const bool over =
        !std::isfinite(d.rel) || d.nan + d.inf > 0 || d.rel > options_.hard_limit ||
        (judged && !LayerWithinTolerance(typical, floor_q, options_.threshold, options_.floor_factor));
    pb::ShadowLayer* ls = stats_.mutable_layers(static_cast<int>(i));
    ls->set_checks(ls->checks() + 1);
    ls->set_last_relative_difference(d.rel);
    ls->set_max_relative_difference(std::max(ls->max_relative_difference(), d.rel));
    ls->set_last_noise_floor(floor);
    if (over) ls->set_divergences(ls->divergences() + 1);
    if (on_layer_) on_layer_(ls->layer(), d.rel, over);
    if (d.rel > worst || worst_layer < 0) {
      worst = d.rel;
      worst_layer = ls->layer();
    }
    if (over && !diverged) {
      diverged = true;
      first_diverged = ls->layer();
      first_rel = d.rel;
      first_median = typical.rel;
      first_n = static_cast<int>(recent.size());
      first_floor = floor_q;
    }
  }
  stats_.set_steps_checked(stats_.steps_checked() + 1);
  stats_.set_last_relative_difference(worst);
  stats_.set_max_relative_difference(std::max(stats_.max_relative_difference(), worst));
  if (diverged) {
    stats_.set_divergences(stats_.divergences() + 1);
    const std::string what = absl::StrFormat(
        "%s: shadow check of sequence %s diverged at layer %d: relative difference %.3e "
        "(median of the last %d checks %.3e) against the CPU reference; threshold %.3g%s "
        "(run `ringctl verify` on these layers to find the op)",
        stage_name_, item.sequence_id, first_diverged, first_rel,
        first_n, first_median, options_.threshold,
        first_floor >= 0 ? absl::StrFormat(", %.3g x the noise floor's 75th percentile %.3e",
                                           options_.floor_factor, first_floor)
                         : std::string());
    stats_.set_last_divergence(what);
    std::cerr << "ring-worker: WARNING: " << what << "\n";
    if (options_.degrade && degraded_.empty()) degraded_ = what;
  }
}

}  // namespace ring::worker
