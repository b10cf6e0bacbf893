// Fault tests of the data path against a real WorkerService over loopback gRPC, holding a
// stage of a tiny synthesized Qwen3: a frame corrupted in flight fails with a checksum
// error naming the hop (both directions), a repeated or skipped step and a token outside
// the vocabulary are refused, a frame of an old epoch is refused after a reload, and a
// sequence's persistent stream gives the same outputs as the stage in process. No test
// can hang: every step has a deadline (and ctest a timeout per test).
#include "worker/worker_service.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include <thread>

#include "gtest/gtest.h"
#include "models/synth.h"
#include "models/temp_dir_for_test.h"
#include "worker/frame.h"
#include "worker/serve_for_test.h"
#include "worker/shm_hop.h"
#include "worker/stage_client.h"
#include "ringserve/v1/coordinator.grpc.pb.h"

namespace ring::worker {
namespace {

namespace pb = ringserve::v1;

constexpr absl::Duration kStep = absl::Seconds(30);

class WorkerServiceTest : public TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    SynthTiny("m", "qwen3", QuantSpec{QuantMode::kNone, 0, 0});
  }
  void Start(WorkerOptions options = {}) {
    options.model_root = dir_.string();
    service_ = std::make_unique<WorkerService>(options);
    server_ = ServeOnLoopbackForTest(service_.get(), &address_);
    ASSERT_NE(server_, nullptr);
    service_->SetListenAddress(address_);
  }
  void TearDown() override {
    if (server_) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    TempDirTest::TearDown();
  }
  // Loads layers [begin, end) as stage `index`; returns the epoch.
  uint64_t Load(StageClient& c, int64_t begin, int64_t end) {
    pb::LoadStageRequest req;
    req.set_model("m");
    req.set_layer_begin(begin);
    req.set_layer_end(end);
    req.set_act_dtype(pb::DTYPE_F32);
    auto r = c.LoadStage(req);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->epoch() : 0;
  }
  static pb::ActivationFrame TokenFrame(uint64_t epoch, uint64_t step, int64_t position,
                                        std::vector<int32_t> tokens) {
    pb::ActivationFrame f;
    f.set_sequence_id("seq");
    f.set_epoch(epoch);
    f.set_step(step);
    f.set_first_position(position);
    f.set_sender("coordinator");
    StageInput in;
    in.tokens = std::move(tokens);
    EXPECT_TRUE(EncodeStageInput(in, static_cast<int64_t>(in.tokens.size()), pb::DTYPE_F32, &f).ok());
    return f;
  }

