#!/usr/bin/env bash
# Regenerates the fixtures into tests/fixtures and checks (1) two runs write identical bytes,
# (2) the result equals what is committed (git status --porcelain tests/fixtures is empty),
# (3) all fixtures together stay within the size budget (40 MB = 40,000,000 bytes).
# Usage: reference/check_fixtures.sh [--once] [--only NAME ...]
#   --once  skip the second run (determinism is then judged against git only)
#   TESSERA_REF_VENV: the reference venv (default: made or reused by reference/setup_venv.sh)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
fixtures="$repo/tests/fixtures"
budget=${TESSERA_FIXTURE_BUDGET:-40000000}
runs=2
if [ "${1:-}" = "--once" ]; then runs=1; shift; fi

if [ -n "${TESSERA_REF_VENV:-}" ] && [ -x "$TESSERA_REF_VENV/bin/python" ]; then
  venv=$TESSERA_REF_VENV
else
  venv=$("$here/setup_venv.sh" | tail -1)
fi

checksums() { (cd "$fixtures" && find . \( -type f -o -type l \) -print0 | LC_ALL=C sort -z | xargs -0 sha256sum && find . -type l -printf '%p -> %l\n' | LC_ALL=C sort); }

status=0
"$venv/bin/python" "$here/make_fixtures.py" "$@"
first=$(checksums)
if [ "$runs" = 2 ]; then
  "$venv/bin/python" "$here/make_fixtures.py" "$@"
  if ! diff <(echo "$first") <(checksums) > /tmp/tessera_fixture_runs.diff; then
    echo "FAIL: two runs wrote different bytes:" >&2
    head -20 /tmp/tessera_fixture_runs.diff >&2
    status=1
  else
    echo "ok: two runs wrote identical bytes"
  fi
fi

changed=$(cd "$repo" && git status --porcelain -- tests/fixtures)
if [ -n "$changed" ]; then
  echo "FAIL: regenerated fixtures differ from the committed ones:" >&2
  echo "$changed" | head -40 >&2
  status=1
else
  echo "ok: regenerated fixtures are byte-identical to the committed ones"
fi

total=$(find "$fixtures" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
if [ "$total" -gt "$budget" ]; then
  echo "FAIL: fixtures take $total bytes, over the budget of $budget" >&2
  status=1
else
  echo "ok: fixtures take $total bytes (budget $budget)"
fi
(cd "$fixtures" && du -s --apparent-size --block-size=1 -- */ | sort -rn | head -20)
exit $status
