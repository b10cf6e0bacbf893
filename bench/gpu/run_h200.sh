#!/usr/bin/env bash
# Runs the CUDA op harness (full shapes) and the GEMV benchmark from a bundle of built
# binaries and writes their output under $OUT (the device machine's result folder).
#
#   bench/gpu/run_h200.sh BUNDLE_DIR
#
# BUNDLE_DIR is what deploy/bundle.sh made from a build on the dev machine:
#   deploy/bundle.sh gpu_bundle build/kernels/cuda_decode_test \
#       build/kernels/cuda_ops_harness_test build/bench/gpu_gemv_bench
# The bundle carries libcudart and the Abseil/gtest libraries; cuBLAS is not bundled (it
# is hundreds of MB): the benchmark dlopens the device image's libcublas.so.13 when found.
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: $0 BUNDLE_DIR" >&2; exit 2; }
bundle=$(cd "$1" && pwd)
out=${OUT:-$PWD/gpu_out}
mkdir -p "$out"
bin=$bundle/bin

source "$(dirname "$0")/cublas_path.sh"
export LD_LIBRARY_PATH="$bundle/lib:$cublas_dirs:${LD_LIBRARY_PATH:-}"

status=0
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total,temperature.gpu --format=csv || true
} > "$out/device.txt" 2>&1

"$bin/cuda_decode_test" --gtest_color=no > "$out/decode_test.txt" 2>&1 || status=1

# Full harness: every op x mode plus the GLM-5.2 / Qwen3-8B shapes (CPU reference and test
# data on all cores: ~20 s on 16 cores).
RING_GPU_FULL=1 "$bin/cuda_ops_harness_test" --gtest_color=no > "$out/harness.txt" 2>&1 || status=1

"$bin/gpu_gemv_bench" ${BENCH_ARGS:-} > "$out/bench.txt" 2>&1 || status=1

grep -E "PASSED|FAILED|SKIPPED" "$out/decode_test.txt" "$out/harness.txt" | tail -20
grep -E "cases,|FAIL \|" "$out/harness.txt" | head -40
cat "$out/bench.txt"
exit $status