  std::unique_ptr<WorkerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

TEST_F(WorkerServiceTest, RepeatedOrSkippedStepIsRefused) {
  Start();
  StageClient c(address_, 0, {});
  const uint64_t epoch = Load(c, 0, 2);
  auto s = c.OpenForward();
  ASSERT_TRUE(s->Step(TokenFrame(epoch, 0, 0, {1, 2, 3}), kStep).ok());
  auto again = s->Step(TokenFrame(epoch, 0, 3, {4}), kStep);  // step 0 replayed
  ASSERT_FALSE(again.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(again.status())) << again.status();
  EXPECT_NE(again.status().message().find("expected step 1"), std::string::npos) << again.status();
  EXPECT_NE(again.status().message().find(absl::StrCat("stage 0 (", address_, ") <- coordinator")),
            std::string::npos)
      << again.status();

  auto s2 = c.OpenForward();  // same sequence, a step from the future
  auto skipped = s2->Step(TokenFrame(epoch, 5, 3, {4}), kStep);
  ASSERT_FALSE(skipped.ok());
  EXPECT_NE(skipped.status().message().find("expected step 1 at position 3, got step 5"),
            std::string::npos)
      << skipped.status();
}

TEST_F(WorkerServiceTest, WrongTokenIsRefused) {
  Start();
  StageClient c(address_, 0, {});
  const uint64_t epoch = Load(c, 0, 2);
  auto s = c.OpenForward();
  auto r = s->Step(TokenFrame(epoch, 0, 0, {1, 99999}), kStep);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("outside the vocabulary"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find(address_), std::string::npos) << r.status();
}

TEST_F(WorkerServiceTest, OldEpochFrameIsRefused) {
  Start();
  StageClient c(address_, 0, {});
  const uint64_t old_epoch = Load(c, 0, 2);
  const uint64_t new_epoch = Load(c, 0, 3);  // a different stage: the epoch moves on
  ASSERT_GT(new_epoch, old_epoch);
  auto s = c.OpenForward();
  auto r = s->Step(TokenFrame(old_epoch, 0, 0, {1, 2}), kStep);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
  EXPECT_NE(r.status().message().find(absl::StrCat("frame is for epoch ", old_epoch,
                                                   " but the loaded stage is epoch ", new_epoch)),
            std::string::npos)
      << r.status();
  // The current epoch is served.
  auto s2 = c.OpenForward();
  EXPECT_TRUE(s2->Step(TokenFrame(new_epoch, 0, 0, {1, 2}), kStep).ok());
}

// The formation barrier: a LoadStage of an abandoned formation that arrives after a later
// one (same coordinator) must not replace the stage; a new coordinator starts its own count.
TEST_F(WorkerServiceTest, LateLoadStageOfAnOldFormationIsRefused) {
  Start();
  StageClient c(address_, 0, {});
  auto load = [&](uint64_t formation, const std::string& coordinator, int64_t end) {
    pb::LoadStageRequest req;
    req.set_model("m");
    req.set_layer_begin(0);
    req.set_layer_end(end);
    req.set_act_dtype(pb::DTYPE_F32);
    req.set_formation(formation);
    req.set_coordinator_id(coordinator);
    return c.LoadStage(req);
  };
  auto f5 = load(5, "c1", 3);
  ASSERT_TRUE(f5.ok()) << f5.status();
  EXPECT_EQ(f5->formation(), 5u);
  // The same layout under a later formation keeps the stage and its epoch.
  auto f6 = load(6, "c1", 3);
  ASSERT_TRUE(f6.ok()) << f6.status();
  EXPECT_TRUE(f6->reused());
  EXPECT_EQ(f6->epoch(), f5->epoch());
  // Formation 4 arrives late, with another layout: refused, the stage stays.
  auto late = load(4, "c1", 2);
  ASSERT_FALSE(late.ok());
  EXPECT_TRUE(absl::IsAborted(late.status())) << late.status();
  EXPECT_NE(late.status().message().find("formation 4"), std::string::npos) << late.status();
  EXPECT_NE(late.status().message().find("after formation 6"), std::string::npos) << late.status();
  auto s = c.OpenForward();
  EXPECT_TRUE(s->Step(TokenFrame(f6->epoch(), 0, 0, {1, 2}), kStep).ok());
  // A restarted coordinator (new id) numbers from 1 again; unnumbered loads always pass.
  auto other = load(1, "c2", 2);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_GT(other->epoch(), f6->epoch());
  EXPECT_TRUE(load(0, "", 3).ok());
}

TEST_F(WorkerServiceTest, FrameCorruptedOnTheWayInFailsWithChecksumNamingTheHop) {
  Start();
  StageClient c(address_, 1, {});
  const uint64_t epoch = Load(c, 2, 4);  // a later stage: takes a hidden state
  pb::ActivationFrame f;
  f.set_sequence_id("seq");
  f.set_epoch(epoch);
  f.set_sender("stage 0 (10.0.0.1:7000)");
  StageInput in;
  in.hidden.assign(2 * 128, 0.25f);
  ASSERT_TRUE(EncodeStageInput(in, 2, pb::DTYPE_F32, &f).ok());
  (*f.mutable_payload())[5] ^= 0x10;  // after the checksum, as a bad link would
  auto s = c.OpenForward();
  auto r = s->Step(f, kStep);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsDataLoss(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("checksum"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find(absl::StrCat("stage 1 (", address_, ") <- stage 0 (10.0.0.1:7000)")),
            std::string::npos)
      << r.status();
  auto d = c.Describe();
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->checksum_failures(), 1u);
}

TEST_F(WorkerServiceTest, ReplyCorruptedInFlightIsCaughtByTheCoordinator) {
  WorkerOptions o;
  o.TEST_corrupt_frame = 2;  // the worker's test-only hook: flip a bit of its 2nd reply
  Start(o);
  StageClient c(address_, 0, {});
  const uint64_t epoch = Load(c, 0, 2);
  RemoteStageRunner r(&c, "seq", epoch, 128, pb::DTYPE_F32);
  StageInput in;
  in.tokens = {1, 2, 3};
  ASSERT_TRUE(r.Forward(in).ok());
  in.tokens = {4};
  auto out = r.Forward(in);
  ASSERT_FALSE(out.ok());
  EXPECT_TRUE(absl::IsDataLoss(out.status())) << out.status();
  EXPECT_NE(out.status().message().find(absl::StrCat("coordinator <- stage 0 (", address_, ")")),
            std::string::npos)
      << out.status();
  EXPECT_NE(out.status().message().find("checksum"), std::string::npos);
  EXPECT_EQ(r.checksum_failures(), 1u);
  // The sequence is gone with its stream; later steps keep failing rather than resending.
  EXPECT_FALSE(r.Forward(in).ok());
}

TEST_F(WorkerServiceTest, PersistentStreamMatchesTheStageInProcess) {
  Start();
  StageClient c0(address_, 0, {});
  const uint64_t epoch = Load(c0, 0, 4);
  LoadOptions lo;
  lo.layers = {0, 4};
  lo.act_dtype = cpu::ActDType::kF32;
  lo.all_logits = false;  // what the worker was asked for (LoadStageRequest default)
  auto local = LoadStage((dir_ / "m").string(), lo);
  ASSERT_TRUE(local.ok()) << local.status();
  auto seq = (*local)->NewSequence();
  RemoteStageRunner remote(&c0, "seq", epoch, 128, pb::DTYPE_F32);
  for (std::vector<int32_t> tokens : {std::vector<int32_t>{5, 6, 7, 8}, {9}, {10}, {11}}) {
    StageInput in;
    in.tokens = tokens;
    auto want = (*local)->Forward(*seq, in);
    auto got = remote.Forward(in);
    ASSERT_TRUE(want.ok() && got.ok()) << got.status();
    ASSERT_EQ(want->logits.size(), got->logits.size());
    EXPECT_EQ(0, std::memcmp(want->logits.data(), got->logits.data(), want->logits.size() * 4));
  }
}

// The flight recorder keeps the last 64 frames (received and sent), oldest first, after
// more than that went through.
TEST_F(WorkerServiceTest, FlightRecorderKeepsTheLastFramesInOrder) {
  Start();
  StageClient c0(address_, 0, {});
  const uint64_t epoch = Load(c0, 0, 4);
  RemoteStageRunner remote(&c0, "rec", epoch, 128, pb::DTYPE_F32);
  constexpr int kSteps = 40;  // 80 frames
  for (int i = 0; i < kSteps; ++i) {
    StageInput in;
    in.tokens = i == 0 ? std::vector<int32_t>{5, 6, 7} : std::vector<int32_t>{8 + i};
    ASSERT_TRUE(remote.Forward(in).ok()) << i;
  }
  auto fr = c0.FlightRecorder();
  ASSERT_TRUE(fr.ok()) << fr.status();
  ASSERT_EQ(fr->events_size(), 64);
  for (int i = 0; i < fr->events_size(); ++i) {
    const pb::FrameEvent& e = fr->events(i);
    EXPECT_EQ(e.sequence_id(), "rec");
    // 16 steps fell out: the recorder starts at step 8's received frame.
    EXPECT_EQ(e.step(), static_cast<uint64_t>(8 + i / 2)) << i;
    EXPECT_EQ(e.sent(), i % 2 == 1) << i;
    EXPECT_EQ(e.payload_bytes() > 0, e.sent()) << i;  // token ids in, logits out
    if (i > 0) EXPECT_GE(e.unix_micros(), fr->events(i - 1).unix_micros()) << i;
  }
  EXPECT_EQ(fr->events(63).step(), static_cast<uint64_t>(kSteps - 1));
}

// Token-only steps (RingSequence::StepGreedy): the last stage's reply is the argmax of
// exactly the logits a full step returns, on the same persistent stream.
TEST_F(WorkerServiceTest, TokenOnlyStepsReturnTheArgmaxOfTheLogits) {
  Start();
  StageClient c0(address_, 0, {});
  const uint64_t epoch = Load(c0, 0, 4);
  RemoteStageRunner full(&c0, "full", epoch, 128, pb::DTYPE_F32);
  RemoteStageRunner greedy(&c0, "greedy", epoch, 128, pb::DTYPE_F32);
  for (std::vector<int32_t> tokens : {std::vector<int32_t>{5, 6, 7, 8}, {9}, {10}, {11}}) {
    StageInput in;
    in.tokens = tokens;
    auto want = full.Forward(in);
    in.argmax_only = true;
    auto got = greedy.Forward(in);
    ASSERT_TRUE(want.ok() && got.ok()) << got.status();
    ASSERT_FALSE(want->logits.empty());
    EXPECT_TRUE(got->logits.empty());
    const auto best = std::max_element(want->logits.begin(), want->logits.end()) - want->logits.begin();
    ASSERT_EQ(got->argmax.size(), 1u);
    EXPECT_EQ(got->argmax[0], best);
    // What crossed back: a token and a fingerprint, not [vocab] floats.
    EXPECT_LT(greedy.last_exchange().bytes_received, 200);
    EXPECT_GT(full.last_exchange().bytes_received, static_cast<int64_t>(want->logits.size()) * 4);
  }
}

// A second worker on loopback, for closed rings of two stages in one test.
struct ExtraWorker {
  std::unique_ptr<WorkerService> service;
  std::unique_ptr<grpc::Server> server;
  std::string address;
  ExtraWorker(const std::string& root) {
    WorkerOptions o;
    o.model_root = root;
    service = std::make_unique<WorkerService>(o);
    server = ServeOnLoopbackForTest(service.get(), &address);
    service->SetListenAddress(address);
  }
  ~ExtraWorker() { server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2))); }
};

