#!/usr/bin/env bash
# The run command: installs dependencies, builds, synthesizes the bundled tiny GLM-5.2-style
# checkpoint (mxfp4, DSA indexer with IndexShare, tokenizer + chat template), starts three
# ring-worker processes on loopback (CPU backend), checks that the ring's logits are
# bit-identical to a single in-process run, then serves the OpenAI API through the ring with
# ring-server on http://127.0.0.1:${PORT:-8000} until Ctrl-C.
#
#   bash deploy/run_local.sh                  # API key: $RINGSERVE_API_KEY or sk-ringserve-local
#   PORT=9000 bash deploy/run_local.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install_deps.sh
BUILD=${BUILD_DIR:-build}
PORT=${PORT:-8000}
export RINGSERVE_API_KEY=${RINGSERVE_API_KEY:-sk-ringserve-local}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRING_ENABLE_CUDA=OFF >/dev/null
ninja -C "$BUILD" ringctl ring-worker ring-server
ROOT="$(cd "$BUILD" && pwd)/models"
MODEL=tiny-glm
[ -f "$ROOT/$MODEL/config.json" ] || "$BUILD/server/ringctl" synth --arch glm_moe_dsa \
  --preset tiny --quant mxfp4 --seed 1 --out "$ROOT/$MODEL"
"$BUILD/server/ringctl" inspect "$ROOT/$MODEL"

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
addrs=()
for i in 0 1 2; do
  log="$BUILD/ring-worker-$i.log"
  "$BUILD/worker/ring-worker" --listen 127.0.0.1:0 --model-root "$ROOT" > "$log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do grep -q "listening on" "$log" && break; sleep 0.1; done
  addrs+=("$(grep -o 'listening on [^ ]*' "$log" | awk '{print $3}')")
done
workers=$(IFS=,; echo "${addrs[*]}")
echo "ring: $workers"
TOKENS=11,22,33,44,55,66,77,88,99,100,101,102,103,104,105,106,107,108,109,110
"$BUILD/server/ringctl" logits --workers "$workers" --model "$MODEL" --tokens "$TOKENS" \
  --prefill-chunk 8 --decode 16 --act f32 --out "$BUILD/ring.npy"
"$BUILD/server/ringctl" logits --model "$ROOT/$MODEL" --tokens "$TOKENS" \
  --prefill-chunk 8 --decode 16 --act f32 --out "$BUILD/local.npy"
cmp "$BUILD/ring.npy" "$BUILD/local.npy" && echo "ring of 3 workers == one process (bit-identical logits)"

cat > "$BUILD/ring.toml" <<TOML
[server]
listen = "127.0.0.1:$PORT"
admin_listen = "127.0.0.1:$((PORT + 1))"
api_key_env = "RINGSERVE_API_KEY"
[model]
name = "$MODEL"
path = "$MODEL"
local_dir = "$ROOT/$MODEL"
[ring]
workers = [$(printf '"%s",' "${addrs[@]}" | sed 's/,$//')]
TOML
echo "config: $BUILD/ring.toml"
echo "try:  curl -s http://127.0.0.1:$PORT/v1/chat/completions -H \"Authorization: Bearer \$RINGSERVE_API_KEY\" \\"
echo "        -H 'Content-Type: application/json' \\"
echo "        -d '{\"model\": \"$MODEL\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}], \"max_tokens\": 16}'"
"$BUILD/server/ring-server" --config "$BUILD/ring.toml" &
pids+=($!)
wait "${pids[-1]}"
