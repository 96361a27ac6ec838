#!/usr/bin/env python3
""""flux2-mini": one Flux2Transformer2DModel step, tessera (bench/flux2_bench, per execution
mode) vs diffusers (PyTorch eager and torch.compile), same weights, inputs, dtype and threads,
in one run.

The model has FLUX.2-dev's widths (48 heads x 128 = 6144 hidden, joint dim 15360, in_channels
128, mlp_ratio 3, 4-axis RoPE, guidance embedding) with --double double-stream and --single
single-stream blocks; the step is 512x512 (1024 image tokens) with 512 text tokens. Random
weights (torch's default init, seed 0) are written once in bf16 to --workdir with
save_pretrained, and the forward() arguments (torch.randn, seed 0; the pipeline's ids) to
inputs.safetensors there; both sides load those. Each side runs in its own process (one model in
memory at a time); warm-up first, then --iters steps; best step by wall time and by process CPU
time (all threads; the steadier number on a shared machine).
Usage: ~/.cache/tessera-ref-venv/bin/python bench/run_flux2_vs_torch.py
       [--bench BUILD/bench/flux2_bench] [--threads 2] [--iters 2] [--double 1] [--single 2]
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


def config(double: int, single: int) -> dict:
    return dict(patch_size=1, in_channels=128, out_channels=None, num_layers=double,
                num_single_layers=single, attention_head_dim=128, num_attention_heads=48,
                joint_attention_dim=15360, timestep_guidance_channels=256, mlp_ratio=3.0,
                axes_dims_rope=[32, 32, 32, 32], rope_theta=2000, eps=1e-6, guidance_embeds=True)


def thread_env(threads: int) -> dict:
    return dict(os.environ, TESSERA_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))


def write_workload(folder: pathlib.Path, double: int, single: int, txt: int, size: int) -> None:
    if (folder / "config.json").exists() and (folder / "inputs.safetensors").exists():
        return
    import torch
    from diffusers import Flux2Transformer2DModel
    from safetensors.torch import save_file

    torch.manual_seed(0)
    print(f"writing flux2-mini random weights (bf16) to {folder} ...", flush=True)
    torch.set_default_dtype(torch.bfloat16)  # built in bf16: no f32 copy of the weights
    m = Flux2Transformer2DModel(**config(double, single))
    torch.set_default_dtype(torch.float32)
    m.save_pretrained(folder)
    del m
    gc.collect()
    g = torch.Generator().manual_seed(0)
    h = w = size // 16
    img_ids = torch.cartesian_prod(torch.arange(1), torch.arange(h), torch.arange(w),
                                   torch.arange(1))
    txt_ids = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1),
                                   torch.arange(txt))
    save_file({
        "hidden_states": torch.randn(1, h * w, 128, generator=g).to(torch.bfloat16),
        "encoder_hidden_states": torch.randn(1, txt, 15360, generator=g).to(torch.bfloat16),
        "timestep": torch.tensor([0.5], dtype=torch.bfloat16),
        "guidance": torch.tensor([4.0], dtype=torch.float32),
        "img_ids": img_ids.contiguous(), "txt_ids": txt_ids.contiguous(),
    }, str(folder / "inputs.safetensors"))


def torch_worker(args) -> int:
    import torch
    from diffusers import Flux2Transformer2DModel
    from safetensors.torch import load_file

    torch.set_num_threads(args.threads)
    m = Flux2Transformer2DModel.from_pretrained(args.workdir, torch_dtype=torch.bfloat16).eval()
    inp = load_file(str(args.workdir / "inputs.safetensors"))
    fn = m
    if args.mode == "compile":
        fn = torch.compile(m)
    walls, cpus = [], []
    with torch.inference_mode():
        c0, t0 = time.process_time(), time.perf_counter()
        for i in range(args.warmup + args.iters):
            c, t = time.process_time(), time.perf_counter()
            out = fn(hidden_states=inp["hidden_states"],
                     encoder_hidden_states=inp["encoder_hidden_states"],
                     timestep=inp["timestep"], img_ids=inp["img_ids"], txt_ids=inp["txt_ids"],
                     guidance=inp["guidance"], return_dict=False)[0]
            out.float()
            if i == args.warmup - 1:
                first = time.perf_counter() - t0  # compile (torch.compile) + warm-up
            if i >= args.warmup:
                walls.append(time.perf_counter() - t)
                cpus.append(time.process_time() - c)
    print(json.dumps(dict(side="torch", mode=args.mode, best_wall_s=min(walls),
                          best_cpu_s=min(cpus), steps=len(walls), warmup_wall_s=first)))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--bench", type=pathlib.Path, default=ROOT / "build" / "bench" / "flux2_bench")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--double", type=int, default=1)
    ap.add_argument("--single", type=int, default=2)
    ap.add_argument("--txt", type=int, default=512)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--modes", default="eager,regional", help="tessera's modes")
    ap.add_argument("--workdir", type=pathlib.Path, default=pathlib.Path("/tmp/tessera-flux2-mini"))
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="eager", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_worker:
        return torch_worker(args)

    write_workload(args.workdir, args.double, args.single, args.txt, args.size)
    print(f"flux2-mini: {args.double} double + {args.single} single blocks, {args.size}x"
          f"{args.size}, {args.txt} text tokens, bf16, {args.threads} threads, "
          f"{datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, load {os.getloadavg()[0]:.1f}",
          flush=True)
    rows = []
    for mode in ("eager", "compile"):
        cmd = [sys.executable, __file__, "--torch-worker", "--mode", mode, "--workdir",
               str(args.workdir), "--threads", str(args.threads), "--iters", str(args.iters),
               "--warmup", str(args.warmup)]
        out = subprocess.run(cmd, env=thread_env(args.threads), check=True, capture_output=True,
                             text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    cmd = [str(args.bench), "--model", str(args.workdir), "--inputs",
           str(args.workdir / "inputs.safetensors"), "--dtype", "bf16", "--modes", args.modes,
           "--iters", str(args.iters), "--warmup", str(args.warmup)]
    out = subprocess.run(cmd, env=thread_env(args.threads), check=True, capture_output=True,
                         text=True).stdout
    for line in out.strip().splitlines():
        rows.append(json.loads(line))
        print(line, flush=True)
    eager = next(r for r in rows if r["side"] == "torch" and r["mode"] == "eager")
    comp = next(r for r in rows if r["side"] == "torch" and r["mode"] == "compile")
    print("\n| side | best wall s | best CPU s | vs torch eager (wall / CPU) | vs torch.compile "
          "(wall / CPU) |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['side']} {r['mode']} | {r['best_wall_s']:.2f} | {r['best_cpu_s']:.2f} | "
              f"{eager['best_wall_s'] / r['best_wall_s']:.2f}x / "
              f"{eager['best_cpu_s'] / r['best_cpu_s']:.2f}x | "
              f"{comp['best_wall_s'] / r['best_wall_s']:.2f}x / "
              f"{comp['best_cpu_s'] / r['best_cpu_s']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
