#include "worker/stage_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "kernels/status.h"
#include "worker/frame.h"
#include "worker/grpc_status.h"
#include "worker/worker_service.h"

namespace ring::worker {
namespace {

namespace pb = ringserve::v1;

// How long closing a stream may take (half-close, then the worker's status).
constexpr absl::Duration kCloseTimeout = absl::Seconds(1);

}  // namespace

CallWatchdog& CallWatchdog::Get() {
  // Leaked on purpose: streams may still be closed from other static destructors.
  static CallWatchdog* const watchdog = new CallWatchdog();
  return *watchdog;
}

CallWatchdog::CallWatchdog() {
  std::thread([this] { Loop(); }).detach();
}

uint64_t CallWatchdog::Arm(grpc::ClientContext* ctx, absl::Time deadline) {
  absl::MutexLock l(&mu_);
  const uint64_t id = next_id_++;
  armed_[id] = {ctx, deadline};
  if (deadline < sleeping_until_) cv_.Signal();
  return id;
}

bool CallWatchdog::Disarm(uint64_t id) {
  absl::MutexLock l(&mu_);
  auto it = armed_.find(id);
  if (it == armed_.end()) return true;  // the loop fired it and removed it
  armed_.erase(it);
  return false;
}

void CallWatchdog::Loop() {
  absl::MutexLock l(&mu_);
  while (true) {
    const absl::Time now = absl::Now();
    absl::Time earliest = absl::InfiniteFuture();
    for (auto it = armed_.begin(); it != armed_.end();) {
      if (it->second.deadline <= now) {
        // Under mu_, so Disarm cannot return (and the context cannot be freed) meanwhile.
        it->second.ctx->TryCancel();
        it = armed_.erase(it);
      } else {
        earliest = std::min(earliest, it->second.deadline);
        ++it;
      }
    }
    sleeping_until_ = earliest;
    cv_.WaitWithDeadline(&mu_, earliest);
  }
}

ForwardStream::ForwardStream(
    std::string what, std::unique_ptr<grpc::ClientContext> ctx,
    std::unique_ptr<grpc::ClientReaderWriter<pb::ActivationFrame, pb::ActivationFrame>> stream)
    : what_(std::move(what)), ctx_(std::move(ctx)), stream_(std::move(stream)) {}

ForwardStream::~ForwardStream() { (void)Close(kCloseTimeout); }

absl::Status ForwardStream::Fail(bool deadline_fired, absl::Duration timeout,
                                 absl::string_view during) {
  if (!finished_) {
    // After a failed read or write the call is over and Finish returns its status at
    // once; the alarm is for a transport that never tells us.
    CallWatchdog& watchdog = CallWatchdog::Get();
    const uint64_t alarm = watchdog.Arm(ctx_.get(), absl::Now() + kCloseTimeout);
    grpc::Status s = stream_->Finish();
    watchdog.Disarm(alarm);
    finished_ = true;
    if (deadline_fired) {
      status_ = absl::DeadlineExceededError(absl::StrCat(
          what_, ": no reply within the step deadline of ", absl::FormatDuration(timeout),
          " (", during, ")"));
    } else if (!s.ok()) {
      status_ = FromGrpcStatus(s, what_);
    } else {
      status_ = absl::UnavailableError(absl::StrCat(what_, ": stream ended without a reply (", during, ")"));
    }
  }
  return status_;
}

absl::StatusOr<pb::ActivationFrame> ForwardStream::Step(const pb::ActivationFrame& f,
                                                        absl::Duration timeout) {
  if (!status_.ok()) return status_;
  CallWatchdog& watchdog = CallWatchdog::Get();
  const uint64_t alarm = watchdog.Arm(ctx_.get(), absl::Now() + timeout);
  pb::ActivationFrame reply;
  const bool wrote = stream_->Write(f);
  const bool got = wrote && stream_->Read(&reply);
  if (!got) {
    // The worker's error status (a refused frame) arrives as the stream's end.
    const bool fired = watchdog.Disarm(alarm);
    return Fail(fired, timeout, wrote ? "waiting for the reply" : "sending the frame");
  }
  if (watchdog.Disarm(alarm)) {
    // The reply arrived just as the deadline fired: the call is cancelled, so the next
    // step could not use it anyway.
    return Fail(true, timeout, "the reply came as the deadline fired");
  }
  return reply;
}

absl::Status ForwardStream::Close(absl::Duration timeout) {
  if (finished_) return status_.ok() ? absl::OkStatus() : status_;
  CallWatchdog& watchdog = CallWatchdog::Get();
  const uint64_t alarm = watchdog.Arm(ctx_.get(), absl::Now() + timeout);
  stream_->WritesDone();
  grpc::Status s = stream_->Finish();
  finished_ = true;
  const bool fired = watchdog.Disarm(alarm);
  status_ = absl::FailedPreconditionError(absl::StrCat(what_, ": stream closed"));
  if (fired) return absl::DeadlineExceededError(absl::StrCat(what_, ": close timed out"));
  return FromGrpcStatus(s, what_);
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat(what, " file ", path, ": cannot open"));
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  if (s.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " file ", path, " is empty"));
  return s;
}

