#!/usr/bin/env bash
# Creates the reference venv outside the repository (default: ~/.cache/tessera-ref-venv).
set -euo pipefail
VENV=${TESSERA_REF_VENV:-$HOME/.cache/tessera-ref-venv}
here=$(cd "$(dirname "$0")" && pwd)
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q -r "$here/requirements.txt"
# goldens/tokenizers.py reads only the CLIP BPE file this package ships; its deps are not needed.
"$VENV/bin/pip" install -q --no-deps open_clip_torch==3.3.0
echo "$VENV"