pb::LinkRequest LinkTo(uint64_t epoch, int stage, int size, const std::string& next, uint64_t next_epoch) {
  pb::LinkRequest l;
  l.set_epoch(epoch);
  l.set_stage_index(stage);
  l.set_ring_size(size);
  l.set_next_address(next);
  l.set_next_epoch(next_epoch);
  return l;
}

// Runs one generation on stage 0 (`c`) and returns its tokens, or the error.
absl::StatusOr<std::vector<int32_t>> RunGenerate(StageClient& c, const std::string& id, uint64_t epoch,
                                                 const SamplingParams& sp, int max_new, int64_t chunk = 0) {
  pb::GenerateRequest g;
  g.set_sequence_id(id);
  g.set_epoch(epoch);
  for (int32_t t : {5, 6, 7, 8, 9, 10, 11}) g.add_tokens(t);
  g.set_prefill_chunk(chunk);
  *g.mutable_sampling() = ToSamplingSpec(sp);
  g.set_max_new_tokens(max_new);
  g.set_step_timeout_ms(10000);
  g.set_wire_dtype(pb::DTYPE_F32);
  auto call = c.Generate(g);
  std::vector<int32_t> out;
  while (true) {
    auto e = call->Next(absl::Seconds(20));
    if (!e.ok()) return e.status();
    if (!e->has_value()) return out;
    out.push_back((*e)->token().id());
  }
}

// A closed ring of one stage generates, by itself, exactly what the coordinator's step
// loop would: the argmax of each step's logits, fed back.
TEST_F(WorkerServiceTest, ClosedRingOfOneGeneratesWhatTheStepLoopDoes) {
  Start();
  StageClient c0(address_, 0, {});
  const uint64_t epoch = Load(c0, 0, 4);
  ASSERT_TRUE(c0.Link(LinkTo(epoch, 0, 1, "", epoch)).ok());
  RemoteStageRunner steps(&c0, "steps", epoch, 128, pb::DTYPE_F32);
  std::vector<int32_t> want;
  StageInput in;
  in.tokens = {5, 6, 7, 8, 9, 10, 11};
  for (int i = 0; i < 6; ++i) {
    auto out = steps.Forward(in);
    ASSERT_TRUE(out.ok()) << out.status();
    want.push_back(static_cast<int32_t>(std::max_element(out->logits.begin(), out->logits.end()) - out->logits.begin()));
    in.tokens = {want.back()};
  }
  SamplingParams greedy;
  greedy.temperature = 0;
  auto got = RunGenerate(c0, "gen", epoch, greedy, 6);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, want);
  // Prefill in chunks (acks round the ring) gives the same tokens.
  auto chunked = RunGenerate(c0, "gen-chunked", epoch, greedy, 6, /*chunk=*/3);
  ASSERT_TRUE(chunked.ok()) << chunked.status();
  EXPECT_EQ(*chunked, want);
}

