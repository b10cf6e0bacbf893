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
// without, the model runs in this process as one stage (the baseline). With --closed 1 the
// ring is closed (RingOptions::closed_loop, ring-server's default): each sequence is one
// RingSequence::Generate of `--decode` greedy tokens that runs round the workers on its
// own, prefill included; the timed phase is from the earliest first token to the latest
// last token over all sequences, counting the decode - 1 tokens after each first one.
//
// bench/ring_bench.py starts the workers and computes the ratios (pipeline efficiency,
// aggregate speed-up with k sequences) from runs of this binary in one session.
//
//   ring_bench --model DIR [--sequences 1] [--decode 32] [--prompt 16] [--rounds 1]
//   ring_bench --workers 127.0.0.1:7001,127.0.0.1:7002 --model NAME_UNDER_ROOT ...
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <latch>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/ring.h"

int main(int argc, char** argv) {
  ring::RingOptions o;
  int sequences = 1, decode = 32, prompt = 16, rounds = 1;
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
    } else if (k == "--rounds") {
      rounds = std::max(1, std::atoi(v.c_str()));
    } else {
      std::fprintf(stderr, "ring_bench: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  o.step_timeout = absl::Seconds(60);
  o.closed_loop = closed;
  // Closed ring: where a step's time goes (each stage's own part, the rest is the hops).
  std::mutex trace_mu;
  double step_s = 0;
  int64_t steps = 0;
  std::vector<double> stage_s;
  o.on_closed_step = [&](double seconds, const std::vector<std::pair<size_t, double>>& stages) {
    std::lock_guard<std::mutex> l(trace_mu);
    step_s += seconds;
    ++steps;
    for (const auto& [i, t] : stages) {
      if (stage_s.size() <= i) stage_s.resize(i + 1);
      stage_s[i] += t;
    }
  };
  if (closed && o.workers.empty()) {
    std::fprintf(stderr, "ring_bench: --closed needs --workers\n");
    return 2;
  }
  auto ring = ring::Ring::Connect(o);
  if (!ring.ok()) {
    std::fprintf(stderr, "ring_bench: %s\n", std::string(ring.status().message()).c_str());
    return 1;
  }
  const int64_t vocab = (*ring)->model().vocab_size;
  std::latch prefilled(sequences + 1);
  std::latch go(1);
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  using Clock = std::chrono::steady_clock;
  std::vector<Clock::time_point> first_token(sequences, Clock::time_point::max());
  std::vector<Clock::time_point> last_token(sequences, Clock::time_point::min());
  for (int s = 0; s < sequences; ++s) {
    threads.emplace_back([&, s] {
      bool ok = true;
      for (int r = 0; ok && r < rounds; ++r) {
        auto seq = (*ring)->NewSequence(absl::StrCat("bench-", getpid(), "-", s, "-", r));
        std::vector<int32_t> tokens;
        for (int i = 0; i < prompt; ++i) {
          tokens.push_back(static_cast<int32_t>((7 * i + 13 * s + 31 * r + 1) % vocab));
        }
        if (closed) {
          if (r == 0) {
            prefilled.count_down();
            go.wait();
          }
          ring::ClosedLoopRequest cl;
          cl.tokens = tokens;
          cl.sampling.temperature = 0;
          cl.max_new_tokens = decode;
          int got = 0;
          absl::Status st = seq.ok() ? (*seq)->Generate(cl, [&](const ring::SampledToken&) {
            const auto now = std::chrono::steady_clock::now();
            if (got == 0) first_token[s] = std::min(first_token[s], now);
            last_token[s] = std::max(last_token[s], now);
            return ++got < decode;
          })
                                     : seq.status();
          if (!st.ok() || got != decode) {
            std::fprintf(stderr, "ring_bench: %s (%d tokens)\n", std::string(st.message()).c_str(), got);
            ok = false;
          }
          continue;
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
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (failed) return 1;
  int counted = decode;
  if (closed) {
    // Decode only, like the star's timed phase: the prompt's step is before each first token.
    secs = std::chrono::duration<double>(*std::max_element(last_token.begin(), last_token.end()) -
                                         *std::min_element(first_token.begin(), first_token.end()))
               .count();
    counted = decode - 1;
  }
  std::string where;
  if (steps > 0) {
    double compute = 0;
    where = absl::StrCat(", \"step_ms\": ", 1e3 * step_s / steps, ", \"stage_compute_ms\": [");
    for (size_t i = 0; i < stage_s.size(); ++i) {
      absl::StrAppend(&where, i ? ", " : "", 1e3 * stage_s[i] / steps);
      compute += stage_s[i];
    }
    absl::StrAppend(&where, "], \"hops_ms\": ", 1e3 * (step_s - compute) / steps);
  }
  std::printf(
      "{\"stages\": %zu, \"topology\": \"%s\", \"sequences\": %d, \"rounds\": %d, \"decode\": %d, "
      "\"seconds\": %.4f, \"tokens_per_s\": %.3f%s}\n",
      std::max<size_t>(1, o.workers.size()), closed ? "closed" : "star", sequences, rounds, decode, secs,
      static_cast<double>(sequences) * rounds * counted / secs, where.c_str());
  return 0;
}
