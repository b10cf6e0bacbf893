// File: bench/hop_bench.cc
//
// Per-hop overhead of the ring's data path: a [rows, 6144] bf16 activation frame over a
// gRPC Forward stream on loopback, through the real frame codec (worker/frame.h: bf16
// rounding, XXH3-64 checksum, fingerprint, verify on receipt), p50 / p99.
//
// Set-up: the bench forks an echo worker process (a Worker service whose Forward decodes
// each frame exactly as a worker decodes its input -- checksum verified -- and encodes
// it back exactly as a worker encodes its output); the parent is the coordinator. No
// model compute runs, so everything measured is overhead. Per sample, timed on the
// coordinator:
//   step RTT      encode the frame, send it, the worker decodes + re-encodes, reply,
//                 decode + verify the reply: what one stage step costs the coordinator
//                 beyond the stage's compute (star topology: 2 frames cross a link).
//   codec         the same 2 encodes + 2 decodes in one process, no gRPC, measured in the
//                 same run on the same frames.
//   transport     step RTT - codec (p50 of each): gRPC + HTTP/2 + loopback TCP + thread
//                 wake-ups for the 2 frames.
//   hop = step RTT / 2   one frame crossing one link with its encode + verify: the figure
//                 the target (p50 <= 50 us) is compared against. The RTT itself
//                 is printed too, for the stricter reading.
// And, for comparison, the same step on a fresh stream per step (StageClient::Forward,
// what the coordinator did before streams were kept open per sequence), and over the
// closed ring's shared-memory hops between workers of one host (worker/shm_hop.h: a second
// echo process, one hop each way), with the receivers polling (what a GPU worker does) and
// sleeping on the futex at once (a CPU worker's default).
//
//   ninja -C build hop_bench && ./build/bench/hop_bench [--iters 3000]
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/frame.h"
#include "worker/shm_hop.h"
#include "worker/stage_client.h"
#include "worker/worker_service.h"

