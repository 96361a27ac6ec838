#!/usr/bin/env python3
""""sd35-mini" (issue 21): one SD3 transformer step with classifier-free guidance, tessera
(bench/sd3_bench, per execution mode) vs diffusers' SD3Transformer2DModel in PyTorch eager and
under torch.compile, same weights, inputs, dtype and threads, in one run.

The model has SD3.5-medium's widths (1536 hidden = 24 heads x 64, joint dim 4096, pooled 2048,
RMS qk-norm) with 2 dual-attention + 2 joint blocks (the last one context_pre_only); one step at
512x512 (1024 image tokens) with 77 + 256 text tokens, batch 2 ([negative, positive]). Random
weights (torch's default init, seed 0) are written once in bf16 to --workdir with
save_pretrained; both sides load that folder. Each side runs in its own process; warm-up steps
first (torch.compile's compilation happens there), then --iters timed steps; best wall and best
process-CPU milliseconds are reported. The GEMM ceiling is bench/gemm_bench's tessera linear at
(4608, 3072, 3072), measured in the same run. With --rounds N the sides take turns N times
(tessera, torch eager, torch.compile, round after round), so a shared machine's load falls on
each alike; the table then adds, per side, the median over rounds of (torch's CPU ms / this
side's CPU ms) in the same round.
Usage: ~/.cache/tessera-ref-venv/bin/python bench/run_sd3_vs_torch.py [--threads 2]
       [--dtype bf16] [--iters 2] [--modes eager,defer,compile,regional] [--rounds N]
"""
import argparse
import datetime
import gc
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
MINI_CONFIG = dict(sample_size=64, patch_size=2, in_channels=16, num_layers=4,
                   attention_head_dim=64, num_attention_heads=24, joint_attention_dim=4096,
                   caption_projection_dim=1536, pooled_projection_dim=2048, out_channels=16,
                   pos_embed_max_size=96, dual_attention_layers=(0, 1), qk_norm="rms_norm")
SIZE, TXT, BATCH = 512, 77 + 256, 2


def find_build_file(rel: str) -> pathlib.Path:
    for build in sorted(ROOT.glob("build*")):
        p = build / rel
        if p.exists():
            return p
    sys.exit(f"{rel} not found; build it: ninja -C <build dir> {rel}")


def thread_env(threads: int) -> dict:
    return dict(os.environ, TESSERA_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))


