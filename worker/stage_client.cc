#include "worker/stage_client.h"

#include <grpcpp/grpcpp.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "kernels/status.h"
#include "worker/frame.h"
#include "worker/grpc_status.h"
#include "worker/worker_service.h"

namespace ring::worker {
namespace {

namespace pb = ringserve::v1;

}  // namespace

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

absl::StatusOr<pb::DescribeResponse> StageClient::Describe(const std::string& probe_model) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.call_timeout);
  pb::DescribeRequest req;
  req.set_probe_model(probe_model);
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

absl::StatusOr<pb::ActivationFrame> StageClient::Forward(const pb::ActivationFrame& f) {
  // One stream per step keeps a deadline on every step; a pipelined coordinator will keep
  // the stream open and cancel it from a watchdog instead.
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

absl::StatusOr<StageOutput> RemoteStageRunner::Forward(const StageInput& in) {
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
  RING_ASSIGN_OR_RETURN(pb::ActivationFrame reply, client_->Forward(f));
  auto out = DecodeStageOutput(reply);
  if (!out.ok()) {
    if (absl::IsDataLoss(out.status())) ++checksum_failures_;
    return absl::Status(out.status().code(), absl::StrCat("coordinator <- ", client_->name(),
                                                          ": ", out.status().message()));
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