// Two stages pushing to each other give the same seeded samples as one stage holding every
// layer (fp32 on the wire: bit-identical), and a Sampler restored with the first tokens
// continues them (a replay).
TEST_F(WorkerServiceTest, ClosedRingOfTwoSamplesLikeOneStageAndResumes) {
  Start();
  ExtraWorker w1(dir_.string());
  StageClient c0(address_, 0, {});
  StageClient c1(w1.address, 1, {});
  SamplingParams sp;
  sp.temperature = 0.9f;
  sp.top_p = 0.95f;
  sp.frequency_penalty = 0.3f;
  sp.seed = 17;
  uint64_t e0 = Load(c0, 0, 4);
  ASSERT_TRUE(c0.Link(LinkTo(e0, 0, 1, "", e0)).ok());
  auto want = RunGenerate(c0, "one", e0, sp, 8);
  ASSERT_TRUE(want.ok()) << want.status();
  e0 = Load(c0, 0, 2);
  const uint64_t e1 = Load(c1, 2, 4);
  ASSERT_TRUE(c0.Link(LinkTo(e0, 0, 2, w1.address, e1)).ok());
  ASSERT_TRUE(c1.Link(LinkTo(e1, 1, 2, address_, e0)).ok());
  auto got = RunGenerate(c0, "two", e0, sp, 8);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, *want);
  // With the generation over, stage 0 says it waits for nothing (it once kept saying it
  // waited for a step that never came when the last token was computed on the reading
  // thread).
  auto fr = c0.FlightRecorder();
  ASSERT_TRUE(fr.ok()) << fr.status();
  EXPECT_EQ(fr->waiting_on().rfind("idle", 0), 0u) << fr->waiting_on();
}

// RING_WORKER_STEP_STATS: a stage that computed a generation's relayed steps reports, when
// it stops, each segment's time per step, decode steps apart from prefill ones, and the
// frame-to-input segment split into its parts for frames read on the stepping thread.
TEST_F(WorkerServiceTest, StepStatsReportRelayedStepsBySegment) {
  Start();
  ASSERT_EQ(setenv("RING_WORKER_STEP_STATS", "1", 1), 0);
  auto w1 = std::make_unique<ExtraWorker>(dir_.string());
  ASSERT_EQ(unsetenv("RING_WORKER_STEP_STATS"), 0);
  StageClient c0(address_, 0, {});
  StageClient c1(w1->address, 1, {});
  const uint64_t e0 = Load(c0, 0, 2);
  const uint64_t e1 = Load(c1, 2, 4);
  ASSERT_TRUE(c0.Link(LinkTo(e0, 0, 2, w1->address, e1)).ok());
  ASSERT_TRUE(c1.Link(LinkTo(e1, 1, 2, address_, e0)).ok());
  SamplingParams greedy;
  greedy.temperature = 0;
  auto got = RunGenerate(c0, "stats", e0, greedy, 8);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 8u);
  ::testing::internal::CaptureStderr();
  w1.reset();
  const std::string report = ::testing::internal::GetCapturedStderr();
  // Step 0 is the prompt's prefill; the 7 after it carry one token each (the 8th token is
  // sampled from the 7th's logits, no step follows it).
  EXPECT_NE(report.find(" 7 relayed decode steps; per step (us):"), std::string::npos) << report;
  EXPECT_NE(report.find(" 1 relayed prefill steps"), std::string::npos) << report;
  for (const char* segment : {"forward ", "[of which: parse, recorder, frame metrics ", "to Step ",
                              "stage and sequence lookup ", "checksum and decode] ",
                              "[of which: encode and fingerprint ", "push: transport send "}) {
    const size_t at = report.find(segment);
    ASSERT_NE(at, std::string::npos) << segment << " in " << report;
    EXPECT_GE(std::strtod(report.c_str() + at + std::strlen(segment), nullptr), 0.0) << segment;
  }
  // A forward of two layers takes longer than nothing: the figures are measured.
  const size_t fwd = report.find("forward ");
  EXPECT_GT(std::strtod(report.c_str() + fwd + std::strlen("forward "), nullptr), 0.0) << report;
}

