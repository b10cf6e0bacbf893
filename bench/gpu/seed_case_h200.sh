#!/usr/bin/env bash
# The issue's seed case on the H200 machine: a 4-layer slice with GLM-5.2 dims (layers 0-2
# dense with a full DSA indexer, layer 3 MoE with an IndexShare "shared" indexer; random
# mxfp4 weights from `ringctl synth`), the same tokens through `ringctl logits --backend
# cuda` and `--backend cpu`; relative difference ||gpu - cpu|| / ||cpu|| of the slice output
# (logits of every row) for a short prompt and for one longer than index_topk (2048), so the
# sparse path (indexer top-k, sparse MLA, IndexShare reuse) is active. Plus the GPU decode
# step time of the slice. Output under $OUT.
#
#   bench/gpu/seed_case_h200.sh BUNDLE_DIR      (BUNDLE_DIR/bin/ringctl from deploy/bundle.sh)
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: $0 BUNDLE_DIR" >&2; exit 2; }
bundle=$(cd "$1" && pwd)
out=${OUT:-$PWD/gpu_out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$bundle/lib:${LD_LIBRARY_PATH:-}"
ringctl=$bundle/bin/ringctl
m=/tmp/ring_glm52x4
log=$out/seed_case.txt
status=0
date -u > "$log"
timeout 240 "$ringctl" synth --arch glm_moe_dsa --preset glm-5.2 --layers 4 --quant mxfp4 \
  --out "$m" >> "$log" 2>&1 || { echo "synth failed" >> "$log"; exit 1; }
"$ringctl" inspect "$m" >> "$log" 2>&1
toks() { python3 -c "print(','.join(str((i * 7919 + $2) % 154000 + 10) for i in range($1)))"; }
short=$(toks 32 1)
long=$(toks ${LONG_TOKENS:-2080} 3)
for be in cuda cpu; do
  echo "== short prompt (32 tokens + 8 forced decode steps) on $be" >> "$log"
  timeout 300 "$ringctl" logits --model "$m" --tokens "$short" --force-decode 11,22,33,44,55,66,77,88 \
    --backend $be --timing --out /tmp/seed_short_$be.npy >> "$log" 2>&1 || status=1
done
for be in cuda cpu; do
  echo "== long prompt (${LONG_TOKENS:-2080} tokens > index_topk 2048 + 2 decode steps) on $be" >> "$log"
  timeout ${CPU_TIMEOUT:-420} "$ringctl" logits --model "$m" --tokens "$long" --force-decode 101,202 \
    --backend $be --timing --out /tmp/seed_long_$be.npy >> "$log" 2>&1 || status=1
done
echo "== GPU decode steps of the slice (16-token prompt, 64 greedy steps, all logits to host)" >> "$log"
timeout 120 "$ringctl" logits --model "$m" --tokens "$(toks 16 5)" --decode 64 --backend cuda --timing \
  --out /tmp/seed_dec.npy >> "$log" 2>&1 || status=1
python3 - >> "$log" 2>&1 <<'PY'
import numpy as np
for name in ("short", "long"):
    try:
        g = np.load(f"/tmp/seed_{name}_cuda.npy").astype(np.float64)
        c = np.load(f"/tmp/seed_{name}_cpu.npy").astype(np.float64)
    except Exception as e:  # noqa: BLE001
        print(f"{name}: missing output ({e})")
        continue
    rel = np.sqrt(((g - c) ** 2).sum() / (c ** 2).sum())
    row = ((g - c) ** 2).sum(-1) / (c ** 2).sum(-1)
    agree = (g.argmax(-1) == c.argmax(-1)).mean()
    print(f"seed case {name}: rows {g.shape[0]}, ||gpu-cpu||/||cpu|| = {rel:.3e}, "
          f"per-row NMSE max {row.max():.3e} mean {row.mean():.3e}, argmax agree {agree:.4f}")
PY
tail -5 "$log"
exit $status
