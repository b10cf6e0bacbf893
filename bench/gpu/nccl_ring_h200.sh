#!/usr/bin/env bash
# NCCL between closed-ring stages on one host (issue 4), on the 2x H200 machine:
#   (a) tiny GLM on two CUDA workers (cuda:0, cuda:1) with --nccl-min-bytes 1, so every
#       hidden-state frame takes NCCL; ring-server, closed topology: with transport auto
#       the hop must report nccl and the workers count NCCL bytes; the greedy completion
#       must be identical with transport grpc, and is compared with the CPU engine's.
#   (b) throughput, bench/ring_bench --closed 1, transports grpc and auto, default
#       --nccl-min-bytes: a long prompt (prefill chunks big enough for NCCL) and decode, on
#       qwen3-0.6b (hidden 1024) and, with BIG=1, a 4-layer GLM-5.2 (hidden 6144).
# Output under $OUT (summary.txt, worker/server logs, bench JSON lines).
# Usage: bench/gpu/nccl_ring_h200.sh BUNDLE_DIR
#   PARTS="a b" (default) picks the parts; DEV0/DEV1 (cuda:0, cuda:1) the devices (a CPU
#   smoke test of the script: DEV0=cpu DEV1=cpu PARTS=a).
#   BUNDLE_DIR: bin/{ring-worker,ring-server,ringctl,ring_bench} lib/... (deploy/bundle.sh)
source "$(dirname "$0")/ring_lib.sh" "$1" nccl_ring_out
export NCCL_NVLS_ENABLE=0  # NVLink multicast (NVLS) is off on these machines
if [ -z "${RING_NCCL_LIBRARY:-}" ]; then
  if nccl_dir=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null); then
    export RING_NCCL_LIBRARY=$nccl_dir/lib
  fi
fi
dev0=${DEV0:-cuda:0}
dev1=${DEV1:-cuda:1}
parts=" ${PARTS:-a b} "
log() { echo "$*" | tee -a "$out/summary.txt"; }
die() { log "FAILED: $*"; exit 1; }
log "RING_NCCL_LIBRARY=${RING_NCCL_LIBRARY:-unset (loader path)}"
nvidia-smi --query-gpu=index,name --format=csv,noheader >> "$out/summary.txt" 2>&1

nccl_bytes() {  # METRICS_ADDR DIRECTION
  python3 - "$1" "$2" <<'PY'
import sys, urllib.request
text = urllib.request.urlopen(f"http://{sys.argv[1]}/metrics", timeout=10).read().decode()
for line in text.splitlines():
    if line.startswith("ring_worker_nccl_bytes_total") and f'direction="{sys.argv[2]}"' in line:
        print(int(float(line.split()[-1]))); break
else:
    print(0)
PY
}

# ---------------------------------------------------------------- (a) correctness
if [[ $parts == *" a "* ]]; then
timeout 120 "$bin/ringctl" synth --arch glm_moe_dsa --preset tiny --quant mxfp4 --seed 1 \
  --out "$root/tiny-glm" > "$out/synth_tiny.txt" 2>&1 || die "synth tiny"
start_worker a_w0.log "$dev0" --nccl-min-bytes 1; w0=$ADDR; m0=$METRICS
start_worker a_w1.log "$dev1" --nccl-min-bytes 1; w1=$ADDR; m1=$METRICS
log "(a) workers $w0 ($dev0, metrics $m0), $w1 ($dev1, metrics $m1)"
# 40 tokens > index_topk 16: the sparse DSA path runs.
TOK=$(python3 -c "print(','.join(str(7*i%1000+1) for i in range(40)))")
timeout 120 "$bin/ringctl" logits --model "$root/tiny-glm" --tokens "$TOK" --decode 16 --act f32 \
  --out "$out/cpu.npy" > "$out/cpu_logits.txt" 2>&1 || die "CPU engine logits"
cpu_tokens=$(grep -o 'decode tokens:[0-9 ]*' "$out/cpu_logits.txt" | head -1 | sed 's/decode tokens: //' | tr ' ' ',')