// Generations running at the same time share the stages (continuous batching: their steps
// go through a stage together when they meet there) and each still gets exactly the
// tokens it gets alone.
TEST_F(WorkerServiceTest, ConcurrentGenerationsOnARingOfTwoGetTheirOwnTokens) {
  Start();
  ExtraWorker w1(dir_.string());
  StageClient c0(address_, 0, {});
  StageClient c1(w1.address, 1, {});
  const uint64_t e0 = Load(c0, 0, 2);
  const uint64_t e1 = Load(c1, 2, 4);
  ASSERT_TRUE(c0.Link(LinkTo(e0, 0, 2, w1.address, e1)).ok());
  ASSERT_TRUE(c1.Link(LinkTo(e1, 1, 2, address_, e0)).ok());
  constexpr int kGens = 6;
  std::vector<SamplingParams> params(kGens);
  for (int i = 0; i < kGens; ++i) {
    params[i].temperature = i == 0 ? 0.0f : 0.8f;
    params[i].top_k = 10 * i;
    params[i].seed = 100 + i;
  }
  std::vector<std::vector<int32_t>> alone(kGens);
  for (int i = 0; i < kGens; ++i) {
    auto r = RunGenerate(c0, "alone-" + std::to_string(i), e0, params[i], 12);
    ASSERT_TRUE(r.ok()) << r.status();
    alone[i] = *r;
  }
  std::vector<absl::StatusOr<std::vector<int32_t>>> together(kGens, absl::InternalError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < kGens; ++i) {
    threads.emplace_back([&, i] {
      StageClient c(address_, 0, {});
      together[i] = RunGenerate(c, "together-" + std::to_string(i), e0, params[i], 12);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kGens; ++i) {
    ASSERT_TRUE(together[i].ok()) << together[i].status();
    EXPECT_EQ(*together[i], alone[i]) << "generation " << i;
  }
}

// The planner's calibration forward: one layer's and the LM head's decode step on the
// worker's device, measured once per model (a second Describe answers from the cache) and
// refused, with the reason, on a worker that is already serving a stage without having it.
TEST_F(WorkerServiceTest, CalibrationForwardIsMeasuredOnceAndNotWhileServing) {
  Start();
  StageClient c(address_, 0, {});
  auto d = c.Describe("m", /*calibrate=*/true);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(d->calibration().error().empty()) << d->calibration().error();
  EXPECT_GT(d->calibration().layer_seconds(), 0);
  EXPECT_GE(d->calibration().head_seconds(), 0);
  EXPECT_EQ(d->calibration().layer(), (d->probed().num_layers() - 1) / 2);
  Load(c, 0, 4);
  auto again = c.Describe("m", true);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->calibration().layer_seconds(), d->calibration().layer_seconds());
  EXPECT_FALSE(c.Describe("m").value().has_calibration());

  ExtraWorker serving(dir_.string());
  StageClient s(serving.address, 0, {});
  Load(s, 0, 4);
  auto refused = s.Describe("m", true);
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_NE(refused->calibration().error().find("serving a stage"), std::string::npos)
      << refused->calibration().error();
}

TEST_F(WorkerServiceTest, LinkAndGenerateRefuseStaleOrUnlinkedRings) {
  Start();
  StageClient c0(address_, 0, {});
  const uint64_t epoch = Load(c0, 0, 4);
  SamplingParams greedy;
  greedy.temperature = 0;
  // Not linked yet.
  auto r = RunGenerate(c0, "a", epoch, greedy, 2);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(r.status().message().find("linked"), std::string::npos) << r.status();
  // A Link for another epoch.
  EXPECT_EQ(c0.Link(LinkTo(epoch + 5, 0, 1, "", epoch)).status().code(), absl::StatusCode::kFailedPrecondition);
  // A Link of an older formation than the one loaded.
  pb::LoadStageRequest lr;
  lr.set_model("m");
  lr.set_layer_begin(0);
  lr.set_layer_end(4);
  lr.set_act_dtype(pb::DTYPE_F32);
  lr.set_formation(3);
  lr.set_coordinator_id("c");
  ASSERT_TRUE(c0.LoadStage(lr).ok());
  pb::LinkRequest old = LinkTo(epoch, 0, 1, "", epoch);
  old.set_formation(2);
  old.set_coordinator_id("c");
  EXPECT_EQ(c0.Link(old).status().code(), absl::StatusCode::kAborted);
  old.set_formation(3);
  ASSERT_TRUE(c0.Link(old).ok());
  // Generate for an epoch the worker does not hold.
  r = RunGenerate(c0, "b", epoch + 1, greedy, 2);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(r.status().message().find("epoch"), std::string::npos) << r.status();
}

// The next stage refuses the frames (here: not a ring worker at all): the generation fails
// at once with an error naming that hop, not after the step deadline.
TEST_F(WorkerServiceTest, APushTheNextStageRefusesFailsNamingTheHop) {
  Start();
  // Some other gRPC service: every Worker RPC is UNIMPLEMENTED there.
  ringserve::v1::Coordinator::Service other;
  std::string next;
  auto empty = ServeOnLoopbackForTest(&other, &next);
  StageClient c0(address_, 0, {});
  const uint64_t epoch = Load(c0, 0, 2);
  ASSERT_TRUE(c0.Link(LinkTo(epoch, 0, 2, next, 1)).ok());
  SamplingParams greedy;
  greedy.temperature = 0;
  const absl::Time t0 = absl::Now();
  auto r = RunGenerate(c0, "x", epoch, greedy, 2);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(absl::StrCat("Relay to stage 1 (", next, ")")), std::string::npos) << r.status();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(8));
  empty->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
}

TEST(DefaultKvCacheBudget, FreeMemoryMinusTenPercentAtLeast256MiB) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  EXPECT_EQ(DefaultKvCacheBudget(10240 * kMiB), 9216 * kMiB);  // 10% headroom
  EXPECT_EQ(DefaultKvCacheBudget(1024 * kMiB), 768 * kMiB);    // the 256 MiB floor
  EXPECT_EQ(DefaultKvCacheBudget(100 * kMiB), 0);              // less than the headroom
  EXPECT_EQ(DefaultKvCacheBudget(-1), 0);                      // free memory unknown
}

// The KV budget: a step whose cache growth would not fit fails with RESOURCE_EXHAUSTED
// naming the worker, the bytes and the budget; nothing is held for it, and the worker
// keeps serving steps that fit.
TEST_F(WorkerServiceTest, KvBudgetRefusesAStepThatWouldNotFit) {
  LoadOptions lo;
  lo.layers = {0, 2};
  auto local = LoadStage((dir_ / "m").string(), lo);
  ASSERT_TRUE(local.ok()) << local.status();
  const int64_t per_token = (*local)->NewSequence()->cache_bytes_per_token();
  ASSERT_GT(per_token, 0);
  WorkerOptions o;
  o.kv_cache_bytes = 5 * per_token;
  Start(o);
  StageClient c(address_, 0, {});
  const uint64_t epoch = Load(c, 0, 2);
  auto s = c.OpenForward();
  ASSERT_TRUE(s->Step(TokenFrame(epoch, 0, 0, {1, 2, 3}), kStep).ok());
  auto d = c.Describe();
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->kv_cache_bytes(), 3 * per_token);
  EXPECT_EQ(d->kv_cache_budget_bytes(), 5 * per_token);
  EXPECT_EQ(d->kv_cache_free_bytes(), 2 * per_token);

  auto over = s->Step(TokenFrame(epoch, 1, 3, {4, 5, 6}), kStep);
  ASSERT_FALSE(over.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(over.status())) << over.status();
  const std::string msg(over.status().message());
  EXPECT_NE(msg.find(absl::StrCat("stage 0 (", address_, ")")), std::string::npos) << msg;
  EXPECT_NE(msg.find(absl::StrCat("needs ", 3 * per_token, " bytes")), std::string::npos) << msg;
  EXPECT_NE(msg.find(absl::StrCat("budget of ", 5 * per_token, " bytes are held by 1 sequence(s)")),
            std::string::npos)
      << msg;
  d = c.Describe();
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->kv_cache_bytes(), 3 * per_token) << "a refused step holds nothing";
  EXPECT_NE(d->last_error().find("KV cache budget exceeded"), std::string::npos) << d->last_error();

  // Another sequence that fits the rest of the budget is served.
  pb::ActivationFrame other = TokenFrame(epoch, 0, 0, {7, 8});
  other.set_sequence_id("seq2");
  auto s2 = c.OpenForward();
  ASSERT_TRUE(s2->Step(other, kStep).ok());
  d = c.Describe();
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->kv_cache_free_bytes(), 0);
  // Releasing the first sequence gives its bytes back.
  ASSERT_TRUE(c.Release("seq").ok());
  d = c.Describe();
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->kv_cache_bytes(), 2 * per_token);
  EXPECT_EQ(d->kv_cache_free_bytes(), 3 * per_token);
}

