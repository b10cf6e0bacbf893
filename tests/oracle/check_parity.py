#!/usr/bin/env python3
"""Compare the engine's logits with the mlx-lm oracle fixtures.

    check_parity.py --ringctl PATH --fixtures DIR [--report FILE.md] [--stages-check]
                    [--only NAME ...] [--threshold 1e-3] [--timeout S]

For every fixture under DIR (a folder holding oracle.json, logits.npy, model/) runs

    PATH logits --model FIXTURE/model --tokens t1,t2,... --prefill-chunk C
                --force-decode d1,d2,... --out tmp.npy

and computes per-row NMSE = sum((ours - ref)^2) / sum(ref^2). A fixture fails if any
row's NMSE exceeds the threshold, if ringctl exits non-zero / times out / writes a
wrong shape or non-finite values, or (with --stages-check) if the --stages 2 or
--stages 3 output is not bit-identical to the 1-stage output.
Exit status: 0 if every fixture passed, 1 otherwise. A PATH ending in .py is run with
this interpreter (for fake_ringctl.py).
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

STAGES_TO_CHECK = (2, 3)


def find_fixtures(root: Path, only):
    fx = sorted(p.parent for p in root.glob("*/oracle.json"))
    if only:
        fx = [p for p in fx if p.name in set(only)]
    return fx


def ringctl_cmd(ringctl: str, model_dir: Path, oracle: dict, out: Path, stages: int | None):
    cmd = [sys.executable, ringctl] if ringctl.endswith(".py") else [ringctl]
    cmd += [
        "logits",
        "--model", str(model_dir),
        "--tokens", ",".join(map(str, oracle["prompt_tokens"])),
        "--prefill-chunk", str(oracle["prefill_chunk"]),
        "--force-decode", ",".join(map(str, oracle["decode_tokens"])),
        "--out", str(out),
    ]
    if stages is not None:
        cmd += ["--stages", str(stages)]
    return cmd


class RunError(Exception):
    pass


def run_ringctl(cmd, out: Path, timeout: float, expect_shape):
    if out.exists():
        out.unlink()
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RunError(f"timed out after {timeout:.0f}s")
    except OSError as e:
        raise RunError(f"cannot execute {cmd[0]}: {e}")
    dt = time.time() - t0
    if p.returncode != 0:
        tail = (p.stderr or p.stdout or "").strip().splitlines()[-5:]
        raise RunError(f"exit status {p.returncode}: " + " | ".join(tail))
    if not out.exists():
        raise RunError("exit status 0 but no output file written")
    try:
        a = np.load(out, allow_pickle=False)
    except Exception as e:  # noqa: BLE001
        raise RunError(f"unreadable .npy output: {e}")
    if a.dtype != np.float32:
        raise RunError(f"output dtype {a.dtype}, expected float32")
    if tuple(a.shape) != tuple(expect_shape):
        raise RunError(f"output shape {tuple(a.shape)}, expected {tuple(expect_shape)}")
    if not np.all(np.isfinite(a)):
        bad = np.argwhere(~np.isfinite(a))
        raise RunError(f"{len(bad)} non-finite values (first at row {bad[0][0]})")
    return a, dt


def row_nmse(ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
    o = ours.astype(np.float64)
    r = ref.astype(np.float64)
    num = np.sum((o - r) ** 2, axis=-1)
    den = np.sum(r**2, axis=-1)
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), num)


def quant_label(oracle: dict) -> str:
    modes = oracle.get("quant", {}).get("modes") or ["?"]
    return ", ".join(modes)


def check_fixture(fdir: Path, args, tmpdir: Path):
    oracle = json.loads((fdir / "oracle.json").read_text())
    ref = np.load(fdir / "logits.npy")
    T = len(oracle["prompt_tokens"])
    N = len(oracle["decode_tokens"])
    res = {
        "name": fdir.name,
        "family": oracle.get("family", "?"),
        "quant": quant_label(oracle),
        "rows": ref.shape[0],
        "max_nmse": None,
        "mean_nmse": None,
        "raw_nmse": None,
        "greedy": "-",
        "stages": "-",
        "ok": False,
        "msgs": [],
        "time": 0.0,
    }
    out = tmpdir / f"{fdir.name}.s1.npy"
    try:
        ours, dt = run_ringctl(
            ringctl_cmd(args.ringctl, fdir / "model", oracle, out, None), out, args.timeout, ref.shape
        )
    except RunError as e:
        res["msgs"].append(f"ringctl failed: {e}")
        return res
    res["time"] += dt
    nm = row_nmse(ours, ref)
    res["max_nmse"] = float(nm.max())
    res["mean_nmse"] = float(nm.mean())
    raw_path = fdir / "logits_mlx_cpu_raw.npy"  # stock mlx CPU numerics: information only
    if raw_path.exists():
        res["raw_nmse"] = float(row_nmse(ours, np.load(raw_path)).max())
    bad = np.nonzero(nm > args.threshold)[0]
    if len(bad):
        where = ", ".join(
            f"{'prompt' if r < T else 'decode'} row {r if r < T else r - T} ({nm[r]:.2e})"
            for r in bad[:5]
        )
        res["msgs"].append(
            f"{len(bad)} row(s) over NMSE {args.threshold:g}: {where}{' ...' if len(bad) > 5 else ''}"
        )
    # Greedy: argmax of rows T-1 .. T+N-1; the oracle's are decode_tokens + final argmax.
    want = list(oracle["decode_tokens"]) + [int(np.argmax(ref[T + N - 1]))]
    got = [int(np.argmax(ours[T - 1 + i])) for i in range(N + 1)]
    agree = sum(int(a == b) for a, b in zip(got, want))
    res["greedy"] = f"{agree}/{N + 1}"
    if agree != N + 1:
        res["msgs"].append(f"greedy tokens differ (info only): ours {got} vs oracle {want}")
    if args.stages_check:
        stage_notes = []
        for s in STAGES_TO_CHECK:
            out_s = tmpdir / f"{fdir.name}.s{s}.npy"
            try:
                a, dt = run_ringctl(
                    ringctl_cmd(args.ringctl, fdir / "model", oracle, out_s, s),
                    out_s, args.timeout, ref.shape,
                )
            except RunError as e:
                res["msgs"].append(f"--stages {s}: ringctl failed: {e}")
                stage_notes.append(f"{s}:FAIL")
                continue
            res["time"] += dt
            if a.tobytes() == ours.tobytes():
                stage_notes.append(f"{s}:ok")
            else:
                diff = a != ours
                rows = np.unique(np.nonzero(diff)[0])
                res["msgs"].append(
                    f"--stages {s} not bit-identical to 1 stage: {int(diff.sum())} values in "
                    f"{len(rows)} row(s) differ, max |diff| {float(np.max(np.abs(a - ours))):.3e}"
                )
                stage_notes.append(f"{s}:DIFF")
        res["stages"] = " ".join(stage_notes)
    res["ok"] = not any(
        m for m in res["msgs"] if not m.startswith("greedy tokens differ (info only)")
    )
    return res


def fmt(x):
    return "-" if x is None else f"{x:.2e}"


def render(results, args):
    hdr = ["fixture", "family", "quant mode(s)", "rows", "max NMSE", "mean NMSE", "greedy agree"]
    if args.stages_check:
        hdr.append("stages 2/3 bit-identical")
    hdr += ["result", "max NMSE vs stock mlx CPU (info)"]
    lines = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for r in results:
        row = [
            r["name"], r["family"], r["quant"], str(r["rows"]),
            fmt(r["max_nmse"]), fmt(r["mean_nmse"]), r["greedy"],
        ]
        if args.stages_check:
            row.append(r["stages"])
        row += ["PASS" if r["ok"] else "**FAIL**", fmt(r["raw_nmse"])]
        lines.append("| " + " | ".join(row) + " |")
    notes = [f"- `{r['name']}`: {m}" for r in results for m in r["msgs"]]
    if notes:
        lines += ["", "Notes:"] + notes
    n_pass = sum(r["ok"] for r in results)
    lines += ["", f"Threshold: per-row NMSE <= {args.threshold:g}. ringctl: `{args.ringctl}`."]
    lines += ["", f"{n_pass} passed, {len(results) - n_pass} failed"]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ringctl", required=True, help="engine CLI (or fake_ringctl.py)")
    ap.add_argument("--fixtures", required=True, type=Path, help="output dir of make_fixtures.py")
    ap.add_argument("--report", type=Path, help="also write the markdown table here")
    ap.add_argument("--stages-check", action="store_true",
                    help="also run --stages 2 and 3 and require bit-identical output")
    ap.add_argument("--only", nargs="+", metavar="NAME")
    ap.add_argument("--threshold", type=float, default=1e-3)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per ringctl run")
    ap.add_argument("--keep", type=Path, help="keep ringctl outputs in this directory")
    args = ap.parse_args(argv)

    fixtures = find_fixtures(args.fixtures, args.only)
    if not fixtures:
        print(f"no fixtures (*/oracle.json) found under {args.fixtures}", file=sys.stderr)
        print("0 passed, 0 failed")
        return 1
    if not args.ringctl.endswith(".py") and not Path(args.ringctl).exists():
        print(f"ringctl not found: {args.ringctl}", file=sys.stderr)
    results = []
    with tempfile.TemporaryDirectory(prefix="parity_") as td:
        tmpdir = args.keep or Path(td)
        tmpdir.mkdir(parents=True, exist_ok=True)
        for fdir in fixtures:
            try:
                r = check_fixture(fdir, args, tmpdir)
            except Exception as e:  # noqa: BLE001 - a broken fixture must not hide the others
                r = {"name": fdir.name, "family": "?", "quant": "?", "rows": "?",
                     "max_nmse": None, "mean_nmse": None, "greedy": "-", "stages": "-",
                     "ok": False, "msgs": [f"harness error: {type(e).__name__}: {e}"], "time": 0.0}
            status = "PASS" if r["ok"] else "FAIL"
            print(f"[{status}] {r['name']} ({r['time']:.1f}s)", flush=True)
            for m in r["msgs"]:
                print(f"    {m}", flush=True)
            results.append(r)
    table = render(results, args)
    print()
    print(table, end="")
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text("# mlx-lm parity\n\n" + table)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
