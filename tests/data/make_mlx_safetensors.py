"""Writes tests/data/mlx_small.safetensors with MLX's own writer (mx.save_safetensors, the
call mlx-lm's save_model uses), so models/safetensors_test.cc checks that we read what
MLX writes: its header is NUL-terminated rather than space-padded and its data offsets
are not aligned. Values are exact in every dtype used; the test hard-codes them.

    .venv/bin/python tests/data/make_mlx_safetensors.py
"""
import os

import mlx.core as mx

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mlx_small.safetensors")

mx.save_safetensors(
    OUT,
    {
        "w.f32": mx.arange(6, dtype=mx.float32).reshape(2, 3),
        "w.bf16": mx.array([1.5, -2.25, 3.0], dtype=mx.bfloat16),
        "q.u32": mx.array([[1, 2], [3, 0xFFFFFFFF]], dtype=mx.uint32),
        "s.u8": mx.array([127, 128, 0], dtype=mx.uint8),
        "h.f16": mx.array([0.5, -0.25], dtype=mx.float16),
    },
    metadata={"format": "mlx"},
)
