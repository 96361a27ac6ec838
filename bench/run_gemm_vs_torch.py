#!/usr/bin/env python3
"""GEMM at FLUX shapes, tessera vs PyTorch, in one run on the same machine and threads.

For each dtype and shape it runs bench/gemm_bench (Google Benchmark, JSON) and then
torch.nn.functional.linear with the same dtype, thread count and weight layout ([N, K]), back to
back, and prints a side-by-side table with the ratio tessera/torch. bf16 is measured twice: the
path users get (tessera's own AMX kernel on AMX CPUs, else oneDNN; the table says which) and,
for reference, oneDNN forced. Both sides time --reps calls
after one warm-up call and report two rates: the best call by wall time, and FLOP per CPU-second
of the whole process (all threads) x threads. On a shared, loaded machine wall time says more
about the load than about the kernel; the CPU-time rate measures the kernel itself. OpenBLAS sgemm (from the C++ bench) is listed for the f32 library
decision (docs/decisions/0002-gemm-library.md).
Usage: /work/refvenv/bin/python bench/run_gemm_vs_torch.py [--bench BUILD/bench/gemm_bench]
       [--threads 2] [--reps 3]
"""
import argparse
import datetime
import json
import os
import pathlib
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


def run_cpp(bench: pathlib.Path, name: str, shape, threads: int, reps: int, want_path=False):
    """(best wall, per-cpu) GFLOP/s of one C++ benchmark, e.g. name='BM_tessera_linear/bf16'
    (plus whether it ran on the AMX kernel when want_path)."""
    env = dict(os.environ, TESSERA_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
               OPENBLAS_NUM_THREADS=str(threads), GEMM_BENCH_ITERS=str(reps))
    m, k, n = shape
    filt = f"^{name}/M:{m}/K:{k}/N:{n}/"
    out = subprocess.run([str(bench), "--benchmark_format=json", f"--benchmark_filter={filt}"],
                         env=env, check=True, capture_output=True, text=True).stdout
    b = json.loads(out)["benchmarks"]
    if len(b) != 1:
        sys.exit(f"expected one benchmark for {filt}, got {len(b)}")
    if want_path:
        return b[0]["best_GFLOP/s"], b[0]["cpu_GFLOP/s"], bool(b[0].get("amx", 0))
    return b[0]["best_GFLOP/s"], b[0]["cpu_GFLOP/s"]


def run_torch(dtype_name: str, shape, reps: int, threads: int):
    import torch
    import torch.nn.functional as F

    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[dtype_name]
    m, k, n = shape
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(m, k, generator=g) * 2 - 1).to(dtype)
    w = (torch.rand(n, k, generator=g) * 2 - 1).to(dtype)
    with torch.inference_mode():
        F.linear(x, w)  # warm-up
        walls, cpus = [], []
        for _ in range(reps):
            c, t = time.process_time(), time.perf_counter()
            F.linear(x, w)
            walls.append(time.perf_counter() - t)
            cpus.append(time.process_time() - c)
    flops = 2.0 * m * k * n
    return flops / min(walls) / 1e9, flops / min(cpus) / 1e9 * threads


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--bench", type=pathlib.Path, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    bench = args.bench or find_bench()
    start = datetime.datetime.now(datetime.timezone.utc)
    loads = [os.getloadavg()[0]]
    rows, worst = [], {}
    variants = [("bf16", "bf16", "BM_tessera_linear/bf16"),
                ("bf16 oneDNN", "bf16", "BM_tessera_linear/bf16_onednn"),
                ("f32", "f32", "BM_tessera_linear/f32")]
    for label, dt, name in variants:
        for s in SHAPES:
            t_best, t_cpu, amx = run_cpp(bench, name, s, args.threads, args.reps, want_path=True)
            p_best, p_cpu = run_torch(dt, s, args.reps, args.threads)
            kernel = "AMX (tessera)" if amx else "oneDNN 2.6"
            blas = "n/a (no bf16)" if dt == "bf16" else ""
            if dt == "f32":
                b_best, b_cpu = run_cpp(bench, "BM_openblas_sgemm", s, args.threads, args.reps)
                blas = f"{b_best:.0f} / {b_cpu:.0f}"
            loads.append(os.getloadavg()[0])
            worst[label] = min(worst.get(label, 1e9), t_best / p_best)
            worst[label + " cpu"] = min(worst.get(label + " cpu", 1e9), t_cpu / p_cpu)
            rows.append(f"| {dt} | {kernel} | {s[0]}, {s[1]}, {s[2]} | {t_best:.0f} | {p_best:.0f} | "
                        f"**{t_best / p_best:.2f}x** | {t_cpu:.0f} | {p_cpu:.0f} | "
                        f"**{t_cpu / p_cpu:.2f}x** | {blas} |")
    rep_best, rep_cpu = run_cpp(bench, "BM_tessera_linear/bf16_repack_each_call", SHAPES[0],
                          args.threads, args.reps)
    print(f"GEMM y[M,N] = x[M,K] @ w[N,K]^T, {args.threads} threads, best of {args.reps} calls, "
          f"GFLOP/s; {start:%Y-%m-%d %H:%M} UTC; torch {torch.__version__}; "
          f"load average {min(loads):.1f}-{max(loads):.1f}\n")
    print("| dtype | tessera kernel | M, K, N | tessera wall | torch wall | ratio wall | "
          "tessera per-CPU | torch per-CPU | ratio per-CPU | OpenBLAS sgemm wall / per-CPU |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    print(f"\nbf16 {SHAPES[0]} with the weight repacked on every call (cache off): "
          f"{rep_best:.0f} wall / {rep_cpu:.0f} per-CPU GFLOP/s")
    print("worst ratio tessera/torch: " + ", ".join(f"{k} {v:.2f}x" for k, v in worst.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
