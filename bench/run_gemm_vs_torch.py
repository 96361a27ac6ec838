#!/usr/bin/env python3
"""GEMM at FLUX shapes, tessera vs PyTorch, in one run on the same machine and threads.

Runs bench/gemm_bench (Google Benchmark, JSON out) and torch.nn.functional.linear with the same
dtype, thread count and weight layout ([N, K]), then prints a side-by-side table with the ratio
tessera/torch. OpenBLAS sgemm (from the C++ bench) is listed for the library decision.
Usage: /work/refvenv/bin/python bench/run_gemm_vs_torch.py [--bench build/bench/gemm_bench]
       [--threads 2] [--reps 3]
"""
import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHAPES = [(4608, 3072, 3072), (4608, 3072, 12288), (4608, 12288, 3072)]


def find_bench() -> pathlib.Path:
    for build in sorted(ROOT.glob("build*")):
        p = build / "bench" / "gemm_bench"
        if p.exists():
            return p
    sys.exit("gemm_bench not found; build it: ninja -C <build dir> gemm_bench")


def run_cpp(bench: pathlib.Path, threads: int) -> dict:
    env = dict(os.environ, TESSERA_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
               OPENBLAS_NUM_THREADS=str(threads))
    out = subprocess.run([str(bench), "--benchmark_format=json"], env=env, check=True,
                         capture_output=True, text=True).stdout
    results = {}
    for b in json.loads(out)["benchmarks"]:
        # e.g. "BM_tessera_linear/bf16/M:4608/K:3072/N:3072/iterations:3/real_time"
        parts = b["name"].split("/")
        kind = parts[0].removeprefix("BM_") + ("/" + parts[1] if ":" not in parts[1] else "")
        dims = tuple(int(p.split(":")[1]) for p in parts if p[:2] in ("M:", "K:", "N:"))
        results[(kind, dims)] = b["FLOP/s"] / 1e9
    return results


def run_torch(threads: int, reps: int) -> dict:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    results = {}
    for dtype_name, dtype in (("bf16", torch.bfloat16), ("f32", torch.float32)):
        for m, k, n in SHAPES:
            g = torch.Generator().manual_seed(0)
            x = (torch.rand(m, k, generator=g) * 2 - 1).to(dtype)
            w = (torch.rand(n, k, generator=g) * 2 - 1).to(dtype)
            with torch.inference_mode():
                F.linear(x, w)  # warm-up
                times = []
                for _ in range(reps):
                    t = time.perf_counter()
                    F.linear(x, w)
                    times.append(time.perf_counter() - t)
            results[(dtype_name, (m, k, n))] = 2.0 * m * k * n / statistics.median(times) / 1e9
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--bench", type=pathlib.Path, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    import torch

    load = os.getloadavg()[0]
    cpp = run_cpp(args.bench or find_bench(), args.threads)
    tor = run_torch(args.threads, args.reps)
    print(f"# GEMM y[M,N] = x[M,K] @ w[N,K]^T, {args.threads} threads, "
          f"{datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, torch {torch.__version__}, "
          f"{platform.processor() or platform.machine()}, load avg at start {load:.2f}")
    print("| dtype | M, K, N | tessera GFLOP/s | torch GFLOP/s | tessera/torch | OpenBLAS GFLOP/s |")
    print("|---|---|---:|---:|---:|---:|")
    worst = {}
    for dt in ("bf16", "f32"):
        for s in SHAPES:
            t, p = cpp[("tessera_linear/" + dt, s)], tor[(dt, s)]
            blas = f"{cpp[('openblas_sgemm', s)]:.0f}" if dt == "f32" else "n/a (no bf16)"
            worst[dt] = min(worst.get(dt, 9e9), t / p)
            print(f"| {dt} | {s[0]}, {s[1]}, {s[2]} | {t:.0f} | {p:.0f} | {t / p:.2f}x | {blas} |")
    rep = cpp.get(("tessera_linear/bf16_repack_each_call", SHAPES[0]))
    if rep:
        print(f"\nbf16 {SHAPES[0]} with the weight repacked on every call (no cache): {rep:.0f} "
              f"GFLOP/s vs {cpp[('tessera_linear/bf16', SHAPES[0])]:.0f} cached")
    print(f"\nworst ratio: bf16 {worst['bf16']:.2f}x, f32 {worst['f32']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
