#!/usr/bin/env python3
"""Where the GPU time of the GLM slice's decode steps goes, from a kernel trace.

  glm_trace_report.py BENCH_OUT TRACE [--marks] [--peak-tflops P]

BENCH_OUT: glm_slice_bench's output of the traced run (step order, bytes per layer, probed
bandwidth). TRACE: bench/gpu/kernel_trace.cc's file of the same run. Steps are cut at the
device-to-host copy that ends every step (the final-normed hidden row, hidden_size * 4
bytes, argmax_only). Per decode step group (after the long / the short prompt; the first
two steps of each left out, they capture graphs): GPU span of a step (first record start
to last record end), busy time (union of kernels, copies, memsets), idle time inside the
span (gaps between kernels), the gap between steps (host), and a per-kernel table.
With the runtime-API records of RING_KERNEL_TRACE_API=1 in the trace: how much of the idle
time the host caused (the GPU idle while the call that queued the next work had not yet
returned) and the host's CUDA calls per step by function.
Prefill: the linear layers' kernel time and TFLOP/s (the bench prints their FLOPs), and with
--peak-tflops (gpu_gemm_bench --peak-only's cuBLAS bf16 figure, same call) the fraction of it.
With --marks (the run had RING_CUDA_LAYER_MARKS=1): per-layer times (from one layer mark to
the next; the head until the step's end) and the 78-layer GLM-5.2 extrapolation next to
its roofline: 3 dense layers with a full indexer, 18 MoE layers with a full indexer, 57
MoE layers sharing one (shared spec section 1.6), plus embedding and head.
"""
import bisect
import re
import subprocess
import sys
from collections import defaultdict


def parse_bench(path):
    info = {"layers": {}, "gbps": None, "hidden_bytes": None}
    for line in open(path):
        m = re.match(r"read bandwidth probe: (\d+) GB/s", line)
        if m:
            info["gbps"] = float(m.group(1))
        m = re.match(r"step order: prefill (\d+) \(warm-up\), prefill (\d+) x (\d+), decode (\d+), "
                     r"prefill (\d+), decode (\d+)", line)
        if m:
            info["order"] = [int(x) for x in m.groups()]
        m = re.match(r"\s+layer (\d+) \((\w+), indexer (\w+)\): ([\d.]+) MB \(non-expert ([\d.]+) MB, "
                     r"of it indexer ([\d.]+) MB", line)
        if m:
            info["layers"][int(m.group(1))] = dict(kind=m.group(2), indexer=m.group(3),
                                                   mb=float(m.group(4)), idx_mb=float(m.group(6)))
        m = re.match(r"decode bytes per token \(weights\): embedding row ([\d.]+) B, head ([\d.]+) MB", line)
        if m:
            info["head_mb"] = float(m.group(2)) + float(m.group(1)) / 1e6
        m = re.match(r"prefill linear FLOPs: ([\d.eE+-]+) TFLOP", line)
        if m:
            info["linear_tflop"] = float(m.group(1))
    return info


# The kernels of the prefill's linear layers: the GEMMs (and a GEMV where a launch has at most
# 8 rows: lm_head's last row), the grouped experts' slot sort and row gather, the transposed
# weight decode of MLA's expanded keys.
LINEAR_KERNELS = re.compile(r"QmmGemmKernel|QmmSimtKernel|QmmNKernel|QgemvKernel|QgemvColKernel|"
                            r"DecodeTransposedKernel|GatherBf16Kernel|GroupSlotsKernel")


def linear_share(steps, short, tflop, peak_tflops=None):
    """(ms a step in the linear layers' kernels, TFLOP/s, fraction of peak_tflops or None)
    for `steps` (lists of records) whose linear layers do `tflop` TFLOP each."""
    ns = sum(r[2] - r[1] for s in steps for r in s if r[0] == "K" and LINEAR_KERNELS.search(short[r[3]]))
    ms = ns / max(1, len(steps)) / 1e6
    rate = tflop / (ms / 1e3) if ms > 0 else 0.0
    return ms, rate, (rate / peak_tflops if peak_tflops else None)


