#!/usr/bin/env bash
# TP=1 on 1 thread, then TP=N on N ranks x 1 thread, one after the other in one run; prints
# both JSON lines and the per-step ratio (median TP=1 step / median TP=N step).
# Usage: bench/run_tp_bench.sh BUILD_DIR MODEL_DIR [N] [extra tp_bench flags...]
set -euo pipefail
build=$1 model=$2 n=${3:-2}
shift 3 || shift $#
bench=$build/bench/tp_bench
root=()
[ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
export TESSERA_NUM_THREADS=1
one=$("$bench" --model "$model" "$@")
echo "$one"
many=$(mpirun "${root[@]}" --quiet --bind-to core -n "$n" -x TESSERA_NUM_THREADS "$bench" --model "$model" "$@")
echo "$many"
python3 - "$one" "$many" <<'PY'
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
med = lambda v: sorted(v)[len(v) // 2]
print(f"TP={b['tp']} vs TP=1 per step (wall): {a['median_step_s']:.3f} s / {b['median_step_s']:.3f} s = "
      f"{a['median_step_s'] / b['median_step_s']:.2f}x")
print(f"TP={b['tp']} vs TP=1 per step (rank CPU): {med(a['cpu_s']):.3f} s / {med(b['cpu_s']):.3f} s = "
      f"{med(a['cpu_s']) / med(b['cpu_s']):.2f}x")
PY
