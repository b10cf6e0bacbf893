#!/usr/bin/env python3
"""Where a ring stage's decode step spends its time, from kernel traces of the workers.

  ring_trace_report.py TRACE [TRACE ...]

Each TRACE is bench/gpu/kernel_trace.cc's file of one process (RING_KERNEL_TRACE with "%p",
RING_KERNEL_TRACE_API=1), given in ring order (stage 0 first); one TRACE alone is a
one-process run. A process's steps are its bursts of CUDA runtime calls: a gap of more
than --gap-us between two calls starts a new step (a stage waits for the rest of the ring
between its steps), and so does one of more than --sync-gap-us after a
cudaStreamSynchronize (a one-process run's steps follow each other closely; a step ends
with its wait). Decode steps are the steps whose kernels' busy time is within 25% of the
median (prefill steps are longer). Per stage, medians over its decode steps, in us:

  start   the step's first CUDA call -> its first kernel starts (the host's preparation,
          the input's upload, the first launch)
  span    first kernel start -> the step's last GPU work ends (its download included)
  busy    union of the kernels, copies and memsets in the span
  tail    last GPU work end -> the step's last CUDA call returns (the wait's wake-up, and
          what the host does between its last two waits)
  host    the step's first call -> its last call's return (start + span + tail)
  out     the step's last call's return -> the next stage's first call of the same token
          (its encode, push, the hop, the next stage's frame decode); the timestamps of
          different processes are CUPTI's, on one host clock

The sum of `host` and `out` over the stages is the ring's time per token.
"""
import argparse
import bisect
import statistics
import sys


def load(path):
    """(gpu, api): GPU records (start, end, kind) and runtime calls (start, end, name), sorted."""
    gpu, api = [], []
    for line in open(path):
        f = line.split()
        if not f:
            continue
        if f[0] in ("K", "C", "S"):
            gpu.append((int(f[1]), int(f[2]), f[0]))
        elif f[0] == "R":
            api.append((int(f[1]), int(f[2]), f[4] if len(f) > 4 else "?"))
    gpu.sort()
    api.sort()
    return gpu, api


def union(iv):
    total, cur_s, cur_e = 0, None, None
    for s, e, *_ in iv:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def steps_of(gpu, api, gap_ns, sync_gap_ns):
    """Cuts the calls into steps; each step with the GPU work that started inside it."""
    steps, first = [], 0
    if not api:
        return steps
    last_end = api[0][1]
    for i in range(1, len(api) + 1):
        if i < len(api):
            gap = api[i][0] - last_end
            after_sync = "Synchronize" in api[i - 1][2]
            if gap <= gap_ns and not (after_sync and gap > sync_gap_ns):
                last_end = max(last_end, api[i][1])
                continue
        t0, t1 = api[first][0], last_end
        work = gpu[bisect.bisect_left(gpu, (t0,)):bisect.bisect_left(gpu, (t1,))]
        kernels = [w for w in work if w[2] == "K"]
        if kernels:
            k0 = kernels[0][0]
            in_span = [w for w in work if w[0] >= k0]
            steps.append(dict(t0=t0, t1=t1, k0=k0, g1=max(w[1] for w in work),
                              busy=union(in_span), kbusy=union(kernels)))
        first = i
        if i < len(api):
            last_end = api[i][1]
    return steps


def decode_steps(steps):
    if not steps:
        return []
    mb = statistics.median(s["kbusy"] for s in steps)
    return [s for s in steps if abs(s["kbusy"] - mb) <= 0.25 * mb]


def median(xs):
    xs = list(xs)
    return statistics.median(xs) if xs else float("nan")


def stage_rows(stages):
    """One dict of medians (ns) per stage; `out` only for a ring (two or more stages)."""
    rows = []
    for i, dec in enumerate(stages):
        row = dict(
            steps=len(dec),
            start=median(s["k0"] - s["t0"] for s in dec),
            span=median(s["g1"] - s["k0"] for s in dec),
            busy=median(s["busy"] for s in dec),
            idle=median(s["g1"] - s["k0"] - s["busy"] for s in dec),
            tail=median(s["t1"] - s["g1"] for s in dec),
            host=median(s["t1"] - s["t0"] for s in dec),
            out=float("nan"),
        )
        if len(stages) > 1:
            nxt = [s["t0"] for s in stages[(i + 1) % len(stages)]]
            outs = []
            for s in dec:
                j = bisect.bisect_left(nxt, s["t1"])
                if j < len(nxt):
                    outs.append(nxt[j] - s["t1"])
            row["out"] = median(outs)
        rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--gap-us", type=float, default=60.0,
                    help="a gap between CUDA calls longer than this starts a step")
    ap.add_argument("--sync-gap-us", type=float, default=3.0,
                    help="so does one this long after a cudaStreamSynchronize")
    args = ap.parse_args()
    stages = []
    for p in args.traces:
        gpu, api = load(p)
        if not api:
            sys.exit(f"{p}: no runtime-API records (RING_KERNEL_TRACE_API=1)")
        stages.append(decode_steps(steps_of(gpu, api, args.gap_us * 1e3, args.sync_gap_us * 1e3)))
    rows = stage_rows(stages)
    keys = ("start", "span", "busy", "idle", "tail", "host", "out")
    print("stage | decode steps | " + " | ".join(keys))
    print("---|---:|" + "---:|" * len(keys))
    for i, r in enumerate(rows):
        print(f"{i} | {r['steps']} | " + " | ".join(f"{r[k] / 1e3:.1f}" for k in keys))
    if len(rows) > 1:
        total = sum(r["host"] + r["out"] for r in rows)
        print(f"ring time per token (sum of host + out): {total / 1e3:.1f} us")


if __name__ == "__main__":
    main()