def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                             check=True).stdout.split("\n")
    except Exception:  # noqa: BLE001 (no c++filt: keep the mangled names)
        out = names
    short = {}
    for n, d in zip(names, out):
        d = d.replace("ring::cuda::", "").replace("(anonymous namespace)::", "")
        d = re.sub(r"\(.*$", "", d)  # drop the parameter list
        short[n] = d[:90]
    return short


def union(intervals):
    tot, end = 0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            tot += e - s
            end = e
        elif e > end:
            tot += e - end
            end = e
    return tot


def host_caused_idle(steps, corr, api_end, before=None):
    """(idle the host caused, all idle) summed over steps, ns; `before` (a dict), if given,
    gets the host's share per name of the record that ended each gap.

    A gap before a record counts as the host's up to the time the call that queued the record
    returned: until then the GPU could not have had it."""
    host = total = 0
    for s in steps:
        end = None
        for r in sorted(s, key=lambda r: r[1]):
            if end is not None and r[1] > end:
                gap = r[1] - end
                total += gap
                ready = api_end.get(corr.get(r))
                if ready is not None:
                    h = min(gap, max(0, ready - end))
                    host += h
                    if before is not None:
                        before[r[3] if r[0] == "K" else {"C": "[memcpy]", "S": "[memset]"}[r[0]]] += h
            end = r[2] if end is None else max(end, r[2])
    return host, total


def host_calls(steps, corr, api):
    """{function: [ns, count]} of the host's runtime calls of these steps: those between the
    return of the call that queued a step's first record and the return of the one that
    queued its last (the step's final copy; the synchronising wait after it included)."""
    by_corr = {c: (st, e) for st, e, c, _ in api}
    out = defaultdict(lambda: [0, 0])
    starts = [st for st, _, _, _ in api]
    for s in steps:
        first = by_corr.get(corr.get(s[0]))
        last = by_corr.get(corr.get(s[-1]))
        if first is None or last is None:
            continue
        lo = bisect.bisect_left(starts, first[0])
        hi = bisect.bisect_right(starts, last[0])
        for st, e, _, f in api[lo:hi + 1]:  # + the wait that follows the final copy
            out[f][0] += e - st
            out[f][1] += 1
    return out


