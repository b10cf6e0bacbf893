#!/usr/bin/env python3
"""MLX oracle fixtures for kernels/quant_mlx_test.cc (CPU quantization parity).

Usage: .venv/bin/python tests/oracle/quant_fixtures.py OUT_DIR

Writes OUT_DIR/{matmul,quant,gather}.safetensors and OUT_DIR/manifest.json. Every tensor
is named "<case>.<role>"; the manifest lists the cases with their quantization parameters
so the C++ test needs no knowledge of this script. All of it runs on MLX's CPU device with
fixed seeds, so the files are deterministic for a given mlx version (recorded).

Case kinds
  matmul  every mode x bits x group x source dtype: mx.quantize of a random [37, C]
          matrix, mx.dequantize (default dtype), and mx.quantized_matmul with
          transpose=True (x [5, C]) and transpose=False (x [5, 37]), each with fp32 x,
          bf16 x, and the same bf16 values widened to fp32.
  quant   mx.quantize of matrices with awkward rows (zeros, constants, ties at rounding
          midpoints, tiny and huge magnitudes, wide dynamic range).
  gather  3-D stacked weights [3, 19, C]: mx.dequantize and mx.gather_qmm with
          rhs_indices for transpose True and False.
"""
import json
import os
import sys

import mlx.core as mx
import numpy as np

M_ROWS = 5  # rows of x: exercises the 4-row blocking of the kernels plus a remainder
W_ROWS = 37  # odd
DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}
AFFINE_COLS = {32: 9 * 32, 64: 5 * 64, 128: 3 * 128}  # whole vector chunks plus a tail
FP_MODES = [("mxfp4", 32, 4, 9 * 32), ("mxfp8", 32, 8, 9 * 32), ("nvfp4", 16, 4, 14 * 16)]


def quantize(w, mode, group, bits, gscale):
    if mode == "nvfp4" and gscale:
        out = mx.quantize(w, group, bits, mode=mode, global_scale=mx.array(gscale, mx.float32))
    else:
        out = mx.quantize(w, group, bits, mode=mode)
    return out[0], out[1], (out[2] if mode == "affine" else None)


def dequantize(wq, s, b, mode, group, bits, gscale):
    if mode == "nvfp4" and gscale:
        return mx.dequantize(wq, s, None, group, bits, mode=mode,
                             global_scale=mx.array(gscale, mx.float32))
    return mx.dequantize(wq, s, b, group, bits, mode=mode)


