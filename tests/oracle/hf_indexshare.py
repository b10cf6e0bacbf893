"""Second oracle for GLM-5.x (glm_moe_dsa) incl. GLM-5.2 IndexShare: HF transformers.

mlx-lm 0.32.2 has no IndexShare, so the mlx fixture for it runs a patched mlx-lm. This
script checks the same fixture against an independent implementation: transformers'
GlmMoeDsaForCausalLM (which implements `indexer_types` natively), in float32, with the
fixture's MLX weights dequantized exactly and mapped to the HF layout:
  embed_q [H, kv_lora, nope] + unembed_out [H, v, kv_lora]  -> kv_b_proj [H*(nope+v), kv_lora]
  mlp.switch_mlp.{gate,up,down}_proj [E, ...]              -> mlp.experts.{gate_up_proj, down_proj}
The whole sequence (prompt + forced decode tokens) goes through one causal forward; row r
of its logits is the prediction after token r, the same rows `ringctl logits` writes.

Needs torch + transformers (the GPU machine has both; CPU is enough). Usage:
  python3 hf_indexshare.py --fixture FIXTURE_DIR --ours OURS.npy [--threshold 1e-6]
  python3 hf_indexshare.py --fixture FIXTURE_DIR --ringctl build/server/ringctl
where OURS.npy is `ringctl logits --act f32 ...` on FIXTURE_DIR/model with the fixture's
schedule (the second form runs it). Exit 1 if any row's NMSE exceeds the threshold, 77
(CTest's skip code) when torch is not installed.
"""
import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np