TEST_F(WorkerServiceTest, WithoutAFlagTheBudgetIsDerivedAtStageLoad) {
  Start();
  StageClient c(address_, 0, {});
  auto before = c.Describe();
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->kv_cache_budget_bytes(), 0) << "no stage, no budget";
  Load(c, 0, 2);
  auto d = c.Describe();
  ASSERT_TRUE(d.ok()) << d.status();
  // Free memory minus headroom: positive on any machine with more than 256 MiB free.
  EXPECT_GT(d->kv_cache_budget_bytes(), 0);
  EXPECT_EQ(d->kv_cache_bytes(), 0);
  EXPECT_EQ(d->kv_cache_free_bytes(), d->kv_cache_budget_bytes());
}

// Each reply carries the worker's own time on the frame, which the coordinator's round
// trip contains (ring_hop_latency_seconds is the difference), and the payload bytes of
// both directions are what the frames held.
TEST_F(WorkerServiceTest, RepliesCarryTheWorkersTimeForTheHopLatency) {
  Start();
  StageClient c(address_, 0, {});
  const uint64_t epoch = Load(c, 0, 2);
  auto s = c.OpenForward();
  auto reply = s->Step(TokenFrame(epoch, 0, 0, {1, 2, 3}), kStep);
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_TRUE(reply->has_worker_seconds());
  EXPECT_GT(reply->worker_seconds(), 0);

  RemoteStageRunner r(&c, "seq-hop", epoch, 128, pb::DTYPE_F32);
  StageInput in;
  in.tokens = {1, 2, 3, 4};
  auto out = r.Forward(in);
  ASSERT_TRUE(out.ok()) << out.status();
  const RemoteStageRunner::Exchange& x = r.last_exchange();
  ASSERT_TRUE(x.worker_seconds.has_value());
  EXPECT_GT(*x.worker_seconds, 0);
  EXPECT_LE(*x.worker_seconds, x.round_trip_seconds) << "the worker's time is inside the round trip";
  EXPECT_GE(x.bytes_sent, 4) << "four token ids, one varint byte each at least";
  EXPECT_GE(x.bytes_received, 4 * 128 * 4) << "a [4, 128] hidden state in f32, plus the header";
}

// The next stage of a closed ring, as far as the worker under test can tell: it records
// every frame pushed to it over Relay or over a shared-memory hop (ShmAccept).
class CapturingNextStage final : public pb::Worker::Service {
 public:
  ~CapturingNextStage() override { CloseShm(); }
  grpc::Status Relay(grpc::ServerContext*, grpc::ServerReader<pb::ActivationFrame>* reader,
                     pb::RelaySummary*) override {
    reader->SendInitialMetadata();  // accepted (RelayStream waits for this, as from a worker)
    pb::ActivationFrame f;
    while (reader->Read(&f)) {
      absl::MutexLock l(&mu_);
      frames_.push_back(f);
      via_shm_.push_back(false);
    }
    return grpc::Status::OK;
  }
  grpc::Status ShmAccept(grpc::ServerContext*, const pb::ShmAcceptRequest* req, pb::ShmAcceptResponse*) override {
    absl::StatusOr<std::unique_ptr<ShmHop>> hop = ShmHop::Open(req->name(), {});
    if (!hop.ok()) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, std::string(hop.status().message()));
    shm_ = *std::move(hop);
    shm_reader_ = std::thread([this] {
      while (true) {
        absl::StatusOr<std::string> m = shm_->Receive(absl::InfiniteFuture(), absl::Seconds(10));
        if (!m.ok()) return;
        pb::ActivationFrame f;
        EXPECT_TRUE(f.ParseFromString(*m));
        absl::MutexLock l(&mu_);
        frames_.push_back(f);
        via_shm_.push_back(true);
      }
    });
    return grpc::Status::OK;
  }
  // Ends the shared-memory hop's receiving end (as a next stage that went away would).
  void CloseShm() {
    if (shm_ == nullptr) return;
    shm_->Close();
    if (shm_reader_.joinable()) shm_reader_.join();
  }
  // The i-th frame pushed (from 0) and whether it came over shared memory, waiting up to
  // `timeout`.
  std::optional<std::pair<pb::ActivationFrame, bool>> Nth(size_t i, absl::Duration timeout) {
    absl::MutexLock l(&mu_);
    auto arrived = [this, i]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return frames_.size() > i; };
    mu_.AwaitWithTimeout(absl::Condition(&arrived), timeout);
    if (frames_.size() <= i) return std::nullopt;
    return std::pair{frames_[i], via_shm_[i]};
  }
  // The first frame pushed, waiting up to `timeout`.
  std::optional<pb::ActivationFrame> First(absl::Duration timeout) {
    absl::MutexLock l(&mu_);
    auto arrived = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !frames_.empty(); };
    mu_.AwaitWithTimeout(absl::Condition(&arrived), timeout);
    if (frames_.empty()) return std::nullopt;
    return frames_.front();
  }

 private:
  absl::Mutex mu_;
  std::vector<pb::ActivationFrame> frames_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> via_shm_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<ShmHop> shm_;
  std::thread shm_reader_;
};

