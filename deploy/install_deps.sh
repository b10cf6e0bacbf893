#!/usr/bin/env bash
# Installs every build and test dependency of RingServe: Debian packages (apt) and
# a Python venv (.venv) with the pinned test oracles. Idempotent: when everything is
# present it only checks and returns in a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git clang
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libboost-dev prometheus-cpp-dev nlohmann-json3-dev libcli11-dev
  libpcre2-dev libutf8proc-dev libtomlplusplus-dev libxxhash-dev libspdlog-dev libgtest-dev libgmock-dev
  libbenchmark-dev prometheus python3-venv python3-dev patchelf zsh systemd
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install_deps: apt-get install ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Python test tools. Versions pinned so oracle fixtures are reproducible.
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
REQ=tests/requirements.txt
STAMP=.venv/.requirements.sha
want=$(sha256sum "$REQ" | cut -d' ' -f1)
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
  .venv/bin/pip install -q --disable-pip-version-check -r "$REQ"
  echo "$want" > "$STAMP"
fi
echo "install_deps: ok"
