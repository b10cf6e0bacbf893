#!/usr/bin/env bash
# The model forward on the GPU, on the H200 machine, from a bundle: the CUDA op harness
# (every op against its CPU reference, model ops included), the whole-model parity of
# `ringctl logits --backend cuda` against `--backend cpu` on the mlx-lm oracle fixtures, and
# a Qwen3-0.6B-shaped end-to-end timing (CPU and GPU, same machine). Output under $OUT.
#
#   bench/gpu/run_model_h200.sh BUNDLE_DIR
#
# BUNDLE_DIR (made on the dev machine, see docs/correctness.md §3):
#   bin/ringctl bin/cuda_ops_harness_test  lib/...   (deploy/bundle.sh, stripped)
#   gpu_parity.py                                    (tests/gpu/gpu_parity.py)
#   fixtures/<name>/{model/,oracle.json,logits.npy}  (tests/oracle/make_fixtures.py)
# RING_GPU_FULL=1 adds the harness's real GLM-5.2 / Qwen3-8B matmul shapes; SKIP_BENCH=1 skips
# the timing; SMEM_CAP (default 101376, 0 = off) the pass as a ~99 KB-a-block GPU.
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: $0 BUNDLE_DIR" >&2; exit 2; }
bundle=$(cd "$1" && pwd)
out=${OUT:-$PWD/gpu_out}
mkdir -p "$out"
bin=$bundle/bin
export LD_LIBRARY_PATH="$bundle/lib:${LD_LIBRARY_PATH:-}"
export PYTHONUNBUFFERED=1
status=0
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv || true
  nproc
} > "$out/device.txt" 2>&1

echo "== op harness"
timeout ${HARNESS_TIMEOUT:-240} "$bin/cuda_ops_harness_test" --gtest_color=no > "$out/harness.txt" 2>&1 || status=1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |cases,|\| FAIL \|" "$out/harness.txt" | head -40

# The same GPU as a ~99 KB-a-block device (sm_86/89/120/121: RING_CUDA_SMEM_PER_BLOCK caps
# what every kernel choice reads): the harness again, on the kernels such a GPU gets (the two
# tests that force each GEMM tile in turn force tiles that do not fit there, so they run
# uncapped only), and the MLA fixtures' parity. SMEM_CAP=0 skips this pass.
cap=${SMEM_CAP:-101376}
if [ "$cap" != 0 ]; then
  echo "== op harness, shared memory capped at $cap B a block"
  RING_CUDA_SMEM_PER_BLOCK=$cap timeout ${HARNESS_TIMEOUT:-240} "$bin/cuda_ops_harness_test" --gtest_color=no \
    --gtest_filter='-*PrefillGemmTileEdges*:*GroupedExpertsTileChoices*' > "$out/harness_capped.txt" 2>&1 || status=1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |cases,|\| FAIL \||^MLA " "$out/harness_capped.txt" | head -40
  echo "== whole-model parity, shared memory capped at $cap B a block"
  RING_CUDA_SMEM_PER_BLOCK=$cap timeout ${PARITY_TIMEOUT:-300} python3 "$bundle/gpu_parity.py" --ringctl "$bin/ringctl" \
    --fixtures "$bundle/fixtures" --report "$out/gpu_parity_capped.md" > "$out/parity_capped.txt" 2>&1 || status=1
  cat "$out/parity_capped.txt"
fi

echo "== whole-model parity"
timeout ${PARITY_TIMEOUT:-300} python3 "$bundle/gpu_parity.py" --ringctl "$bin/ringctl" --fixtures "$bundle/fixtures" \
  --report "$out/gpu_parity.md" > "$out/parity.txt" 2>&1 || status=1
cat "$out/parity.txt"

if [ "${SKIP_BENCH:-0}" != 1 ]; then
  echo "== Qwen3-0.6B-shaped end to end (affine int4 g64, 128-token prompt, 32 greedy steps)"
  q=/tmp/ring_qwen06
  timeout 120 "$bin/ringctl" synth --preset qwen3-0.6b --quant affine --bits 4 --out "$q" > "$out/bench.txt" 2>&1
  toks=$(python3 -c "print(','.join(str((i * 7919) % 150000 + 10) for i in range(128)))")
  for be in cuda cpu; do
    for rep in 1 2; do
      echo "backend $be run $rep" >> "$out/bench.txt"
      timeout 60 "$bin/ringctl" logits --model "$q" --tokens "$toks" --decode 32 --backend $be --timing \
        --out "/tmp/q06_$be.npy" >> "$out/bench.txt" 2>&1 || status=1
    done
  done
  python3 - "$out" >> "$out/bench.txt" 2>&1 <<'PY'
import sys, numpy as np
a, b = np.load("/tmp/q06_cuda.npy"), np.load("/tmp/q06_cpu.npy")
n = ((a.astype(np.float64) - b) ** 2).sum(-1) / (b.astype(np.float64) ** 2).sum(-1)
g = a.argmax(-1) == b.argmax(-1)
first = int(np.argmin(g[127:])) if not g[127:].all() else None
print(f"qwen3-0.6b gpu vs cpu: prompt rows max NMSE {n[:128].max():.3e} mean {n[:128].mean():.3e}; "
      f"greedy tokens agree {int(g[127:].sum())}/{len(g) - 127}"
      + ("" if first is None else f" (first difference at step {first}; later rows see different tokens)"))
PY
  cat "$out/bench.txt"
fi
exit $status