def special_matrix(cols, group, dtype, rng):
    """Rows that stress the encoders' rounding and edge handling."""
    rows = []
    rows.append(np.zeros(cols))                                # all zero
    rows.append(np.full(cols, 0.375))                          # constant > 0
    rows.append(np.full(cols, -1.25))                          # constant < 0
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])  # fp4 ties at scale 1
    rows.append(np.resize(np.concatenate([mids, -mids]), cols))
    ramp = np.arange(cols) % group
    rows.append((ramp - 7.5) / 15.0)                           # affine ties (k+0.5)/15
    rows.append(rng.standard_normal(cols) * 1e-38)             # tiny (bf16/f32 normal edge)
    rows.append(rng.standard_normal(cols) * 1e-6)              # below fp16 normals
    rows.append(rng.standard_normal(cols) * 1e4)               # large
    rows.append(np.exp(rng.uniform(-20, 8, cols)) * rng.choice([-1, 1], cols))  # wide range
    rows.append(rng.integers(-8, 9, cols).astype(np.float64) * 0.5)  # exact grid values
    rows.append(rng.standard_normal(cols))
    m = np.stack(rows).astype(np.float32)
    if dtype == "float16":
        m = np.clip(m, -6e4, 6e4)
    return mx.array(m).astype(DTYPES[dtype])


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    mx.set_default_device(mx.cpu)
    mx.random.seed(20260814)
    rng = np.random.default_rng(7)
    tensors = {"matmul": {}, "quant": {}, "gather": {}}
    cases = []

    def add(kind, name, role, arr):
        mx.eval(arr)
        tensors[kind][f"{name}.{role}"] = arr

    # ---- matmul cases ------------------------------------------------------------
    combos = []
    for bits in [1, 2, 3, 4, 5, 6, 8]:
        for group in [32, 64, 128]:
            for dt in DTYPES:
                combos.append(("affine", group, bits, AFFINE_COLS[group], dt, 0.0))
    for mode, group, bits, cols in FP_MODES:
        for dt in DTYPES:
            combos.append((mode, group, bits, cols, dt, 0.0))
    for dt in DTYPES:
        combos.append(("nvfp4", 16, 4, 14 * 16, dt, 3.7))
    for mode, group, bits, cols, dt, gscale in combos:
        name = f"{mode}_b{bits}_g{group}_{dt}" + ("_gs" if gscale else "")
        w = (mx.random.normal((W_ROWS, cols)) * 0.05 + 0.01).astype(DTYPES[dt])
        wq, s, b = quantize(w, mode, group, bits, gscale)
        deq = dequantize(wq, s, b, mode, group, bits, gscale)
        add("matmul", name, "w_src", w)
        add("matmul", name, "wq", wq)
        add("matmul", name, "scales", s)
        if b is not None:
            add("matmul", name, "biases", b)
        add("matmul", name, "deq", deq)
        case = {"kind": "matmul", "name": name, "mode": mode, "bits": bits, "group_size": group,
                "dtype": dt, "global_scale": gscale, "rows": W_ROWS, "cols": cols,
                "m": M_ROWS, "file": "matmul.safetensors"}
        if not gscale:  # quantized_matmul has no global_scale argument
            for tr, xin in [("t", cols), ("n", W_ROWS)]:
                x32 = mx.random.normal((M_ROWS, xin))
                xb = mx.random.normal((M_ROWS, xin)).astype(mx.bfloat16)
                transpose = tr == "t"
                y32 = mx.quantized_matmul(x32, wq, s, b, transpose, group, bits, mode=mode)
                yb = mx.quantized_matmul(xb, wq, s, b, transpose, group, bits, mode=mode)
                yb32 = mx.quantized_matmul(xb.astype(mx.float32), wq, s, b, transpose, group,
                                           bits, mode=mode)
                add("matmul", name, f"x32_{tr}", x32)
                add("matmul", name, f"y32_{tr}", y32)
                add("matmul", name, f"xb_{tr}", xb)
                add("matmul", name, f"yb_{tr}", yb)
                add("matmul", name, f"yb32_{tr}", yb32)
            case["has_matmul"] = True
        else:
            case["has_matmul"] = False
        cases.append(case)

    # ---- quantize-only cases with awkward inputs -----------------------------------
    qcombos = []
    for bits in [1, 2, 3, 4, 5, 6, 8]:
        for dt in DTYPES:
            qcombos.append(("affine", 64, bits, 128, dt, 0.0))
    for dt in DTYPES:
        qcombos.append(("affine", 32, 4, 128, dt, 0.0))
        qcombos.append(("affine", 128, 3, 128, dt, 0.0))
        qcombos.append(("mxfp4", 32, 4, 128, dt, 0.0))
        qcombos.append(("mxfp8", 32, 8, 128, dt, 0.0))
        qcombos.append(("nvfp4", 16, 4, 128, dt, 0.0))
        qcombos.append(("nvfp4", 16, 4, 128, dt, 0.37))
    for mode, group, bits, cols, dt, gscale in qcombos:
        name = f"q_{mode}_b{bits}_g{group}_{dt}" + ("_gs" if gscale else "")
        w = special_matrix(cols, group, dt, rng)
        wq, s, b = quantize(w, mode, group, bits, gscale)
        deq = dequantize(wq, s, b, mode, group, bits, gscale)
        add("quant", name, "w_src", w)
        add("quant", name, "wq", wq)
        add("quant", name, "scales", s)
        if b is not None:
            add("quant", name, "biases", b)
        add("quant", name, "deq", deq)
        cases.append({"kind": "quant", "name": name, "mode": mode, "bits": bits,
                      "group_size": group, "dtype": dt, "global_scale": gscale,
                      "rows": int(w.shape[0]), "cols": cols, "file": "quant.safetensors"})

    # ---- gather (stacked experts) ----------------------------------------------------
    experts, erows, tokens = 3, 19, 6
    idx = mx.array([2, 0, 1, 2, 1, 0], mx.uint32)
    gcombos = [("affine", 64, 4, 192, "bfloat16"), ("affine", 32, 3, 96, "float16"),
               ("affine", 128, 8, 256, "float32"), ("affine", 32, 2, 160, "bfloat16"),
               ("mxfp4", 32, 4, 160, "bfloat16"), ("mxfp8", 32, 8, 96, "bfloat16"),
               ("nvfp4", 16, 4, 96, "bfloat16")]
    for mode, group, bits, cols, dt in gcombos:
        name = f"g_{mode}_b{bits}_g{group}_{dt}"
        w = (mx.random.normal((experts, erows, cols)) * 0.05).astype(DTYPES[dt])
        wq, s, b = quantize(w, mode, group, bits, 0.0)
        add("gather", name, "wq", wq)
        add("gather", name, "scales", s)
        if b is not None:
            add("gather", name, "biases", b)
        add("gather", name, "deq", dequantize(wq, s, b, mode, group, bits, 0.0))
        add("gather", name, "idx", idx)
        xt = mx.random.normal((tokens, 1, cols))
        xn = mx.random.normal((tokens, 1, erows))
        add("gather", name, "x_t", xt)
        add("gather", name, "x_n", xn)
        add("gather", name, "y_t", mx.gather_qmm(xt, wq, s, b, rhs_indices=idx, transpose=True,
                                                 group_size=group, bits=bits, mode=mode))
        add("gather", name, "y_n", mx.gather_qmm(xn, wq, s, b, rhs_indices=idx, transpose=False,
                                                 group_size=group, bits=bits, mode=mode))
        cases.append({"kind": "gather", "name": name, "mode": mode, "bits": bits,
                      "group_size": group, "dtype": dt, "global_scale": 0.0, "experts": experts,
                      "rows": erows, "cols": cols, "tokens": tokens, "file": "gather.safetensors"})

    for kind, t in tensors.items():
        mx.save_safetensors(os.path.join(out_dir, f"{kind}.safetensors"), t)
    manifest = {"mlx_version": mx.__version__, "device": "cpu", "cases": cases}
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"wrote {len(cases)} cases to {out_dir}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: quant_fixtures.py OUT_DIR")
    main(sys.argv[1])
