#!/usr/bin/env python3
"""Parity of the C++ tokenizer (`ringctl tokenize`, server/tokenizer.h) with HF `tokenizers`.

Tokenizer files (each checked on --count strings, 10,000 by default):
  synth-glm, synth-qwen  what `ringctl synth` writes (models/bpe_builder.cc): GLM style
                         (digits in runs of 1-3, no normalizer) and Qwen style (single digits,
                         NFC), read as model directories (tokenizer_config.json included);
  trained-glm            a BPE trained here by `tokenizers` itself with the real GLM-4 Split
                         regex, 20k+ merges, GLM special tokens and non-special ones;
  trained-qwen           the same with the Qwen2 regex and NFC, merges stored as "a b"
                         strings (the older format) instead of pairs;
  gpt2-features          trained-glm's merges under a GPT-2 style ByteLevel pre-tokenizer
                         (add_prefix_space, use_regex), ignore_merges, Sequence normalizer
                         and decoder, TemplateProcessing, and added tokens with lstrip,
                         rstrip, single_word and normalized=true;
  split-behaviors        trained-qwen's merges under Split steps with MergedWithPrevious,
                         MergedWithNext, Contiguous + invert and Removed;
  fallback-unk           a small handmade vocab lacking most non-ASCII bytes, with
                         byte_fallback tokens for some, <unk> with fuse_unk for the others.

For every string: ids of encode(s, add_special_tokens=False) must be identical (a fifth of
the strings with special tokens matched as text: HF encode_special_tokens=True vs our
allow_special=false); decode(ids) identical with and without skip_special_tokens; and the
StreamDecoder concatenation identical to decode. Plus random id sequences (invalid UTF-8
byte runs, special and unknown ids) decoded both ways. Exits 1 printing the first
mismatches (with the seed to reproduce them).

Usage: tokenizer_parity.py --ringctl build/server/ringctl --work /tmp/dir [--count N]
"""
import argparse
import copy
import json
import os
import random
import subprocess
import sys
import time

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_strings  # noqa: E402

GLM_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN_REGEX = GLM_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")

GLM_SPECIAL = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>",
               "<|user|>", "<|assistant|>", "<|observation|>", "<|begin_of_image|>",
               "<|end_of_image|>"]
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
                "<|object_ref_end|>", "<|box_start|>", "<|vision_pad|>", "<|fim_prefix|>"]
CONTENT_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
                  "</tool_response>", "<arg_key>", "</arg_key>"]


def train(corpus, regex, nfc, special, merges_target):
    tok = Tokenizer(models.BPE())
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=256 + merges_target + 64, min_frequency=2,
                                  show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    # As in real files: special tokens after the BPE vocab, then content-like ones.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in CONTENT_TOKENS])
    return json.loads(tok.to_str())


def gpt2_features(base):
    j = copy.deepcopy(base)
    j["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFC"},
                                                           {"type": "Sequence",
                                                            "normalizers": [{"type": "NFC"}]}]}
    j["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                          "use_regex": True}
    j["model"]["ignore_merges"] = True
    j["decoder"] = {"type": "Sequence", "decoders": [j["decoder"]]}
    eot = next(t["id"] for t in base["added_tokens"] if t["content"] == "<|endoftext|>")
    holder = Tokenizer(models.BPE())
    holder.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", pair="$A $B", special_tokens=[("<|endoftext|>", eot)])
    j["post_processor"] = json.loads(holder.to_str())["post_processor"]
    n = max([t["id"] for t in j["added_tokens"]] + list(j["model"]["vocab"].values())) + 1
    extra = [
        dict(content="<mask>", lstrip=True, rstrip=True, special=True, normalized=False),
        dict(content="<sep>", lstrip=True, special=True, normalized=False),
        dict(content="[CLS]", rstrip=True, special=True, normalized=False),
        dict(content="café", single_word=True, special=False, normalized=True),
        dict(content="A\u030angstr\u00f6m", special=False, normalized=True),  # NFC: Ångström
        dict(content="hello world", special=False, normalized=True, lstrip=True),
        dict(content="ab", single_word=True, special=False, normalized=False),
        dict(content="\u212b", special=False, normalized=False),  # singleton, matched raw
        dict(content="tokenizer", special=False, normalized=False),
    ]
    for i, t in enumerate(extra):
        full = dict(id=n + i, content="", single_word=False, lstrip=False, rstrip=False,
                    normalized=True, special=False)
        full.update(t)
        j["added_tokens"].append(full)
    return j


def split_behaviors(base):
    j = copy.deepcopy(base)
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": "\n"}, "behavior": "MergedWithPrevious",
         "invert": False},
        {"type": "Split", "pattern": {"Regex": r"[-_/]"}, "behavior": "MergedWithNext",
         "invert": False},
        {"type": "Split", "pattern": {"Regex": r"\p{N}+|\p{L}+"}, "behavior": "Contiguous",
         "invert": True},
        {"type": "Split", "pattern": {"Regex": r"\t"}, "behavior": "Removed", "invert": False},
        {"type": "Split", "pattern": {"Regex": r"\s+(?!\S)|\s*$|^\s+|x*"},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
         "use_regex": False},
    ]}
    return j


