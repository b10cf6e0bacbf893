#include "server/admin_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/grpc_status.h"
#include "worker/stage_client.h"

namespace ring {
namespace {

namespace pb = ringserve::v1;

bool SameKey(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
}

Engine::MembershipSource Source(const pb::JoinRequest& req) {
  return req.from_worker() ? Engine::MembershipSource::kWorker : Engine::MembershipSource::kOperator;
}

}  // namespace

AdminService::AdminService(AdminOptions options, Engine* engine, ServerMetrics* metrics)
    : options_(std::move(options)), engine_(engine), metrics_(metrics), started_(absl::Now()) {}

grpc::Status AdminService::CheckAuth(const grpc::ServerContext* ctx) const {
  if (options_.keys.empty()) return grpc::Status::OK;
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  if (it != md.end()) {
    const std::string got(it->second.data(), it->second.size());
    for (const auto& k : options_.keys) {
      if (SameKey(got, "Bearer " + k)) return grpc::Status::OK;
    }
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      "ring-server admin: missing or wrong key (ringctl --api-key or $RINGSERVE_API_KEY)");
}

std::string AdminService::RingState() const {
  if (options_.draining && options_.draining()) return "draining";
  const Engine::Membership m = engine_->membership();
  if (!m.ready) return "forming";
  return m.missing.empty() ? "ready" : "degraded";
}

grpc::Status AdminService::Status(grpc::ServerContext* ctx, const pb::StatusRequest*,
                                  pb::StatusResponse* resp) {
  if (auto a = CheckAuth(ctx); !a.ok()) return a;
  const Engine::Membership m = engine_->membership();
  resp->set_state(RingState());
  if (!m.ready) {
    resp->set_reason(m.reason);
  } else if (!m.missing.empty()) {
    std::string r = "unreachable, left out of the ring:";
    for (const auto& w : m.missing) absl::StrAppend(&r, " ", w);
    resp->set_reason(r);
  }
  const RingModelInfo info = engine_->model();
  resp->set_model(options_.model_name);
  resp->set_model_type(info.model_type);
  resp->set_num_layers(info.num_layers);
  resp->set_requests_in_flight(options_.in_flight ? options_.in_flight() : 0);
  resp->set_max_concurrent(options_.max_concurrent);
  resp->set_generated_tokens_total(metrics_->generated_tokens.Value());
  resp->set_requests_replayed_total(metrics_->requests_replayed.Value());
  resp->set_ring_reforms_total(metrics_->ring_reforms.Value());
  resp->set_build_version(RING_BUILD_VERSION);
  resp->set_uptime_seconds(absl::ToInt64Seconds(absl::Now() - started_));

  const std::vector<RingStageInfo> stages = engine_->stages();
  const worker::StageClientOptions co = ClientOptions(engine_->ring_options(), absl::Seconds(2));
  for (size_t i = 0; i < m.workers.size(); ++i) {
    const std::string& addr = m.workers[i];
    pb::WorkerStatus* w = resp->add_workers();
    w->set_address(addr);
    w->set_stage_index(-1);
    for (size_t s = 0; s < stages.size(); ++s) {
      if (stages[s].name.find("(" + addr + ")") != std::string::npos) {
        w->set_stage_index(static_cast<int32_t>(s));
        w->set_weight_bytes(stages[s].weight_bytes);
      }
    }
    const bool drained = std::find(m.drained.begin(), m.drained.end(), addr) != m.drained.end();
    worker::StageClient c(addr, static_cast<int>(i), co);
    auto d = c.Describe();
    if (!d.ok()) {
      w->set_state("unreachable");
      w->set_last_error(std::string(d.status().message()));
      continue;
    }
    w->set_state(!d->degraded_reason().empty() ? "degraded"
                 : drained                      ? "drained"
                 : w->stage_index() >= 0        ? "serving"
                                                : "standby");
    w->set_degraded_reason(d->degraded_reason());
    w->set_backend(d->backend());
    for (const auto& dev : d->devices()) w->add_devices(dev);
    if (d->has_attestation() && d->attestation().compute_capability() > 0) {
      w->set_arch(absl::StrCat("sm_", d->attestation().compute_capability()));
      w->set_device_name(d->attestation().device_name());
    } else {
      for (const auto& a : d->compiled_archs()) {
        if (a == "x86_64" || a == "aarch64") w->set_arch(a);
      }
    }
    w->set_memory_free_bytes(d->memory_free_bytes());
    w->set_build_version(d->build_version());
    w->set_checksum_failures(d->checksum_failures());
    w->set_tokens_per_second(d->tokens_per_second());
    w->set_metrics_address(d->metrics_address());
    w->set_last_error(d->last_error());
    w->set_last_error_unix_seconds(d->last_error_unix_seconds());
    if (d->loaded()) {
      w->set_layer_begin(d->layer_begin());
      w->set_layer_end(d->layer_end());
      w->set_epoch(d->epoch());
      w->set_cache_bytes(d->kv_cache_bytes());
      w->set_kv_cache_budget_bytes(d->kv_cache_budget_bytes());
    }
    auto fr = c.FlightRecorder();
    if (fr.ok()) {
      w->set_waiting_on(fr->waiting_on());
      w->set_live_sequences(fr->sequences_size());
    }
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::Drain(grpc::ServerContext* ctx, const pb::DrainRequest* req,
                                 pb::DrainResponse* resp) {
  if (auto a = CheckAuth(ctx); !a.ok()) return a;
  if (auto s = engine_->Drain(req->address()); !s.ok()) return worker::ToGrpcStatus(s);
  resp->set_state(RingState());
  for (const auto& d : engine_->membership().drained) resp->add_drained(d);
  return grpc::Status::OK;
}

grpc::Status AdminService::Undrain(grpc::ServerContext* ctx, const pb::DrainRequest* req,
                                   pb::DrainResponse* resp) {
  if (auto a = CheckAuth(ctx); !a.ok()) return a;
  if (auto s = engine_->Undrain(req->address()); !s.ok()) return worker::ToGrpcStatus(s);
  resp->set_state(RingState());
  for (const auto& d : engine_->membership().drained) resp->add_drained(d);
  return grpc::Status::OK;
}

grpc::Status AdminService::Join(grpc::ServerContext* ctx, const pb::JoinRequest* req,
                                pb::JoinResponse* resp) {
  if (auto a = CheckAuth(ctx); !a.ok()) return a;
  if (auto s = engine_->Join(req->address(), Source(*req)); !s.ok()) return worker::ToGrpcStatus(s);
  for (const auto& w : engine_->membership().workers) resp->add_workers(w);
  return grpc::Status::OK;
}

grpc::Status AdminService::Leave(grpc::ServerContext* ctx, const pb::JoinRequest* req,
                                 pb::JoinResponse* resp) {
  if (auto a = CheckAuth(ctx); !a.ok()) return a;
  if (auto s = engine_->Leave(req->address(), Source(*req)); !s.ok()) return worker::ToGrpcStatus(s);
  for (const auto& w : engine_->membership().workers) resp->add_workers(w);
  return grpc::Status::OK;
}

}  // namespace ring

namespace ring {

grpc::Status AdminService::MoveTo(grpc::ServerContext* ctx, absl::StatusOr<Engine::Layout> layout,
                                  bool dry_run, pb::ApplyResponse* resp) {
  if (!layout.ok()) return worker::ToGrpcStatus(layout.status());
  for (const auto& st : layout->plan.stages) resp->add_workers(st.address);
  for (int64_t n : layout->plan.LayerCounts()) resp->add_split(n);
  resp->set_plan(layout->plan.ToText());
  resp->set_changed(!engine_->IsCurrentLayout(*layout));
  if (!dry_run && resp->changed()) {
    const uint64_t generation = engine_->ApplyLayout(*layout);
    // Loading the new stages can take minutes on a real model: wait as long as the caller
    // does; a caller that gives up early sees DeadlineExceeded while the ring keeps forming.
    // Never unbounded: a caller without a deadline waits for one full load at most.
    const absl::Time deadline = std::min(absl::FromChrono(ctx->deadline()),
                                         absl::Now() + engine_->ring_options().load_timeout + absl::Minutes(1));
    if (absl::Status s = engine_->WaitForLayout(generation, deadline); !s.ok()) {
      return worker::ToGrpcStatus(s);
    }
  }
  resp->set_state(RingState());
  for (const auto& st : engine_->stages()) {
    resp->add_stages(absl::StrCat(st.name, " layers ", st.layers.begin, "..", st.layers.end));
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::Apply(grpc::ServerContext* ctx, const pb::ApplyRequest* req,
                                 pb::ApplyResponse* resp) {
  if (auto a = CheckAuth(ctx); !a.ok()) return a;
  std::vector<std::string> workers(req->workers().begin(), req->workers().end());
  std::vector<int64_t> split(req->split().begin(), req->split().end());
  if (workers.empty() && split.empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "apply: give workers and/or a split (ringctl rebalance re-plans the split)");
  }
  return MoveTo(ctx, engine_->PlanLayout(std::move(workers), std::move(split)), req->dry_run(), resp);
}

grpc::Status AdminService::Rebalance(grpc::ServerContext* ctx, const pb::RebalanceRequest* req,
                                     pb::ApplyResponse* resp) {
  if (auto a = CheckAuth(ctx); !a.ok()) return a;
  return MoveTo(ctx, engine_->PlanLayout({}, {}), req->dry_run(), resp);
}

}  // namespace ring
