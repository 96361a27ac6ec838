#!/usr/bin/env bash
# Creates the reference venv outside the repository (default: ~/.cache/tessera-ref-venv).
set -euo pipefail
VENV=${TESSERA_REF_VENV:-$HOME/.cache/tessera-ref-venv}
here=$(cd "$(dirname "$0")" && pwd)
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q -r "$here/requirements.txt"
echo "$VENV"
