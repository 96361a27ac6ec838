#!/usr/bin/env python3
"""Compiled mode vs strict eager vs PyTorch eager, in one run: the dispatch-bound tiny FLUX
transformer step (tests/fixtures/flux1-schnell-tiny, 64..256 px, 64 text tokens, same inputs as
bench/flux_bench) and flux-deep's compile times (bench/compile_bench).
PyTorch's side is bench/run_flux_vs_torch.py's worker (diffusers FluxTransformer2DModel, own
process, same threads). Best-of-N wall and process-CPU times.
Usage: /work/refvenv/bin/python bench/run_compile_vs_torch.py [--bench BUILD/bench/compile_bench]
       [--threads 2] [--iters 30] [--dtype f32]
"""
import argparse
import datetime
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import run_flux_vs_torch as rf  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--dtype", default="f32")
    args = ap.parse_args()
    bench = pathlib.Path(args.bench) if args.bench else rf.find_build_file("bench/compile_bench")
    sizes = [64, 128, 256]
    out = subprocess.run([str(bench), "--iters", str(args.iters), "--dtype", args.dtype],
                         env=rf.thread_env(args.threads), cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    torch = rf.run_torch(ROOT / "tests/fixtures/flux1-schnell-tiny/transformer", args.dtype, sizes,
                         64, args.threads, args.iters, 3, 1.0)
    print(f"# {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, threads {args.threads}, {args.dtype}")
    print(f"{'size':>5} {'torch_ms':>9} {'torch_cpu':>9} {'eager_ms':>9} {'eager_cpu':>9} "
          f"{'full_ms':>8} {'full_cpu':>8} {'reg_ms':>7} {'reg_cpu':>7} "
          f"{'full/eager':>10} {'full/eager cpu':>14} {'eager/torch cpu':>15}")
    for line in out.splitlines():
        f = line.split()
        if len(f) == 9 and f[0].isdigit():
            size = int(f[0])
            e, ec, fu, fc, r, rc = map(float, f[1:7])
            t = torch[size]
            print(f"{size:>5} {t['best_ms']:>9.3f} {t['best_cpu_ms']:>9.3f} {e:>9.3f} {ec:>9.3f} "
                  f"{fu:>8.3f} {fc:>8.3f} {r:>7.3f} {rc:>7.3f} {e / fu:>10.2f} {ec / fc:>14.2f} "
                  f"{t['best_cpu_ms'] / ec:>15.2f}")
    print(out[out.index("flux-deep"):] if "flux-deep" in out else out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
