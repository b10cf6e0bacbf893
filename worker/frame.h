// File: worker/frame.h
//
// ActivationFrame codec: what crosses a stage boundary (models/model.h StageInput /
// StageOutput) to and from the wire, with an XXH3-64 checksum of the payload. gRPC adds
// no payload checksum of its own, and a flipped bit in an activation is silent garbage
// rather than a crash, so the sender checksums and every receiver verifies.
//
//   ringserve::v1::ActivationFrame f;
//   EncodeStageOutput(out, ringserve::v1::DTYPE_F32, true, &f);   // sets payload + checksum
//   RING_ASSIGN_OR_RETURN(StageInput in, DecodeStageInput(f));  // DataLoss on mismatch
//
// F32 payloads are the exact bits of the floats; BF16 payloads round to nearest even, which
// is exact for activations a bf16 stage already rounded.
#ifndef RINGSERVE_WORKER_FRAME_H_
#define RINGSERVE_WORKER_FRAME_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/cpu/sampling.h"
#include "models/model.h"
#include "ringserve/v1/worker.pb.h"

namespace ring::worker {

// XXH3-64 of `bytes`.
uint64_t PayloadChecksum(absl::string_view bytes);

// Numerical summary of `values` (see proto Fingerprint).
ringserve::v1::Fingerprint ComputeFingerprint(const std::vector<float>& values);

// Writes `values` into frame->payload as `dtype` with shape [rows, values.size() / rows]
// and sets frame->checksum and frame->fingerprint. InvalidArgument for an unsupported
// dtype or a ragged shape.
absl::Status EncodeFloats(const std::vector<float>& values, int64_t rows,
                          ringserve::v1::DType dtype, ringserve::v1::ActivationFrame* frame);

// Verifies the checksum (DataLoss, message contains "checksum") and the payload size
// against dtype and shape (InvalidArgument), then returns the values as floats.
absl::StatusOr<std::vector<float>> DecodeFloats(const ringserve::v1::ActivationFrame& frame);

// StageInput <-> frame. Hidden states travel as `dtype`; token ids and top-k as they are.
absl::Status EncodeStageInput(const StageInput& in, int64_t rows, ringserve::v1::DType dtype,
                              ringserve::v1::ActivationFrame* frame);
absl::StatusOr<StageInput> DecodeStageInput(const ringserve::v1::ActivationFrame& frame);

// StageOutput <-> frame. Logits always travel as F32: they are the ring's result;
// `all_logits` (LoadOptions) says whether they have out.rows rows or one.
absl::Status EncodeStageOutput(const StageOutput& out, ringserve::v1::DType dtype,
                               bool all_logits, ringserve::v1::ActivationFrame* frame);
absl::StatusOr<StageOutput> DecodeStageOutput(const ringserve::v1::ActivationFrame& frame);

// Closed ring (Worker.Relay), last stage -> stage 0: the sampled token (none for the ack
// of a prefill chunk) as a checksummed payload, with the shape and fingerprint of
// `checked` (the logits or final-normed rows the token came from, [rows, n]) so NaN/Inf
// are still seen at the stage.
absl::Status EncodeSampled(const std::optional<SampledToken>& token,
                           const std::vector<float>& checked, int64_t rows,
                           ringserve::v1::ActivationFrame* frame);
// DataLoss on a checksum mismatch; nullopt for an ack.
absl::StatusOr<std::optional<SampledToken>> DecodeSampled(const ringserve::v1::ActivationFrame& frame);

// A failed step travelling round a closed ring to stage 0: the status (code and message).
void EncodeStepError(const absl::Status& error, ringserve::v1::ActivationFrame* frame);
// The carried error; DataLoss when the frame itself is damaged.
absl::Status DecodeStepError(const ringserve::v1::ActivationFrame& frame);

ringserve::v1::SamplingSpec ToSamplingSpec(const SamplingParams& p);
SamplingParams FromSamplingSpec(const ringserve::v1::SamplingSpec& s);

}  // namespace ring::worker

#endif  // RINGSERVE_WORKER_FRAME_H_