class ClosedRingNcclTest : public WorkerServiceTest {
 protected:
  void SetUp() override {
    WorkerServiceTest::SetUp();
    Start();
    next_server_ = ServeOnLoopbackForTest(&next_, &next_address_);
    ASSERT_NE(next_server_, nullptr);
  }
  void TearDown() override {
    if (next_server_) next_server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    WorkerServiceTest::TearDown();
  }
  // Loads the last layers as stage 1 of a ring of 2 and links it to the capturing next
  // stage; returns the loaded stage.
  pb::LoadStageResponse LoadAndLink(StageClient& c, bool nccl, pb::LinkResponse* linked, bool shm = false) {
    pb::LoadStageRequest req;
    req.set_model("m");
    req.set_layer_begin(1);
    req.set_layer_end(-1);
    req.set_act_dtype(pb::DTYPE_F32);
    req.set_stage_index(1);
    auto loaded = c.LoadStage(req);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    pb::LinkRequest link;
    link.set_epoch(loaded.ok() ? loaded->epoch() : 0);
    link.set_stage_index(1);
    link.set_ring_size(2);
    link.set_next_address(next_address_);
    link.set_next_epoch(7);
    link.set_nccl(nccl);
    link.set_shm(shm);
    link.set_transport_reason("test");
    auto l = c.Link(link);
    EXPECT_TRUE(l.ok()) << l.status();
    if (l.ok()) *linked = *l;
    return loaded.ok() ? *loaded : pb::LoadStageResponse{};
  }

  CapturingNextStage next_;
  std::unique_ptr<grpc::Server> next_server_;
  std::string next_address_;
};

// A relayed frame says its payload follows over NCCL, but this worker has no NCCL link
// from the previous stage: the step fails with an error naming both stages, which goes on
// round the ring (to stage 0 and the coordinator) like any step error.
TEST_F(ClosedRingNcclTest, NcclPayloadWithoutAnInboundLinkIsAStepErrorNamingBothStages) {
  StageClient c(address_, 1, {});
  pb::LinkResponse linked;
  const pb::LoadStageResponse loaded = LoadAndLink(c, /*nccl=*/false, &linked);
  EXPECT_EQ(linked.next_transport(), "grpc (test)");

  pb::ActivationFrame f;
  f.set_sequence_id("seq");
  f.set_step(0);
  f.set_epoch(loaded.epoch());
  f.set_first_position(0);
  f.set_relay(pb::RELAY_ACTION_SAMPLE);
  f.set_sender("stage 0 (10.0.0.9:7001)");
  StageOutput hidden;
  hidden.rows = 1;
  hidden.hidden.assign(static_cast<size_t>(loaded.model().hidden_size()), 0.5f);
  ASSERT_TRUE(EncodeStageOutput(hidden, pb::DTYPE_F32, false, &f).ok());
  ASSERT_EQ(f.kind(), pb::PAYLOAD_KIND_HIDDEN);
  f.set_nccl_payload_bytes(static_cast<int64_t>(f.payload().size()));
  f.clear_payload();  // "on the NCCL link", which does not exist
  std::unique_ptr<RelayStream> relay = c.OpenRelay();
  ASSERT_TRUE(relay->Push(f, kStep).ok());

  std::optional<pb::ActivationFrame> out = next_.First(absl::Seconds(20));
  ASSERT_TRUE(out.has_value()) << "nothing was pushed on to the next stage";
  EXPECT_EQ(out->kind(), pb::PAYLOAD_KIND_ERROR);
  EXPECT_EQ(out->sequence_id(), "seq");
  EXPECT_EQ(out->epoch(), 7u);  // the next stage's
  const absl::Status error = DecodeStepError(*out);
  EXPECT_TRUE(absl::IsFailedPrecondition(error)) << error;
  for (const std::string& part : {absl::StrCat("stage 1 (", address_, ")"), std::string("stage 0 (10.0.0.9:7001)"),
                                  std::string("over NCCL"), std::string("no NCCL link from the previous stage")}) {
    EXPECT_NE(error.message().find(part), std::string::npos) << part << " not in: " << error;
  }
  auto d = c.Describe();
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_NE(d->last_error().find("no NCCL link"), std::string::npos) << d->last_error();
  EXPECT_FALSE(d->host_id().empty());
}

// Asked for NCCL, a CPU worker keeps the hop on gRPC and says why; the Link itself succeeds.
// The receiving side refuses too.
TEST_F(ClosedRingNcclTest, CpuWorkerAskedForNcclStaysOnGrpc) {
  StageClient c(address_, 1, {});
  pb::LinkResponse linked;
  const pb::LoadStageResponse loaded = LoadAndLink(c, /*nccl=*/true, &linked);
  EXPECT_NE(linked.next_transport().find("grpc (this worker runs on cpu"), std::string::npos)
      << linked.next_transport();
  auto d = c.Describe();
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->next_transport(), linked.next_transport());

  pb::NcclAcceptRequest accept;
  accept.set_id(std::string(256, 'x'));
  accept.set_sender("stage 0 (10.0.0.9:7001)");
  accept.set_sender_host_id(d->host_id());
  accept.set_epoch(loaded.epoch());
  accept.set_timeout_ms(1000);
  auto r = c.NcclAccept(accept);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("NCCL link from stage 0 (10.0.0.9:7001) refused"), std::string::npos)
      << r.status();
}

