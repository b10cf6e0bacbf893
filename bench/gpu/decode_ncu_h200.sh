#!/usr/bin/env bash
# Nsight Compute on a GLM-5.2 decode step's attention-core kernels (MLA decode, its split
# combine, the DSA indexer's scores and top-k), in one run on the H200: the GLM-5.2 4-layer
# slice (ringctl synth, random mxfp4 weights) decodes after a PROMPT-token prompt under ncu,
# and bench/gpu/ncu_stall_report.py turns the output into tables: per launch, the
# instructions a warp issues and the cycles between its issues (these kernels are bound by
# latency), per kernel the warp-stall reasons and the instructions that wait most.
#
#   [PROMPT=2048] [OUT=dir] bench/gpu/decode_ncu_h200.sh BUNDLE
# BUNDLE (deploy/bundle.sh) holds bin/glm_slice_bench and bin/ringctl. ncu runs with the
# clocks left alone (--clock-control none) and replays each launch with the caches flushed
# (its default), so durations are upper bounds for data a real step finds in L2.
# Output under $OUT: ncu_details.txt, ncu_scores.txt, ncu_sass.csv, report.md.
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: $0 BUNDLE" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
b=$(cd "$1" && pwd)
out=${OUT:-$PWD/gpu_out}
prompt=${PROMPT:-2048}
mkdir -p "$out"
export LD_LIBRARY_PATH="$b/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "no ncu on this machine" >&2; exit 1; }
m=/tmp/ring_glm52x4
if [ ! -d "$m" ]; then
  timeout 300 "$b/bin/ringctl" synth --arch glm_moe_dsa --preset glm-5.2 --layers 4 --quant mxfp4 \
    --out "$m" --quiet > "$out/synth.txt" 2>&1 || { cat "$out/synth.txt"; exit 1; }
fi
app=("$b/bin/glm_slice_bench" --model "$m" --prompt "$prompt" --decode 8 --reps 1 --no-probe)
# The launches skipped are the first decode step's (its graphs are being captured); the
# kernels named here run in decode only, except the indexer's scores (also the 2 prefills'
# 3 layers: 6 launches, then the first decode step's 3).
timeout 300 "$ncu" --clock-control none --set full -k 'regex:MlaDecodeMma|SplitCombine|TopKRowsCluster' \
  --launch-skip 8 -c 6 "${app[@]}" > "$out/ncu_details.txt" 2>&1 || echo "ncu details: rc $?" >&2
timeout 200 "$ncu" --clock-control none --set full -k 'regex:IndexerScoresMma' --launch-skip 9 -c 1 \
  "${app[@]}" > "$out/ncu_scores.txt" 2>&1 || echo "ncu scores: rc $?" >&2
timeout 200 "$ncu" --clock-control none --set full --import-source no -k 'regex:MlaDecodeMma|TopKRowsCluster' \
  --launch-skip 8 -c 2 --page source --print-source sass --csv "${app[@]}" > "$out/ncu_sass.csv" 2>&1 ||
  echo "ncu sass: rc $?" >&2
{
  echo "# decode attention core under ncu (prompt $prompt)"
  python3 "$here/ncu_stall_report.py" --details "$out/ncu_details.txt" --sass "$out/ncu_sass.csv"
  echo
  python3 "$here/ncu_stall_report.py" --details "$out/ncu_scores.txt"
} > "$out/report.md"
cat "$out/report.md"