run_server() {  # TRANSPORT: one greedy completion through ring-server -> $out/completion_TRANSPORT.json
  local transport=$1
  tiny_glm_server_toml "$out/ring_$transport.toml" "$w0" "$w1"
  printf 'topology = "closed"\ntransport = "%s"\n' "$transport" >> "$out/ring_$transport.toml"
  "$bin/ring-server" --config "$out/ring_$transport.toml" > "$out/server_$transport.out" 2> "$out/server_$transport.log" &
  local spid=$!
  pids+=($spid)
  for _ in $(seq 600); do grep -q "listening on" "$out/server_$transport.out" && break; sleep 0.1; done
  local port
  port=$(grep -o 'http://[^ ]*' "$out/server_$transport.out" | head -1 | sed 's/.*://')
  [ -n "$port" ] || die "ring-server ($transport) did not start (see server_$transport.log)"
  timeout 120 python3 - "$port" "$TOK" "$out/completion_$transport.json" <<'PY' || die "completion ($transport)"
import json, sys, time, urllib.request
port, tok, path = sys.argv[1], sys.argv[2], sys.argv[3]
def call(p, body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{p}", data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status, json.loads(r.read())
deadline = time.time() + 60
while True:
    try:
        if call("/ready")[0] == 200: break
    except Exception:
        pass
    if time.time() > deadline: sys.exit("not ready within 60 s")
    time.sleep(0.2)
ids = [int(t) for t in tok.split(",")]
_, c = call("/v1/completions", {"model": "tiny-glm", "prompt": ids, "max_tokens": 16, "temperature": 0, "ignore_eos": True})
json.dump(c, open(path, "w"), indent=1)
print(json.dumps(c["choices"][0]["text"]), c["usage"])
PY
  kill "$spid" 2>/dev/null
  for _ in $(seq 100); do kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$spid" 2>/dev/null
}

before=$(nccl_bytes "$m1" received)
run_server auto | sed 's/^/(a) auto: /' | tee -a "$out/summary.txt"
after=$(nccl_bytes "$m1" received)
log "(a) coordinator: $(grep -h 'ring: stage' "$out/server_auto.log" | tr '\n' ' ')"
log "(a) worker 0 hop: $(grep -h 'next:' "$out/a_w0.log" | tail -1)"
log "(a) NCCL bytes received by $dev1 during the auto run: $((after - before))"
grep -q 'next: .*nccl (' "$out/a_w0.log" || log "(a) CHECK FAILED: stage 0 -> stage 1 did not report nccl"
[ "$((after - before))" -gt 0 ] || log "(a) CHECK FAILED: no bytes went over NCCL"
run_server grpc | sed 's/^/(a) grpc: /' | tee -a "$out/summary.txt"
log "(a) worker 0 hop after the grpc run: $(grep -h 'next:' "$out/a_w0.log" | tail -1)"
echo "{\"ids\": [$cpu_tokens]}" | "$bin/ringctl" tokenize --model "$root/tiny-glm" --skip-special \
  > "$out/cpu_text.json" 2>&1
python3 - "$out" <<'PY' | tee -a "$out/summary.txt"
import json, sys
out = sys.argv[1]
auto = json.load(open(f"{out}/completion_auto.json"))["choices"][0]["text"]
grpc = json.load(open(f"{out}/completion_grpc.json"))["choices"][0]["text"]
try:
    cpu = json.load(open(f"{out}/cpu_text.json"))
    cpu = cpu.get("decoded", cpu) if isinstance(cpu, dict) else cpu
except Exception as e:
    cpu = f"(unreadable: {e})"
print("(a) greedy text auto == grpc:", auto == grpc, "| auto == CPU engine:", auto == cpu)
print("(a)   auto:", json.dumps(auto)); print("(a)   grpc:", json.dumps(grpc)); print("(a)   cpu: ", json.dumps(cpu))
PY
for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
sleep 1
fi

# ---------------------------------------------------------------- (b) throughput
if [[ $parts == *" b "* ]]; then
timeout 180 "$bin/ringctl" synth --preset qwen3-0.6b --quant affine --bits 4 --out "$root/qwen" \
  > "$out/synth_qwen.txt" 2>&1 || die "synth qwen3-0.6b"
models=(qwen)
if [ "${BIG:-0}" = 1 ]; then
  timeout 300 "$bin/ringctl" synth --arch glm_moe_dsa --preset glm-5.2 --layers 4 --quant mxfp4 \
    --out "$root/glm4" > "$out/synth_glm4.txt" 2>&1 && models+=(glm4) || log "(b) synth glm-5.2 x4 failed: skipped"
fi
start_worker b_w0.log "$dev0"; w0=$ADDR; m0=$METRICS
start_worker b_w1.log "$dev1"; w1=$ADDR; m1=$METRICS
log "(b) workers $w0 ($dev0), $w1 ($dev1), default --nccl-min-bytes"
for model in "${models[@]}"; do
  for shape in "prompt 2048 prefill-chunk 512 decode 16" "prompt 16 prefill-chunk 0 decode 128"; do
    read -r _ prompt _ chunk _ decode <<< "$shape"
    for transport in grpc auto; do
      before=$(nccl_bytes "$m0" sent)
      line=$(timeout 300 "$bin/ring_bench" --workers "$w0,$w1" --model "$model" --closed 1 \
        --transport "$transport" --act bf16 --prompt "$prompt" --prefill-chunk "$chunk" \
        --decode "$decode" 2>> "$out/bench_stderr.txt" | tail -1)
      after=$(nccl_bytes "$m0" sent)
      log "(b) $model $transport: ${line:-FAILED (see bench_stderr.txt)} nccl_bytes_sent=$((after - before))"
    done
  done
done
fi
log "done"
