"""Shared helpers for the mlx-lm oracle: model loading (incl. the IndexShare patch)
and the exact prefill/decode schedule whose logits the C++ engine must reproduce.

Used by make_fixtures.py (records logits) and fake_ringctl.py (replays them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

import mlx.core as mx
import numpy as np

from mlx_lm.models import deepseek_v32 as _dsv32
from mlx_lm.models import glm_moe_dsa as _glm
from mlx_lm.models.cache import CacheList, KVCache, make_prompt_cache
from mlx_lm.utils import _get_classes, load_model

ORACLE_BASE = "mlx-lm 0.32.2 (mlx 0.32.4, CPU backend)"
ORACLE_INDEXSHARE = (
    "mlx-lm 0.32.2 + IndexShare patch per spec §1.6 / mlx-lm PR #1410 "
    "(tests/oracle/oracle_common.py)"
)


# ---------------------------------------------------------------------------
# IndexShare (GLM-5.2) patch.
#
# mlx-lm 0.32.2 builds a DSA indexer on every layer and has no cross-layer
# top-k sharing (no `indexer_types` / `prev_topk` anywhere in the package).
# This patch reuses mlx-lm's own DeepseekV32Attention.__call__ unchanged and only
# swaps what `self.indexer` is:
#   * "full" layer:   the real mlx-lm Indexer (same weights, same math); its
#                     result (top-k indices or None) is published to a carrier
#                     that lives for one model forward call;
#   * "shared" layer: no indexer module at all (=> no indexer weights in the
#                     checkpoint, no indexer cache); a plain callable returns the
#                     carrier's value, i.e. the most recent full layer's top-k of
#                     the *same* forward call, or None (=> dense causal) when that
#                     layer returned None or no full layer ran yet.
# The carrier is reset at the start of every Model.__call__ (one prefill chunk
# or one decode step). No pipeline split happens in the oracle, so PR1410's
# per-stage reset of prev_topk never triggers here.
# ---------------------------------------------------------------------------


def resolve_indexer_types(cfg: dict, num_layers: int) -> List[str]:
    """Spec §1.6: explicit list > index_topk_pattern ("F"/"S") > freq/offset rule."""
    types = cfg.get("indexer_types")
    if types is not None:
        types = list(types)
        if len(types) != num_layers:
            raise ValueError(f"indexer_types has {len(types)} entries, expected {num_layers}")
        return types
    pattern = cfg.get("index_topk_pattern")
    if pattern is not None:
        return ["full" if c.upper() == "F" else "shared" for c in pattern[:num_layers]]
    freq = cfg.get("index_topk_freq", 1) or 1
    offset = cfg.get("index_skip_topk_offset", 2)
    return [
        "full" if max(i - offset + 1, 0) % freq == 0 else "shared"
        for i in range(num_layers)
    ]


def uses_indexshare(cfg: dict) -> bool:
    if cfg.get("model_type") not in ("glm_moe_dsa", "deepseek_v32"):
        return False
    if not any(k in cfg for k in ("indexer_types", "index_topk_pattern", "index_topk_freq")):
        return False
    return "shared" in resolve_indexer_types(cfg, cfg["num_hidden_layers"])


class _TopKCarrier:
    """Per-forward-call holder of the most recent full layer's top-k (not a Module)."""

    def __init__(self):
        self.topk = None


class _SharedTopK:
    """Stands in for `self.indexer` on a shared layer: a plain callable, no params."""

    def __init__(self, carrier: _TopKCarrier):
        self.carrier = carrier

    def __call__(self, x, qr, mask, cache=None):
        return self.carrier.topk


class _PublishingIndexer(_dsv32.Indexer):
    """mlx-lm's Indexer, unchanged, that also publishes its result to the carrier."""

    def __call__(self, x, qr, mask, cache=None):
        topk = super().__call__(x, qr, mask, cache=cache)
        self._carrier.topk = topk
        return topk


class _NoIndexerCache(KVCache):
    """Slot 1 of a shared layer's CacheList. Never written; holds empty arrays so that
    mlx-lm's `mx.depends(cache[0].keys, (cache[1].keys, cache[1].values))` is a no-op."""

    def __init__(self):
        super().__init__()
        self.keys = mx.zeros((1, 1, 0, 0))
        self.values = mx.zeros((1, 1, 0, 0))


@dataclass
class IndexShareModelArgs(_glm.ModelArgs):
    indexer_types: Optional[List[str]] = None
    index_topk_pattern: Optional[str] = None
    index_topk_freq: int = 1
    index_skip_topk_offset: int = 2

    def __post_init__(self):
        super().__post_init__()
        self.indexer_types = resolve_indexer_types(
            {
                "indexer_types": self.indexer_types,
                "index_topk_pattern": self.index_topk_pattern,
                "index_topk_freq": self.index_topk_freq,
                "index_skip_topk_offset": self.index_skip_topk_offset,
            },
            self.num_hidden_layers,
        )


