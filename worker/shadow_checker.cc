#include "worker/shadow_checker.h"

#include <xxhash.h>

#include <cmath>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ring::worker {
namespace pb = ringserve::v1;

namespace {

double RelativeDifference(const std::vector<float>& d, const std::vector<float>& c) {
  double num = 0, den = 0;
  if (d.size() != c.size()) return INFINITY;
  for (size_t i = 0; i < c.size(); ++i) {
    if (!std::isfinite(d[i])) return INFINITY;
    const double e = static_cast<double>(d[i]) - c[i];
    num += e * e;
    den += static_cast<double>(c[i]) * c[i];
  }
  return den > 0 ? std::sqrt(num / den) : (num > 0 ? INFINITY : 0);
}

}  // namespace

ShadowChecker::ShadowChecker(std::unique_ptr<Stage> reference, ShadowOptions options,
                             std::string stage_name, LayerObserver on_layer)
    : reference_(std::move(reference)), options_(options), stage_name_(std::move(stage_name)),
      on_layer_(std::move(on_layer)) {
  stats_.set_rate(options_.rate);
  stats_.set_threshold(options_.threshold);
  for (int64_t l = reference_->range().begin; l < reference_->range().end; ++l) {
    stats_.add_layers()->set_layer(l);
  }
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
  auto& seq = sequences_[item.sequence_id];
  const bool first = seq == nullptr;
  if (first) seq = reference_->NewSequence();
  absl::StatusOr<StageOutput> out = reference_->Forward(*seq, item.in);
  absl::MutexLock l(&mu_);
  if (first) stats_.set_sequences_sampled(stats_.sequences_sampled() + 1);
  if (!out.ok() || out->layer_hidden.size() != item.device_layers.size()) {
    // The mirror lost step with the device (e.g. it started mid-sequence): stop mirroring.
    dropped_[item.sequence_id] = true;
    stats_.set_sequences_dropped(stats_.sequences_dropped() + 1);
    sequences_.erase(item.sequence_id);
    return;
  }
  double worst = 0;
  int64_t worst_layer = -1;
  for (size_t i = 0; i < out->layer_hidden.size(); ++i) {
    const double rel = RelativeDifference(item.device_layers[i], out->layer_hidden[i]);
    pb::ShadowLayer* ls = stats_.mutable_layers(static_cast<int>(i));
    ls->set_checks(ls->checks() + 1);
    ls->set_last_relative_difference(rel);
    ls->set_max_relative_difference(std::max(ls->max_relative_difference(), rel));
    if (on_layer_) on_layer_(ls->layer(), rel, rel > options_.threshold);
    if (rel > worst || worst_layer < 0) {
      worst = rel;
      worst_layer = ls->layer();
    }
  }
  stats_.set_steps_checked(stats_.steps_checked() + 1);
  stats_.set_last_relative_difference(worst);
  stats_.set_max_relative_difference(std::max(stats_.max_relative_difference(), worst));
  if (worst > options_.threshold) {
    stats_.set_divergences(stats_.divergences() + 1);
    const std::string what = absl::StrFormat(
        "%s: shadow check of sequence %s diverged at layer %d: relative difference %.3e > %.3g "
        "against the CPU reference (run `ringctl verify` on these layers to find the op)",
        stage_name_, item.sequence_id, worst_layer, worst, options_.threshold);
    stats_.set_last_divergence(what);
    std::cerr << "ring-worker: WARNING: " << what << "\n";
    if (options_.degrade && degraded_.empty()) degraded_ = what;
  }
}

}  // namespace ring::worker
