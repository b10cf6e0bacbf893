#!/usr/bin/env python3
"""Structural parity of `ringctl synth` with mlx-lm itself.

For each case, the same tiny architecture is built twice:
  ours:      ringctl synth --preset tiny --arch A --quant ...
  reference: mlx-lm's own Model class built from our config.json (minus the
             quantization block), cast to bf16 as mlx_lm.convert does (cast_predicate keeps
             e_score_correction_bias fp32), quantized with mlx_lm.utils.quantize_model
             (the model's quant_predicate included: Qwen3-MoE routers 8-bit), written with
             save_model/save_config.
and the test asserts:
  - exactly the same tensor names, dtypes and shapes;
  - the same "quantization" / "quantization_config" blocks (keys and values);
  - our safetensors carry the {"format": "mlx"} metadata;
  - mlx-lm loads our directory strictly (every parameter present, nothing extra) and the
    forward pass gives finite, non-constant logits; generation through mlx_lm runs;
  - a few tensors are bit-identical to mx.quantize applied to the same random values
    (the generator is re-implemented here), so packing/row order are MLX's.

GLM-5.2 IndexShare: mlx-lm 0.32 has no IndexShare, so the reference model drops the
indexer of "shared" layers (as PR #1410 does); those layers attend densely here, which is
enough for a structural test.

Usage: synth_vs_mlx.py --ringctl build/server/ringctl --work /tmp/dir
"""
import argparse
import json
import math
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_map_with_path
from mlx_lm.utils import (_get_classes, load_model, load_tokenizer, quantize_model,
                          save_config, save_model)

SEED = 5

# (arch, ringctl quant args, quantize_model args or None for bf16)
CASES = [
    ("glm_moe_dsa", ["--quant", "mxfp4"], ("mxfp4", None, None)),
    ("qwen3_moe", ["--quant", "affine", "--bits", "4", "--group-size", "64"], ("affine", 64, 4)),
    ("deepseek_v32", ["--quant", "nvfp4"], ("nvfp4", None, None)),
    ("deepseek_v3", ["--quant", "mxfp8"], ("mxfp8", None, None)),
    ("qwen3", ["--quant", "affine", "--bits", "3", "--group-size", "32"], ("affine", 32, 3)),
    ("glm_moe_dsa", ["--quant", "bf16"], None),
]


class NoIndexer(nn.Module):
    """The indexer slot of an IndexShare "shared" layer: no weights, dense attention.

    mlx-lm's attention still ties its KV cache to the indexer cache, so that one gets
    empty (zero-width) keys appended.
    """

    def __call__(self, x, qr, mask, cache=None):
        if cache is not None:
            empty = mx.zeros((x.shape[0], 1, x.shape[1], 0), dtype=x.dtype)
            cache.update_and_fetch(empty, empty)
        return None


def get_classes(config):
    model_class, args_class = _get_classes(config)
    types = config.get("indexer_types")
    if not types:
        return model_class, args_class

    class IndexShareModel(model_class):
        def __init__(self, args):
            super().__init__(args)
            for i, t in enumerate(types):
                if t == "shared":
                    self.model.layers[i].self_attn.indexer = NoIndexer()

    return IndexShareModel, args_class


def load_json(p):
    with open(p) as f:
        return json.load(f)


def read_headers(d):
    """{name: (dtype, shape)} and the set of metadata dicts, from the files' headers."""
    tensors, metas = {}, []
    files = sorted(Path(d).glob("*.safetensors"))
    assert files, f"no safetensors in {d}"
    for f in files:
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
        metas.append(header.pop("__metadata__", None))
        for k, v in header.items():
            assert k not in tensors, f"{k} in two shards"
            tensors[k] = (v["dtype"], tuple(v["shape"]))
    return tensors, metas


