#!/usr/bin/env bash
# The precision guard on the H200 machine, in one call (results under $OUT/verify_h200.txt):
#   1. capability attestation as ring-worker --device cuda:0 prints it at start;
#   2. tests/verify_cli_test.sh on cuda:0 (tiny models of two families: a correct GPU passes,
#      the test-only fault switch is named by the bisection);
#   3. `ringctl verify` over the 4-layer GLM-5.2-dims slice (3 dense + 1 MoE layer, DSA,
#      IndexShare; random mxfp4 weights from `ringctl synth`): short prompt, then with a wrong
#      scale on one mxfp4 group of the MoE experts (must be named), then a prompt longer than
#      index_topk (sparse path) as time allows;
#   4. the fingerprint's cost per step (hop_bench) next to the slice's GPU decode step time;
#   5. the hot-path cost of shadow checks: the slice's decode through a CUDA ring-worker with
#      --shadow-rate 0 and 1 (every step captured and queued for the CPU);
#   6. shadow checks under load: bench/ring_bench with 8 concurrent sequences x ROUNDS rounds
#      (distinct ids, so the worker's per-sequence sampling sees 8 x ROUNDS sequences) through
#      one CUDA worker, at --shadow-rate 0, 0.01, 0, 0.01, 0, 0.01 (alternated against drift)
#      and 0.1; the worker's shadow statistics (mirrored sequences, per-layer differences and
#      noise floors, divergences) after each run;
#   7. verify of the slice with fp32 activations (no noise floor): 32-token prompt, then the
#      LONG_TOKENS prompt as time allows.
#
#   bench/gpu/verify_h200.sh BUNDLE_DIR   (bin/ringctl, bin/ring-worker, bin/hop_bench,
#                                          bin/ring_bench)
#   PARTS="2 3" bench/gpu/verify_h200.sh BUNDLE_DIR   (only those parts; default all)
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: $0 BUNDLE_DIR" >&2; exit 2; }
bundle=$(cd "$1" && pwd)
out=${OUT:-$PWD/gpu_out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$bundle/lib:${LD_LIBRARY_PATH:-}"
R=$bundle/bin/ringctl
W=$bundle/bin/ring-worker
log=$out/verify_h200.txt
budget=${BUDGET_S:-560}
m=/tmp/ring_glm52x4
want() { [[ " ${PARTS:-1 2 3 4 5 6 7} " == *" $1 "* ]]; }
toks() { python3 -c "print(','.join(str((i * 7919 + $2) % 154000 + 10) for i in range($1)))"; }
start_worker() {  # start_worker LOGNAME ARGS... -> sets WPID, WADDR
  "$W" --listen 127.0.0.1:0 --model-root /tmp --device cuda:0 "${@:2}" > /tmp/$1.out 2> /tmp/$1.err &
  WPID=$!
  for _ in $(seq 100); do grep -q "listening on" /tmp/$1.out 2>/dev/null && break; sleep 0.2; done
  WADDR=$(awk '/listening on/ {print $NF}' /tmp/$1.out)
}
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  if want 1; then
  echo "== 1. attestation"
  start_worker att
  cat /tmp/att.err
  "$R" describe --worker "$WADDR"
  kill $WPID; wait $WPID 2>/dev/null
  fi

  if want 2; then
  echo "== 2. verify_cli_test.sh on cuda:0"
  bash tests/verify_cli_test.sh "$R" /tmp/vcli cuda:0 | tail -3; echo "rc=${PIPESTATUS[0]}"
  cat /tmp/vcli/glm.txt
  fi

  if want 3 || want 5 || want 6 || want 7; then
  echo "== 3. GLM-5.2 slice"
  t0=$SECONDS
  "$R" synth --arch glm_moe_dsa --preset glm-5.2 --layers 4 --quant mxfp4 --out "$m" --quiet
  echo "(synth took $((SECONDS - t0)) s)"
  fi
  if want 3; then
  echo "-- 3a. verify, 32-token prompt + 2 decode steps, with the noise floor"
  t0=$SECONDS
  timeout 300 "$R" verify --model "$m" --layers 0-3 --device cuda:0 --prompt-len 32 --decode-steps 2 --noise-floor
  echo "rc=$? ($((SECONDS - t0)) s)"
  echo "-- 3b. verify with a wrong scale on one mxfp4 group of layer 3's routed experts (gate_proj)"
  t0=$SECONDS
  timeout 300 "$R" verify --model "$m" --layers 0-3 --device cuda:0 --prompt-len 16 --decode-steps 0 \
    --test-fault scale:layers.3.mlp.switch_mlp.gate_proj | tail -4
  echo "rc=${PIPESTATUS[0]} ($((SECONDS - t0)) s)"
  fi

  if want 4; then
  echo "== 4. fingerprint cost vs GPU decode step"
  "$bundle/bin/hop_bench" --iters 1000 | tail -6
  timeout 120 "$R" logits --model "$m" --tokens "$(toks 16 5)" --decode 32 --backend cuda --timing \
    --out /tmp/dec.npy | tail -3
  fi

  # with_shadow_worker RATE LOG DESCRIBE_GREP CMD...: one CUDA worker at that shadow rate,
  # CMD run against it (its address in the environment as WADDR), then its shadow statistics.
  with_shadow_worker() {
    local rate=$1 name=$2 pick=$3
    shift 3
    start_worker "$name" --shadow-rate "$rate"
    export WADDR
    timeout 240 "$@" | tail -3
    echo "rc=${PIPESTATUS[0]} (shadow rate $rate)"
    "$R" describe --worker "$WADDR" | grep -E "$pick" || true
    kill $WPID; wait $WPID 2>/dev/null
  }
  if want 5; then
  echo "== 5. shadow checks: hot-path cost (slice decode through one CUDA worker)"
  for rate in 0 1; do
    with_shadow_worker $rate shadow$rate "shadow|health" bash -c '"$0" logits --workers "$WADDR" \
      --model ring_glm52x4 --tokens "$1" --decode 32 --timing --out /tmp/sh.npy' "$R" "$(toks 16 5)"
  done
  fi

  if want 6; then
  echo "== 6. shadow checks under load (ring_bench: 8 sequences x ${ROUNDS:-40} rounds, 16-token prompt, 32 decode steps)"
  for rate in ${RATES:-0 0.01 0 0.01 0 0.01 0.1}; do
    with_shadow_worker $rate load$rate "^shadow|^  layer|divergence|^kv" bash -c '"$0" --workers "$WADDR" \
      --model ring_glm52x4 --sequences 8 --rounds "$1" --decode 32 --prompt 16' \
      "$bundle/bin/ring_bench" "${ROUNDS:-40}"
  done
  fi

  if want 7; then
  echo "== 7a. verify with fp32 activations, 32-token prompt + 2 decode steps, no noise floor"
  t0=$SECONDS
  timeout 300 "$R" verify --model "$m" --layers 0-3 --device cuda:0 --prompt-len 32 --decode-steps 2 --act f32
  echo "rc=$? ($((SECONDS - t0)) s)"
  left=$((budget - SECONDS))
  echo "== 7b. verify with fp32 activations, ${LONG_TOKENS:-2080}-token prompt + 1 decode step ($left s left)"
  if [ $left -gt 60 ]; then
    t0=$SECONDS
    timeout $left "$R" verify --model "$m" --layers 0-3 --device cuda:0 --act f32 \
      --prompt-len "${LONG_TOKENS:-2080}" --decode-steps 1
    echo "rc=$? ($((SECONDS - t0)) s)"
  else
    echo "skipped: not enough time left in this call"
  fi
  fi

  if want 3; then
  left=$((budget - SECONDS))
  echo "== 3c. verify, ${LONG_TOKENS:-2080}-token prompt (> index_topk 2048) + 1 decode step ($left s left)"
  if [ $left -gt 60 ]; then
    t0=$SECONDS
    timeout $left "$R" verify --model "$m" --layers 0-3 --device cuda:0 \
      --prompt-len "${LONG_TOKENS:-2080}" --decode-steps 1 --noise-floor
    echo "rc=$? ($((SECONDS - t0)) s)"
  else
    echo "skipped: not enough time left in this call"
  fi
  fi
} > "$log" 2>&1
tail -5 "$log"