def fallback_unk():
    """Handmade: printable ASCII tokens, byte-fallback tokens for a few bytes' stand-ins,
    <unk> (fused) for the rest, some merges."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_char = {}
    n = 256
    for b in range(256):
        printable = 33 <= b <= 126 or 161 <= b <= 172 or b >= 174
        byte_char[b] = chr(b) if printable else chr(n)
        n += 0 if printable else 1
    assert set(byte_char.values()) == set(alphabet)
    vocab = {"<unk>": 0}
    for b in list(range(0x21, 0x7F)) + [0x20, 0x0A]:
        vocab[byte_char[b]] = len(vocab)
    # Fallback tokens cover the UTF-8 of the stand-ins of bytes 0xC3-0xC5, 0xE4-0xE9 (whose
    # stand-ins are 2-byte characters C3 xx), so those bytes fall back; the others are unk.
    for u in sorted({x for b in list(range(0xC3, 0xC6)) + list(range(0xE4, 0xEA))
                     for x in byte_char[b].encode()}):
        vocab[f"<0x{u:02X}>"] = len(vocab)
    merges = []
    for a, b in [("t", "h"), ("th", "e"), ("Ġ", "t"), ("Ġt", "he"), ("i", "n"), ("in", "g"),
                 ("e", "r"), ("Ġ", "a"), ("o", "n"), ("<unk>", "<unk>"), ("a", "n"),
                 ("an", "d"), ("Ġ", "and")]:
        for t in (a, b, a + b):
            if t not in vocab:
                vocab[t] = len(vocab)
        merges.append([a, b])
    n = len(vocab)
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [dict(id=n, content="<|end|>", single_word=False, lstrip=False,
                              rstrip=False, normalized=False, special=True)],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": GLM_REGEX}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
             "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }


def synth(ringctl, arch, out):
    subprocess.run([ringctl, "synth", "--arch", arch, "--preset", "tiny", "--quant", "bf16",
                    "--out", out, "--force", "--quiet"], check=True, stdout=subprocess.DEVNULL)


def make_files(ringctl, work, seed):
    """name -> (path of tokenizer.json, ringctl source argument list)."""
    files = {}
    for name, arch in [("synth-glm", "glm_moe_dsa"), ("synth-qwen", "qwen3")]:
        d = os.path.join(work, name)
        synth(ringctl, arch, d)
        files[name] = (os.path.join(d, "tokenizer.json"), ["--model", d])

    t0 = time.time()
    corpus = tokenizer_strings.corpus(seed + 1, 1_500_000)
    glm = train(corpus, GLM_REGEX, False, GLM_SPECIAL, 20000)
    qwen = train(corpus, QWEN_REGEX, True, QWEN_SPECIAL, 20000)
    qwen["model"]["merges"] = [" ".join(m) for m in qwen["model"]["merges"]]
    print(f"trained 2 BPE models ({len(glm['model']['merges'])} and "
          f"{len(qwen['model']['merges'])} merges) in {time.time() - t0:.1f}s", flush=True)
    for name, j in [("trained-glm", glm), ("trained-qwen", qwen),
                    ("gpt2-features", gpt2_features(glm)),
                    ("split-behaviors", split_behaviors(qwen)),
                    ("fallback-unk", fallback_unk())]:
        path = os.path.join(work, name + ".json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False)
        files[name] = (path, ["--tokenizer", path])
    return files


def run_case(name, path, source, ringctl, work, count, seed):
    hf = Tokenizer.from_file(path)
    hf_text = Tokenizer.from_file(path)
    hf_text.encode_special_tokens = True
    added = [t.content for t in hf.get_added_tokens_decoder().values()]
    special = {i for i, t in hf.get_added_tokens_decoder().items() if t.special}
    rng = random.Random(seed)
    texts = tokenizer_strings.strings(seed, count, added)
    cases = []  # (kind, payload, allow_special, skip_special)
    for s in texts:
        cases.append(("text", s, rng.random() >= 0.2, rng.random() < 0.5))
    vocab_n = hf.get_vocab_size(with_added_tokens=True)
    for _ in range(max(1, count // 10)):
        ids = [rng.randrange(vocab_n + 5) for _ in range(rng.randint(0, 24))]
        if special and rng.random() < 0.5:
            ids.insert(rng.randint(0, len(ids)), rng.choice(sorted(special)))
        cases.append(("ids", ids, True, rng.random() < 0.5))

    in_path = os.path.join(work, name + ".in.jsonl")
    with open(in_path, "w", encoding="utf-8") as f:
        for kind, payload, allow, skip in cases:
            obj = {"text": payload} if kind == "text" else {"ids": payload}
            if not allow:
                obj["allow_special"] = False
            obj["skip_special"] = skip
            f.write(json.dumps(obj, ensure_ascii=True) + "\n")
    t0 = time.time()
    proc = subprocess.run([ringctl, "tokenize", *source, "--input", in_path],
                          capture_output=True, check=False)
    ours_s = time.time() - t0
    if proc.returncode != 0:
        print(f"[{name}] ringctl tokenize failed ({proc.returncode}):\n"
              f"{proc.stderr.decode(errors='replace')}")
        return False, 0
    # Split on b"\n" only: str.splitlines() would also cut at U+2028, U+0085...
    ours = [json.loads(line) for line in proc.stdout.split(b"\n") if line]
    if len(ours) != len(cases):
        print(f"[{name}] {len(ours)} output lines for {len(cases)} inputs")
        return False, 0

    t0 = time.time()
    allowed = [c[1] for c in cases if c[0] == "text" and c[2]]
    as_text = [c[1] for c in cases if c[0] == "text" and not c[2]]
    enc_allowed = iter(hf.encode_batch(allowed, add_special_tokens=False))
    enc_text = iter(hf_text.encode_batch(as_text, add_special_tokens=False))
    mismatches = []
    for i, ((kind, payload, allow, skip), got) in enumerate(zip(cases, ours)):
        if kind == "text":
            want_ids = next(enc_allowed if allow else enc_text).ids
            if "error" in got:
                mismatches.append((i, kind, payload, allow, skip, f"error: {got['error']}"))
                continue
            if got["ids"] != want_ids:
                k = next((j for j, (a, b) in enumerate(zip(got["ids"], want_ids)) if a != b),
                         min(len(got["ids"]), len(want_ids)))
                mismatches.append((i, kind, payload, allow, skip,
                                   f"ids differ at {k}: ours {got['ids'][max(0, k - 3):k + 4]} "
                                   f"hf {want_ids[max(0, k - 3):k + 4]} (hf tokens "
                                   f"{[hf.id_to_token(t) for t in want_ids[max(0, k - 3):k + 4]]})"))
                continue
            ids = want_ids
        else:
            ids = payload
        want = hf.decode(ids, skip_special_tokens=skip)
        if got["decoded"] != want:
            mismatches.append((i, kind, payload, allow, skip,
                               f"decode: ours {got['decoded']!r} hf {want!r}"))
        elif got["stream"] != want:
            mismatches.append((i, kind, payload, allow, skip,
                               f"stream: ours {got['stream']!r} hf {want!r}"))
    hf_s = time.time() - t0
    n_text = sum(1 for c in cases if c[0] == "text")
    print(f"[{name}] {n_text} strings + {len(cases) - n_text} id sequences: "
          f"{len(cases) - len(mismatches)}/{len(cases)} identical "
          f"(ringctl {ours_s:.1f}s, HF check {hf_s:.1f}s)", flush=True)
    for i, kind, payload, allow, skip, what in mismatches[:8]:
        print(f"  case {i} ({kind}, allow_special={allow}, skip_special={skip}): "
              f"{payload!r:.300}\n    {what:.600}")
    return not mismatches, n_text - sum(1 for m in mismatches if m[1] == "text")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ringctl", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--count", type=int, default=10000, help="strings per tokenizer file")
    ap.add_argument("--seed", type=int, default=20260530)
    ap.add_argument("--only", default="", help="comma-separated tokenizer names")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    t0 = time.time()
    files = make_files(args.ringctl, args.work, args.seed)
    ok_all, total, ran = True, 0, 0
    for k, (name, (path, source)) in enumerate(files.items()):
        if args.only and name not in args.only.split(","):
            continue
        ok, n = run_case(name, path, source, args.ringctl, args.work, args.count,
                         args.seed + 100 * k)
        ok_all &= ok
        total += n
        ran += 1
    print(f"{'PASS' if ok_all else 'FAIL'}: {total} strings identical to HF tokenizers "
          f"over {ran} tokenizer files in {time.time() - t0:.1f}s")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