def build_reference(ours, out, quant):
    cfg = load_json(Path(ours) / "config.json")
    base = {k: v for k, v in cfg.items() if k not in ("quantization", "quantization_config")}
    model_class, args_class = get_classes(base)
    model = model_class(args_class.from_dict(base))
    cast = getattr(model, "cast_predicate", lambda _: True)

    def set_dtype(k, v):
        if cast(k) and mx.issubdtype(v.dtype, mx.floating):
            return v.astype(mx.bfloat16)
        return v

    model.update(tree_map_with_path(set_dtype, model.parameters()))
    qcfg = base
    if quant is not None:
        mode, group_size, bits = quant
        model, qcfg = quantize_model(model, base, group_size, bits, mode=mode)
    save_model(out, model)
    save_config(qcfg, Path(out) / "config.json")


# --- the generator of models/synth.cc, re-implemented -------------------------------------

GOLDEN = 0x9E3779B97F4A7C15
MASK = (1 << 64) - 1


def mix64_int(z):
    z &= MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def mix64(z):
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def tensor_key(seed, name):
    h = 0xCBF29CE484222325
    for c in name.encode():
        h = ((h ^ c) * 0x100000001B3) & MASK
    return mix64_int(seed ^ h)


def synth_values(name, shape, mean, std, dtype):
    key = np.uint64(tensor_key(SEED, name))
    n = int(np.prod(shape))
    idx = np.arange(n, dtype=np.uint64)
    pair = idx >> np.uint64(1)
    with np.errstate(over="ignore"):
        a = mix64(key + (np.uint64(2) * pair + np.uint64(1)) * np.uint64(GOLDEN))
        b = mix64(key + (np.uint64(2) * pair + np.uint64(2)) * np.uint64(GOLDEN))
    u1 = ((a >> np.uint64(11)) + np.uint64(1)).astype(np.float64) * 2.0**-53
    u2 = (b >> np.uint64(11)).astype(np.float64) * 2.0**-53
    r = np.sqrt(-2.0 * np.log(u1))
    theta = 6.283185307179586 * u2
    z = np.where((idx & np.uint64(1)) == 0, r * np.cos(theta), r * np.sin(theta))
    v = np.float32(mean) + (np.float64(np.float32(std)) * z).astype(np.float32)
    return mx.array(v.reshape(shape)).astype(dtype)


def bits_of(x):
    if x.dtype == mx.bfloat16:
        x = x.view(mx.uint16)
    return np.array(x)


def check_values(ours, cfg, arch):
    """Regenerates a few parameters and compares with our bytes."""
    weights = {}
    for f in Path(ours).glob("*.safetensors"):
        weights.update(mx.load(str(f)))
    q = cfg.get("quantization")
    h = cfg["hidden_size"]
    names = [("model.embed_tokens.weight", 0.0, 1 / math.sqrt(h)), ("model.norm.weight", 1.0, 0.02),
             ("model.layers.1.post_attention_layernorm.weight", 1.0, 0.02)]
    if arch.startswith("qwen3"):
        names.append(("model.layers.1.self_attn.q_proj.weight", 0.0, 1 / math.sqrt(h)))
    else:
        names.append(("model.layers.1.self_attn.kv_a_proj_with_mqa.weight", 0.0, 1 / math.sqrt(h)))
        names.append(("model.layers.1.mlp.gate.e_score_correction_bias", 0.0, 0.02))
    if arch in ("qwen3_moe", "glm_moe_dsa", "deepseek_v32", "deepseek_v3"):
        names.append(("model.layers.1.mlp.switch_mlp.down_proj.weight", 0.0,
                      1 / math.sqrt(cfg["moe_intermediate_size"])))
    if arch == "qwen3_moe":
        names.append(("model.layers.1.mlp.gate.weight", 0.0, 1 / math.sqrt(h)))
    checked = 0
    for name, mean, std in names:
        module = name.rsplit(".", 1)[0]
        quantized = f"{module}.scales" in weights and name.endswith(".weight")
        if not quantized:
            stored = weights[name]
            want = synth_values(name, stored.shape, mean, std, stored.dtype)
            assert np.array_equal(bits_of(stored), bits_of(want)), f"{name}: values differ"
        else:
            spec = q.get(module) or q
            mode = spec.get("mode", "affine")
            gs, bits = spec["group_size"], spec["bits"]
            packed = weights[name]
            logical = list(packed.shape)
            logical[-1] = logical[-1] * 32 // bits
            w = synth_values(name, logical, mean, std, mx.bfloat16)
            ref = mx.quantize(w, gs, bits, mode=mode)
            got = [packed, weights[f"{module}.scales"]]
            if mode == "affine":
                got.append(weights[f"{module}.biases"])
            assert len(ref) == len(got), (name, len(ref), len(got))
            for label, r, g in zip(("weight", "scales", "biases"), ref, got):
                rb, gb = bits_of(r), bits_of(g)
                if not np.array_equal(rb, gb):
                    frac = float(np.mean(rb != gb))
                    raise AssertionError(f"{name} {label}: differs from mx.quantize "
                                         f"({mode}/g{gs}/b{bits}) in {frac:.4%} of elements")
            # MLX's own decoder sees well-scaled weights.
            deq = mx.dequantize(*got, group_size=gs, bits=bits, mode=mode).astype(mx.float32)
            rms = float(mx.sqrt(mx.mean(deq * deq)))
            assert 0.6 * std < rms < 1.4 * std, (name, rms, std)
        checked += 1
    return checked


