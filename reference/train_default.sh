#!/usr/bin/env bash
# Trains models/tessera-shapes from scratch in one command: the stages the model card lists
# (VAE; decoder fine-tune; a width-128 transformer + text encoders on the first VAE's latents;
# the fine-tuned decoder swapped in; a caption-dropout fine-tune; a fresh width-192 transformer on
# those text encoders; 6,800 more steps of it at a lower lr; 5,656 more on fresh images (seed 1);
# its classifier-free guidance distilled into the guidance input, its default 3.5 standing for the
# teacher's CFG 5: what is shipped). Fixed seeds, one torch thread each: about 5 hours on one
# free core.
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
"$py" "$train" --vae-from "$work/vae" --dit-steps 7500 --dit-batch 32 --out "$work/small"
"$py" "$train" --out "$work/small" --replace-vae "$work/decoder"
"$py" "$train" --resume "$work/small" --caption-dropout 0.1 --dit-steps 1500 --dit-lr 3e-4 \
  --out "$work/teacher"
"$py" "$train" --resume "$work/teacher" --new-transformer 6 2 3 --caption-dropout 0.1 \
  --t-shift 1.58 --dit-steps 8000 --dit-stop-at 7176 --out "$work/wide"
"$py" "$train" --resume "$work/wide" --caption-dropout 0.1 --t-shift 1.58 --dit-steps 6800 \
  --dit-lr 5e-4 --out "$work/wide2"
"$py" "$train" --resume "$work/wide2" --caption-dropout 0.1 --t-shift 1.58 --dit-steps 6400 \
  --dit-stop-at 5656 --dit-lr 5e-4 --seed 1 --out "$work/wide3"
"$py" "$train" --resume "$work/wide3" --distill-guidance --guidance-gain 1.6 --dit-steps 1800 \
  --dit-lr 2e-4 --ema 0.995 --out "$out"
