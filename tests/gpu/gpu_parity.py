#!/usr/bin/env python3
"""Whole-model GPU parity: `ringctl logits --backend cuda` against `--backend cpu`.

    gpu_parity.py --ringctl PATH --fixtures DIR [--backend cuda:0] [--threshold 1e-3]
                  [--report FILE.md] [--only NAME ...] [--timeout S] [--no-stages]

For every mlx-lm oracle fixture under DIR (tests/oracle/README.md: a folder holding
oracle.json, logits.npy, model/) runs the fixture's schedule (prompt in chunks of
prefill_chunk through the KV cache, then the forced decode tokens one at a time) on the CPU
reference engine and on the GPU, in the checkpoint's activation dtype, and compares every
row: per-row NMSE = sum((gpu - cpu)^2) / sum(cpu^2) must be <= the threshold (1e-3) at
every position. Also reported, for information: the GPU against the mlx-lm oracle's
logits, greedy agreement, the same comparison with fp32 activations (--act f32), where
both engines compute the same function up to fp32 summation order, and the model's noise
floor: the CPU engine against itself with every matmul output perturbed by a relative 1e-6
(`--jitter`), i.e. how far a difference of the size of an fp32 summation-order change
travels through this bf16 network. Unless --no-stages, the
GPU run split into 2 and 3 in-process stages (hidden state and IndexShare top-k crossing
the boundaries through the host) must be bit-identical to the 1-stage GPU run.

Exit status: 0 all fixtures pass; 1 a failure; 77 no usable CUDA device or a ringctl
without the CUDA backend (CTest's SKIP_RETURN_CODE).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SKIP = 77
NO_DEVICE_MARKERS = ("no CUDA device", "no CUDA backend", "CUDA device(s) are visible",
                     "cudaErrorNoDevice", "cudaErrorInsufficientDriver")


def row_nmse(ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
    o = ours.astype(np.float64)
    r = ref.astype(np.float64)
    num = np.sum((o - r) ** 2, axis=-1)
    den = np.sum(r ** 2, axis=-1)
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), num)


class RunError(Exception):
    pass


def run(ringctl, fdir: Path, oracle, out: Path, backend: str, extra, timeout, shape):
    cmd = [ringctl, "logits", "--model", str(fdir / "model"),
           "--tokens", ",".join(map(str, oracle["prompt_tokens"])),
           "--prefill-chunk", str(oracle["prefill_chunk"]),
           "--force-decode", ",".join(map(str, oracle["decode_tokens"])),
           "--backend", backend, "--out", str(out)] + list(extra)
    if out.exists():
        out.unlink()
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RunError(f"timed out after {timeout:.0f}s: {' '.join(cmd)}")
    dt = time.time() - t0
    if p.returncode != 0:
        msg = (p.stderr or p.stdout or "").strip()
        raise RunError(f"exit {p.returncode}: {msg.splitlines()[-1] if msg else ''}")
    a = np.load(out)
    if a.dtype != np.float32 or tuple(a.shape) != tuple(shape):
        raise RunError(f"output {a.dtype} {a.shape}, expected float32 {tuple(shape)}")
    if not np.all(np.isfinite(a)):
        raise RunError("non-finite logits")
    return a, dt


def probe_device(ringctl, fdir: Path, backend: str, tmp: Path):
    """None when the GPU backend runs; otherwise the reason to skip."""
    oracle = json.loads((fdir / "oracle.json").read_text())
    cmd = [ringctl, "logits", "--model", str(fdir / "model"),
           "--tokens", str(oracle["prompt_tokens"][0]), "--backend", backend,
           "--out", str(tmp / "probe.npy")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if p.returncode == 0:
        return None
    msg = (p.stderr or p.stdout or "").strip()
    if any(m in msg for m in NO_DEVICE_MARKERS):
        return msg.splitlines()[-1]
    raise RunError(f"probe failed: {msg}")


def check(fdir: Path, args, tmp: Path):
    oracle = json.loads((fdir / "oracle.json").read_text())
    ref = np.load(fdir / "logits.npy")
    T, N = len(oracle["prompt_tokens"]), len(oracle["decode_tokens"])
    res = {"name": fdir.name, "family": oracle.get("family", "?"), "rows": ref.shape[0],
           "msgs": [], "ok": False, "cpu_s": 0.0, "gpu_s": 0.0}
    try:
        cpu, dc = run(args.ringctl, fdir, oracle, tmp / "cpu.npy", "cpu", [], args.timeout, ref.shape)
        gpu, dg = run(args.ringctl, fdir, oracle, tmp / "gpu.npy", args.backend, [], args.timeout, ref.shape)
        cpu32, _ = run(args.ringctl, fdir, oracle, tmp / "cpu32.npy", "cpu", ["--act", "f32"],
                       args.timeout, ref.shape)
        gpu32, _ = run(args.ringctl, fdir, oracle, tmp / "gpu32.npy", args.backend, ["--act", "f32"],
                       args.timeout, ref.shape)
        jit, _ = run(args.ringctl, fdir, oracle, tmp / "jitter.npy", "cpu", ["--jitter", "1e-6"],
                     args.timeout, ref.shape)
    except RunError as e:
        res["msgs"].append(str(e))
        return res
    res["cpu_s"], res["gpu_s"] = dc, dg
    nm = row_nmse(gpu, cpu)
    res["max"], res["mean"] = float(nm.max()), float(nm.mean())
    res["argmax_prompt"] = int(np.argmax(nm))
    res["oracle"] = float(row_nmse(gpu, ref).max())
    res["cpu_oracle"] = float(row_nmse(cpu, ref).max())
    res["f32"] = float(row_nmse(gpu32, cpu32).max())
    res["floor"] = float(row_nmse(jit, cpu).max())
    want = [int(np.argmax(cpu[T - 1 + i])) for i in range(N + 1)]
    got = [int(np.argmax(gpu[T - 1 + i])) for i in range(N + 1)]
    res["greedy"] = f"{sum(int(a == b) for a, b in zip(got, want))}/{N + 1}"
    bad = np.nonzero(nm > args.threshold)[0]
    if len(bad):
        where = ", ".join(f"{'prompt' if r < T else 'decode'} row {r if r < T else r - T} ({nm[r]:.2e})"
                          for r in bad[:5])
        res["msgs"].append(f"{len(bad)} row(s) over NMSE {args.threshold:g}: {where}")
    stages = []
    if not args.no_stages:
        for s in (2, 3):
            try:
                a, _ = run(args.ringctl, fdir, oracle, tmp / f"gpu_s{s}.npy", args.backend,
                           ["--stages", str(s)], args.timeout, ref.shape)
            except RunError as e:
                res["msgs"].append(f"--stages {s}: {e}")
                stages.append(f"{s}:FAIL")
                continue
            if a.tobytes() == gpu.tobytes():
                stages.append(f"{s}:ok")
            else:
                res["msgs"].append(f"--stages {s} differs from 1 stage (max |diff| "
                                   f"{float(np.max(np.abs(a - gpu))):.3e})")
                stages.append(f"{s}:DIFF")
    res["stages"] = " ".join(stages) if stages else "-"
    res["ok"] = not res["msgs"]
    return res


def fmt(x):
    return "-" if x is None else f"{x:.2e}"


def render(results, args):
    hdr = ["fixture", "family", "rows", "max NMSE gpu vs cpu", "mean NMSE", "greedy agree",
           "GPU stages 2/3 bit-identical", "result", "max NMSE gpu vs mlx-lm (info)",
           "max NMSE cpu vs mlx-lm (info)", "max NMSE gpu vs cpu, --act f32 (info)",
           "noise floor: max NMSE cpu vs cpu --jitter 1e-6 (info)"]
    lines = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for r in results:
        lines.append("| " + " | ".join([
            r["name"], r["family"], str(r["rows"]), fmt(r.get("max")), fmt(r.get("mean")),
            r.get("greedy", "-"), r.get("stages", "-"), "PASS" if r["ok"] else "FAIL",
            fmt(r.get("oracle")), fmt(r.get("cpu_oracle")), fmt(r.get("f32")),
            fmt(r.get("floor"))]) + " |")
    notes = [f"- `{r['name']}`: {m}" for r in results for m in r["msgs"]]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ringctl", required=True)
    ap.add_argument("--fixtures", required=True, type=Path)
    ap.add_argument("--backend", default="cuda:0")
    ap.add_argument("--threshold", type=float, default=1e-3)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--report", type=Path)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--no-stages", action="store_true")
    args = ap.parse_args()
    fixtures = sorted(p.parent for p in args.fixtures.glob("*/oracle.json"))
    if args.only:
        fixtures = [f for f in fixtures if f.name in set(args.only)]
    if not fixtures:
        print(f"no fixtures under {args.fixtures}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        try:
            why = probe_device(args.ringctl, fixtures[0], args.backend, tmp)
        except RunError as e:
            print(e, file=sys.stderr)
            return 1
        if why is not None:
            print(f"SKIP: {why}")
            return SKIP
        results = []
        for f in fixtures:
            sub = tmp / f.name
            sub.mkdir()
            r = check(f, args, sub)
            results.append(r)
            print(f"{'PASS' if r['ok'] else 'FAIL'} {f.name}: max NMSE {fmt(r.get('max'))}, "
                  f"f32 {fmt(r.get('f32'))}, floor {fmt(r.get('floor'))}, stages {r.get('stages', '-')} "
                  f"(cpu {r['cpu_s']:.2f}s, gpu {r['gpu_s']:.2f}s)", flush=True)
            for m in r["msgs"]:
                print(f"    {m}", flush=True)
    table = render(results, args)
    print(table)
    if args.report:
        args.report.write_text(table)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
