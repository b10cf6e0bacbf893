#!/usr/bin/env python3
"""Encoding throughput: our tokenizer (`ringctl tokenize --bench`, C++, one thread) vs HF
`tokenizers` (Python binding: an `encode` loop on one thread, and `encode_batch`, which
uses all cores through rayon), on the same corpus, in one run. Prints MB/s and the ratios.

Tokenizers: the two BPEs tests/tokenizer_parity.py trains with `tokenizers` itself (GLM-4
Split regex, no normalizer; Qwen2 regex + NFC; 20k merges, special and content added
tokens), or any tokenizer.json given with --tokenizer. Corpus: --mb MB of seeded text from
tests/tokenizer_strings.py (mostly prose and code, some CJK, digits, emoji, whitespace),
one JSON string per line (~430 bytes a line). Every side encodes with
add_special_tokens=False; each timing is the best of --repeat passes. The id counts of
both sides are compared as a sanity check (tests/tokenizer_parity.py checks the ids).

Usage: bench/tokenizer_bench.py --ringctl build/server/ringctl [--mb 4] [--repeat 3]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import tokenizer_parity  # noqa: E402
import tokenizer_strings  # noqa: E402


def best_of(repeat, fn):
    best = float("inf")
    result = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ringctl", required=True)
    ap.add_argument("--work", default="")
    ap.add_argument("--mb", type=float, default=4.0, help="corpus size in MB")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tokenizer", action="append", default=[],
                    help="tokenizer.json to bench (repeatable); default: the trained pair")
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="tokenizer_bench_")
    os.makedirs(work, exist_ok=True)

    if args.tokenizer:
        files = {os.path.basename(p): p for p in args.tokenizer}
    else:
        train_corpus = tokenizer_strings.corpus(20260531, 1_500_000)
        files = {}
        for name, regex, nfc, special in [
                ("glm-style (GLM-4 regex)", tokenizer_parity.GLM_REGEX, False,
                 tokenizer_parity.GLM_SPECIAL),
                ("qwen-style (Qwen2 regex, NFC)", tokenizer_parity.QWEN_REGEX, True,
                 tokenizer_parity.QWEN_SPECIAL)]:
            j = tokenizer_parity.train(train_corpus, regex, nfc, special, 20000)
            path = os.path.join(work, name.split()[0] + ".json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(j, f, ensure_ascii=False)
            files[name] = path

    lines = tokenizer_strings.corpus(7, int(args.mb * 1e6))
    nbytes = sum(len(s.encode()) for s in lines)
    corpus_path = os.path.join(work, "corpus.jsonl")
    with open(corpus_path, "w", encoding="utf-8") as f:
        for s in lines:
            f.write(json.dumps(s, ensure_ascii=True) + "\n")
    print(f"corpus: {len(lines)} lines, {nbytes / 1e6:.2f} MB; best of {args.repeat} passes; "
          f"{os.cpu_count()} CPUs (encode_batch uses them all)\n")

    header = (f"{'tokenizer':32} {'ours MB/s':>10} {'HF loop':>9} {'HF batch':>9} "
              f"{'ours/loop':>10} {'ours/batch':>11}")
    print(header)
    print("-" * len(header))
    ok = True
    for name, path in files.items():
        hf = Tokenizer.from_file(path)
        loop_s, loop_ids = best_of(args.repeat, lambda: [
            hf.encode(s, add_special_tokens=False).ids for s in lines])
        batch_s, _ = best_of(args.repeat, lambda: hf.encode_batch(lines,
                                                                  add_special_tokens=False))
        proc = subprocess.run([args.ringctl, "tokenize", "--tokenizer", path, "--input",
                               corpus_path, "--bench", "--repeat", str(args.repeat)],
                              capture_output=True, text=True, check=True)
        ours = json.loads(proc.stdout)
        hf_tokens = sum(len(x) for x in loop_ids)
        if ours["tokens"] != hf_tokens:
            print(f"  {name}: token counts differ (ours {ours['tokens']}, HF {hf_tokens})")
            ok = False
        ours_mbs = ours["mb_per_s"]
        loop_mbs = nbytes / loop_s / 1e6
        batch_mbs = nbytes / batch_s / 1e6
        print(f"{name:32} {ours_mbs:10.2f} {loop_mbs:9.2f} {batch_mbs:9.2f} "
              f"{ours_mbs / loop_mbs:9.2f}x {ours_mbs / batch_mbs:10.2f}x")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