void StageClient::Prepare(grpc::ClientContext* ctx, absl::Duration timeout) const {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!options_.auth_token.empty()) ctx->AddMetadata("authorization", "Bearer " + options_.auth_token);
}

StageClient::StageClient(std::string address, int stage_index, StageClientOptions options)
    : address_(std::move(address)), stage_index_(stage_index), options_(options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (options_.tls_ca.empty()) {
    creds = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options_.tls_ca;
    ssl.pem_cert_chain = options_.tls_cert;
    ssl.pem_private_key = options_.tls_key;
    creds = grpc::SslCredentials(ssl);
  }
  stub_ = pb::Worker::NewStub(grpc::CreateCustomChannel(address_, creds, args));
}

std::string StageClient::name() const {
  return absl::StrCat("stage ", stage_index_, " (", address_, ")");
}

absl::StatusOr<pb::DescribeResponse> StageClient::Describe(const std::string& probe_model, bool calibrate) {
  grpc::ClientContext ctx;
  Prepare(&ctx, calibrate ? options_.load_timeout : options_.call_timeout);
  pb::DescribeRequest req;
  req.set_probe_model(probe_model);
  req.set_calibrate(calibrate);
  pb::DescribeResponse resp;
  RING_RETURN_IF_ERROR(FromGrpcStatus(stub_->Describe(&ctx, req, &resp), "Describe " + name()));
  return resp;
}

absl::StatusOr<pb::LoadStageResponse> StageClient::LoadStage(pb::LoadStageRequest req) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.load_timeout);
  req.set_stage_index(stage_index_);
  pb::LoadStageResponse resp;
  RING_RETURN_IF_ERROR(FromGrpcStatus(stub_->LoadStage(&ctx, req, &resp), "LoadStage " + name()));
  return resp;
}

absl::StatusOr<pb::VerifyStageResponse> StageClient::VerifyStage(pb::VerifyStageRequest req) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.load_timeout);  // loads the layers on the device and on the CPU
  req.mutable_stage()->set_stage_index(stage_index_);
  pb::VerifyStageResponse resp;
  RING_RETURN_IF_ERROR(FromGrpcStatus(stub_->VerifyStage(&ctx, req, &resp), "VerifyStage " + name()));
  return resp;
}

std::unique_ptr<ForwardStream> StageClient::OpenForward() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  // No call deadline: the stream lives as long as its sequence; each step is bounded by
  // ForwardStream::Step's watchdog instead.
  if (!options_.auth_token.empty()) ctx->AddMetadata("authorization", "Bearer " + options_.auth_token);
  // Corked: the headers go out with the first frame, so opening never blocks on a worker
  // that does not answer.
  ctx->set_initial_metadata_corked(true);
  auto stream = stub_->Forward(ctx.get());
  return std::unique_ptr<ForwardStream>(
      new ForwardStream("Forward " + name(), std::move(ctx), std::move(stream)));
}

absl::StatusOr<pb::ActivationFrame> StageClient::Forward(const pb::ActivationFrame& f) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.call_timeout);
  auto stream = stub_->Forward(&ctx);
  const std::string what = "Forward " + name();
  pb::ActivationFrame reply;
  const bool sent = stream->Write(f) && stream->WritesDone();
  const bool got = sent && stream->Read(&reply);
  grpc::Status s = stream->Finish();
  RING_RETURN_IF_ERROR(FromGrpcStatus(s, what));
  if (!got) return absl::UnavailableError(absl::StrCat(what, ": stream ended without a reply"));
  return reply;
}

