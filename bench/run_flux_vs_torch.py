#!/usr/bin/env python3
"""One FLUX transformer step, tessera (bench/flux_bench, per execution mode) vs diffusers'
FluxTransformer2DModel (PyTorch eager), same weights, inputs, dtype and threads, in one run.

Workloads:
  tiny  dispatch-bound (issue 5): the transformer of tests/fixtures/flux1-schnell-tiny (width 32,
        2 double + 2 single blocks) at 64x64, 128x128, 256x256 (16/64/256 image tokens) with
        --txt text tokens; many small ops per step.
  vae   FLUX.1's AutoencoderKL decoder (block_out_channels 128/256/512/512, 16 latent
        channels, random f32 weights written once next to --workdir) at 512x512, with the
        decoder's convolution FLOPs (counted by forward hooks) against the GEMM ceiling.
  mini  compute-bound "flux-mini" (issue 4): FLUX.1's widths (3072 hidden, 24 heads x 128, joint
        dim 4096, pooled 768, in_channels 64) with 2 double + 4 single blocks, one step at
        512x512 (1024 image + 512 text tokens). Random weights (torch's default init, seed 0) are
        written once in bf16 by this script to --workdir with save_pretrained; both sides load
        that folder (cast to f32 for the f32 runs). The GEMM ceiling is bench/gemm_bench's
        tessera linear at (4608, 3072, 3072), measured in the same run.
Each side runs in its own process (one model in memory at a time), warm-up steps first, then
--iters steps; it reports the best step by wall time and the best by process CPU time (all
threads). On a shared machine the CPU-time numbers are the steadier comparison.
Usage: /work/refvenv/bin/python bench/run_flux_vs_torch.py [--workload tiny|mini|vae|all]
       [--bench BUILD/bench/flux_bench] [--gemm-bench BUILD/bench/gemm_bench] [--threads 2] [--dtypes f32,bf16] [--iters N]
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
TINY = ROOT / "tests" / "fixtures" / "flux1-schnell-tiny" / "transformer"
MINI_CONFIG = dict(patch_size=1, in_channels=64, out_channels=None, num_layers=2,
                   num_single_layers=4, attention_head_dim=128, num_attention_heads=24,
                   joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=False,
                   axes_dims_rope=[16, 56, 56])

# FLUX.1's AutoencoderKL (the published vae/config.json's shape keys).
VAE_CONFIG = dict(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 4,
                  up_block_types=["UpDecoderBlock2D"] * 4, block_out_channels=[128, 256, 512, 512],
                  layers_per_block=2, act_fn="silu", latent_channels=16, norm_num_groups=32,
                  sample_size=1024, scaling_factor=0.3611, shift_factor=0.1159,
                  use_quant_conv=False, use_post_quant_conv=False, force_upcast=True)


def find_build_file(rel: str) -> pathlib.Path:
    for build in sorted(ROOT.glob("build*")):
        p = build / rel
        if p.exists():
            return p
    sys.exit(f"{rel} not found; build it: ninja -C <build dir> {rel}")


def thread_env(threads: int) -> dict:
    return dict(os.environ, TESSERA_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))


# ---------------------------------------------------------------- torch side (own process)
def torch_inputs(torch, cfg: dict, size: int, txt: int, dtype):
    """The same draws as flux_bench's make_inputs (torch.randn, seed 0, in this order)."""
    h = w = size // 16
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(1, h * w, cfg["in_channels"], generator=g)
    enc = torch.randn(1, txt, cfg["joint_attention_dim"], generator=g)
    pooled = torch.randn(1, cfg["pooled_projection_dim"], generator=g)
    ids = torch.zeros(h * w, 3)
    ids[:, 1] = torch.arange(h).repeat_interleave(w).float()
    ids[:, 2] = torch.arange(w).repeat(h).float()
    kw = dict(hidden_states=hidden.to(dtype), encoder_hidden_states=enc.to(dtype),
              pooled_projections=pooled.to(dtype), timestep=torch.tensor([1.0], dtype=dtype),
              img_ids=ids, txt_ids=torch.zeros(txt, 3), return_dict=False)
    if cfg.get("guidance_embeds"):
        kw["guidance"] = torch.tensor([3.5])
    return kw


