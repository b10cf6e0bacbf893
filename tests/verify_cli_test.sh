#!/usr/bin/env bash
# `ringctl verify` as a user runs it: exit status, the human report and --json.
#   verify_cli_test.sh RINGCTL WORKDIR [DEVICE]
# DEVICE defaults to cpu (the CPU engine against itself, plus the test-only fault switch on
# the device side); with cuda:N it checks that GPU (exit 77 = skipped when the build or the
# machine has no CUDA device).
set -euo pipefail
RINGCTL=$1 WORK=$2 DEVICE=${3:-cpu}
rm -rf "$WORK" && mkdir -p "$WORK"
fail() { echo "FAIL: $*" >&2; exit 1; }

"$RINGCTL" synth --arch glm_moe_dsa --preset tiny --layers 4 --seed 3 --out "$WORK/glm" --quiet
"$RINGCTL" synth --arch qwen3_moe --preset tiny --layers 3 --seed 3 --out "$WORK/qwen" --quiet
if [[ $DEVICE != cpu ]]; then
  # No CUDA backend in this build (UNIMPLEMENTED) or no such device (FAILED_PRECONDITION).
  if ! out=$("$RINGCTL" verify --model "$WORK/glm" --layers 0 --device "$DEVICE" 2>&1); then
    if grep -q "UNIMPLEMENTED\|FAILED_PRECONDITION" <<<"$out"; then echo "skipped: $out"; exit 77; fi
  fi
fi

# A correct device: exit 0, PASS, every layer listed.
for m in glm qwen; do
  "$RINGCTL" verify --model "$WORK/$m" --layers 0-2 --device "$DEVICE" --prompt-len 20 \
      > "$WORK/$m.txt" || { cat "$WORK/$m.txt"; fail "$m: clean verify exited $?"; }
  grep -q "^PASS" "$WORK/$m.txt" || fail "$m: no PASS"
done

# --noise-floor (docs/operations.md): each layer also shows the checkpoint's own noise
# floor (the CPU engine against itself with jittered matmuls), and a correct device passes.
"$RINGCTL" verify --model "$WORK/glm" --layers 0-3 --device "$DEVICE" --prompt-len 20 --noise-floor \
    > "$WORK/floor.txt" || { cat "$WORK/floor.txt"; fail "--noise-floor verify exited $?"; }
grep -q "^PASS" "$WORK/floor.txt" || fail "--noise-floor: no PASS"
grep -q "floor rel" "$WORK/floor.txt" || fail "--noise-floor: no floor column: $(cat "$WORK/floor.txt")"

# A wrong scale on one mxfp4 group of one matrix: exit 1, the op is named.
set +e
"$RINGCTL" verify --model "$WORK/glm" --layers 0-3 --device "$DEVICE" --prompt-len 20 \
    --test-fault scale:layers.1.self_attn.kv_a_proj_with_mqa > "$WORK/fault.txt"
rc=$?
"$RINGCTL" verify --model "$WORK/glm" --layers 0-3 --device "$DEVICE" --prompt-len 20 --json \
    --test-fault scale:layers.1.self_attn.kv_a_proj_with_mqa > "$WORK/fault.json"
rcj=$?
"$RINGCTL" verify --model "$WORK/glm" --layers 9 > "$WORK/usage.txt" 2>&1
rcu=$?
"$RINGCTL" verify --model "$WORK/glm" --layers 1-x > "$WORK/usage2.txt" 2>&1
rcu2=$?
set -e
cat "$WORK/fault.txt"
[[ $rc == 1 && $rcj == 1 ]] || fail "fault: exit $rc / $rcj, expected 1"
grep -q "^FAIL" "$WORK/fault.txt" || fail "fault: no FAIL line"
grep -q "wrong on its own: op #[0-9]* Linear (model.layers.1.self_attn.kv_a_proj_with_mqa)" "$WORK/fault.txt" ||
  fail "fault: the diagnosis does not name kv_a_proj_with_mqa"
grep -q '"detail": "model.layers.1.self_attn.kv_a_proj_with_mqa"' "$WORK/fault.json" ||
  fail "fault: --json culprit missing"
grep -q '"ok": false' "$WORK/fault.json" || fail "fault: --json ok is not false"
[[ $rcu == 1 ]] && grep -q "not inside" "$WORK/usage.txt" || fail "layer 9 of 4: $(cat "$WORK/usage.txt")"
[[ $rcu2 == 2 ]] && grep -q "expected A-B" "$WORK/usage2.txt" || fail "bad --layers: $(cat "$WORK/usage2.txt")"
# ringctl bench on the same device: bandwidth probed, decode timed, a fraction reported.
"$RINGCTL" bench --model "$WORK/glm" --layers 0-3 --device "$DEVICE" --prompt-len 8 --decode 4 --json \
    > "$WORK/bench.json" || fail "bench exited $?"
python3 - "$WORK/bench.json" <<'PY' || fail "bench: $(cat "$WORK/bench.json")"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["bandwidth_bytes_per_s"] > 0 and j["decode_bytes_per_token"] > 0, j
assert j["decode_tokens_per_s"] > 0 and 0 < j["fraction_of_roofline"], j
print(f"bench: {j['decode_tokens_per_s']:.1f} tok/s, {100 * j['fraction_of_roofline']:.1f}% of roofline")
PY
echo "verify_cli_test ($DEVICE): OK"
