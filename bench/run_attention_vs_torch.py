#!/usr/bin/env python3
"""Attention at the FLUX shape: tessera's SDPA next to torch's, same dtype, same threads, one run.

Runs build/bench/attention_bench (Google Benchmark, JSON output) and
torch.nn.functional.scaled_dot_product_attention on (1, 24, 4608, 128) in f32 and bf16 with
2 threads, then prints milliseconds, GFLOP/s and the ratio (torch time / tessera time).
Usage: python bench/run_attention_vs_torch.py [--bench PATH] [--threads 2] [--reps 3]
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

H, L, D = 24, 4608, 128
FLOPS = 4.0 * H * L * L * D


def run_tessera(bench: str, threads: int) -> dict:
    env = dict(os.environ, TESSERA_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    out = subprocess.run([bench, "--benchmark_format=json"], env=env, check=True,
                         capture_output=True, text=True).stdout
    times = {}
    for b in json.loads(out)["benchmarks"]:
        dtype = b["name"].split("/")[1]  # bf16, bf16_onednn, f32, f32_onednn
        wall = b["real_time"] / 1e3 if b["time_unit"] == "ms" else b["real_time"]
        times[dtype] = (wall, b["cpu_s_per_call"])
    return times


def run_torch(threads: int, reps: int) -> dict:
    import resource

    import torch
    import torch.nn.functional as F

    def cpu_seconds():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    torch.set_num_threads(threads)
    times = {}
    for name, dtype in (("bf16", torch.bfloat16), ("f32", torch.float32)):
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, H, L, D, generator=g).to(dtype) for _ in range(3))
        F.scaled_dot_product_attention(q, k, v)  # warm-up
        cpu0 = cpu_seconds()
        t0 = time.perf_counter()
        for _ in range(reps):
            F.scaled_dot_product_attention(q, k, v)
        # Mean wall and CPU time per call, the same statistics attention_bench reports.
        times[name] = ((time.perf_counter() - t0) / reps, (cpu_seconds() - cpu0) / reps)
    return times


def main() -> int:
    root = pathlib.Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bench", default=str(root / "build" / "bench" / "attention_bench"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    if not pathlib.Path(args.bench).exists():
        print(f"attention_bench not found at {args.bench}; build it or pass --bench",
              file=sys.stderr)
        return 2
    load_before = os.getloadavg()[0]
    ours = run_tessera(args.bench, args.threads)
    theirs = run_torch(args.threads, args.reps)
    print(f"SDPA (1, {H}, {L}, {D}), {args.threads} threads; load average {load_before:.2f} before,"
          f" {os.getloadavg()[0]:.2f} after")
    print("wall: mean per call (tessera: its iterations, torch: --reps calls after a warm-up);"
          " cpu: process CPU seconds per call, all threads")
    print(f"{'dtype':6} {'tessera ms':>11} {'GFLOP/s':>8} {'torch ms':>9} {'GFLOP/s':>8} "
          f"{'speedup':>8} {'tessera cpu s':>14} {'torch cpu s':>12} {'cpu ratio':>10}")
    for name in ("bf16", "f32"):
        (a, ac), (b, bc) = ours[name], theirs[name]
        print(f"{name:6} {a * 1e3:11.1f} {FLOPS / a / 1e9:8.0f} {b * 1e3:9.1f} "
              f"{FLOPS / b / 1e9:8.0f} {b / a:7.2f}x {ac:14.3f} {bc:12.3f} {bc / ac:9.2f}x")
    for name in ("bf16", "f32"):  # tessera's oneDNN-tile paths (no AMX kernel), for reference
        if name + "_onednn" not in ours:
            continue
        a, ac = ours[name + "_onednn"]
        bc = theirs[name][1]
        print(f"{name} with oneDNN tiles instead of the AMX kernel: {a * 1e3:.1f} ms,"
              f" {FLOPS / a / 1e9:.0f} GFLOP/s, {ac:.3f} cpu s, cpu ratio vs torch {bc / ac:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
