# Sourced by the bench/gpu ring scripts: the bundle's environment, worker processes that
# are killed when the script exits, and a bounded wait for each to listen.
#   source "$(dirname "$0")/ring_lib.sh" "$1" DEFAULT_OUT_NAME
# sets bundle, bin, out (= $OUT or $PWD/DEFAULT_OUT_NAME), work (a temp dir), root
# (= $work/models) and pids; start_worker sets ADDR and METRICS.
set -uo pipefail
bundle=$(cd "$1" && pwd)
out=${OUT:-$PWD/$2}
mkdir -p "$out"
bin=$bundle/bin
export LD_LIBRARY_PATH="$bundle/lib:${LD_LIBRARY_PATH:-}"
work=$(mktemp -d)
root=$work/models
pids=()
ring_cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  sleep 1
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap ring_cleanup EXIT

# start_worker LOG DEVICE [FLAGS...]: a ring-worker on a free port, its log in $out/LOG;
# waits up to 30 s for it to listen, then sets ADDR and METRICS (its /metrics host:port).
# Not in a $(...) subshell: the pid must reach `pids` for the cleanup.
start_worker() {
  local name=$1 dev=$2
  shift 2
  "$bin/ring-worker" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --model-root "$root" \
    --device "$dev" "$@" > "$out/$name" 2>&1 &
  pids+=($!)
  for _ in $(seq 300); do grep -q "listening on" "$out/$name" && break; sleep 0.1; done
  local line
  line=$(grep -m1 "listening on" "$out/$name") || { echo "$name: worker did not start" >&2; exit 1; }
  ADDR=$(echo "$line" | awk '{print $4}')
  METRICS=$(echo "$line" | sed -n 's|.*metrics http://\([^/]*\)/metrics.*|\1|p')
}

# tiny_glm_server_toml FILE WORKER...: a ring-server config (loopback, no API keys, no
# admin service) serving $root/tiny-glm with f32 activations over these workers; more
# [ring] keys may be appended to FILE.
tiny_glm_server_toml() {
  local file=$1 list
  shift
  list=$(printf '"%s", ' "$@")
  cat > "$file" <<TOML
[server]
listen = "127.0.0.1:0"
admin_listen = "off"
auth = "disabled"
[model]
name = "tiny-glm"
path = "tiny-glm"
local_dir = "$root/tiny-glm"
act_dtype = "f32"
[ring]
workers = [${list%, }]
TOML
}
