#!/usr/bin/env bash
# Where a ring stage's decode step goes, on the GPU machine: N ring-workers (one set) under
# the kernel trace (bench/gpu/kernel_trace.cc, every process its own file, runtime-API
# records on), one ring_bench round at 1 sequence, then bench/gpu/ring_trace_report.py over
# the workers in ring order and over each one-process baseline run.
#   bench/gpu/ring_trace_h200.sh BUNDLE_DIR [DEVICES] [STAGES] [RING_BENCH ARGS...]
#   BUNDLE_DIR: bin/{ring-worker,ring_bench,ringctl}, lib/ with libring_kernel_trace.so and
#   libcupti (deploy/bundle.sh); DEVICES: comma list (default cuda:0; several stages on one
#   GPU need CUDA MPS running); STAGES: default 4; e.g.
#   bench/gpu/ring_trace_h200.sh B cuda:0,cuda:1,cuda:2,cuda:3 4 --preset qwen3-8b --layers 36 --decode 64
# Output under $OUT (default /tmp/ring_trace): the bench's output, the workers' logs
# (RING_WORKER_STEP_STATS=1), the reports and the compressed traces.
set -euo pipefail
B=$(cd "$1" && pwd); DEVICES=${2:-cuda:0}; STAGES=${3:-4}; shift $(( $# < 3 ? $# : 3 ))
OUT=${OUT:-/tmp/ring_trace}; mkdir -p "$OUT"
work=$(mktemp -d); tr="$work/traces"; mkdir -p "$tr"
export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
CUDA_INJECTION64_PATH="$B/lib/libring_kernel_trace.so" RING_KERNEL_TRACE="$tr/%p.txt" RING_KERNEL_TRACE_API=1 \
RING_WORKER_STEP_STATS=1 python3 "$(dirname "$0")/../ring_bench.py" --bindir "$B/bin" --work "$work" \
  --devices "$DEVICES" --stages "$STAGES" --sequences 1 --rounds 1 "$@" > "$OUT/bench.txt" 2>&1
cp "$work"/worker_*.log "$OUT/" 2>/dev/null || true
# Processes that ran CUDA, in start order: the workers first (ring order), then the
# one-process baselines (ring_bench.py runs one before and one after the rings).
mapfile -t traces < <(ls "$tr" | sort -n | while read -r f; do
                        grep -q '^K' "$tr/$f" && echo "$tr/$f"; done)
report="$(dirname "$0")/ring_trace_report.py"
python3 "$report" "${traces[@]:0:$STAGES}" | tee "$OUT/report.txt"
for t in "${traces[@]:$STAGES}"; do python3 "$report" "$t" | tee -a "$OUT/report.txt"; done
xz -T4 -1 "$tr"/*.txt && cp -r "$tr" "$OUT/"
rm -rf "$work"