class IndexShareModel(_glm.Model):
    def __init__(self, config: IndexShareModelArgs):
        super().__init__(config)
        carrier = _TopKCarrier()
        object.__setattr__(self, "_topk_carrier", carrier)
        for i, layer in enumerate(self.model.layers):
            attn = layer.self_attn
            if config.indexer_types[i] == "full":
                idx = _PublishingIndexer(config)
                object.__setattr__(idx, "_carrier", carrier)
                attn.indexer = idx
            else:
                # A non-Module value replaces (and removes) the indexer child module.
                attn.indexer = _SharedTopK(carrier)

    def __call__(self, inputs, cache=None):
        self._topk_carrier.topk = None
        try:
            return super().__call__(inputs, cache)
        finally:
            self._topk_carrier.topk = None

    def make_cache(self):
        out = []
        for i, _ in enumerate(self.layers):
            if self.args.indexer_types[i] == "full":
                out.append(CacheList(KVCache(), KVCache()))
            else:
                out.append(CacheList(KVCache(), _NoIndexerCache()))
        return out


def get_model_classes(config: dict):
    """Drop-in for mlx_lm.utils._get_classes that adds the IndexShare patch when needed."""
    if uses_indexshare(config):
        return IndexShareModel, IndexShareModelArgs
    return _get_classes(config)


def load_checkpoint(model_dir: Path | str):
    """mlx_lm.utils.load_model (strict) with the IndexShare-aware class lookup."""
    model_dir = Path(model_dir)
    with open(model_dir / "config.json") as f:
        cfg = json.load(f)
    model, config = load_model(model_dir, get_model_classes=get_model_classes)
    return model, config, uses_indexshare(cfg)


# ---------------------------------------------------------------------------
# Numerics modes.
#
# mlx 0.32.4's CPU backend evaluates several bf16 primitives with bf16 intermediate
# arithmetic, unlike the Metal/CUDA kernels (fp32 inside, one rounding of the output):
#   quantized_matmul / gather_qmm  bf16 accumulation: ~1e-2 (fp modes) to ~4e-2 (affine)
#                                  relative error per matmul at K=1024 (plain bf16
#                                  matmul is fine: fp32 accumulation, single rounding);
#   fast.scaled_dot_product_attention  unfused fallback: bf16 scaled q, bf16 scores,
#                                  bf16 probabilities;
#   fast.rope                      rotation arithmetic in bf16.
# A raw CPU oracle therefore sits ~1e-3 NMSE away from any fp32-accumulating engine
# even for a dense 3-layer model, and tiny MoE/DSA models flip routing / top-k
# decisions. The recorded oracle ("gpu" numerics) runs those four primitives on fp32
# copies of their floating inputs (bf16 -> fp32 is exact) and rounds the output back
# to the input dtype once - what the GPU kernels do. Everything else (model code,
# graph, every other op and rounding point, compile) is stock mlx-lm / mlx.
#   "cpu":  stock mlx CPU, unpatched (kept as logits_mlx_cpu_raw.npy for reference).
#   "fp32": all parameters and activations fp32 (an 'ideal' engine; robustness probe).
# ---------------------------------------------------------------------------

NUMERICS = ("gpu", "cpu", "fp32", "jitter")
NUMERICS_DOC = {
    "gpu": "mlx-lm model code on mlx CPU, with quantized_matmul, gather_qmm, "
    "fast.scaled_dot_product_attention and fast.rope evaluated on fp32 copies of "
    "their inputs and rounded once to the activation dtype (GPU-kernel numerics)",
    "cpu": "stock mlx 0.32.4 CPU backend (bf16 accumulation inside quantized matmuls)",
    "fp32": "all parameters and activations in float32",
    "jitter": "gpu numerics plus N(0, 1e-6) relative noise on the fp32 results of the four "
    "patched primitives before rounding (a stand-in for a faithful engine that sums in a "
    "different order)",
}
JITTER_EPS = 1e-6


def _up(a):
    if isinstance(a, mx.array) and a.dtype in (mx.bfloat16, mx.float16):
        return a.astype(mx.float32)
    return a


