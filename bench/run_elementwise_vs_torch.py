"""PyTorch CPU timings for the cases of bench/elementwise_bench.cpp (same sizes and threads).

Usage: /work/refvenv/bin/python bench/run_elementwise_vs_torch.py [--threads N]
"""
import argparse
import time

import torch
import torch.nn.functional as F

T, D = 4608, 3072


def filled(shape, dtype):
    n = 1
    for s in shape:
        n *= s
    v = (torch.arange(n) % 97 - 48).float() / 17.0
    return v.reshape(shape).to(dtype)


def timeit(fn, reps=10):
    """Best wall and best process-CPU milliseconds (the CPU time is steadier on a shared box)."""
    fn()
    best, best_cpu = float("inf"), float("inf")
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        best = min(best, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    return best * 1e3, best_cpu * 1e3


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    for name, dt in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        a, b = filled((T, D), dt), filled((T, D), dt)
        a3, g = filled((1, T, D), dt), filled((1, 1, D), dt)
        w = filled((D,), dt)
        gx, gw, gb = filled((1, 512, 128, 128), dt), filled((512,), dt), filled((512,), dt)

        def rms():
            v = a.to(torch.float32).pow(2).mean(-1, keepdim=True)
            h = a * torch.rsqrt(v + 1e-6)
            if w.dtype == torch.bfloat16:
                h = h.to(w.dtype)
            return h * w

        cases = {
            "AddSameShape": lambda: a + b,
            "MulRowBroadcast": lambda: a3 * g,
            "Silu": lambda: F.silu(a),
            "GeluTanh": lambda: F.gelu(a, approximate="tanh"),
            "LayerNorm": lambda: F.layer_norm(a, (D,), None, None, 1e-6),
            "RmsNorm": rms,
            "GroupNorm": lambda: F.group_norm(gx, 32, gw, gb, 1e-6),
        }
        for k, fn in cases.items():
            wall, cpu = timeit(fn)
            print(f"{k:16s} {name:5s} wall {wall:8.2f} ms  cpu {cpu:8.2f} ms")


if __name__ == "__main__":
    main()
