// File: bench/ring_bench.cc
//
// Decode throughput of a ring (server/ring.h), the same step loop ring-server runs: k
// sequences, each on its own thread as ring-server's generation pool runs them, prefill
// a short prompt, wait for each other, then decode `--decode` single-token steps. Prints
// one JSON line: tokens/s = k * decode / wall time of the decode phase (all threads).
// With --rounds R > 1 each thread runs R sequences one after another (distinct ids, so a
// worker's per-sequence sampling, e.g. shadow checks, sees R * k sequences); the timed
// phase then covers every round after the first prefill, and tokens/s counts decode tokens.
// With --workers the stages are ring-worker processes (gRPC, persistent Forward streams);
// without, the model runs in this process as one stage (the baseline).
//
// bench/ring_bench.py starts the workers and computes the ratios (pipeline efficiency,
// aggregate speed-up with k sequences) from runs of this binary in one session.
//
// With --closed 1 the ring is closed (RingOptions::closed_loop: the workers pass steps on
// and the last stage samples) and each sequence is one greedy Generate: the prompt in
// --prefill-chunk rows per step, then `--decode` tokens. The JSON line then also has the
// prefill time (to the first token) and rate, and tokens/s counts the tokens after the
// first over the time after it. --transport auto|grpc picks the hops' transport (NCCL
// between CUDA workers on one host, or gRPC); --act f32|bf16 the activations' dtype. The
// closed ring's JSON also says where a step's time went: each stage's own time (from the
// trace that comes back with every token) and the rest, the hops ("stage_compute_ms",
// "hops_ms", means over all steps). --plan auto splits the layers by the planner
// (server/planner.h) instead of evenly; --device cpu|cuda:N runs the in-process baseline
// there.
//
//   ring_bench --model DIR [--sequences 1] [--decode 32] [--prompt 16] [--rounds 1]
//   ring_bench --workers 127.0.0.1:7001,127.0.0.1:7002 --model NAME_UNDER_ROOT ...
//   ring_bench --workers ... --model NAME --closed 1 --transport grpc --prompt 2048 --prefill-chunk 512
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <latch>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/ring.h"
#include "worker/mutex_mode.h"

namespace {

using Clock = std::chrono::steady_clock;

// Closed ring: every decode step's time round the ring and where it went (RingOptions::
// on_closed_step): each stage's own time (frame in to reply out) and the forward inside
// it, and each hop's time on the wire (reply ready at one stage to frame read at the next,
// by the workers' clocks: the same host's here). The hop into stage 0 ends when stage 0's
// Generate has the token.
struct StepTrace {
  std::mutex mu;
  double step_s = 0;
  int64_t steps = 0;
  std::vector<double> stage_s, compute_s, wire_s;

