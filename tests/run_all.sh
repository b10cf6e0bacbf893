#!/usr/bin/env bash
# The test command: installs dependencies, builds everything (CUDA code too when nvcc is
# present, for sm_90 and sm_120a), and runs the whole suite. Works on a fresh Debian machine
# without a GPU. GPU-only tests skip themselves when no device is visible.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install_deps.sh
BUILD=${BUILD_DIR:-build}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DRING_ENABLE_CUDA=AUTO -DRING_CUDA_ARCHS="${RING_CUDA_ARCHS:-90a;120a}"
ninja -C "$BUILD" -j"$(nproc)"
# The product binaries run absl::Mutex without its lock-order graph (worker/mutex_mode.h);
# the suite keeps it on, in-process and in every ring-worker / ring-server it starts.
export RING_MUTEX_DEADLOCK_CHECK=1
ctest --test-dir "$BUILD" --output-on-failure -j"$(nproc)" --timeout 900