// A stage-1 hidden-state frame for `seq` that samples (this worker is the last stage).
pb::ActivationFrame SampleFrame(const pb::LoadStageResponse& loaded, const std::string& seq, float value) {
  pb::ActivationFrame f;
  f.set_sequence_id(seq);
  f.set_step(0);
  f.set_epoch(loaded.epoch());
  f.set_first_position(0);
  f.set_relay(pb::RELAY_ACTION_SAMPLE);
  f.set_sender("stage 0 (test)");
  f.mutable_sampling()->set_temperature(0);  // greedy
  StageOutput hidden;
  hidden.rows = 16;  // a prompt's hidden states: larger than the test's 4 KiB ring
  hidden.hidden.resize(static_cast<size_t>(16 * loaded.model().hidden_size()));
  for (size_t i = 0; i < hidden.hidden.size(); ++i) hidden.hidden[i] = value * static_cast<float>(i % 7);
  EXPECT_TRUE(EncodeStageOutput(hidden, pb::DTYPE_F32, false, &f).ok());
  return f;
}

// Both hops of a stage over shared memory: frames in from the "previous stage" (this test)
// and out to the next stage. The token sampled from a frame that came over shared memory
// is the one sampled from the same frame over the Relay stream, and it leaves over shared
// memory too. When the next stage's end goes away, the frame in flight fails (naming the
// hop) and later frames fall back to the Relay stream.
TEST_F(ClosedRingNcclTest, SharedMemoryHopsCarryFramesAndFallBackToGrpc) {
  StageClient c(address_, 1, {});
  pb::LinkResponse linked;
  const pb::LoadStageResponse loaded = LoadAndLink(c, /*nccl=*/false, &linked, /*shm=*/true);
  EXPECT_EQ(linked.next_transport(), "shm");
  auto d = c.Describe();
  ASSERT_TRUE(d.ok()) << d.status();

  absl::StatusOr<std::unique_ptr<ShmHop>> in = ShmHop::Create({.capacity = 4096, .spin = {}, .peer = "stage 1"});
  ASSERT_TRUE(in.ok()) << in.status();
  pb::ShmAcceptRequest accept;
  accept.set_name((*in)->name());
  accept.set_sender("stage 0 (test)");
  accept.set_sender_host_id(d->host_id());
  accept.set_epoch(loaded.epoch());
  ASSERT_TRUE(c.ShmAccept(accept).ok());
  (*in)->Unlink();
  d = c.Describe();
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->prev_transport(), "shm from stage 0 (test)");

  // A frame larger than the ring (streamed through it) and the same over gRPC.
  const pb::ActivationFrame over_shm = SampleFrame(loaded, "a", 0.25f);
  ASSERT_GT(over_shm.ByteSizeLong(), 4096u);
  ASSERT_TRUE((*in)->Send(over_shm.SerializeAsString(), absl::Now() + kStep).ok());
  std::unique_ptr<RelayStream> relay = c.OpenRelay();
  ASSERT_TRUE(relay->Push(SampleFrame(loaded, "b", 0.25f), kStep).ok());
  std::optional<std::pair<pb::ActivationFrame, bool>> first = next_.Nth(0, absl::Seconds(20));
  std::optional<std::pair<pb::ActivationFrame, bool>> second = next_.Nth(1, absl::Seconds(20));
  ASSERT_TRUE(first.has_value() && second.has_value()) << "the tokens were not pushed on";
  EXPECT_TRUE(first->second && second->second) << "the stage's output goes over shared memory";
  for (const auto& out : {first->first, second->first}) {
    EXPECT_EQ(out.kind(), pb::PAYLOAD_KIND_SAMPLED) << DecodeStepError(out);
    EXPECT_EQ(out.epoch(), 7u);
  }
  EXPECT_EQ(first->first.payload(), second->first.payload()) << "the sampled TokenChoice";
  EXPECT_FALSE(first->first.payload().empty());

  next_.CloseShm();
  ASSERT_TRUE((*in)->Send(SampleFrame(loaded, "c", 0.5f).SerializeAsString(), absl::Now() + kStep).ok());
  ASSERT_TRUE((*in)->Send(SampleFrame(loaded, "d", 0.5f).SerializeAsString(), absl::Now() + kStep).ok());
  // c and d are two sequences, so the stage may step them in either order: the first push
  // fails with the hop, the other goes over the Relay stream.
  std::optional<std::pair<pb::ActivationFrame, bool>> third = next_.Nth(2, absl::Seconds(20));
  ASSERT_TRUE(third.has_value()) << "after the shared-memory hop failed, nothing came over gRPC";
  EXPECT_FALSE(third->second);
  const std::string fell_back = third->first.sequence_id();
  ASSERT_TRUE(fell_back == "c" || fell_back == "d") << fell_back;
  const std::string failed = fell_back == "c" ? "d" : "c";
  d = c.Describe();
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_NE(d->next_transport().find("grpc (shared-memory hop failed"), std::string::npos) << d->next_transport();
  EXPECT_NE(d->last_error().find(absl::StrCat("sequence ", failed, " step 0: over shared memory")), std::string::npos)
      << d->last_error();

  // Refusals: another host, another epoch, a name that is no hop.
  accept.set_sender_host_id("elsewhere/host");
  absl::Status refused = c.ShmAccept(accept);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_NE(refused.message().find("on host 'elsewhere/host'"), std::string::npos) << refused;
  accept.set_sender_host_id(d->host_id());
  accept.set_epoch(loaded.epoch() + 100);
  refused = c.ShmAccept(accept);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  accept.set_epoch(loaded.epoch());
  accept.set_name("/ringserve-hop-gone");
  refused = c.ShmAccept(accept);
  EXPECT_TRUE(absl::IsNotFound(refused)) << refused;
  EXPECT_NE(refused.message().find("shared-memory hop from stage 0 (test) refused"), std::string::npos) << refused;
}

}  // namespace
}  // namespace ring::worker