def torch_worker(args) -> int:
    import torch
    from diffusers import FluxTransformer2DModel

    torch.set_num_threads(args.threads)
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[args.dtype]
    model = FluxTransformer2DModel.from_pretrained(args.model, torch_dtype=dtype).eval()
    cfg = dict(model.config)
    results = []
    with torch.inference_mode():
        for size in args.sizes:
            kw = torch_inputs(torch, cfg, size, args.txt, dtype)
            for _ in range(args.warmup):
                model(**kw)
            walls, cpus = [], []
            deadline = time.perf_counter() + args.min_seconds
            while len(walls) < args.iters or (args.iters == 0 and time.perf_counter() < deadline):
                c, t = time.process_time(), time.perf_counter()
                model(**kw)
                walls.append(time.perf_counter() - t)
                cpus.append(time.process_time() - c)
                if args.iters == 0 and len(walls) >= 2000:
                    break
            results.append(dict(size=size, best_ms=min(walls) * 1e3, best_cpu_ms=min(cpus) * 1e3,
                                mean_ms=sum(walls) / len(walls) * 1e3, iters=len(walls)))
    print(json.dumps(results))
    return 0


def torch_vae_worker(args) -> int:
    """AutoencoderKL.decode at each size; also counts the decoder's convolution FLOPs."""
    import torch
    from diffusers import AutoencoderKL

    torch.set_num_threads(args.threads)
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[args.dtype]
    vae = AutoencoderKL.from_pretrained(args.model, torch_dtype=dtype).eval()
    results = []
    with torch.inference_mode():
        for size in args.sizes:
            g = torch.Generator().manual_seed(0)
            z = torch.randn(1, vae.config.latent_channels, size // 8, size // 8, generator=g)
            z = z.to(dtype)
            flops = [0.0]

            def hook(mod, inp, out):
                k = mod.kernel_size[0] * mod.kernel_size[1] * mod.in_channels // mod.groups
                flops[0] += 2.0 * out.numel() * k

            hs = [m.register_forward_hook(hook) for m in vae.decoder.modules()
                  if isinstance(m, torch.nn.Conv2d)]
            vae.decode(z)  # warm-up, counts FLOPs
            for h in hs:
                h.remove()
            walls, cpus = [], []
            for _ in range(max(args.iters, 1)):
                c, t = time.process_time(), time.perf_counter()
                vae.decode(z)
                walls.append(time.perf_counter() - t)
                cpus.append(time.process_time() - c)
            results.append(dict(size=size, best_ms=min(walls) * 1e3, best_cpu_ms=min(cpus) * 1e3,
                                mean_ms=sum(walls) / len(walls) * 1e3, iters=len(walls),
                                conv_GFLOP=flops[0] / 1e9))
    print(json.dumps(results))
    return 0


def run_vae(bench, folder, dtype, sizes, threads, iters):
    cmd = [sys.executable, __file__, "--torch-worker", "--vae-worker", "--model", str(folder),
           "--dtype", dtype, "--sizes", ",".join(map(str, sizes)), "--threads", str(threads),
           "--iters", str(iters)]
    out = subprocess.run(cmd, env=thread_env(threads), check=True, capture_output=True,
                         text=True).stdout
    ref = {r["size"]: r for r in json.loads(out.strip().splitlines()[-1])}
    cmd = [str(bench), "--vae", str(folder), "--dtype", dtype, "--sizes",
           ",".join(map(str, sizes)), "--warmup", "1", "--iters", str(iters),
           "--benchmark_format=json"]
    out = subprocess.run(cmd, env=thread_env(threads), check=True, capture_output=True,
                         text=True).stdout
    tes = {int(b["run_name"].split("/")[2]): b for b in json.loads(out)["benchmarks"]}
    return tes, ref


def write_vae(folder: pathlib.Path) -> None:
    if (folder / "config.json").exists():
        return
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    print(f"writing the FLUX VAE with random weights (f32) to {folder} ...", flush=True)
    AutoencoderKL(**VAE_CONFIG).save_pretrained(folder)


def run_torch(model: pathlib.Path, dtype: str, sizes, txt: int, threads: int, iters: int,
              warmup: int, min_seconds: float):
    cmd = [sys.executable, __file__, "--torch-worker", "--model", str(model), "--dtype", dtype,
           "--sizes", ",".join(map(str, sizes)), "--txt", str(txt), "--threads", str(threads),
           "--iters", str(iters), "--warmup", str(warmup), "--min-seconds", str(min_seconds)]
    out = subprocess.run(cmd, env=thread_env(threads), check=True, capture_output=True,
                         text=True).stdout
    return {r["size"]: r for r in json.loads(out.strip().splitlines()[-1])}


# ---------------------------------------------------------------- tessera side
def run_tessera(bench: pathlib.Path, model: pathlib.Path, dtype: str, sizes, txt: int,
                modes, threads: int, iters: int, warmup: int, min_seconds: float,
                interleave: int = 0):
    cmd = [str(bench), "--model", str(model), "--dtype", dtype, "--sizes",
           ",".join(map(str, sizes)), "--txt", str(txt), "--modes", ",".join(modes), "--warmup",
           str(warmup), "--benchmark_format=json", f"--benchmark_min_time={min_seconds}"]
    if interleave:
        cmd += ["--interleave", str(interleave)]  # modes in turns of a few steps, N rounds
    elif iters:
        cmd += ["--iters", str(iters)]
    out = subprocess.run(cmd, env=thread_env(threads), check=True, capture_output=True,
                         text=True).stdout
    res = {}
    for b in json.loads(out)["benchmarks"]:
        _, _, size, mode = b["run_name"].split("/")[:4]
        b["mean_ms"] = b["real_time"]  # ms per iteration (Unit kMillisecond)
        res[(int(size), mode)] = b
    return res


def gemm_ceiling(threads: int, dtype: str, bench=None):
    """(best wall, per-CPU) GFLOP/s of tessera linear at (4608, 3072, 3072)."""
    bench = bench or find_build_file("bench/gemm_bench")
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
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    print(f"writing flux-mini random weights (bf16) to {folder} ...", flush=True)
    m = FluxTransformer2DModel(**MINI_CONFIG).to(torch.bfloat16)
    m.save_pretrained(folder)
    del m
    gc.collect()


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workload", default="tiny", choices=["tiny", "mini", "vae", "all"])
    ap.add_argument("--bench", type=pathlib.Path, default=None)
    ap.add_argument("--gemm-bench", type=pathlib.Path, default=None,
                    help="bench/gemm_bench for the ceiling (default: the first build*/ found)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtypes", default=None, help="default: f32 for tiny, f32,bf16 for mini")
    ap.add_argument("--modes", default="eager,defer,compile,regional")
    ap.add_argument("--txt", type=int, default=64, help="text tokens of the tiny workload")
    ap.add_argument("--iters", type=int, default=0,
                    help="timed steps (0: tiny runs for --min-seconds, mini runs 2)")
    ap.add_argument("--min-seconds", type=float, default=2.0)
    ap.add_argument("--interleave", type=int, default=0,
                    help="tessera's modes take turns of 8 steps (7 timed), for N rounds (a "
                         "shared machine's load then falls on all alike); adds the median over "
                         "paired steps of eager CPU / mode CPU in the same round")
    ap.add_argument("--workdir", type=pathlib.Path, default=pathlib.Path("/tmp/tessera-flux-mini"))
    # Internal: the torch side in its own process.
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--vae-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--dtype", default="f32", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", default="64,128,256", help=argparse.SUPPRESS)
    ap.add_argument("--warmup", type=int, default=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_worker:
        args.sizes = [int(s) for s in args.sizes.split(",")]
        return torch_vae_worker(args) if args.vae_worker else torch_worker(args)

    import torch
    import diffusers

    bench = args.bench or find_build_file("bench/flux_bench")
    modes = args.modes.split(",")
    start = datetime.datetime.now(datetime.timezone.utc)
    print(f"# {start:%Y-%m-%d %H:%M} UTC, torch {torch.__version__}, diffusers "
          f"{diffusers.__version__}, {args.threads} threads, load average "
          f"{os.getloadavg()[0]:.2f}, bench {bench}")
    workloads = ["tiny", "mini", "vae"] if args.workload == "all" else [args.workload]
    for wl in workloads:
        if wl == "vae":
            folder = args.workdir.parent / "tessera-flux-vae"
            write_vae(folder)
            ceil_dt = {}
            for dt in (args.dtypes or "f32").split(","):
                tes, ref = run_vae(bench, folder, dt, [512], args.threads, args.iters or 1)
                ceil = gemm_ceiling(args.threads, dt, args.gemm_bench)
                r, b = ref[512], tes[512]
                gf = r["conv_GFLOP"]
                print(f"\n## vae decode {dt} 512x512 (conv FLOPs {gf:.0f} GFLOP), GEMM ceiling "
                      f"{ceil[0]:.0f} wall / {ceil[1]:.0f} per CPU-s, load average "
                      f"{os.getloadavg()[0]:.2f}")
                print("| side | best ms | best CPU ms | vs torch (wall) | vs torch (CPU) | "
                      "GFLOP/s wall | of ceiling | GFLOP/s per CPU | of ceiling |")
                print("|---|---|---|---|---|---|---|---|---|")
                for name, x in (("torch eager", r), ("tessera eager", b)):
                    w = gf / (x["best_ms"] / 1e3)
                    c = gf / (x["best_cpu_ms"] / 1e3) * args.threads
                    print(f"| {name} | {x['best_ms']:.0f} | {x['best_cpu_ms']:.0f} | "
                          f"{ratio(r['best_ms'], x['best_ms'])} | "
                          f"{ratio(r['best_cpu_ms'], x['best_cpu_ms'])} | {w:.0f} | "
                          f"{w / ceil[0]:.0%} | {c:.0f} | {c / ceil[1]:.0%} |", flush=True)
            continue
        if wl == "tiny":
            model, sizes, txt = TINY, [64, 128, 256], args.txt
            dtypes = (args.dtypes or "f32").split(",")
            iters, warmup = args.iters, 5
        else:
            write_mini(args.workdir)
            model, sizes, txt = args.workdir, [512], 512
            dtypes = (args.dtypes or "bf16,f32").split(",")
            iters, warmup = args.iters or 2, 1
        for dt in dtypes:
            tes = run_tessera(bench, model, dt, sizes, txt, modes, args.threads, iters, warmup,
                              args.min_seconds, args.interleave)
            ref = run_torch(model, dt, sizes, txt, args.threads, iters, warmup, args.min_seconds)
            print(f"\n## {wl} {dt} (text tokens {txt}), load average {os.getloadavg()[0]:.2f}")
            ceil = None
            if wl == "mini":
                ceil = gemm_ceiling(args.threads, dt, args.gemm_bench)
                print(f"GEMM ceiling (gemm_bench 4608x3072x3072): {ceil[0]:.0f} GFLOP/s wall, "
                      f"{ceil[1]:.0f} per CPU-second")
            head = "| size | side | best ms | mean ms | best CPU ms | vs torch (wall) | " \
                   "vs torch (CPU) | vs eager (wall) | vs eager (CPU) | ops/step | fused/step |"
            if args.interleave:
                head += " median CPU ms | median paired ratio vs eager (CPU) |"
            if ceil:
                head += " GFLOP/s wall | of ceiling | GFLOP/s per CPU | of ceiling |"
            print(head)
            print("|" + "---|" * (head.count("|") - 1))
            for size in sizes:
                r = ref[size]
                eager = tes.get((size, "eager"))
                rows = [("torch eager", r, {})] + [(f"tessera {m}", tes[(size, m)], tes[(size, m)])
                                                   for m in modes]
                for name, b, c in rows:
                    line = (f"| {size} | {name} | {b['best_ms']:.3f} | {b['mean_ms']:.3f} | "
                            f"{b['best_cpu_ms']:.3f} | {ratio(r['best_ms'], b['best_ms'])} | "
                            f"{ratio(r['best_cpu_ms'], b['best_cpu_ms'])} | ")
                    if eager and c:
                        line += (f"{ratio(eager['best_ms'], b['best_ms'])} | "
                                 f"{ratio(eager['best_cpu_ms'], b['best_cpu_ms'])} | "
                                 f"{c.get('ops_per_step', 0):.0f} | "
                                 f"{c.get('fused_per_step', 0):.0f} |")
                    else:
                        line += "- | - | - | - |"
                    if args.interleave:
                        line += (f" {c['median_cpu_ms']:.3f} | {c['median_round_ratio']:.2f}x |"
                                 if c else " - | - |")
                    if ceil:
                        gf = (eager or b)["GFLOP"] if eager else None
                        if gf:
                            w = gf / (b["best_ms"] / 1e3)
                            cpu = gf / (b["best_cpu_ms"] / 1e3) * args.threads
                            line += (f" {w:.0f} | {w / ceil[0]:.0%} | {cpu:.0f} | "
                                     f"{cpu / ceil[1]:.0%} |")
                    print(line, flush=True)
            if eager:
                print(f"step FLOPs (matmul + attention): {eager['GFLOP']:.1f} GFLOP")
    print(f"\n# finished {datetime.datetime.now(datetime.timezone.utc):%H:%M} UTC, load average "
          f"{os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
