#!/usr/bin/env bash
# The run command: installs dependencies, builds, synthesizes the bundled tiny GLM-5.2-style
# checkpoint (mxfp4, DSA indexer with IndexShare) and generates greedily through it split
# into three in-process stages on the CPU engine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install_deps.sh
BUILD=${BUILD_DIR:-build}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRING_CUDA_ARCHS="${RING_CUDA_ARCHS:-90}"
ninja -C "$BUILD" ringctl
MODEL="$BUILD/models/tiny-glm"
[ -f "$MODEL/config.json" ] || "$BUILD/server/ringctl" synth --arch glm_moe_dsa --preset tiny \
  --quant mxfp4 --seed 1 --out "$MODEL"
"$BUILD/server/ringctl" inspect "$MODEL"
"$BUILD/server/ringctl" logits --model "$MODEL" --tokens 11,22,33,44,55,66,77,88,99,100,101,102 \
  --decode 16 --stages 3 --out "$BUILD/tiny-glm-logits.npy"