namespace {

namespace pb = ringserve::v1;
using ring::StageInput;
using ring::StageOutput;

constexpr int64_t kWidth = 6144;

// What a worker does to a frame, without the model: decode its input (checksum verified) and
// encode it back as its output.
absl::Status EchoFrame(const pb::ActivationFrame& in, pb::ActivationFrame* reply) {
  auto decoded = ring::worker::DecodeStageInput(in);
  if (!decoded.ok()) return decoded.status();
  StageOutput out;
  out.rows = in.rows();
  out.hidden = std::move(decoded->hidden);
  reply->Clear();
  reply->set_sequence_id(in.sequence_id());
  reply->set_step(in.step());
  reply->set_epoch(in.epoch());
  reply->set_first_position(in.first_position());
  reply->set_sender("echo");
  return ring::worker::EncodeStageOutput(out, pb::DTYPE_BF16, false, reply);
}

class EchoWorker final : public pb::Worker::Service {
 public:
  grpc::Status Forward(grpc::ServerContext*,
                       grpc::ServerReaderWriter<pb::ActivationFrame, pb::ActivationFrame>* s) override {
    pb::ActivationFrame in, reply;
    while (s->Read(&in)) {
      absl::Status st = EchoFrame(in, &reply);
      if (!st.ok()) return grpc::Status(grpc::StatusCode::DATA_LOSS, std::string(st.message()));
      if (!s->Write(reply)) break;
    }
    return grpc::Status::OK;
  }
};

// Child process: serves EchoWorker on a loopback port, writes the port to `fd`, and runs
// until killed.
[[noreturn]] void ServeEcho(int fd) {
  EchoWorker service;
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.SetMaxReceiveMessageSize(ring::worker::kMaxMessageBytes);
  b.SetMaxSendMessageSize(ring::worker::kMaxMessageBytes);
  b.RegisterService(&service);
  auto server = b.BuildAndStart();
  if (write(fd, &port, sizeof(port)) != sizeof(port)) _exit(1);
  close(fd);
  pause();
  _exit(0);
}

// EchoFrame on a frame's bytes, as the shared-memory hop carries them.
bool EchoBytes(const std::string& in_bytes, std::string* out_bytes) {
  pb::ActivationFrame in, reply;
  if (!in.ParseFromString(in_bytes) || !EchoFrame(in, &reply).ok()) return false;
  *out_bytes = reply.SerializeAsString();
  return true;
}

// Child process: opens the hop `name` from the parent, creates the hop back (its name goes
// to `fd`), and echoes every frame until the parent closes its end.
[[noreturn]] void ServeShmEcho(const std::string& name, absl::Duration spin, int fd) {
  auto rx = ring::worker::ShmHop::Open(name, {.spin = spin, .peer = "bench"});
  auto tx = ring::worker::ShmHop::Create({.spin = spin, .peer = "bench"});
  if (!rx.ok() || !tx.ok()) _exit(1);
  const std::string back = (*tx)->name();
  const uint32_t n = static_cast<uint32_t>(back.size());
  if (write(fd, &n, sizeof(n)) != sizeof(n) || write(fd, back.data(), n) != static_cast<ssize_t>(n)) _exit(1);
  close(fd);
  std::string reply;
  while (true) {
    auto m = (*rx)->Receive(absl::InfiniteFuture(), absl::Seconds(10));
    if (!m.ok()) _exit(0);  // the parent closed its end
    if (!EchoBytes(*m, &reply) || !(*tx)->Send(reply, absl::Now() + absl::Seconds(10)).ok()) _exit(1);
  }
}

// A parent's pair of hops to a forked shared-memory echo process.
struct ShmEcho {
  pid_t pid = -1;
  std::unique_ptr<ring::worker::ShmHop> tx, rx;
};
ShmEcho StartShmEcho(absl::Duration spin) {
  ShmEcho e;
  auto tx = ring::worker::ShmHop::Create({.spin = spin, .peer = "shm echo"});
  int fds[2];
  if (!tx.ok() || pipe(fds) != 0) return e;
  e.pid = fork();
  if (e.pid == 0) {
    close(fds[0]);
    ServeShmEcho((*tx)->name(), spin, fds[1]);
  }
  close(fds[1]);
  uint32_t n = 0;
  std::string back;
  if (read(fds[0], &n, sizeof(n)) == sizeof(n) && n < 256) {
    back.resize(n);
    if (read(fds[0], back.data(), n) != static_cast<ssize_t>(n)) back.clear();
  }
  close(fds[0]);
  (*tx)->Unlink();
  auto rx = ring::worker::ShmHop::Open(back, {.spin = spin, .peer = "shm echo"});
  if (!rx.ok()) return e;
  e.tx = *std::move(tx);
  e.rx = *std::move(rx);
  return e;
}

std::string LoadAvg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

struct Stats {
  double p50 = 0, p99 = 0, mean = 0;
};

Stats Summarize(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  Stats s;
  s.p50 = us[us.size() / 2];
  s.p99 = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  for (double v : us) s.mean += v;
  s.mean /= static_cast<double>(us.size());
  return s;
}

// Times `fn` `iters` times after `warmup` untimed calls, in microseconds.
std::vector<double> Time(int warmup, int iters, const std::function<bool()>& fn) {
  for (int i = 0; i < warmup; ++i) {
    if (!fn()) std::exit(1);
  }
  std::vector<double> us;
  us.reserve(iters);
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!fn()) std::exit(1);
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  return us;
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 3000;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0) iters = std::atoi(argv[i + 1]);
  }
  // Fork before any gRPC state exists in this process: the gRPC echo worker and two
  // shared-memory echo processes (receivers polling 50 ms, and sleeping at once).
  ShmEcho shm_poll = StartShmEcho(absl::Milliseconds(50));
  ShmEcho shm_sleep = StartShmEcho(absl::ZeroDuration());
  if (shm_poll.tx == nullptr || shm_sleep.tx == nullptr) {
    std::fprintf(stderr, "hop_bench: shared-memory echo did not start\n");
    return 1;
  }
  int fds[2];
  if (pipe(fds) != 0) return 1;
  const pid_t child = fork();
  if (child == 0) {
    close(fds[0]);
    ServeEcho(fds[1]);
  }
  close(fds[1]);
  int port = 0;
  if (read(fds[0], &port, sizeof(port)) != sizeof(port) || port == 0) {
    std::fprintf(stderr, "hop_bench: echo worker did not start\n");
    return 1;
  }
  close(fds[0]);
  const std::string address = absl::StrCat("127.0.0.1:", port);
  std::printf("hop_bench: echo worker pid %d on %s; %d timed steps per row (after %d warm-up)\n",
              static_cast<int>(child), address.c_str(), iters, iters / 10);
  std::printf("load average at start: %s\n\n", LoadAvg().c_str());

  ring::worker::StageClient client(address, 1, {});
  std::printf("| rows | frame bytes | step RTT p50 | step RTT p99 | codec p50 | transport p50 | "
              "hop = RTT/2 p50 | hop p99 | new stream per step: RTT p50 | p99 | shared memory, "
              "polling: RTT p50 | p99 | hop p50 | shared memory, futex: RTT p50 | p99 | hop p50 |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  int rc = 0;
  std::vector<double> fingerprint_p50;
  for (int64_t rows : {1, 8}) {
    StageInput in;
    in.hidden.resize(rows * kWidth);
    for (size_t i = 0; i < in.hidden.size(); ++i) in.hidden[i] = static_cast<float>((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    uint64_t step = 0;
    auto make_frame = [&](pb::ActivationFrame* f) {
      f->set_sequence_id("bench");
      f->set_step(step++);
      f->set_epoch(1);
      f->set_sender("coordinator");
      f->set_reply_dtype(pb::DTYPE_BF16);
      return ring::worker::EncodeStageInput(in, rows, pb::DTYPE_BF16, f).ok();
    };
    size_t frame_bytes = 0;

    auto stream = client.OpenForward();
    const std::vector<double> rtt = Time(iters / 10, iters, [&] {
      pb::ActivationFrame f;
      if (!make_frame(&f)) return false;
      frame_bytes = f.ByteSizeLong();
      auto reply = stream->Step(f, absl::Seconds(10));
      if (!reply.ok()) {
        std::fprintf(stderr, "hop_bench: %s\n", std::string(reply.status().message()).c_str());
        return false;
      }
      return ring::worker::DecodeStageOutput(*reply).ok();
    });
    if (!stream->Close(absl::Seconds(5)).ok()) rc = 1;

    // The same codec work in process: coordinator encode, worker decode + encode,
    // coordinator decode.
    const std::vector<double> codec = Time(iters / 10, iters, [&] {
      pb::ActivationFrame f, reply;
      if (!make_frame(&f) || !EchoFrame(f, &reply).ok()) return false;
      return ring::worker::DecodeStageOutput(reply).ok();
    });

    // The precision guard's share: the activation fingerprint a worker computes over its
    // output every step (L2, absmax, NaN/Inf counts, samples), alone.
    volatile double sink = 0;
    const std::vector<double> fp = Time(iters / 10, iters, [&] {
      sink = sink + ring::worker::ComputeFingerprint(in.hidden).l2();
      return true;
    });
    fingerprint_p50.push_back(Summarize(fp).p50);

    // The old way: a new stream (HTTP/2 stream, headers, trailers) per step.
    const int fresh_iters = std::max(100, iters / 5);
    const std::vector<double> fresh = Time(fresh_iters / 10, fresh_iters, [&] {
      pb::ActivationFrame f;
      if (!make_frame(&f)) return false;
      auto reply = client.Forward(f);
      return reply.ok() && ring::worker::DecodeStageOutput(*reply).ok();
    });

    // The same step over shared-memory hops (the frame and the reply serialized as the
    // worker's PushNext and its reader do).
    auto shm_step = [&](ShmEcho& e) {
      return Time(iters / 10, iters, [&] {
        pb::ActivationFrame f;
        if (!make_frame(&f)) return false;
        if (!e.tx->Send(f.SerializeAsString(), absl::Now() + absl::Seconds(10)).ok()) return false;
        auto back = e.rx->Receive(absl::Now() + absl::Seconds(10), absl::Seconds(10));
        pb::ActivationFrame reply;
        return back.ok() && reply.ParseFromString(*back) && ring::worker::DecodeStageOutput(reply).ok();
      });
    };
    const Stats sp = Summarize(shm_step(shm_poll)), ss = Summarize(shm_step(shm_sleep));

    const Stats r = Summarize(rtt), c = Summarize(codec), n = Summarize(fresh);
    std::printf("| %ld | %zu | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | "
                "%.1f | %.1f |\n",
                static_cast<long>(rows), frame_bytes, r.p50, r.p99, c.p50, r.p50 - c.p50,
                r.p50 / 2, r.p99 / 2, n.p50, n.p99, sp.p50, sp.p99, sp.p50 / 2, ss.p50, ss.p99, ss.p50 / 2);
    std::fflush(stdout);
  }
  std::printf("\n(all times in microseconds)\n");
  std::printf("fingerprint of a worker's output (ComputeFingerprint), p50: 1 row %.2f us, 8 rows "
              "%.2f us\n", fingerprint_p50[0], fingerprint_p50[1]);
  std::printf("load average at end: %s\n", LoadAvg().c_str());
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  for (ShmEcho* e : {&shm_poll, &shm_sleep}) {
    e->tx.reset();  // closes the hop: the echo process exits
    waitpid(e->pid, nullptr, 0);
  }
  return rc;
}