absl::StatusOr<pb::ReleaseResponse> StageClient::Release(const std::string& sequence_id,
                                                         absl::Duration timeout) {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout > absl::ZeroDuration() ? timeout : options_.call_timeout);
  pb::ReleaseRequest req;
  req.set_sequence_id(sequence_id);
  pb::ReleaseResponse resp;
  RING_RETURN_IF_ERROR(FromGrpcStatus(stub_->Release(&ctx, req, &resp), "Release " + name()));
  return resp;
}

absl::StatusOr<pb::FlightRecorderResponse> StageClient::FlightRecorder() {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.call_timeout);
  pb::FlightRecorderResponse resp;
  RING_RETURN_IF_ERROR(FromGrpcStatus(stub_->FlightRecorder(&ctx, {}, &resp),
                                      "FlightRecorder " + name()));
  return resp;
}

absl::StatusOr<pb::LinkResponse> StageClient::Link(const pb::LinkRequest& req) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.call_timeout);
  pb::LinkResponse resp;
  RING_RETURN_IF_ERROR(FromGrpcStatus(stub_->Link(&ctx, req, &resp), "Link " + name()));
  return resp;
}

absl::StatusOr<pb::NcclAcceptResponse> StageClient::NcclAccept(const pb::NcclAcceptRequest& req) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.call_timeout);
  pb::NcclAcceptResponse resp;
  RING_RETURN_IF_ERROR(FromGrpcStatus(stub_->NcclAccept(&ctx, req, &resp), "NcclAccept " + name()));
  return resp;
}

absl::Status StageClient::ShmAccept(const pb::ShmAcceptRequest& req) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.call_timeout);
  pb::ShmAcceptResponse resp;
  return FromGrpcStatus(stub_->ShmAccept(&ctx, req, &resp), "ShmAccept " + name());
}

std::unique_ptr<RelayStream> StageClient::OpenRelay() {
  return std::unique_ptr<RelayStream>(
      new RelayStream("Relay to " + name(), stub_.get(), options_.auth_token));
}

std::unique_ptr<GenerateCall> StageClient::Generate(const pb::GenerateRequest& req) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  // No call deadline: a generation lasts as long as it lasts; GenerateCall::Next bounds
  // every wait for the next token instead.
  if (!options_.auth_token.empty()) ctx->AddMetadata("authorization", "Bearer " + options_.auth_token);
  auto reader = stub_->Generate(ctx.get(), req);
  return std::unique_ptr<GenerateCall>(new GenerateCall(name(), std::move(ctx), std::move(reader)));
}

RelayStream::~RelayStream() {
  absl::MutexLock l(&mu_);
  FinishLocked();
}

void RelayStream::FinishLocked() {
  if (writer_ == nullptr) return;
  CallWatchdog& watchdog = CallWatchdog::Get();
  const uint64_t alarm = watchdog.Arm(ctx_.get(), absl::Now() + kCloseTimeout);
  writer_->WritesDone();
  (void)writer_->Finish();
  watchdog.Disarm(alarm);
  writer_.reset();
  ctx_.reset();
}

absl::Status RelayStream::Push(const pb::ActivationFrame& f, absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  CallWatchdog& watchdog = CallWatchdog::Get();
  const absl::Time deadline = absl::Now() + timeout;
  bool fired = false;
  bool ok = true;
  if (writer_ == nullptr) {
    ctx_ = std::make_unique<grpc::ClientContext>();
    if (!auth_token_.empty()) ctx_->AddMetadata("authorization", "Bearer " + auth_token_);
    summary_.Clear();
    writer_ = stub_->Relay(ctx_.get(), &summary_);
    // A write into a stream the peer refused (wrong token, not a ring worker) succeeds
    // into the buffer and the refusal would only show as the step's deadline; the peer
    // sends its headers once it accepts, so wait for them (or its error) first.
    const uint64_t alarm = watchdog.Arm(ctx_.get(), deadline);
    writer_->WaitForInitialMetadata();
    fired = watchdog.Disarm(alarm);
  }
  if (!fired) {
    const uint64_t alarm = watchdog.Arm(ctx_.get(), deadline);
    ok = writer_->Write(f);
    fired = watchdog.Disarm(alarm);
  }
  if (ok && !fired) return absl::OkStatus();
  // The write failed: the peer's status (it refused the stream) says why, unless the
  // deadline did.
  const uint64_t close_alarm = watchdog.Arm(ctx_.get(), absl::Now() + kCloseTimeout);
  grpc::Status s = writer_->Finish();
  watchdog.Disarm(close_alarm);
  writer_.reset();
  ctx_.reset();
  if (fired) {
    return absl::DeadlineExceededError(absl::StrCat(what_, ": frame not taken within ",
                                                    absl::FormatDuration(timeout)));
  }
  if (!s.ok()) return FromGrpcStatus(s, what_);
  return absl::UnavailableError(absl::StrCat(what_, ": stream closed by the peer"));
}

