#!/usr/bin/env bash
# Installs the XLA CPU PJRT plugin (pinned wheel from PyPI) into a cache outside the repository,
# where CMake finds its pjrt_c_api.h and the XLA backend finds the plugin (decision 0030).
# Idempotent and fast when present. TESSERA_XLA=0 skips it; TESSERA_LIBTPU=1 adds libtpu
# (Google's terms: installed with pip on this machine, never shipped). Offline: a warning, and
# the XLA backend is simply not built.
set -uo pipefail
[ "${TESSERA_XLA:-1}" = "0" ] && { echo "setup_xla: skipped (TESSERA_XLA=0)"; exit 0; }
root=${TESSERA_XLA_DIR:-$HOME/.cache/tessera/xla}
cpu_dir=$root/xla-cpu-pjrt-0.0.1
so=$cpu_dir/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so
header=$cpu_dir/xla_plugins/xla_cpu_pjrt/include/pjrt_c_api.h
if [ ! -f "$cpu_dir/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so" ] && ! python3 -m pip --version >/dev/null 2>&1; then
  echo "setup_xla: WARNING: no pip (apt-get install python3-pip); the XLA backend will not be built" >&2
  exit 0
fi
mkdir -p "$root/wheels"
pip_install() {  # pip_install TARGET SPEC: download into the wheel cache once, then unpack
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$root/wheels" "$2" &&
    python3 -m pip install -q --no-deps --no-index --find-links "$root/wheels" --target "$1" "$2"
}
if [ -f "$so" ] && [ -f "$header" ]; then
  echo "setup_xla: XLA CPU plugin present ($cpu_dir)"
elif pip_install "$cpu_dir" xla-cpu-pjrt==0.0.1; then
  echo "setup_xla: installed xla-cpu-pjrt 0.0.1 into $cpu_dir"
else
  rm -rf "$cpu_dir"
  echo "setup_xla: WARNING: could not install xla-cpu-pjrt (offline?); the XLA backend will not be built" >&2
fi
if [ "${TESSERA_LIBTPU:-0}" = "1" ]; then
  tpu_dir=$root/libtpu
  if [ -f "$tpu_dir/libtpu/libtpu.so" ]; then
    echo "setup_xla: libtpu present ($tpu_dir)"
  elif pip_install "$tpu_dir" libtpu==0.0.52; then
    echo "setup_xla: installed libtpu 0.0.52 into $tpu_dir"
  else
    echo "setup_xla: WARNING: could not install libtpu" >&2
  fi
fi
exit 0
