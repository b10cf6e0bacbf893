#!/usr/bin/env bash
# Continuous batching inside a stage (issue 4) on the 2x H200 machine:
#   (a) models_test's batch tests on the GPU: decode steps of 4 sequences as one batch give
#       bit-identical outputs to each stepping alone (GLM-5.2-style, Qwen3, Qwen3-MoE);
#   (b) bench/ring_bench.py over two CUDA workers (one per GPU), Qwen3-0.6B dims, 28
#       layers: k = 1, 4, 8 sequences with ring-worker --max-batch 8 and 1 (batching off)
#       in the same rounds, and where one sequence's step goes (forward per stage, hops);
#   (c) the same on CPU workers (RING_CPU_THREADS=4 each, 8 layers);
#   (d) a diagnosis of the hop cost: one sequence on the two CUDA workers with and without
#       a lowest-priority busy loop on every core (nice 19, so it takes no time from the
#       ring but keeps the cores out of their idle states): if the hops get much cheaper,
#       their cost is the wake-up of sleeping cores, not gRPC or the codec;
#   (e) whether Linux's PM QoS fixes what (d) finds: the same with /dev/cpu_dma_latency held
#       at 0 (cores kept out of deep idle states while it is open), between two runs without.
#       The request is machine-wide, so the runs go one after another, not mixed;
#   (f) a model whose stages carry more work: Qwen3-8B dimensions (36 layers, int4) on the
#       two GPUs, 1 and 4 sequences: pipeline efficiency where a token's compute is larger
#       than the hops.
#   (g) one and four sequences on the two CUDA workers: workers of an OLD bundle (OLD=DIR)
#       and of this one in the same rounds (session 7: stage 0 continues a lone generation
#       on the thread that received its token);
#   (h) decode frames over NCCL: --nccl-min-bytes 1 (every hidden-state frame over the
#       host-staged NCCL link) vs --no-nccl.
#   (i) shared-memory hops (the default between workers of one host; the receiving thread
#       polls 50 ms on a CUDA worker) vs gRPC (--no-shm), same rounds: Qwen3-0.6B dims on
#       2, 3 and 4 stages (stages cycled over the two GPUs: one sequence's pipeline
#       efficiency is unaffected by two stages sharing a GPU, k = 4 is), Qwen3-8B dims on
#       2, and CPU workers (4 threads each) on 2, 3 and 4 with and without polling.
# Output under $OUT. Usage: bench/gpu/batching_h200.sh BUNDLE_DIR [PARTS="a b c"]
#   BUNDLE_DIR: bin/{ring-worker,ringctl,ring_bench,models_test} lib/... (deploy/bundle.sh)
set -uo pipefail
bundle=$(cd "$1" && pwd)
out=${OUT:-$PWD/batching_out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$bundle/lib:${LD_LIBRARY_PATH:-}"
here=$(cd "$(dirname "$0")/../.." && pwd)
parts=" ${PARTS:-a b c} "
status=0
if [[ $parts == *" a "* ]]; then
  "$bundle/bin/models_test" --gtest_color=no --gtest_filter='*BatchTest*:StageSample.*' \
    > "$out/models_batch.txt" 2>&1 || status=1
  tail -3 "$out/models_batch.txt"
fi
if [[ $parts == *" b "* ]]; then
  python3 "$here/bench/ring_bench.py" --bindir "$bundle/bin" --work /tmp/rb_gpu --layers 28 \
    --devices cuda:0,cuda:1 --stages 2 --sequences 4,8 --rounds ${ROUNDS:-3} --decode 64 --variants '--max-batch 8|--max-batch 1' \
    > "$out/ring_batch_gpu.txt" 2>&1 || status=1
  tail -12 "$out/ring_batch_gpu.txt"
fi
if [[ $parts == *" c "* ]]; then
  python3 "$here/bench/ring_bench.py" --bindir "$bundle/bin" --work /tmp/rb_cpu --threads 4 \
    --stages 2 --sequences 4,8 --rounds 3 --variants '--max-batch 8|--max-batch 1' > "$out/ring_batch_cpu.txt" 2>&1 || status=1
  tail -12 "$out/ring_batch_cpu.txt"
fi
if [[ $parts == *" d "* ]]; then
  d() {
    python3 "$here/bench/ring_bench.py" --bindir "$bundle/bin" --work /tmp/rb_gpu --layers 28 \
      --devices cuda:0,cuda:1 --stages 2 --sequences 2 --rounds 2 --decode 64 > "$out/hops_$1.txt" 2>&1 || status=1
    echo "== $1"; grep -A1 "closed ring, N=2" "$out/hops_$1.txt"; grep "^| 2 \|^| default" "$out/hops_$1.txt"
  }
  d idle
  spin=()
  for _ in $(seq "$(nproc)"); do nice -n 19 bash -c 'while :; do :; done' & spin+=($!); done
  d busy
  kill "${spin[@]}" 2>/dev/null
  d idle_again
fi
if [[ $parts == *" e "* ]]; then
  ls -la /dev/cpu_dma_latency > "$out/pmqos.txt" 2>&1
  e() {  # NAME
    python3 "$here/bench/ring_bench.py" --bindir "$bundle/bin" --work /tmp/rb_gpu --layers 28 \
      --devices cuda:0,cuda:1 --stages 2 --sequences 2 --rounds 2 --decode 64 \
      > "$out/pmqos_$1.txt" 2>&1 || status=1
    echo "== $1"; grep -A1 "closed ring, N=2" "$out/pmqos_$1.txt"; grep "^| " "$out/pmqos_$1.txt" | tail -1
  }
  e default
  python3 -c 'import os, struct, time
fd = os.open("/dev/cpu_dma_latency", os.O_WRONLY); os.write(fd, struct.pack("i", 0)); time.sleep(3600)' &
  hold=$!
  sleep 1
  e latency0
  kill $hold 2>/dev/null
  e default_again
fi
if [[ $parts == *" f "* ]]; then
  python3 "$here/bench/ring_bench.py" --bindir "$bundle/bin" --work /tmp/rb_8b --preset qwen3-8b --layers 36 \
    --devices cuda:0,cuda:1 --stages 2 --sequences 4 --rounds ${ROUNDS:-2} --decode 32 --timeout 600 \
    > "$out/ring_8b.txt" 2>&1 || status=1
  tail -8 "$out/ring_8b.txt"
fi
if [[ $parts == *" g "* ]]; then
  old=${OLD:+--bindir=$(cd "$OLD" && pwd)/bin|}
  python3 "$here/bench/ring_bench.py" --bindir "$bundle/bin" --work /tmp/rb_gpu --layers 28 \
    --devices cuda:0,cuda:1 --stages 2 --sequences 4 --rounds ${ROUNDS:-3} --decode 64 \
    "--variants=${old}--max-batch 8" > "$out/hops.txt" 2>&1 || status=1
  tail -14 "$out/hops.txt"
fi
if [[ $parts == *" h "* ]]; then
  export NCCL_NVLS_ENABLE=0
  if [ -z "${RING_NCCL_LIBRARY:-}" ] && d=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null); then
    export RING_NCCL_LIBRARY=$d/lib
  fi
  python3 "$here/bench/ring_bench.py" --bindir "$bundle/bin" --work /tmp/rb_gpu --layers 28 \
    --devices cuda:0,cuda:1 --stages 2 --sequences 4 --rounds ${ROUNDS:-2} --decode 64 \
    --variants '--nccl-min-bytes 1|--no-nccl' > "$out/hops_nccl.txt" 2>&1 || status=1
  tail -12 "$out/hops_nccl.txt"
