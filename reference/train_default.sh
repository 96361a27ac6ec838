#!/usr/bin/env bash
# Trains models/tessera-shapes from scratch in one command: the stages the model card lists
# (VAE; decoder fine-tune; transformer + text encoders on the first VAE's latents; the fine-tuned
# decoder swapped in). Fixed seeds, one torch thread each: about 1.5 hours on one free core.
# Usage: reference/train_default.sh [OUT_DIR]   (default: models/tessera-shapes)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-/work/refvenv/bin/python}
out=${1:-$root/models/tessera-shapes}
work=$(mktemp -d "${TMPDIR:-/tmp}/tessera-train.XXXXXX")
trap 'rm -rf "$work"' EXIT
train="$root/reference/train_default.py"
"$py" "$train" --vae-only --out "$work/vae" --vae-steps 1500
"$py" "$train" --vae-only --vae-from "$work/vae" --decoder-steps 1200 --vae-lr 5e-4 \
  --out "$work/decoder"
"$py" "$train" --vae-from "$work/vae" --dit-steps 7500 --dit-batch 32 --out "$out"
"$py" "$train" --out "$out" --replace-vae "$work/decoder"
