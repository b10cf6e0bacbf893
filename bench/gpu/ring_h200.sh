#!/usr/bin/env bash
# A ring with GPU stages on the H200 machine, end to end through the product path:
#   1. mixed ring (CPU worker + CUDA worker) and all-GPU ring (two CUDA workers on one GPU)
#      vs the single-process CPU engine: `ringctl logits --workers`, fp32 activations,
#      NMSE per row and greedy tokens;
#   2. ring-server over the two CUDA workers: /ready, a greedy completion from token ids
#      (its text must be the CPU engine's greedy tokens, decoded), a chat completion.
# Output under $OUT. Usage: bench/gpu/ring_h200.sh BUNDLE_DIR
#   BUNDLE_DIR: bin/{ringctl,ring-worker,ring-server} lib/... (deploy/bundle.sh)
source "$(dirname "$0")/ring_lib.sh" "$1" ring_out
"$bin/ringctl" synth --arch glm_moe_dsa --preset tiny --quant mxfp4 --seed 1 --out "$root/tiny-glm" > /dev/null
start_worker w_cpu.log cpu; cpu=$ADDR
start_worker w_gpu1.log cuda:0; gpu1=$ADDR
start_worker w_gpu2.log cuda:0; gpu2=$ADDR
echo "workers: cpu $cpu, gpu $gpu1 $gpu2" | tee "$out/ring.txt"
# 24 tokens > index_topk 16: the sparse DSA path runs.
TOK=$(python3 -c "print(','.join(str(7*i%1000+1) for i in range(24)))")
common=(--tokens "$TOK" --prefill-chunk 10 --decode 16 --act f32)
"$bin/ringctl" logits --model "$root/tiny-glm" "${common[@]}" --out "$out/cpu.npy" 2>> "$out/ring.txt"
"$bin/ringctl" logits --workers "$cpu,$gpu1" --model tiny-glm "${common[@]}" --out "$out/mixed.npy" 2>> "$out/ring.txt"
"$bin/ringctl" logits --workers "$gpu1,$gpu2" --model tiny-glm "${common[@]}" --out "$out/gpu.npy" 2>> "$out/ring.txt"
python3 - "$out" <<'PY' | tee -a "$out/ring.txt"
import sys, numpy as np
out = sys.argv[1]
ref = np.load(f"{out}/cpu.npy").astype(np.float64)
for name in ["mixed", "gpu"]:
    x = np.load(f"{out}/{name}.npy").astype(np.float64)
    nmse = ((x - ref) ** 2).sum(1) / (ref ** 2).sum(1)
    print(f"{name} ring vs CPU engine: rows {len(ref)}, max per-row NMSE {nmse.max():.3e}, "
          f"argmax agreement {np.mean(x.argmax(1) == ref.argmax(1)) * 100:.1f}%")
PY
tiny_glm_server_toml "$out/ring.toml" "$gpu1" "$gpu2"
"$bin/ring-server" --config "$out/ring.toml" > "$out/server.out" 2> "$out/server.log" &
pids+=($!)
for _ in $(seq 100); do grep -q "listening on" "$out/server.out" && break; sleep 0.1; done
port=$(grep -o 'http://[^ ]*' "$out/server.out" | head -1 | sed 's/.*://')
python3 - "$port" "$TOK" "$root/tiny-glm" "$out" <<'PY' | tee -a "$out/ring.txt"
import json, sys, time, urllib.request
port, tok, model_dir, out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
def call(path, body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status, json.loads(r.read())
deadline = time.time() + 60
while time.time() < deadline:
    try:
        st, ready = call("/ready")
        if st == 200:
            break
    except Exception:
        time.sleep(0.2)
print("ready:", json.dumps(ready))
ids = [int(t) for t in tok.split(",")]
st, c = call("/v1/completions", {"model": "tiny-glm", "prompt": ids, "max_tokens": 16, "temperature": 0, "ignore_eos": True})
print("completion (GPU ring, greedy):", json.dumps(c["choices"][0]["text"]), c["usage"])
st, chat = call("/v1/chat/completions", {"model": "tiny-glm", "max_tokens": 12, "seed": 3,
                                         "messages": [{"role": "user", "content": "Hello from the H200"}]})
print("chat:", json.dumps(chat["choices"][0]["message"]), chat["usage"])
json.dump({"completion": c, "chat": chat}, open(f"{out}/api.json", "w"), indent=1)
PY
# Expected greedy text: the CPU engine's decode tokens, decoded by the C++ tokenizer.
cpu_tokens=$(grep -o 'decode tokens:[0-9 ]*' "$out/ring.txt" | head -1 | sed 's/decode tokens: //' | tr ' ' ',')
echo "{\"ids\": [$cpu_tokens]}" | "$bin/ringctl" tokenize --model "$root/tiny-glm" --skip-special > "$out/cpu_text.json" 2>&1
echo "CPU engine greedy tokens: $cpu_tokens -> $(cat "$out/cpu_text.json")" | tee -a "$out/ring.txt"
# Sampling on the GPU's last stage (closed ring, the default topology) vs the CPU engine
# in process: seeded requests with temperature, top-k/top-p/min-p, penalties and logprobs.
sed -e '/^workers/d' -e "s|^path = .*|path = \"$root/tiny-glm\"|" "$out/ring.toml" > "$out/cpu.toml"
"$bin/ring-server" --config "$out/cpu.toml" > "$out/cpu_server.out" 2> "$out/cpu_server.log" &
pids+=($!)
for _ in $(seq 100); do grep -q "listening on" "$out/cpu_server.out" && break; sleep 0.1; done
cport=$(grep -o 'http://[^ ]*' "$out/cpu_server.out" | head -1 | sed 's/.*://')
python3 - "$port" "$cport" "$TOK" <<'PY' | tee -a "$out/ring.txt"
import json, sys, urllib.request
gport, cport, tok = sys.argv[1], sys.argv[2], sys.argv[3]
def call(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())["choices"][0]
ids = [int(t) for t in tok.split(",")]
cases = {"temperature 0.9": dict(temperature=0.9, seed=1),
         "top-k 8 + top-p 0.9": dict(temperature=1.1, top_k=8, top_p=0.9, seed=2),
         "min-p + penalties": dict(temperature=0.8, min_p=0.05, frequency_penalty=0.5, presence_penalty=0.3, seed=3),
         "greedy + logprobs": dict(temperature=0)}
for name, params in cases.items():
    body = {"model": "tiny-glm", "prompt": ids, "max_tokens": 24, "ignore_eos": True, "logprobs": 3, **params}
    g, c = call(gport, body), call(cport, body)
    gl, cl = g["logprobs"]["token_logprobs"], c["logprobs"]["token_logprobs"]
    same = g["logprobs"]["tokens"] == c["logprobs"]["tokens"]
    worst = max(abs(a - b) for a, b in zip(gl, cl))
    print(f"GPU-sampled closed ring vs CPU engine, {name}: tokens {'identical' if same else 'DIFFER'} "
          f"({len(gl)} tokens), max |logprob diff| {worst:.2e}")
PY
