#!/usr/bin/env bash
# Sets up, builds and generates an image with the bundled default model.
# Extra arguments go to `tessera generate` (e.g. --prompt "..." --seed 7).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh" "$root/build"
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--prompt "a red circle on a white background" --seed 0)
# The bundled 64x64 model is too small to gain from a second thread, which a busy machine delays.
export TESSERA_NUM_THREADS=${TESSERA_NUM_THREADS:-1}
"$root/build/tessera" generate --height 64 --width 64 --output "$root/tessera.png" "${args[@]}"