FP4_LUT = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def read_safetensors(path):
    raw = Path(path).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n].rstrip(b"\0 ").decode())
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, t = e["data_offsets"]
        buf = raw[base + b:base + t]
        dt = e["dtype"]
        if dt == "BF16":
            a = (np.frombuffer(buf, np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif dt == "F32":
            a = np.frombuffer(buf, np.float32)
        elif dt == "F16":
            a = np.frombuffer(buf, np.float16).astype(np.float32)
        elif dt == "U32":
            a = np.frombuffer(buf, np.uint32)
        elif dt == "U8":
            a = np.frombuffer(buf, np.uint8)
        else:
            raise SystemExit(f"{path}: dtype {dt} of {name} not handled")
        out[name] = a.reshape(e["shape"])
    return out


def dequantize(w, scales, biases, mode, bits, group):
    """Exact MLX dequantization to float32 (mxfp4 and affine with power-of-two bits)."""
    if mode == "mxfp4":
        b = w.view(np.uint8)
        nib = np.stack([b & 0xF, b >> 4], axis=-1).reshape(*w.shape[:-1], -1)
        vals = FP4_LUT[nib]
        s = np.ldexp(np.float32(1), scales.astype(np.int32) - 127).astype(np.float32)
        return (vals.reshape(*vals.shape[:-1], -1, 32) * s[..., None]).reshape(vals.shape)
    if mode == "affine" and bits in (2, 4, 8):
        per = 32 // bits
        q = (w[..., None] >> (np.arange(per, dtype=np.uint32) * bits)) & ((1 << bits) - 1)
        q = q.reshape(*w.shape[:-1], -1).astype(np.float32)
        q = q.reshape(*q.shape[:-1], -1, group)
        return (q * scales[..., None] + biases[..., None]).reshape(*w.shape[:-1], -1)
    raise SystemExit(f"quant mode {mode}/{bits} not handled by this script")


def load_mlx(model_dir):
    cfg = json.loads((model_dir / "config.json").read_text())
    tensors = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        tensors.update(read_safetensors(f))
    q = cfg.get("quantization") or {}
    out = {}
    for name in list(tensors):
        if not name.endswith(".weight"):
            continue
        mod = name[: -len(".weight")]
        if mod + ".scales" in tensors:
            spec = q.get(mod) if isinstance(q.get(mod), dict) else q
            mode = spec.get("mode", "affine")
            bits = spec.get("bits", 4)
            group = spec.get("group_size") or (32 if mode == "mxfp4" else 64)
            out[name] = dequantize(tensors[name], tensors[mod + ".scales"],
                                   tensors.get(mod + ".biases"), mode, bits, group)
    for name, a in tensors.items():
        if name.endswith((".scales", ".biases")) and name.rsplit(".", 1)[0] + ".weight" in out:
            continue
        out.setdefault(name, a.astype(np.float32) if a.dtype != np.float32 else a)
    return cfg, out


def to_hf(cfg, w):
    H, nope, v = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    hf = {}
    for name, a in w.items():
        if name.endswith("self_attn.embed_q.weight"):
            p = name[: -len("embed_q.weight")]
            uk = np.swapaxes(a, 1, 2)  # [H, nope, kv_lora]
            uv = w[p + "unembed_out.weight"]  # [H, v, kv_lora]
            hf[p + "kv_b_proj.weight"] = np.concatenate([uk, uv], axis=1).reshape(H * (nope + v), -1)
        elif name.endswith("self_attn.unembed_out.weight"):
            continue
        elif ".mlp.switch_mlp." in name:
            p = name.split(".mlp.switch_mlp.")[0] + ".mlp.experts."
            if name.endswith("gate_proj.weight"):
                up = w[name.replace("gate_proj", "up_proj")]
                hf[p + "gate_up_proj"] = np.concatenate([a, up], axis=1)
            elif name.endswith("down_proj.weight"):
                hf[p + "down_proj"] = a
        else:
            hf[name] = a
    return hf


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixture", required=True, type=Path)
    ap.add_argument("--ours", type=Path)
    ap.add_argument("--ringctl")
    ap.add_argument("--threshold", type=float, default=1e-6)
    args = ap.parse_args()
    try:
        import torch
        import transformers
        from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM
    except ImportError as e:
        print(f"SKIP: {e} (the HF oracle needs torch + transformers)")
        return 77

    oracle = json.loads((args.fixture / "oracle.json").read_text())
    if args.ours is None:
        if not args.ringctl:
            raise SystemExit("give --ours or --ringctl")
        import subprocess
        import tempfile
        args.ours = Path(tempfile.mkdtemp()) / "ours_f32.npy"
        subprocess.run([args.ringctl, "logits", "--model", str(args.fixture / "model"), "--act", "f32",
                        "--tokens", ",".join(map(str, oracle["prompt_tokens"])),
                        "--prefill-chunk", str(oracle["prefill_chunk"]),
                        "--force-decode", ",".join(map(str, oracle["decode_tokens"])),
                        "--out", str(args.ours)], check=True, timeout=300)
    cfg, w = load_mlx(args.fixture / "model")
    hf_cfg = {k: v for k, v in cfg.items() if k not in ("quantization", "quantization_config")}
    hf_cfg["torch_dtype"] = "float32"
    config = GlmMoeDsaConfig(**hf_cfg)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = GlmMoeDsaForCausalLM(config).float().eval()
    state = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in to_hf(cfg, w).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if "rotary" not in m]
    if missing or unexpected:
        raise SystemExit(f"weight mapping: missing {missing[:8]} unexpected {unexpected[:8]}")
    toks = list(oracle["prompt_tokens"]) + list(oracle["decode_tokens"])
    with torch.no_grad():
        logits = model(torch.tensor([toks])).logits[0].float().numpy()
    ours = np.load(args.ours)
    if ours.shape != logits.shape:
        raise SystemExit(f"shape: ours {ours.shape} vs hf {logits.shape}")
    nmse = ((ours - logits) ** 2).sum(-1) / (logits ** 2).sum(-1)
    print(f"fixture {args.fixture.name}: indexer_types {config.indexer_types}, "
          f"transformers {transformers.__version__}, torch {torch.__version__}")
    print(f"rows {len(nmse)}  max NMSE {nmse.max():.3e}  mean {nmse.mean():.3e}  "
          f"argmax agree {(ours.argmax(-1) == logits.argmax(-1)).sum()}/{len(nmse)}")
    bad = np.nonzero(nmse > args.threshold)[0]
    print("1 passed, 0 failed" if not len(bad) else f"0 passed, 1 failed (rows {bad.tolist()})")
    return 1 if len(bad) else 0


if __name__ == "__main__":
    sys.exit(main())