def torch_worker(args) -> int:
    import torch
    from diffusers import SD3Transformer2DModel

    torch.set_num_threads(args.threads)
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[args.dtype]
    model = SD3Transformer2DModel.from_pretrained(args.model, torch_dtype=dtype).eval()
    c = model.config
    g = torch.Generator().manual_seed(0)  # sd3_bench draws the same values in this order
    kw = dict(hidden_states=torch.randn(BATCH, c.in_channels, SIZE // 8, SIZE // 8, generator=g),
              encoder_hidden_states=torch.randn(BATCH, TXT, c.joint_attention_dim, generator=g),
              pooled_projections=torch.randn(BATCH, c.pooled_projection_dim, generator=g))
    kw = {k: v.to(dtype) for k, v in kw.items()}
    kw["timestep"] = torch.full((BATCH,), 500.0)
    fn = torch.compile(model) if args.compiled else model
    with torch.inference_mode():
        t0 = time.perf_counter()
        for _ in range(args.warmup):
            fn(**kw, return_dict=False)
        warm = time.perf_counter() - t0
        walls, cpus = [], []
        for _ in range(args.iters):
            c0, t = time.process_time(), time.perf_counter()
            fn(**kw, return_dict=False)
            walls.append(time.perf_counter() - t)
            cpus.append(time.process_time() - c0)
    print(json.dumps(dict(best_ms=min(walls) * 1e3, best_cpu_ms=min(cpus) * 1e3, warmup_s=warm)))
    return 0


def run_torch(args, compiled: bool) -> dict:
    cmd = [sys.executable, __file__, "--torch-worker", "--model", str(args.workdir), "--dtype",
           args.dtype, "--threads", str(args.threads), "--iters", str(args.iters), "--warmup",
           str(args.warmup + (1 if compiled else 0))]
    if compiled:
        cmd.append("--compiled")
    out = subprocess.run(cmd, env=thread_env(args.threads), check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def run_tessera(args) -> dict:
    bench = args.bench or find_build_file("bench/sd3_bench")
    cmd = [str(bench), "--model", str(args.workdir), "--dtype", args.dtype, "--size", str(SIZE),
           "--txt", str(TXT), "--batch", str(BATCH), "--modes", args.modes, "--warmup",
           str(args.warmup), "--iters", str(args.iters)]
    out = subprocess.run(cmd, env=thread_env(args.threads), check=True, capture_output=True,
                         text=True).stdout
    return {r["mode"]: r for r in map(json.loads, out.strip().splitlines())}


def gemm_ceiling(threads: int, dtype: str):
    """(best wall, per-CPU) GFLOP/s of tessera linear at (4608, 3072, 3072)."""
    bench = find_build_file("bench/gemm_bench")
    env = dict(thread_env(threads), GEMM_BENCH_ITERS="3")
    out = subprocess.run([str(bench), "--benchmark_format=json",
                          f"--benchmark_filter=^BM_tessera_linear/{dtype}/M:4608/K:3072/N:3072/"],
                         env=env, check=True, capture_output=True, text=True).stdout
    b = json.loads(out)["benchmarks"][0]
    return b["best_GFLOP/s"], b["cpu_GFLOP/s"]


def write_mini(folder: pathlib.Path) -> None:
    if (folder / "config.json").exists():
        return
    import torch
    from diffusers import SD3Transformer2DModel

    torch.manual_seed(0)
    print(f"writing sd35-mini random weights (bf16) to {folder} ...", flush=True)
    m = SD3Transformer2DModel(**MINI_CONFIG).to(torch.bfloat16)
    m.save_pretrained(folder)
    del m
    gc.collect()


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--bench", type=pathlib.Path, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--modes", default="eager,defer,compile,regional")
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile side")
    ap.add_argument("--rounds", type=int, default=1, help="sides take turns, N rounds")
    ap.add_argument("--workdir", type=pathlib.Path, default=pathlib.Path("/tmp/tessera-sd35-mini"))
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--compiled", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_worker:
        return torch_worker(args)

    import torch
    import diffusers

    start = datetime.datetime.now(datetime.timezone.utc)
    print(f"# {start:%Y-%m-%d %H:%M} UTC, torch {torch.__version__}, diffusers "
          f"{diffusers.__version__}, {args.threads} threads, load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    write_mini(args.workdir)
    rounds = []  # per round: {side name: result}
    for r in range(args.rounds):
        tes_r = run_tessera(args)
        res = {"torch eager": run_torch(args, compiled=False)}
        if not args.no_compile:
            res["torch.compile"] = run_torch(args, compiled=True)
        res.update({f"tessera {m}": x for m, x in tes_r.items()})
        rounds.append(res)
        print(f"# round {r + 1}/{args.rounds} done, load average {os.getloadavg()[0]:.2f}",
              flush=True)

    def best(side):  # the best step over all rounds
        xs = [rd[side] for rd in rounds]
        return dict(best_ms=min(x["best_ms"] for x in xs),
                    best_cpu_ms=min(x["best_cpu_ms"] for x in xs),
                    warmup_s=min(x["warmup_s"] for x in xs))

    def paired(side, ref):  # median over rounds of ref CPU / side CPU
        v = sorted(rd[ref]["best_cpu_ms"] / rd[side]["best_cpu_ms"] for rd in rounds)
        return f"{v[len(v) // 2]:.2f}x"

    tes = {m: best(f"tessera {m}") for m in args.modes.split(",")}
    tes = {m: dict(x, GFLOP=rounds[0][f"tessera {m}"]["GFLOP"]) for m, x in tes.items()}
    eager = best("torch eager")
    compiled = None if args.no_compile else best("torch.compile")
    ceil = gemm_ceiling(args.threads, args.dtype)
    gf = next(iter(tes.values()))["GFLOP"]
    print(f"\n## sd35-mini {args.dtype}, {SIZE}x{SIZE}, {TXT} text tokens, batch {BATCH}: "
          f"{gf:.0f} GFLOP per step (matmul + attention); GEMM ceiling (gemm_bench "
          f"4608x3072x3072) {ceil[0]:.0f} GFLOP/s wall, {ceil[1]:.0f} per CPU-second; load "
          f"average {os.getloadavg()[0]:.2f}")
    print("| side | best ms | best CPU ms | vs torch eager (wall) | vs torch eager (CPU) | "
          "vs torch.compile (wall) | vs torch.compile (CPU) | GFLOP/s wall | of ceiling | "
          "GFLOP/s per CPU | of ceiling | warm-up s |" +
          (" paired vs torch eager (CPU) | paired vs torch.compile (CPU) |"
           if args.rounds > 1 else ""))
    print("|---|---|---|---|---|---|---|---|---|---|---|---|" +
          ("---|---|" if args.rounds > 1 else ""))
    rows = [("torch eager", eager)]
    if compiled:
        rows.append(("torch.compile", compiled))
    rows += [(f"tessera {m}", tes[m]) for m in args.modes.split(",")]
    for name, x in rows:
        w = gf / (x["best_ms"] / 1e3)
        c = gf / (x["best_cpu_ms"] / 1e3) * args.threads
        tc = compiled or {}
        print(f"| {name} | {x['best_ms']:.0f} | {x['best_cpu_ms']:.0f} | "
              f"{ratio(eager['best_ms'], x['best_ms'])} | "
              f"{ratio(eager['best_cpu_ms'], x['best_cpu_ms'])} | "
              f"{ratio(tc.get('best_ms', 0), x['best_ms'])} | "
              f"{ratio(tc.get('best_cpu_ms', 0), x['best_cpu_ms'])} | {w:.0f} | "
              f"{w / ceil[0]:.0%} | {c:.0f} | {c / ceil[1]:.0%} | "
              f"{x.get('warmup_s', 0):.1f} |" +
              (f" {paired(name, 'torch eager')} | "
               f"{paired(name, 'torch.compile') if compiled else '-'} |"
               if args.rounds > 1 else ""), flush=True)
    print(f"\n# finished {datetime.datetime.now(datetime.timezone.utc):%H:%M} UTC, load average "
          f"{os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
