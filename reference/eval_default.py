#!/usr/bin/env python3
"""Evaluates models/tessera-shapes: the 20 held-out prompts x 5 seeds.

For each (prompt, seed): diffusers' FluxPipeline from the folder (float32 compute, 64x64,
max_sequence_length 48, its default 28 steps and guidance 3.5) and `tessera generate` with no
--model and no size/steps flags (the bundled model's defaults); the max pixel difference between
the two, and tools/judge_shapes' verdict on tessera's image. Prints a summary and writes
summary.json (and the images) under --out.

--goldens writes the diffusers images of the first three cases to
tests/fixtures/goldens/tessera-shapes/ for tests/default_model_test.cpp.

Usage: /work/refvenv/bin/python reference/eval_default.py --build build-train [--out DIR]
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import torch

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import train_default  # noqa: E402  (the held-out prompts and the training constants)

MODEL = ROOT / "models" / "tessera-shapes"
GOLDENS = ROOT / "tests" / "fixtures" / "goldens" / "tessera-shapes"
SEEDS = [0, 1, 2, 3, 4]
GOLDEN_CASES = [(0, 0), (3, 1), (8, 2)]  # (prompt index, seed): one, two, one on black


def diffusers_image(pipe, prompt, seed):
    from PIL import Image

    out = pipe(prompt, height=train_default.SIZE, width=train_default.SIZE,
               max_sequence_length=train_default.MAX_SEQ,
               generator=torch.Generator("cpu").manual_seed(seed), output_type="np")
    arr = np.clip(np.rint(out.images[0] * 255), 0, 255).astype(np.uint8)
    return arr, Image.fromarray(arr)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--build", default=str(ROOT / "build"))
    p.add_argument("--out", default="/tmp/tessera-shapes-eval")
    p.add_argument("--goldens", action="store_true")
    p.add_argument("--prompts", type=int, default=20)
    p.add_argument("--seeds", type=int, default=len(SEEDS))
    p.add_argument("--model", default=str(MODEL), help="a candidate folder instead of the "
                   "bundled one (tessera then gets --model and the size/length flags)")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    from diffusers import FluxPipeline
    from PIL import Image

    out = pathlib.Path(args.out)
    (out / "diffusers").mkdir(parents=True, exist_ok=True)
    (out / "tessera").mkdir(parents=True, exist_ok=True)
    build = pathlib.Path(args.build).resolve()
    tessera = build / "tessera"
    judge = build / "tools" / "judge_shapes"
    model = pathlib.Path(args.model).resolve()
    bundled = model == MODEL.resolve()
    extra = [] if bundled else [
        "--model", str(model), "--height", str(train_default.SIZE), "--width",
        str(train_default.SIZE), "--max-sequence-length", str(train_default.MAX_SEQ)]
    pipe = FluxPipeline.from_pretrained(model, torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    prompts = train_default.eval_prompts()[: args.prompts]
    rows, tessera_seconds, diffusers_seconds = [], [], []
    for pi, prompt in enumerate(prompts):
        for seed in SEEDS[: args.seeds]:
            name = f"p{pi:02d}_s{seed}.png"
            t0 = time.time()
            ref, img = diffusers_image(pipe, prompt, seed)
            diffusers_seconds.append(time.time() - t0)
            img.save(out / "diffusers" / name)
            t0 = time.time()
            subprocess.run([str(tessera), "generate", "--prompt", prompt, "--seed", str(seed),
                            "--output", str(out / "tessera" / name)] + extra, check=True,
                           env=dict(os.environ, TESSERA_NUM_THREADS="1"),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            tessera_seconds.append(time.time() - t0)
            ours = np.asarray(Image.open(out / "tessera" / name).convert("RGB"))
            diff = int(np.abs(ours.astype(int) - ref.astype(int)).max())
            verdict = json.loads(subprocess.run(
                [str(judge), "--json", str(out / "tessera" / name)], check=True,
                capture_output=True, text=True).stdout)
            rows.append({"prompt": prompt, "seed": seed, "max_diff": diff, **{
                k: verdict[k] for k in ["colour_ok", "shape_ok", "count_ok", "background_ok"]},
                "seen": [f"{c['colour']} {c['shape']}" for c in verdict["components"]]})
            r = rows[-1]
            print(f"{prompt!r:50} seed {seed}: diff {diff}/255 colour {r['colour_ok']} "
                  f"shape {r['shape_ok']} count {r['count_ok']} saw {r['seen']}", flush=True)
            if args.goldens and bundled and (pi, seed) in GOLDEN_CASES:
                GOLDENS.mkdir(parents=True, exist_ok=True)
                img.save(GOLDENS / f"p{pi:02d}_s{seed}.png")
    n = len(rows)
    summary = {
        "cases": n,
        "colour_ok": sum(r["colour_ok"] for r in rows) / n,
        "shape_ok": sum(r["shape_ok"] for r in rows) / n,
        "count_ok": sum(r["count_ok"] for r in rows) / n,
        "background_ok": sum(r["background_ok"] for r in rows) / n,
        "max_diff_vs_diffusers": max(r["max_diff"] for r in rows),
        "tessera_seconds_per_image": sum(tessera_seconds) / n,
        "diffusers_seconds_per_image": sum(diffusers_seconds) / n,
        "rows": rows,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if args.goldens and bundled:
        cases = [{"prompt": prompts[pi], "seed": s, "image": f"p{pi:02d}_s{s}.png"}
                 for pi, s in GOLDEN_CASES if pi < len(prompts)]
        (GOLDENS / "cases.json").write_text(json.dumps(cases, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}, indent=2))


if __name__ == "__main__":
    main()