def run_case(ringctl, work, arch, qargs, quant):
    tag = f"{arch}-{qargs[1]}" + ("".join(qargs[2:]).replace("--", "-") if len(qargs) > 2 else "")
    ours, ref = work / f"ours-{tag}", work / f"ref-{tag}"
    subprocess.run([ringctl, "synth", "--arch", arch, "--preset", "tiny", "--seed", str(SEED),
                    "--out", str(ours), "--force", "--quiet"] + qargs, check=True)
    build_reference(ours, ref, quant)

    a, metas = read_headers(ours)
    b, _ = read_headers(ref)
    missing = sorted(set(b) - set(a))
    extra = sorted(set(a) - set(b))
    wrong = sorted(k for k in set(a) & set(b) if a[k] != b[k])
    problems = [f"missing {k} {b[k]}" for k in missing] + [f"extra {k} {a[k]}" for k in extra]
    problems += [f"{k}: ours {a[k]} mlx-lm {b[k]}" for k in wrong]
    assert not problems, f"{tag}:\n  " + "\n  ".join(problems[:40])
    assert all(m == {"format": "mlx"} for m in metas), metas

    ca, cb = load_json(ours / "config.json"), load_json(ref / "config.json")
    for key in ("quantization", "quantization_config"):
        assert ca.get(key) == cb.get(key), f"{tag} {key}: ours {ca.get(key)} mlx-lm {cb.get(key)}"

    # mlx-lm loads our checkpoint strictly and runs it.
    model, _ = load_model(ours, strict=True, get_model_classes=get_classes)
    loaded = dict(tree_flatten(model.parameters()))
    assert set(loaded) == set(a), "mlx-lm parameter names differ from the checkpoint"
    if quant is None:
        model.set_dtype(mx.float32)  # MLX's CPU gather_mm (unquantized experts) is fp32-only
    tokens = mx.array([[(7 * i + 3) % 600 for i in range(24)]])  # > tiny index_topk (16)
    logits = model(tokens).astype(mx.float32)
    mx.eval(logits)
    assert logits.shape == (1, 24, ca["vocab_size"]), logits.shape
    assert bool(mx.all(mx.isfinite(logits))), "non-finite logits"
    spread = float(mx.std(logits[0, -1]))
    assert 0.05 < spread < 100.0, f"logit std {spread}"
    checked = check_values(ours, ca, arch)

    from mlx_lm import generate
    tokenizer = load_tokenizer(ours)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi there"}],
                                           add_generation_prompt=True)
    text = generate(model, tokenizer, prompt=prompt, max_tokens=4, verbose=False)
    assert isinstance(text, str)
    print(f"  {tag}: {len(a)} tensors match mlx-lm; quantization block equal; strict load, "
          f"forward (logit std {spread:.2f}), generate ok; {checked} tensors bit-identical")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ringctl", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    mx.random.seed(0)
    for arch, qargs, quant in CASES:
        run_case(args.ringctl, work, arch, qargs, quant)
    print("synth_vs_mlx: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