  void Add(const ring::ClosedStepTrace& t) {
    if (t.prefill) return;  // decode steps only: a prompt's step is of another size
    std::lock_guard<std::mutex> l(mu);
    step_s += t.seconds;
    ++steps;
    const size_t n = t.stages.size();
    if (stage_s.size() < n) {
      stage_s.resize(n);
      compute_s.resize(n);
      wire_s.resize(n);
    }
    for (size_t j = 0; j < n; ++j) {
      const auto& st = t.stages[j];
      const size_t i = std::min(st.index, n - 1);
      stage_s[i] += st.worker_seconds;
      compute_s[i] += st.compute_seconds;
      const int64_t next_in = j + 1 < n ? t.stages[j + 1].received_unix_nanos : t.returned_unix_nanos;
      wire_s[i] += 1e-9 * static_cast<double>(next_in - st.sent_unix_nanos);
    }
  }
  // ", \"step_ms\": ..., \"stage_compute_ms\": [...], \"hops_ms\": ..., \"forward_ms\": [...],
  // \"wire_ms\": [...]" (empty without steps). stage_compute_ms: each stage's whole time;
  // forward_ms: the Stage's forward in it; wire_ms[i]: hop from stage i to the next.
  std::string Json() {
    std::lock_guard<std::mutex> l(mu);
    if (steps == 0) return "";
    double compute = 0;
    auto list = [this](const std::vector<double>& v) {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) absl::StrAppend(&out, i ? ", " : "", 1e3 * v[i] / steps);
      return out + "]";
    };
    for (double t : stage_s) compute += t;
    return absl::StrCat(", \"step_ms\": ", 1e3 * step_s / steps, ", \"stage_compute_ms\": ", list(stage_s),
                        ", \"hops_ms\": ", 1e3 * (step_s - compute) / steps, ", \"forward_ms\": ", list(compute_s),
                        ", \"wire_ms\": ", list(wire_s));
  }
};

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// --closed 1: every sequence is one greedy generation round the closed ring; the threads
// start together. Prefill = start to first token (the whole prompt went round, plus one
// sample); decode = the tokens after the first, over the time after it.
int RunClosed(ring::Ring& r, const ring::RingOptions& o, StepTrace& trace, int sequences, int rounds,
              int prompt, int prefill_chunk, int decode) {
  const int64_t vocab = r.model().vocab_size;
  std::latch go(1);
  std::atomic<bool> failed{false};
  std::vector<double> prefill_seconds(sequences * rounds, 0);
  std::vector<Clock::time_point> decode_start(sequences), decode_end(sequences);
  std::vector<std::thread> threads;
  for (int s = 0; s < sequences; ++s) {
    threads.emplace_back([&, s] {
      go.wait();
      for (int round = 0; round < rounds && !failed; ++round) {
        auto seq = r.NewSequence(absl::StrCat("bench-", getpid(), "-", s, "-", round));
        if (!seq.ok()) {
          std::fprintf(stderr, "ring_bench: %s\n", std::string(seq.status().message()).c_str());
          failed = true;
          return;
        }
        ring::ClosedLoopRequest req;
        for (int i = 0; i < prompt; ++i) {
          req.tokens.push_back(static_cast<int32_t>((7 * i + 13 * s + 31 * round + 1) % vocab));
        }
        req.prefill_chunk = prefill_chunk;
        req.sampling.temperature = 0;
        req.max_new_tokens = decode + 1;
        const Clock::time_point start = Clock::now();
        int got = 0;
        absl::Status st = (*seq)->Generate(req, [&](const ring::SampledToken&) {
          const Clock::time_point now = Clock::now();
          if (got++ == 0) {
            prefill_seconds[s * rounds + round] = Seconds(start, now);
            if (round == 0) decode_start[s] = now;
          }
          decode_end[s] = now;
          return true;
        });
        if (!st.ok()) {
          std::fprintf(stderr, "ring_bench: %s\n", std::string(st.message()).c_str());
          failed = true;
        }
      }
    });
  }
  go.count_down();
  for (auto& t : threads) t.join();
  if (failed) return 1;
  double prefill_sum = 0, prefill_max = 0;
  for (double p : prefill_seconds) {
    prefill_sum += p;
    prefill_max = std::max(prefill_max, p);
  }
  const Clock::time_point first =
      *std::min_element(decode_start.begin(), decode_start.end());
  const Clock::time_point last = *std::max_element(decode_end.begin(), decode_end.end());
  // With rounds > 1 the later rounds' prefills fall inside the decode window: tokens/s is
  // then the sustained rate of the mix.
  const double decode_secs = Seconds(first, last);
  std::printf(
      "{\"closed\": true, \"transport\": \"%s\", \"stages\": %zu, \"sequences\": %d, \"rounds\": %d, "
      "\"prompt\": %d, \"prefill_chunk\": %d, \"prefill_seconds\": %.4f, \"prefill_tokens_per_s\": %.1f, "
      "\"decode\": %d, \"seconds\": %.4f, \"tokens_per_s\": %.3f%s}\n",
      o.transport == ring::RingTransport::kGrpc ? "grpc" : "auto", o.workers.size(), sequences, rounds,
      prompt, prefill_chunk, prefill_sum / prefill_seconds.size(),
      static_cast<double>(sequences) * prompt / std::max(prefill_max, 1e-9), decode, decode_secs,
      static_cast<double>(sequences) * rounds * decode / std::max(decode_secs, 1e-9), trace.Json().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ring::worker::UseServingMutexMode();  // as ring-server and ring-worker: a fair baseline
  ring::RingOptions o;
  int sequences = 1, decode = 32, prompt = 16, rounds = 1, prefill_chunk = 0;
  bool closed = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--workers") {
      o.workers = absl::StrSplit(v, ',', absl::SkipEmpty());
    } else if (k == "--model") {
      o.model = v;
    } else if (k == "--sequences") {
      sequences = std::atoi(v.c_str());
    } else if (k == "--decode") {
      decode = std::atoi(v.c_str());
    } else if (k == "--prompt") {
      prompt = std::atoi(v.c_str());
    } else if (k == "--rounds") {
      rounds = std::max(1, std::atoi(v.c_str()));
    } else if (k == "--device") {  // the in-process baseline's device (cpu, cuda:N)
      auto d = ring::ParseDevice(v);
      if (!d.ok()) {
        std::fprintf(stderr, "ring_bench: %s\n", std::string(d.status().message()).c_str());
        return 2;
      }
      o.device = *d;
    } else if (k == "--plan") {  // auto: split by the planner (server/planner.h); even
      o.auto_plan = v == "auto";
    } else if (k == "--closed") {
      closed = v == "1" || v == "true";
    } else if (k == "--prefill-chunk") {
      prefill_chunk = std::atoi(v.c_str());
    } else if (k == "--transport" && (v == "auto" || v == "grpc")) {
      o.transport = v == "grpc" ? ring::RingTransport::kGrpc : ring::RingTransport::kAuto;
    } else if (k == "--act" && (v == "f32" || v == "bf16")) {
      o.act_dtype = v == "f32" ? ring::cpu::ActDType::kF32 : ring::cpu::ActDType::kBF16;
    } else {
      std::fprintf(stderr, "ring_bench: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  o.step_timeout = absl::Seconds(60);
  o.closed_loop = closed;
  StepTrace trace;
  o.on_closed_step = [&trace](const ring::ClosedStepTrace& t) { trace.Add(t); };
  if (closed && o.workers.empty()) {
    std::fprintf(stderr, "ring_bench: --closed needs --workers\n");
    return 2;
  }
  auto ring = ring::Ring::Connect(o);
  if (!ring.ok()) {
    std::fprintf(stderr, "ring_bench: %s\n", std::string(ring.status().message()).c_str());
    return 1;
  }
  if (closed) return RunClosed(**ring, o, trace, sequences, rounds, prompt, prefill_chunk, decode);
  const int64_t vocab = (*ring)->model().vocab_size;
  std::latch prefilled(sequences + 1);
  std::latch go(1);
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  for (int s = 0; s < sequences; ++s) {
    threads.emplace_back([&, s] {
      bool ok = true;
      for (int r = 0; ok && r < rounds; ++r) {
        auto seq = (*ring)->NewSequence(absl::StrCat("bench-", getpid(), "-", s, "-", r));
        std::vector<int32_t> tokens;
        for (int i = 0; i < prompt; ++i) {
          tokens.push_back(static_cast<int32_t>((7 * i + 13 * s + 31 * r + 1) % vocab));
        }
        ok = seq.ok() && (*seq)->Step(tokens).ok();
        if (r == 0) {
          prefilled.count_down();
          go.wait();
        }
        for (int i = 0; ok && i < decode; ++i) {
          // The token fed back does not change the cost of a step; greedy would also do.
          auto logits = (*seq)->Step({static_cast<int32_t>((101 * i + s) % vocab)});
          if (!logits.ok()) {
            std::fprintf(stderr, "ring_bench: %s\n", std::string(logits.status().message()).c_str());
            ok = false;
          }
        }
      }
      if (!ok) failed = true;
    });
  }
  prefilled.arrive_and_wait();
  const auto t0 = std::chrono::steady_clock::now();
  go.count_down();
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (failed) return 1;
  std::printf(
      "{\"stages\": %zu, \"sequences\": %d, \"rounds\": %d, \"decode\": %d, \"seconds\": %.4f, "
      "\"tokens_per_s\": %.3f}\n",
      std::max<size_t>(1, o.workers.size()), sequences, rounds, decode, secs,
      static_cast<double>(sequences) * rounds * decode / secs);
  return 0;
}
