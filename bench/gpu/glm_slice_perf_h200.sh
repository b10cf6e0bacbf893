#!/usr/bin/env bash
# GLM-5.2 4-layer slice (3 dense layers with a full DSA indexer + 1 MoE layer with an
# IndexShare shared indexer; random mxfp4 weights from `ringctl synth`) on the H200, in one
# run per bundle: prefill tokens/s of a 2048-token prompt, decode ms/step after it (sparse
# DSA) and after a 16-token prompt, the bytes a decode step reads and the roofline at the
# bandwidth probed in the same run (bench/glm_slice_bench.cc); then the same binary under a
# CUPTI kernel trace (bench/gpu/kernel_trace.cc), once plain (per-kernel GPU time, idle time
# between kernels), once with RING_CUDA_LAYER_MARKS=1 (per-layer times and the 78-layer
# extrapolation; bench/gpu/glm_trace_report.py) and once with RING_CUDA_PDL=0: under PDL a
# kernel's traced duration includes the time it waits for its predecessor, so only the
# PDL-off trace gives each kernel's own time (the busy time is the same).
#
#   [PROMPT=2048] [CHUNK=0] [REPS=2] [DECODE=64] [MODES="plain marks nopdl"] \
#     bench/gpu/glm_slice_perf_h200.sh BUNDLE [BUNDLE...]
# PROMPT sets the long prompt (the context the decode steps run at); CHUNK prefills it in
# steps of that many tokens in the timing run, as ring-server does (prefill_chunk; the traces
# always take one step, which glm_trace_report.py expects); MODES the trace runs (empty:
# timing only).
# Each BUNDLE (deploy/bundle.sh) holds bin/glm_slice_bench, bin/ringctl (for synth) and
# lib/libring_kernel_trace.so + lib/libcupti.so.13; the report script sits beside this one.
# With bin/gpu_gemm_bench in the first bundle the traces' prefill also reports its linear
# layers as a fraction of the cuBLAS bf16 peak probed in the same call.
# Output under $OUT: slice_<bundle>.txt (timing), trace_<bundle>.txt (reports).
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: $0 BUNDLE [BUNDLE...]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$PWD/gpu_out}
mkdir -p "$out"
m=/tmp/ring_glm52x4
first=$(cd "$1" && pwd)
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
} > "$out/machine.txt" 2>&1
if [ ! -d "$m" ]; then
  t0=$(date +%s)
  LD_LIBRARY_PATH="$first/lib" timeout 300 "$first/bin/ringctl" synth --arch glm_moe_dsa \
    --preset glm-5.2 --layers 4 --quant mxfp4 --out "$m" > /tmp/synth.txt 2>&1 || { cat /tmp/synth.txt; exit 1; }
  echo "synth: $(( $(date +%s) - t0 )) s" >> "$out/machine.txt"
fi
# The bf16 tensor-core peak of this call (cuBLAS through gpu_gemm_bench --peak-only), where the
# first bundle has that bench and the image has cuBLAS: the report puts the prefill's linear
# layers against it (the issue's >= 0.4 target).
peak_args=()
if [ -x "$first/bin/gpu_gemm_bench" ]; then
  source "$here/cublas_path.sh"
  peak=$(LD_LIBRARY_PATH="$first/lib:$cublas_dirs" timeout 120 "$first/bin/gpu_gemm_bench" --peak-only 2>&1 |
         sed -nE 's/^tensor-core peak probe: .* ([0-9]+) TFLOP\/s \(best.*/\1/p')
  if [ -n "$peak" ]; then
    echo "bf16 tensor-core peak probe (cuBLAS): $peak TFLOP/s" >> "$out/machine.txt"
    peak_args=(--peak-tflops "$peak")
  fi
fi
status=0
for b in "$@"; do
  bundle=$(cd "$b" && pwd)
  v=$(basename "$bundle")
  bench=$bundle/bin/glm_slice_bench
  export LD_LIBRARY_PATH="$bundle/lib"
  echo "== $v: timing" | tee -a "$out/slice_$v.txt"
  timeout 240 "$bench" --model "$m" --prompt ${PROMPT:-2048} --chunk ${CHUNK:-0} --decode ${DECODE:-64} --reps ${REPS:-2} \
    >> "$out/slice_$v.txt" 2>&1 || status=1
  for mode in ${MODES-plain marks nopdl}; do
    # RING_CUDA_KERNEL_COPIES=0: the step's hidden-row download as a copy-engine copy, the
    # record glm_trace_report.py ends a step at (as a copy kernel into mapped memory, since
    # session 22, the report found no steps).
    envs="CUDA_INJECTION64_PATH=$bundle/lib/libring_kernel_trace.so RING_KERNEL_TRACE=/tmp/trace_${v}_$mode.txt RING_CUDA_KERNEL_COPIES=0"
    [ $mode = marks ] && envs="$envs RING_CUDA_LAYER_MARKS=1"
    [ $mode = nopdl ] && envs="$envs RING_CUDA_PDL=0"
    env $envs timeout 240 "$bench" --model "$m" --prompt ${PROMPT:-2048} --decode 32 --reps 1 \
      > "/tmp/bench_${v}_$mode.txt" 2>&1 || status=1
    echo "== $v: kernel trace ($mode)" >> "$out/trace_$v.txt"
    grep -E "^(prefill|decode|  decode)" "/tmp/bench_${v}_$mode.txt" >> "$out/trace_$v.txt"
    python3 "$here/glm_trace_report.py" "/tmp/bench_${v}_$mode.txt" "/tmp/trace_${v}_$mode.txt" \
      $([ $mode = marks ] && echo --marks) "${peak_args[@]}" >> "$out/trace_$v.txt" 2>&1 || status=1
  done
  grep -A4 "^summary" "$out/slice_$v.txt"
  grep -E "^== |GPU span|78-layer|  (layer|head|embedding)" "$out/trace_$v.txt"
done
exit $status
