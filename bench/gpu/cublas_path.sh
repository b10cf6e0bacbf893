# Sourced by the bench/gpu scripts whose benchmarks dlopen cuBLAS (not bundled: hundreds of
# MB): sets cublas_dirs to where the device image may keep it, the toolkit or the pip wheel
# beside PyTorch.
cublas_dirs=/usr/local/cuda/lib64
if command -v python3 >/dev/null; then
  pip_cublas=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(os.path.dirname(nvidia.cublas.__file__), "lib"))' 2>/dev/null || true)
  [ -n "$pip_cublas" ] && cublas_dirs="$cublas_dirs:$pip_cublas"
fi
