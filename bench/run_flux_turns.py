#!/usr/bin/env python3
"""Two builds of flux_bench in turns (A, B, A, B, ...), for before/after comparisons of one change.

A shared machine's load then falls on both sides alike; the table gives each side's median over
the rounds and the median of the per-round ratios B / A (below 1: B is faster).

Usage: bench/run_flux_turns.py --a OLD/bench/flux_bench --b NEW/bench/flux_bench --rounds 5 \
           [--threads 1] -- --model DIR --dtype f32 --sizes 64,128 --modes eager,compile ...
(everything after -- goes to both flux_bench runs).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def run(bench: str, args, threads: int) -> dict:
    env = dict(os.environ, TESSERA_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    out = subprocess.run([bench, *args, "--benchmark_format=json"], env=env, check=True,
                         capture_output=True, text=True).stdout
    res = {}
    for b in json.loads(out)["benchmarks"]:
        _, dtype, size, mode = b["run_name"].split("/")[:4]
        res[(dtype, int(size), mode)] = b["real_time"]  # ms per step (wall)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="flux_bench before the change")
    ap.add_argument("--b", required=True, help="flux_bench after the change")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("bench_args", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    bench_args = [a for a in args.bench_args if a != "--"]
    rounds = []
    for r in range(args.rounds):
        rounds.append((run(args.a, bench_args, args.threads), run(args.b, bench_args, args.threads)))
        print(f"round {r + 1}/{args.rounds} done, load average {os.getloadavg()[0]:.2f}",
              file=sys.stderr, flush=True)
    print("| dtype | size | mode | A ms (median) | B ms (median) | B / A (median of rounds) |")
    print("|---|---|---|---|---|---|")
    for key in rounds[0][0]:
        a = [ra[key] for ra, _ in rounds]
        b = [rb[key] for _, rb in rounds]
        ratio = statistics.median(y / x for x, y in zip(a, b))
        print(f"| {key[0]} | {key[1]} | {key[2]} | {statistics.median(a):.3f} | "
              f"{statistics.median(b):.3f} | {ratio:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