def main():
    bench, trace = sys.argv[1], sys.argv[2]
    marks = "--marks" in sys.argv
    peak = None
    if "--peak-tflops" in sys.argv:
        peak = float(sys.argv[sys.argv.index("--peak-tflops") + 1])
    info = parse_bench(bench)
    recs, api = [], []
    corr = {}  # record -> correlation id of the host call that queued it
    for line in open(trace):
        p = line.rstrip("\n").split(" ")
        if p[0] == "K":
            # Older traces have no correlation field before the name.
            new = len(p) >= 8 and p[6].isdigit()
            r = ("K", int(p[1]), int(p[2]), " ".join(p[7 if new else 6:]), p[4])
            if new:
                corr[r] = int(p[6])
            recs.append(r)
        elif p[0] in "CS":
            r = (p[0], int(p[1]), int(p[2]), int(p[3]), int(p[4]))
            if len(p) >= 6:
                corr[r] = int(p[5])
            recs.append(r)
        elif p[0] == "R":
            api.append((int(p[1]), int(p[2]), int(p[3]), p[4]))
    recs.sort(key=lambda r: r[1])
    api.sort()
    api_end = {c: e for _, e, c, _ in api}
    # Step ends: the hidden-row download (copy kind 2 = device to host) of hidden_size floats.
    hid_bytes = 6144 * 4
    steps, cur = [], []
    for r in recs:
        cur.append(r)
        if r[0] == "C" and r[3] == 2 and r[4] == hid_bytes:
            steps.append(cur)
            cur = []
    o = info["order"]
    n_pre = 1 + o[2]
    groups = {"decode after the long prompt": steps[n_pre + 2:n_pre + o[3]],
              "decode after the short prompt": steps[n_pre + o[3] + 1 + 2:n_pre + o[3] + 1 + o[5]],
              "prefill (timed reps)": steps[1:n_pre]}
    print(f"trace: {len(recs)} records, {len(steps)} steps (expected {n_pre + o[3] + 1 + o[5]})")
    names = sorted({r[3] for r in recs if r[0] == "K"})
    short = demangle(names)
    prev_end = {}
    for i, s in enumerate(steps):
        prev_end[id(s)] = steps[i - 1][-1][2] if i > 0 else None
    layer_ms_all = {}
    for gname, g in groups.items():
        if not g:
            continue
        n = len(g)
        span = sum(s[-1][2] - s[0][1] for s in g) / n / 1e6
        busy = sum(union([(r[1], r[2]) for r in s]) for s in g) / n / 1e6
        ktime = sum(r[2] - r[1] for s in g for r in s if r[0] == "K") / n / 1e6
        nk = sum(1 for s in g for r in s if r[0] == "K") / n
        gaps = [s[0][1] - prev_end[id(s)] for s in g if prev_end[id(s)] is not None]
        gap = sum(gaps) / max(1, len(gaps)) / 1e6
        print(f"\n== {gname}: {n} steps; per step: GPU span {span:.3f} ms, busy {busy:.3f} ms, "
              f"idle inside the span {span - busy:.3f} ms ({100 * (span - busy) / span:.0f}%), "
              f"kernels {nk:.0f} ({ktime:.3f} ms), gap before the step (host) {gap:.3f} ms")
        if api:
            before = defaultdict(float)
            host_idle, idle_all = host_caused_idle(g, corr, api_end, before)
            print(f"   idle the host caused (next work's call returned after the GPU went idle): "
                  f"{host_idle / n / 1e6:.3f} ms of {idle_all / n / 1e6:.3f} ms per step; before: " +
                  ", ".join(f"{short.get(k, k)} {v / n / 1e3:.1f} us" for k, v in
                            sorted(before.items(), key=lambda kv: -kv[1])[:8]))
            calls = host_calls(g, corr, api)
            print("   host CUDA calls per step: " + ", ".join(
                f"{f} {cnt / n:.1f}x {ns / n / 1e3:.1f} us" for f, (ns, cnt) in
                sorted(calls.items(), key=lambda kv: -kv[1][0])[:12]))
        per = defaultdict(lambda: [0.0, 0])
        for s in g:
            for r in s:
                key = short[r[3]] if r[0] == "K" else {"C": "[memcpy]", "S": "[memset]"}[r[0]]
                per[key][0] += (r[2] - r[1]) / 1e3
                per[key][1] += 1
        rows = sorted(per.items(), key=lambda kv: -kv[1][0])
        print(f"| kernel | us/step | launches/step | % of busy |")
        print(f"|---|---:|---:|---:|")
        for k, (us, cnt) in rows[:25]:
            print(f"| `{k}` | {us / n:.1f} | {cnt / n:.1f} | {100 * us / n / 1e3 / busy:.1f}% |")
        if gname.startswith("prefill") and info.get("linear_tflop"):
            ms, rate, frac = linear_share(g, short, info["linear_tflop"], peak)
            print(f"linear layers: {info['linear_tflop']:.3f} TFLOP in {ms:.2f} ms a prefill = {rate:.0f} TFLOP/s" +
                  (f" = {frac:.2f} of the {peak:.0f} TFLOP/s bf16 peak (--peak-tflops)" if frac is not None else
                   " (--peak-tflops P: as a fraction of the bf16 peak)"))
        if gname.startswith("prefill") and not marks:
            # The same kernel serves several jobs in prefill (QmmGemmKernel: projections, MLPs,
            # grouped experts, expanded keys/values): per launch shape (grid x.y.z), so time can
            # be attributed to a layer class by its grid.
            shape = defaultdict(lambda: [0.0, 0])
            for s in g:
                for r in s:
                    if r[0] == "K":
                        shape[(short[r[3]], r[4])][0] += (r[2] - r[1]) / 1e3
                        shape[(short[r[3]], r[4])][1] += 1
            print("\nprefill by launch shape:")
            print("| kernel | grid | us/step | launches/step |")
            print("|---|---|---:|---:|")
            for (k, grid), (us, cnt) in sorted(shape.items(), key=lambda kv: -kv[1][0])[:40]:
                print(f"| `{k}` | {grid} | {us / n:.1f} | {cnt / n:.1f} |")
        if not marks or gname.startswith("prefill"):
            continue
        # Per layer: from the mark of value v (layer v - 2; 1 = embedding) to the next.
        lay = defaultdict(float)
        for s in g:
            ms = [(r[1], r[3]) for r in s if r[0] == "S" and r[4] == 4]
            for j, (t, v) in enumerate(ms):
                t_next = ms[j + 1][0] if j + 1 < len(ms) else s[-1][2]
                lay[v - 2] += (t_next - t) / 1e6
        lay = {k: v / n for k, v in sorted(lay.items())}
        layer_ms_all[gname] = lay
        L = len(info["layers"])
        print("\nper layer (GPU timeline, layer mark to next mark), ms:")
        for k, v in lay.items():
            name = "embedding" if k == -1 else "head (norm, lm_head, argmax)" if k == L else f"layer {k}"
            extra = ""
            if 0 <= k < L and info["gbps"]:
                li = info["layers"][k]
                roof = li["mb"] * 1e6 / (info["gbps"] * 1e9) * 1e3
                extra = f"  ({li['kind']}, indexer {li['indexer']}: {li['mb']:.1f} MB, roofline {roof:.3f} ms, {v / roof:.2f}x)"
            if k == L and info["gbps"]:
                roof = info["head_mb"] * 1e6 / (info["gbps"] * 1e9) * 1e3
                extra = f"  ({info['head_mb']:.1f} MB, roofline {roof:.3f} ms, {v / roof:.2f}x)"
            print(f"  {name}: {v:.3f}{extra}")
        # Indexer kernels per full layer (scores + top-k), for the MoE full-layer estimate.
        idx_us = 0.0
        for s in g:
            for r in s:
                if r[0] == "K" and re.search(r"Indexer|TopKRows", short[r[3]]):
                    idx_us += (r[2] - r[1]) / 1e3
        full = [k for k, li in info["layers"].items() if li["indexer"] == "full"]
        idx_us /= n * max(1, len(full))
        dense = [lay[k] for k, li in info["layers"].items() if li["kind"] == "dense" and k in lay]
        moe = [lay[k] for k, li in info["layers"].items() if li["kind"] == "moe" and li["indexer"] != "full" and k in lay]
        if not dense or not moe or not info["gbps"]:
            continue
        t_dense, t_moe = sum(dense) / len(dense), sum(moe) / len(moe)
        idx_mb = max(li["idx_mb"] for li in info["layers"].values())
        gb = info["gbps"] * 1e9
        # A full MoE layer = a shared one + its indexer: the indexer's kernels as measured on
        # the dense layers + its weights read at the probed bandwidth (estimate).
        t_idx = idx_us / 1e3 + idx_mb * 1e6 / gb * 1e3
        t_ends = lay.get(-1, 0) + lay.get(L, 0)
        t78 = 3 * t_dense + 18 * (t_moe + t_idx) + 57 * t_moe + t_ends
        d_mb = sum(info["layers"][k]["mb"] for k in info["layers"] if info["layers"][k]["kind"] == "dense") / len(dense)
        m_mb = sum(info["layers"][k]["mb"] for k in info["layers"] if info["layers"][k]["kind"] == "moe") / len(moe)
        b78 = (3 * d_mb + 18 * (m_mb + idx_mb) + 57 * m_mb + info["head_mb"]) * 1e6
        r78 = b78 / gb * 1e3
        print(f"\n78-layer GLM-5.2 extrapolation ({gname}): 3 x dense {t_dense:.3f} + 18 x (MoE {t_moe:.3f} "
              f"+ indexer {t_idx:.3f}) + 57 x MoE {t_moe:.3f} + embedding/head {t_ends:.3f} = {t78:.2f} ms/token "
              f"({1e3 / t78:.1f} tok/s); weights {b78 / 1e9:.2f} GB -> roofline {r78:.2f} ms "
              f"({1e3 / r78:.1f} tok/s) at {info['gbps']:.0f} GB/s; measured/roofline {t78 / r78:.2f}x "
              "(KV-cache bytes not in the roofline)")


if __name__ == "__main__":
    main()
