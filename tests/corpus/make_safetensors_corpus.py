#!/usr/bin/env python3
"""Writes the seed corpus for models/safetensors_fuzz.cc into tests/corpus/safetensors/.

Plain Python, no dependencies, deterministic: re-running it reproduces the committed files.
Each seed is one file: valid ones of several dtypes, and one per corruption class the
parser must reject (see models/safetensors.h).

    python3 tests/corpus/make_safetensors_corpus.py
"""
import json
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "safetensors")


def build(header, data=b"", length=None, pad=True):
    """A file: 8-byte LE length, JSON header (space-padded to 8 bytes), data."""
    text = header if isinstance(header, (bytes, str)) else json.dumps(header, separators=(",", ":"))
    raw = text.encode() if isinstance(text, str) else text
    if pad:
        raw += b" " * ((8 - len(raw) % 8) % 8)
    n = len(raw) if length is None else length
    return struct.pack("<Q", n) + raw + data


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def seeds():
    f32 = struct.pack("<4f", 1.0, -2.0, 0.5, 3.25)
    yield "valid_f32", build({"__metadata__": {"format": "mlx"}, "w": entry("F32", [2, 2], 0, 16)}, f32)
    yield "valid_mixed", build(
        {
            "__metadata__": {"format": "mlx"},
            "a.bf16": entry("BF16", [3], 0, 6),
            "b.u32": entry("U32", [1, 2], 6, 14),
            "c.u8": entry("U8", [2], 14, 16),
            "d.f16": entry("F16", [2], 16, 20),
            "e.i64": entry("I64", [], 20, 28),
            "f.f8": entry("F8_E4M3", [4], 28, 32),
        },
        bytes(range(32)),
    )
    yield "valid_empty_tensor", build({"z": entry("F32", [0, 4], 0, 0), "b": entry("BOOL", [1], 0, 1)}, b"\x01")
    yield "valid_mlx_nul_terminated", build(b'{"x":{"data_offsets":[0,2],"dtype":"I8","shape":[2]}}\x00', b"\x01\xff", pad=False)
    yield "valid_no_tensors", build({"__metadata__": {"k": "v"}})
    yield "truncated_data", build({"w": entry("F32", [2, 2], 0, 16)}, f32[:10])
    yield "truncated_header", build({"w": entry("F32", [1], 0, 4)}, b"")[:20]
    yield "tiny_file", b"\x05\x00\x00"
    yield "lying_length", build({"w": entry("F32", [1], 0, 4)}, f32[:4], length=4096)
    yield "huge_length", build({"w": entry("F32", [1], 0, 4)}, f32[:4], length=(1 << 40))
    yield "overlap", build({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}, f32)
    yield "huge_shape", build({"w": entry("F32", [1 << 40, 1 << 40], 0, 16)}, f32)
    yield "shape_overflow_bytes", build({"w": entry("F64", [1 << 61], 0, 16)}, f32)
    yield "size_mismatch", build({"w": entry("F32", [3], 0, 16)}, f32)
    yield "begin_after_end", build({"w": entry("F32", [0], 8, 4)}, f32)
    yield "negative_dim", build({"w": entry("F32", [-1, 4], 0, 16)}, f32)
    yield "float_dim", build({"w": entry("F32", [2.0, 2], 0, 16)}, f32)
    yield "bad_dtype", build({"w": entry("FLOAT32", [4], 0, 16)}, f32)
    yield "dtype_not_string", build({"w": {"dtype": 4, "shape": [4], "data_offsets": [0, 16]}}, f32)
    yield "offsets_three", build({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8, 16]}}, f32)
    yield "offsets_huge", build({"w": entry("U8", [16], 18446744073709551600, 18446744073709551615)}, f32)
    yield "missing_shape", build({"w": {"dtype": "F32", "data_offsets": [0, 16]}}, f32)
    yield "metadata_not_strings", build({"__metadata__": {"n": 3}, "w": entry("F32", [4], 0, 16)}, f32)
    yield "bad_json", build(b'{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]', f32)
    yield "not_object", build(b"[1, 2, 3]", f32)
    yield "embedded_nul", build(b'{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}\x00junk', b"\x00", pad=False)
    yield "deep_nesting", build(b"[" * 5000 + b"]" * 5000)
    yield "invalid_utf8_name", build(b'{"\xff\xfe":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x00")


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, blob in seeds():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(blob)


if __name__ == "__main__":
    main()
