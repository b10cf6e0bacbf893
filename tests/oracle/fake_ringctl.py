#!/usr/bin/env python3
"""Stand-in for the C++ `ringctl logits` CLI, computed with mlx-lm. Used to test the
parity harness (it must give NMSE 0 against the oracle) and as a sanity check later.

    fake_ringctl.py logits --model DIR --tokens 1,2,3 --prefill-chunk C
                           [--force-decode d1,d2,...] [--stages N] --out FILE.npy

Writes float32 .npy [T + N, vocab]: logits at every prompt position, then one row per
forced decode token. --stages is accepted and ignored (single process: the output is
identical for any N, which is what the engine must also guarantee).

FAKE_RINGCTL_NUMERICS=gpu|cpu|fp32|jitter selects the numerics (default gpu = the
oracle's; see oracle_common.NUMERICS): `fp32` behaves like an accurate engine that is
not bit-identical, `cpu` is stock mlx CPU. All of them should pass.

Fault injection, for testing check_parity.py itself (environment variables):
  FAKE_RINGCTL_FAIL=1          exit 3 with an error message, write nothing
  FAKE_RINGCTL_NOISE=eps       add N(0, eps * rms(row)) noise to every row (seeded)
  FAKE_RINGCTL_STAGE_NOISE=1   perturb one element by 1 ulp when --stages > 1
  FAKE_RINGCTL_BAD_SHAPE=1     drop the last row
  FAKE_RINGCTL_ONLY=name,...   apply the faults only when --model's fixture dir
                               (parent of the model dir) has one of these names
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _ints(s: str):
    s = s.strip()
    return [int(t) for t in s.split(",") if t.strip()] if s else []


def main(argv=None):
    ap = argparse.ArgumentParser(prog="fake_ringctl")
    sub = ap.add_subparsers(dest="cmd", required=True)
    lg = sub.add_parser("logits")
    lg.add_argument("--model", required=True, type=Path)
    lg.add_argument("--tokens", required=True)
    lg.add_argument("--prefill-chunk", type=int, default=2048)
    lg.add_argument("--force-decode", default="")
    lg.add_argument("--stages", type=int, default=1)
    lg.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)

    only = os.environ.get("FAKE_RINGCTL_ONLY")
    faults = only is None or args.model.resolve().parent.name in only.split(",")
    if faults and os.environ.get("FAKE_RINGCTL_FAIL"):
        print("fake_ringctl: injected failure (FAKE_RINGCTL_FAIL)", file=sys.stderr)
        return 3

    import mlx.core as mx

    import oracle_common as oc

    mx.set_default_device(mx.cpu)
    try:
        model, _, _ = oc.load_checkpoint(args.model)
    except Exception as e:  # noqa: BLE001 - CLI: report, don't trace
        print(f"fake_ringctl: cannot load {args.model}: {e}", file=sys.stderr)
        return 2
    prompt = _ints(args.tokens)
    if not prompt:
        print("fake_ringctl: --tokens is empty", file=sys.stderr)
        return 2
    mode = os.environ.get("FAKE_RINGCTL_NUMERICS", "gpu")
    if mode not in oc.NUMERICS:
        print(f"fake_ringctl: FAKE_RINGCTL_NUMERICS must be one of {oc.NUMERICS}", file=sys.stderr)
        return 2
    mx.random.seed(0)  # jitter mode: deterministic, so --stages N stays bit-identical
    logits, _ = oc.run_schedule(
        model, prompt, args.prefill_chunk, forced_decode=_ints(args.force_decode), mode=mode
    )
    if faults:
        if eps := float(os.environ.get("FAKE_RINGCTL_NOISE", "0") or 0):
            rng = np.random.default_rng(0)
            rms = np.sqrt(np.mean(logits.astype(np.float64) ** 2, axis=-1, keepdims=True))
            logits = (logits + rng.standard_normal(logits.shape) * eps * rms).astype(np.float32)
        if os.environ.get("FAKE_RINGCTL_STAGE_NOISE") and args.stages > 1:
            logits[0, 0] = np.nextafter(logits[0, 0], np.float32(np.inf))
        if os.environ.get("FAKE_RINGCTL_BAD_SHAPE"):
            logits = logits[:-1]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.save(args.out, logits.astype(np.float32))
    return 0


if __name__ == "__main__":
    sys.exit(main())