class numerics:
    """Context manager selecting the numerics of run_schedule (see above)."""

    def __init__(self, mode: str = "gpu"):
        if mode not in NUMERICS:
            raise ValueError(f"numerics must be one of {NUMERICS}")
        self.mode = mode
        self._saved = None

    def __enter__(self):
        if self.mode not in ("gpu", "jitter"):
            return self
        self._saved = (mx.quantized_matmul, mx.gather_qmm, mx.fast.scaled_dot_product_attention, mx.fast.rope)
        qmm, gqmm, sdpa, rope = self._saved
        if self.mode == "jitter":

            def rnd(y, dt):
                return (y * (1.0 + JITTER_EPS * mx.random.normal(y.shape))).astype(dt)
        else:

            def rnd(y, dt):
                return y.astype(dt)

        def quantized_matmul(x, w, scales, biases=None, *a, **k):
            return rnd(qmm(_up(x), w, scales, biases, *a, **k), x.dtype)

        def gather_qmm(x, w, scales, biases=None, *a, **k):
            return rnd(gqmm(_up(x), w, scales, biases, *a, **k), x.dtype)

        def scaled_dot_product_attention(q, k, v, *a, **kw):
            if "mask" in kw:
                kw["mask"] = _up(kw["mask"])
            if "sinks" in kw:
                kw["sinks"] = _up(kw["sinks"])
            return rnd(sdpa(_up(q), _up(k), _up(v), *map(_up, a), **kw), q.dtype)

        def rope_(x, *a, **k):
            return rnd(rope(_up(x), *a, **k), x.dtype)

        mx.quantized_matmul = quantized_matmul
        mx.gather_qmm = gather_qmm
        mx.fast.scaled_dot_product_attention = scaled_dot_product_attention
        mx.fast.rope = rope_
        return self

    def __exit__(self, *exc):
        if self._saved is not None:
            (mx.quantized_matmul, mx.gather_qmm, mx.fast.scaled_dot_product_attention, mx.fast.rope) = self._saved
            self._saved = None


def to_fp32_model(model):
    """In place: every floating parameter to float32, embedding outputs float32.
    Returns a function that restores the model exactly."""
    import mlx.nn as nn
    from mlx.utils import tree_map

    saved = tree_map(lambda v: v, model.parameters())
    model.update(
        tree_map(
            lambda v: v.astype(mx.float32) if mx.issubdtype(v.dtype, mx.floating) else v,
            model.parameters(),
        )
    )
    swapped = []
    for _, m in model.named_modules():
        if isinstance(m, (nn.Embedding, nn.QuantizedEmbedding)):
            cls = type(m)

            class _F32(cls):  # dequantize() of fp modes defaults to bf16 output
                def __call__(self, x):
                    return super().__call__(x).astype(mx.float32)

            swapped.append((m, cls))
            m.__class__ = _F32

    def restore():
        for m, cls in swapped:
            m.__class__ = cls
        model.update(saved)

    return restore


# ---------------------------------------------------------------------------
# The schedule the engine must reproduce.
# ---------------------------------------------------------------------------


def _to_f32(logits: mx.array) -> np.ndarray:
    # [1, L, V] (bf16 for every fixture) -> float32 numpy [L, V]; exact widening.
    return np.array(logits[0].astype(mx.float32), dtype=np.float32)


def run_schedule(
    model,
    prompt: Sequence[int],
    prefill_chunk: int,
    n_decode: int = 4,
    forced_decode: Optional[Sequence[int]] = None,
    mode: str = "gpu",
):
    """See _run_schedule; `mode` selects the numerics ("gpu" = the recorded oracle)."""
    restore = to_fp32_model(model) if mode == "fp32" else None
    try:
        with numerics(mode):
            return _run_schedule(model, prompt, prefill_chunk, n_decode, forced_decode)
    finally:
        if restore is not None:
            restore()


def _run_schedule(
    model,
    prompt: Sequence[int],
    prefill_chunk: int,
    n_decode: int = 4,
    forced_decode: Optional[Sequence[int]] = None,
):
    """Prompt in chunks of `prefill_chunk` through a fresh mlx-lm prompt cache (logits
    kept at every position), then `n_decode` single-token steps (the L == 1 path).
    Decode step i feeds forced_decode[i] if given, else the greedy argmax of the
    previous row (np.argmax: lowest index wins ties).

    Returns (logits float32 [T + n_decode, V], fed decode tokens)."""
    if prefill_chunk <= 0:
        raise ValueError("prefill_chunk must be > 0")
    if forced_decode is not None:
        n_decode = len(forced_decode)
    cache = make_prompt_cache(model)
    rows = []
    T = len(prompt)
    for s in range(0, T, prefill_chunk):
        toks = mx.array([list(prompt[s : s + prefill_chunk])])
        out = model(toks, cache=cache)
        mx.eval(out)
        rows.append(_to_f32(out))
    fed = []
    last = rows[-1][-1]
    for i in range(n_decode):
        tok = int(forced_decode[i]) if forced_decode is not None else int(np.argmax(last))
        fed.append(tok)
        out = model(mx.array([[tok]]), cache=cache)
        mx.eval(out)
        r = _to_f32(out)
        rows.append(r)
        last = r[-1]
    return np.concatenate(rows, axis=0), fed
