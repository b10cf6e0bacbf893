#!/usr/bin/env python3
"""Pipeline efficiency and aggregate decode throughput of a ring on loopback (CPU backend).

Synthesizes a model with `ringctl synth` (default: qwen3-0.6b dimensions -- hidden 1024,
vocab 151936, tied LM head -- cut to 8 layers, affine 4-bit), starts N ring-worker
processes on loopback, and times decode with build/bench/ring_bench (the step loop
ring-server runs, k sequences on k threads). Every figure is a ratio of runs made in this
one session. Each round runs the one-process baseline, then every ring configuration, then
the baseline again; a ring's ratio is taken against the mean of its round's two baseline
runs (and a k-sequence run against the same round's 1-sequence run), and the table gives
the median over rounds of those per-round ratios, so that load from other processes that
drifts over minutes cancels rather than landing on one side:

  pipeline efficiency(N) = tokens/s of an N-stage ring, 1 sequence
                           / tokens/s of one process running all layers, 1 sequence
  aggregate speed-up(N, k) = tokens/s of N stages with k concurrent sequences
                             / tokens/s of the same N stages with 1 sequence
  variant gain(N, k) = tokens/s of N stages with k sequences, workers started with the
                       first --variants flags / the same with the last (one set of workers
                       per variant, all timed in the same rounds), e.g.
                       --variants '--max-batch 8|--max-batch 1' (continuous batching on/off)

Tokens/s cells are medians over rounds too. RING_CPU_THREADS (--threads, default 1) is
set for every process, the baseline included: on a machine with fewer cores than stages
the pool threads of idle stages would otherwise compete with the busy one.

  .venv/bin/python bench/ring_bench.py --build build --work /tmp/ring_bench
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import urllib.request

WORKERS = []
# --pin: the CPUs of each stage's worker (by stage index) and of the one-process baseline.
CPUS = {}
METRICS = {}  # worker address -> its /metrics URL
BREAKDOWN = {}  # workers -> [(per-stage ms, hops ms, forward ms, wire ms)] of closed-ring 1-sequence runs


def exe(args, rel):
    """A binary of the build dir (build/worker/ring-worker), or of --bindir (a bundle's bin/)."""
    return os.path.join(args.bindir, os.path.basename(rel)) if args.bindir else os.path.join(args.build, rel)


def start_worker(args, root, env, device="cpu", flags="", stage=0):
    # A variant may name other binaries: "--bindir=DIR" takes DIR/ring-worker (another build);
    # "--env=NAME=VALUE" sets a variable in its workers' environment (a backend switch).
    worker = exe(args, "worker/ring-worker")
    rest = []
    for f in flags.split():
        if f.startswith("--bindir="):
            worker = os.path.join(f[len("--bindir="):], "ring-worker")
        elif f.startswith("--env=") and "=" in f[len("--env="):]:
            name, value = f[len("--env="):].split("=", 1)
            env = dict(env, **{name: value})
        else:
            rest.append(f)
    cmd = [worker, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
           "--model-root", root, "--device", device]
    cmd += rest
    # Each worker's stderr goes to WORK/worker_<n>.log (e.g. RING_CUDA_STEP_STATS=1 in the
    # environment: its backend's per-step statistics, printed when it exits on SIGTERM).
    log = open(os.path.join(args.work, f"worker_{len(WORKERS)}.log"), "w")
    cpus = CPUS.get(stage)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env,
                         preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    log.close()
    WORKERS.append(p)
    line = p.stdout.readline()
    if "listening on" not in line:
        raise RuntimeError(f"ring-worker did not start: {line!r}")
    addr = line.split()[3]
    m = re.search(r"metrics (http://\S+/metrics)", line)
    if m:
        METRICS[addr] = m.group(1)
    return addr


def batch_counts(workers):
    """(sum, count) of ring_worker_batch_steps over these workers: steps and batches so far."""
    total, batches = 0.0, 0.0
    for w in workers:
        if w not in METRICS:
            continue
        with urllib.request.urlopen(METRICS[w], timeout=10) as r:
            text = r.read().decode()
        for line in text.splitlines():
            if line.startswith("ring_worker_batch_steps_sum"):
                total += float(line.split()[-1])
            elif line.startswith("ring_worker_batch_steps_count"):
                batches += float(line.split()[-1])
    return total, batches


BATCH = {}  # (workers, sequences) -> [mean steps per batch of each run]


def bench(args, env, model, workers=(), sequences=1):
    cmd = [exe(args, "bench/ring_bench"), "--model", model, "--sequences", str(sequences),
           "--decode", str(args.decode), "--prompt", str(args.prompt)]
    if workers:
        cmd += ["--workers", ",".join(workers), "--closed", "1" if args.topology == "closed" else "0",
                "--plan", args.plan]
    else:
        cmd += ["--device", args.devices.split(",")[0]]
    before = batch_counts(workers)
    # The baseline computes in this process: it gets a stage's CPUs (--pin).
    cpus = CPUS.get("baseline") if not workers else None
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env,
                       preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    after = batch_counts(workers)
    if after[1] > before[1]:
        BATCH.setdefault((tuple(workers), sequences), []).append(
            (after[0] - before[0]) / (after[1] - before[1]))
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")
    result = json.loads(r.stdout.strip().splitlines()[-1])
    if "hops_ms" in result and sequences == 1:
        # Closed ring: where one sequence's step went (ring_bench's trace of every step).
        BREAKDOWN.setdefault(tuple(workers), []).append((result["stage_compute_ms"], result["hops_ms"],
                                                       result.get("forward_ms"), result.get("wire_ms")))
    return result["tokens_per_s"]


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--bindir", default="", help="take the binaries from here instead (a bundle's bin/)")
    ap.add_argument("--devices", default="cpu",
                    help="worker devices, cycled over the stages (e.g. cuda:0,cuda:1); the baseline "
                         "runs on the first")
    ap.add_argument("--work", default="/tmp/ring_bench")
    ap.add_argument("--preset", default="qwen3-0.6b")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--quant", default="affine")
    ap.add_argument("--stages", default="2,3,4")
    ap.add_argument("--sequences", default="2,4")
    ap.add_argument("--decode", type=int, default=24)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", default="1")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--pin", action="store_true",
                    help="give each stage's worker its own --threads + 1 CPUs (the baseline stage 0's), "
                         "so that stages do not share cores and placement does not move the figures")
    ap.add_argument("--plan", default="auto", choices=["auto", "even"],
                    help="layer split of the rings: the planner's (balances weight bytes read per "
                         "token, LM head included) or near-equal layer counts")
    ap.add_argument("--topology", default="closed", choices=["closed", "star"],
                    help="the rings' topology (ring-server's ring.topology); the baseline is one process")
    ap.add_argument("--variants", default="",
                    help="'|'-separated ring-worker flag sets, one set of workers each, compared in "
                         "the same rounds (e.g. '--max-batch 8|--max-batch 1'); default: one set, "
                         "default flags. A set may hold --bindir=DIR: its workers are DIR/ring-worker "
                         "(compare two builds in the same rounds), and --env=NAME=VALUE: its "
                         "workers run with that variable set (e.g. '|--env=RING_CUDA_GRAPH_FIRST_OPS=2')")
    args = ap.parse_args()
    env = dict(os.environ, RING_CPU_THREADS=args.threads)
    root = os.path.join(args.work, "models")
    name = f"{args.preset}-{args.layers}l-{args.quant}"
    model_dir = os.path.join(root, name)
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        os.makedirs(root, exist_ok=True)
        subprocess.run([exe(args, "server/ringctl"), "synth", "--preset", args.preset,
                        "--layers", str(args.layers), "--quant", args.quant, "--out", model_dir, "--quiet",
                        "--force"], check=True, timeout=1800)
    stages = [int(s) for s in args.stages.split(",")]
    seqs = [int(k) for k in args.sequences.split(",")]
    devices = args.devices.split(",")
    variants = [v.strip() for v in args.variants.split("|")] if args.variants else [""]
    if args.pin:
        # Stage i's worker on CPUs [i (t + 1), (i + 1)(t + 1)): its t pool threads and the thread
        # that reads its frames; the baseline on stage 0's. Every set of workers (--variants)
        # shares the same partition.
        avail = sorted(os.sched_getaffinity(0))
        per = int(args.threads) + 1
        if per * max(stages) > len(avail):
            sys.exit(f"--pin: {max(stages)} stages of {per} CPUs need {per * max(stages)}, "
                     f"this process may use {len(avail)}")
        for i in range(max(stages)):
            CPUS[i] = set(avail[i * per:(i + 1) * per])
        CPUS["baseline"] = CPUS[0]
    addrs = {b: [start_worker(args, root, env, devices[i % len(devices)], b, i) for i in range(max(stages))]
             for b in variants}
    print(f"model {name}, {args.topology} rings, {args.plan} split, decode {args.decode} steps after a {args.prompt}-token prompt, "
          f"RING_CPU_THREADS={args.threads}{' (pinned: --threads + 1 CPUs a stage)' if args.pin else ''}, "
          f"{args.rounds} rounds, worker flags "
          f"{' vs '.join(repr(b) if b else 'default' for b in variants)}; load average at start {loadavg()}",
          flush=True)

    cfgs = [(b, n) for b in variants for n in stages]
    base, ring1, ringk = [], {c: [] for c in cfgs}, {(c, k): [] for c in cfgs for k in seqs}
    eff, speedup = {c: [] for c in cfgs}, {(c, k): [] for c in cfgs for k in seqs}
    gain = {(n, k): [] for n in stages for k in seqs}
    for rnd in range(args.rounds):
        before = bench(args, env, model_dir)
        for c in cfgs:
            b, n = c
            ring1[c].append(bench(args, env, name, addrs[b][:n]))
            for k in seqs:
                ringk[(c, k)].append(bench(args, env, name, addrs[b][:n], k))
                speedup[(c, k)].append(ringk[(c, k)][-1] / ring1[c][-1])
        after = bench(args, env, model_dir)
        base += [before, after]
        for c in cfgs:
            eff[c].append(ring1[c][-1] / ((before + after) / 2))
        if len(variants) > 1:
            for n in stages:
                for k in seqs:
                    gain[(n, k)].append(ringk[((variants[0], n), k)][-1] / ringk[((variants[-1], n), k)][-1])
        print(f"  round {rnd + 1}: one process {before:.2f} / {after:.2f} tok/s; "
              + "; ".join((f"[{b}] " if b else "") + f"N={n} {ring1[(b, n)][-1]:.2f} ("
                          + ", ".join(f"k={k} {ringk[((b, n), k)][-1]:.2f}" for k in seqs) + ")"
                          for b, n in cfgs), flush=True)
    med = statistics.median
    print(f"\none process, all {args.layers} layers, 1 sequence: {med(base):.2f} tokens/s "
          f"(median of {len(base)} runs, min {min(base):.2f}, max {max(base):.2f})")
    print("\n| worker flags | stages N | ring tokens/s (1 seq) | pipeline efficiency (min..max over rounds) | "
          + " | ".join(f"k={k}: tokens/s | speed-up vs 1 seq (min..max) | target 0.8*min(k,N)" for k in seqs) + " |")
    print("|---:|---:|---:|---:|" + "---:|---:|---:|" * len(seqs))
    for c in cfgs:
        b, n = c
        cells = []
        for k in seqs:
            sp = speedup[(c, k)]
            cells.append(f"{med(ringk[(c, k)]):.2f} | {med(sp):.2f} ({min(sp):.2f}..{max(sp):.2f}) | {0.8 * min(k, n):.1f}")
        print(f"| {b or 'default'} | {n} | {med(ring1[c]):.2f} | {med(eff[c]):.3f} ({min(eff[c]):.2f}..{max(eff[c]):.2f}) | "
              + " | ".join(cells) + " |")
    if len(variants) > 1:
        print("\nmean sequences per batch through a stage (all stages, prefill steps included; median over rounds):")
        for c in cfgs:
            b, n = c
            print(f"  [{b or 'default'}], N={n}: " + ", ".join(
                f"k={k} {med(BATCH.get((tuple(addrs[b][:n]), k), [0])):.2f}" for k in [1] + seqs))
        print(f"\nvariant gain, tokens/s with [{variants[0]}] / [{variants[-1]}] "
              "(median, min..max over rounds):")
        for n in stages:
            print(f"  N={n}: " + ", ".join(
                f"k={k} {med(gain[(n, k)]):.2f} ({min(gain[(n, k)]):.2f}..{max(gain[(n, k)]):.2f})" for k in seqs))
    for b, n in cfgs:
        runs = BREAKDOWN.get(tuple(addrs[b][:n]))
        if not runs:
            continue
        stages_ms = [med([r[0][i] for r in runs]) for i in range(n)]
        print((f"[{b}] " if b else "") + f"closed ring, N={n}, 1 sequence, median per step: compute per stage "
              + ", ".join(f"{t:.3f}" for t in stages_ms) + f" ms; all hops {med([r[1] for r in runs]):.3f} ms")
        if all(r[2] and r[3] for r in runs):
            fwd = [med([r[2][i] for r in runs]) for i in range(n)]
            wire = [med([r[3][i] for r in runs]) for i in range(n)]
            print("  of which the stages' forward " + ", ".join(f"{t:.3f}" for t in fwd)
                  + " ms (the rest of a stage's time: frame decode/encode, checks); hops on the wire "
                  + ", ".join(f"{i}->{(i + 1) % n} {t:.3f}" for i, t in enumerate(wire))
                  + " ms (reply ready to frame read by the next stage; into stage 0: to its Generate having the token)")
    print(f"\nload average at end {loadavg()}")


if __name__ == "__main__":
    try:
        main()
    finally:
        # SIGTERM first: a worker then shuts down and its backend says what it did (above).
        for p in WORKERS:
            p.terminate()
        for p in WORKERS:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
    sys.exit(0)
