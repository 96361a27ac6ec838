#!/usr/bin/env bash
# Sets up, builds and generates an image with the bundled default model.
# Extra arguments go to `tessera generate` (e.g. --prompt "..." --seed 7).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh" "$root/build"
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--prompt "a red circle on a white background" --seed 0)
"$root/build/tessera" generate --height 64 --width 64 --output "$root/tessera.png" "${args[@]}"
