#!/usr/bin/env python3
"""Self-test of the fixtures' power: re-run fixtures with deliberate, engine-plausible
bugs patched into mlx-lm and require that check_parity's criterion (per-row NMSE <=
1e-3) would catch every one of them.

    mutation_check.py FIXTURES_DIR

Also re-runs each fixture with the all-fp32 and the jittered numerics (see
oracle_common.NUMERICS) and requires those to PASS: a correct but not bit-identical
engine must not fail. Maintenance tool; not part of CTest.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mlx.core as mx  # noqa: E402

import oracle_common as oc  # noqa: E402
from check_parity import row_nmse  # noqa: E402

THRESHOLD = 1e-3


def _layers(model):
    return model.model.layers


def m_indexer_rope_flip(model):
    for l in _layers(model):
        ix = l.self_attn.indexer
        if hasattr(ix, "rope"):
            ix.rope.traditional = not ix.rope.traditional


def m_indexer_dense(model):
    for l in _layers(model):
        ix = l.self_attn.indexer
        if hasattr(ix, "index_topk"):
            ix.index_topk = 10**9


def m_index_topk_minus_one(model):
    for l in _layers(model):
        ix = l.self_attn.indexer
        if hasattr(ix, "index_topk"):
            ix.index_topk -= 1


def m_shared_layers_dense(model):
    oc._SharedTopK.__call__ = lambda self, *a, **k: None


def m_shared_use_first_full(model):
    """Shared layers read the FIRST full layer's top-k of the call, not the latest."""
    orig_call = oc.IndexShareModel.__call__
    orig_pub = oc._PublishingIndexer.__call__

    def call(self, inputs, cache=None):
        self._topk_carrier.first = None
        return orig_call(self, inputs, cache)

    def publish(self, x, qr, mask, cache=None):
        r = orig_pub(self, x, qr, mask, cache=cache)
        if self._carrier.first is None:
            self._carrier.first = (r,)
        self._carrier.topk = self._carrier.first[0]
        return r

    oc.IndexShareModel.__call__ = call
    oc._PublishingIndexer.__call__ = publish

    def undo():
        oc.IndexShareModel.__call__ = orig_call
        oc._PublishingIndexer.__call__ = orig_pub

    return undo


def m_ignore_groups(model):
    for l in _layers(model):
        if hasattr(l.mlp, "gate") and hasattr(l.mlp.gate, "n_group"):
            l.mlp.gate.n_group = 1


def m_no_scaling_factor(model):
    for l in _layers(model):
        if hasattr(l.mlp, "gate") and hasattr(l.mlp.gate, "routed_scaling_factor"):
            l.mlp.gate.routed_scaling_factor = 1.0


def m_no_correction_bias(model):
    for l in _layers(model):
        g = getattr(l.mlp, "gate", None)
        if g is not None and "e_score_correction_bias" in g:
            g.e_score_correction_bias = mx.zeros_like(g.e_score_correction_bias)


def m_yarn_mscale_ignored(model):
    for l in _layers(model):
        r = l.self_attn.rope
        if hasattr(r, "mscale"):
            r.mscale = 1.0


def m_attn_scale_without_mscale(model):
    for l in _layers(model):
        a = l.self_attn
        a.scale = (a.qk_nope_head_dim + a.qk_rope_head_dim) ** -0.5


def m_rope_flip(model):
    for l in _layers(model):
        l.self_attn.rope.traditional = not l.self_attn.rope.traditional


def m_norm_topk_flip(model):
    for l in _layers(model):
        if hasattr(l.mlp, "norm_topk_prob"):
            l.mlp.norm_topk_prob = not l.mlp.norm_topk_prob


def m_no_shared_expert(model):
    for l in _layers(model):
        if hasattr(l.mlp, "shared_experts"):
            l.mlp.config = type(l.mlp.config)(**{**l.mlp.config.__dict__, "n_shared_experts": None})


MUTATIONS = {
    "glm5_mxfp4": [m_indexer_rope_flip, m_indexer_dense, m_no_correction_bias, m_no_scaling_factor,
                   m_no_shared_expert],
    "glm5_mxfp4_c7": [m_indexer_dense, m_index_topk_minus_one],
    "glm52_indexshare_mxfp4": [m_shared_layers_dense, m_shared_use_first_full, m_indexer_dense],
    "dsv32_mxfp8_yarn_group": [m_ignore_groups, m_indexer_rope_flip, m_attn_scale_without_mscale],
    "dsv32_nvfp4_topk_boundary": [m_index_topk_minus_one, m_indexer_dense],
    "dsv3_affine4_qnone_yarn_group": [m_ignore_groups, m_no_scaling_factor, m_rope_flip],
    "dsv3_mixed36_yarn_mscale": [m_yarn_mscale_ignored, m_attn_scale_without_mscale],
    "qwen3_affine4_tied_c7": [m_rope_flip],
    "qwen3_bf16": [m_rope_flip],
    "qwen3_moe_affine4": [m_norm_topk_flip],
    "qwen3_moe_mxfp4": [m_norm_topk_flip, m_rope_flip],
}


def run(fdir: Path, mutate=None, mode="gpu"):
    o = json.loads((fdir / "oracle.json").read_text())
    ref = np.load(fdir / "logits.npy")
    saved = oc._SharedTopK.__call__
    undo = None
    try:
        model, _, _ = oc.load_checkpoint(fdir / "model")
        if mutate:
            undo = mutate(model)
        out, _ = oc.run_schedule(
            model, o["prompt_tokens"], o["prefill_chunk"], forced_decode=o["decode_tokens"], mode=mode
        )
    finally:
        oc._SharedTopK.__call__ = saved
        if undo is not None:
            undo()
    return float(row_nmse(out, ref).max())


def main(argv=None):
    root = Path((argv or sys.argv[1:])[0])
    bad = 0
    for fdir in sorted(p.parent for p in root.glob("*/oracle.json")):
        for mode in ("fp32", "jitter"):
            mx.random.seed(0)
            v = run(fdir, mode=mode)
            ok = v <= THRESHOLD
            bad += not ok
            print(f"{'ok ' if ok else 'BAD'} {fdir.name:32s} {mode:24s} max NMSE {v:.2e} (must pass)")
        for m in MUTATIONS.get(fdir.name, []):
            v = run(fdir, m)
            ok = v > THRESHOLD
            bad += not ok
            print(f"{'ok ' if ok else 'BAD'} {fdir.name:32s} {m.__name__[2:]:24s} max NMSE {v:.2e} (must fail)")
    print(f"{bad} problem(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
