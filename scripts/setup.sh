#!/usr/bin/env bash
# Installs every system dependency tessera needs from Debian 12's packages. Idempotent: only
# missing packages are installed, so a second run does nothing.
# --with-libtpu (or TESSERA_LIBTPU=1): also install the pinned libtpu wheel from PyPI into
# ~/.cache/tessera/xla/libtpu (Google's terms; never in the repository), for TPU devices and
# `tessera compile --target tpu:...` without a TPU.
set -euo pipefail
for arg in "$@"; do
  case "$arg" in
    --with-libtpu) export TESSERA_LIBTPU=1 ;;
    *) echo "setup: unknown option '$arg' (expected --with-libtpu)" >&2; exit 2 ;;
  esac
done
PACKAGES=(
  build-essential cmake ninja-build pkg-config git python3
  ccache                                 # scripts/build.sh reuses earlier compiles when present
  clang-14 libclang-rt-14-dev            # libFuzzer target and sanitizers
  libdnnl-dev                            # oneDNN: GEMM and convolution (docs/decisions/0002)
  libopenblas-dev                        # only for the GEMM library comparison benchmark
  nlohmann-json3-dev libcli11-dev libspng-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libcpp-httplib-dev                     # tessera serve's HTTP server (docs/decisions/0035)
  chromium                               # headless test of tessera serve's page
  libopenmpi-dev openmpi-bin             # tensor parallelism over CPU ranks (docs/decisions/0040)
)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
else
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
# The XLA CPU plugin for the XLA backend (optional; TESSERA_XLA=0 skips it).
"$(dirname "$0")/setup_xla.sh"