GenerateCall::~GenerateCall() {
  if (!finished_) {
    ctx_->TryCancel();
    (void)Finish(false, kCloseTimeout);
  }
}

void GenerateCall::Cancel() { ctx_->TryCancel(); }

absl::Status GenerateCall::Finish(bool deadline_fired, absl::Duration timeout) {
  if (finished_) return status_;
  CallWatchdog& watchdog = CallWatchdog::Get();
  const uint64_t alarm = watchdog.Arm(ctx_.get(), absl::Now() + kCloseTimeout);
  grpc::Status s = reader_->Finish();
  watchdog.Disarm(alarm);
  finished_ = true;
  if (deadline_fired) {
    status_ = absl::DeadlineExceededError(absl::StrCat(
        "Generate ", what_, ": no token within ", absl::FormatDuration(timeout), " (stage 0 is not answering)"));
  } else {
    // The worker's message names the stage where the step failed (it may have come round
    // the ring to stage 0), so this prefix must not name a stage of its own.
    status_ = FromGrpcStatus(s, "Generate via stage 0");
  }
  return status_;
}

absl::StatusOr<std::optional<pb::GenerateEvent>> GenerateCall::Next(absl::Duration timeout) {
  if (finished_) {
    if (!status_.ok()) return status_;
    return std::optional<pb::GenerateEvent>();
  }
  CallWatchdog& watchdog = CallWatchdog::Get();
  const uint64_t alarm = watchdog.Arm(ctx_.get(), absl::Now() + timeout);
  pb::GenerateEvent e;
  const bool got = reader_->Read(&e);
  const bool fired = watchdog.Disarm(alarm);
  if (got && !fired) return std::optional<pb::GenerateEvent>(std::move(e));
  RING_RETURN_IF_ERROR(Finish(fired, timeout));
  return std::optional<pb::GenerateEvent>();
}

absl::StatusOr<StageOutput> RemoteStageRunner::Forward(const StageInput& in) {
  if (!failed_.ok()) return failed_;
  const int64_t rows = in.hidden.empty() ? static_cast<int64_t>(in.tokens.size())
                                         : static_cast<int64_t>(in.hidden.size()) / hidden_size_;
  pb::ActivationFrame f;
  f.set_sequence_id(sequence_id_);
  f.set_step(step_);
  f.set_epoch(epoch_);
  f.set_first_position(position_);
  f.set_sender("coordinator");
  f.set_reply_dtype(wire_dtype_);
  RING_RETURN_IF_ERROR(EncodeStageInput(in, rows, wire_dtype_, &f));
  if (stream_ == nullptr) stream_ = client_->OpenForward();
  // Steady clock: a wall-clock step (NTP) must not show up as hop latency.
  const auto written = std::chrono::steady_clock::now();
  auto sent = stream_->Step(f, client_->options().call_timeout);
  last_exchange_ = {};
  last_exchange_.round_trip_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - written).count();
  last_exchange_.bytes_sent = static_cast<int64_t>(f.ByteSizeLong());
  if (!sent.ok()) {
    failed_ = sent.status();
    stream_.reset();  // torn down: finished already, nothing to wait for
    return failed_;
  }
  pb::ActivationFrame& reply = *sent;
  last_exchange_.bytes_received = static_cast<int64_t>(reply.ByteSizeLong());
  if (reply.has_worker_seconds()) last_exchange_.worker_seconds = reply.worker_seconds();
  auto out = DecodeStageOutput(reply);
  if (!out.ok()) {
    if (absl::IsDataLoss(out.status())) ++checksum_failures_;
    failed_ = absl::Status(out.status().code(), absl::StrCat("coordinator <- ", client_->name(),
                                                             ": ", out.status().message()));
    stream_.reset();
    return failed_;
  }
  ++step_;
  position_ += rows;
  int64_t elems = 1;
  for (int64_t d : reply.shape()) elems *= d;
  last_rms_ = elems > 0 ? reply.fingerprint().l2() / std::sqrt(static_cast<double>(elems)) : 0;
  last_absmax_ = reply.fingerprint().absmax();
  return out;
}

}  // namespace ring::worker
