#!/usr/bin/env bash
# Decode speed of the GPU forward on the H200 machine, before/after in one run: the same
# greedy `ringctl logits --timing` runs with up to three ringctl builds or settings:
#   before   BEFORE_BUNDLE/bin/ringctl (optional; e.g. the previous commit's bundle)
#   graphs   AFTER_BUNDLE/bin/ringctl (CUDA graphs on, the default)
#   direct   AFTER_BUNDLE/bin/ringctl with RING_CUDA_GRAPHS=0 (every op launched directly)
# on a Qwen3-0.6B-shaped model (affine int4 g64, 128-token prompt, 32 greedy steps) and the
# GLM-5.2 4-layer slice (mxfp4, 16-token prompt, 64 greedy steps); both models are random
# weights from `ringctl synth`. Every run writes all its logits; the script then checks that
# graphs and direct are bitwise identical (they launch the same kernels on the same data)
# and compares both with before. AFTER runs print the backend's step statistics
# (RING_CUDA_STEP_STATS=1).
# Output under $OUT: perf.txt.
#
#   bench/gpu/decode_perf_h200.sh AFTER_BUNDLE [BEFORE_BUNDLE]
# REPS (default 2) runs of each; MODELS="q g" (default both: q = Qwen3-0.6B, g = GLM-5.2).
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: $0 AFTER_BUNDLE [BEFORE_BUNDLE]" >&2; exit 2; }
after=$(cd "$1" && pwd)
before=""
[ $# -ge 2 ] && before=$(cd "$2" && pwd)
out=${OUT:-$PWD/gpu_out}
mkdir -p "$out"
log=$out/perf.txt
reps=${REPS:-2}
models=${MODELS:-q g}
q=/tmp/ring_qwen06
g=/tmp/ring_glm52x4
status=0
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
} > "$log" 2>&1
synth() { LD_LIBRARY_PATH="$after/lib" "$after/bin/ringctl" synth "$@"; }
[[ " $models " == *" q "* ]] && { [ -d "$q" ] || synth --preset qwen3-0.6b --quant affine --bits 4 --out "$q" > /tmp/synth_q.txt 2>&1 & }
[[ " $models " == *" g "* ]] && { [ -d "$g" ] || synth --arch glm_moe_dsa --preset glm-5.2 --layers 4 --quant mxfp4 --out "$g" \
  > /tmp/synth_g.txt 2>&1 & }
wait
qt=$(python3 -c "print(','.join(str((i * 7919) % 150000 + 10) for i in range(128)))")
gt=$(python3 -c "print(','.join(str((i * 7919 + 5) % 154000 + 10) for i in range(16)))")
variants="graphs direct"
[ -n "$before" ] && variants="before $variants"
for v in $variants; do
  bundle=$after
  envs="RING_CUDA_STEP_STATS=1"
  case $v in
    before) bundle=$before; envs="" ;;
    direct) envs="RING_CUDA_STEP_STATS=1 RING_CUDA_GRAPHS=0" ;;
  esac
  for rep in $(seq 1 "$reps"); do
    if [[ " $models " == *" q "* ]]; then
      echo "== $v qwen3-0.6b run $rep" >> "$log"
      env $envs LD_LIBRARY_PATH="$bundle/lib" timeout 120 "$bundle/bin/ringctl" logits --model "$q" \
        --tokens "$qt" --decode 32 --backend cuda --timing --out "/tmp/q_$v.npy" >> "$log" 2>&1 || status=1
    fi
    if [[ " $models " == *" g "* ]]; then
      echo "== $v glm-5.2x4 run $rep" >> "$log"
      env $envs LD_LIBRARY_PATH="$bundle/lib" timeout 120 "$bundle/bin/ringctl" logits --model "$g" \
        --tokens "$gt" --decode 64 --backend cuda --timing --out "/tmp/g_$v.npy" >> "$log" 2>&1 || status=1
    fi
  done
done
MODELS="$models" python3 - $variants >> "$log" 2>&1 <<'PY' || status=1
# graphs and direct launch the same kernels: bitwise identical. Against before (other
# kernels, e.g. attention's summation order): per-row NMSE of the prompt rows, and the
# greedy steps up to the first different token (later rows see different inputs).
import os, sys, numpy as np
vs = sys.argv[1:]
bad = 0
for m, T in (("q", 128), ("g", 16)):
    if m not in os.environ["MODELS"].split():
        continue
    runs = {v: np.load(f"/tmp/{m}_{v}.npy") for v in vs}
    if "graphs" in runs and "direct" in runs:
        a, b = runs["graphs"], runs["direct"]
        same = a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))
        print(f"{m}: graphs vs direct: shape {a.shape}, bitwise identical {same}")
        bad += not same
    if "before" in runs:
        ref = runs["before"].astype(np.float64)
        for v in vs:
            if v == "before":
                continue
            a = runs[v].astype(np.float64)
            nm = ((a - ref) ** 2).sum(-1) / (ref ** 2).sum(-1)
            same_tok = a.argmax(-1) == ref.argmax(-1)
            steps = same_tok[T - 1:]
            agree = len(steps) if steps.all() else int(np.argmin(steps))
            print(f"{m}: {v} vs before: prompt rows max NMSE {nm[:T].max():.3e}, greedy tokens "
                  f"identical for {agree}/{len(steps)} steps, NMSE over those rows max "
                  f"{nm[T - 1:T - 1 + agree].max() if agree else 0:.3e}")
sys.exit(1 if bad else 0)
PY
grep -E "^==|timing:|ring: cuda|bitwise|vs before" "$log"
exit $status
