#!/usr/bin/env bash
# Relocatable bundle: deploy/bundle.sh OUT_DIR BINARY...
# Copies each binary into OUT_DIR/bin and every shared library it needs that is not part of
# the base system (glibc, libstdc++, libgcc_s, the NVIDIA driver's libcuda) into
# OUT_DIR/lib, then points every ELF at $ORIGIN/../lib (binaries) or $ORIGIN (libraries).
# The result runs from any directory on another machine with the same glibc or newer.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 OUT_DIR BINARY..." >&2; exit 2; }
out=$1; shift
mkdir -p "$out/bin" "$out/lib"
system_lib='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libstdc\+\+\.|libgcc_s\.|libcuda\.|libnvidia-)'
for bin in "$@"; do
  [ -x "$bin" ] || { echo "bundle: $bin is not an executable" >&2; exit 1; }
  cp -f "$bin" "$out/bin/"
  patchelf --set-rpath '$ORIGIN/../lib' "$out/bin/$(basename "$bin")"
  ldd "$bin" | awk '/=> \//{print $1, $3}' | while read -r name path; do
    if [[ "$name" =~ $system_lib ]]; then continue; fi
    if [ ! -f "$out/lib/$name" ]; then
      cp -fL "$path" "$out/lib/$name"
      chmod u+w "$out/lib/$name"
      patchelf --set-rpath '$ORIGIN' "$out/lib/$name"
    fi
  done
done
echo "bundle: $(ls "$out/bin" | wc -l) binaries, $(ls "$out/lib" | wc -l) libraries, $(du -sh "$out" | cut -f1) in $out"