fi
if [[ $parts == *" i "* ]]; then
  python3 "$here/bench/ring_bench.py" --bindir "$bundle/bin" --work /tmp/rb_gpu --layers 28 \
    --devices cuda:0,cuda:1 --stages 2,3,4 --sequences 4 --rounds ${ROUNDS:-3} --decode 64 \
    --variants '|--no-shm' > "$out/shm_gpu.txt" 2>&1 || status=1
  tail -16 "$out/shm_gpu.txt"
  python3 "$here/bench/ring_bench.py" --bindir "$bundle/bin" --work /tmp/rb_8b --preset qwen3-8b --layers 36 \
    --devices cuda:0,cuda:1 --stages 2 --sequences 4 --rounds ${ROUNDS:-2} --decode 32 --timeout 600 \
    --variants '|--no-shm' > "$out/shm_8b.txt" 2>&1 || status=1
  tail -12 "$out/shm_8b.txt"
  python3 "$here/bench/ring_bench.py" --bindir "$bundle/bin" --work /tmp/rb_cpu --threads 4 \
    --stages 2,3,4 --sequences 4 --rounds ${ROUNDS:-3} \
    --variants '--poll-us 50000|--poll-us 0|--no-shm' > "$out/shm_cpu.txt" 2>&1 || status=1
  tail -20 "$out/shm_cpu.txt"
fi
exit $status
