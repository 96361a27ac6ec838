#!/usr/bin/env python3
"""Trains models/tessera-shapes: a small FLUX.1-dev-architecture pipeline that draws shapes.

Procedural 64x64 images (circle, square, triangle, star in named colours on named backgrounds,
one or two of them) with captions like "a red circle on a white background" or "two blue
squares". Stage 1 trains the AutoencoderKL (FLUX layout: 16 latent channels, 8x down, no quant
convs); stage 2 trains FluxTransformer2DModel jointly with the tiny CLIP and T5 encoders on the
rectified-flow objective (x_t = (1-t) x0 + t noise, target noise - x0, logit-normal t).
Reproducible: fixed seeds, torch on one thread, deterministic algorithms.

Usage: /work/refvenv/bin/python reference/train_default.py [--out models/tessera-shapes]
       [--vae-steps N] [--dit-steps N]   (smaller numbers: a smoke run)
"""
import argparse
import json
import math
import os
import pathlib
import shutil
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
TOKENIZERS = ROOT / "tests" / "fixtures" / "flux1-schnell-tiny"

SIZE = 64
MAX_SEQ = 48  # T5 tokens: the longest caption is 39 tokens with this (character-level) vocabulary

# Named colours (RGB). Foreground colours, then background-only ones.
COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 160, 50),
    "blue": (30, 70, 220),
    "yellow": (245, 215, 30),
    "orange": (245, 135, 20),
    "purple": (135, 45, 175),
    "white": (255, 255, 255),
    "black": (0, 0, 0),
    "gray": (128, 128, 128),
}
FOREGROUNDS = ["red", "green", "blue", "yellow", "orange", "purple", "white", "black"]
BACKGROUNDS = ["white", "black", "gray", "yellow", "blue"]
SHAPES = ["circle", "square", "triangle", "star"]
PLURAL = {"circle": "circles", "square": "squares", "triangle": "triangles", "star": "stars"}

# (colour, shape, background) triples never shown in training: the held-out evaluation set.
HELD_OUT = [
    ("red", "star", "black"), ("red", "square", "gray"), ("green", "circle", "white"),
    ("green", "triangle", "yellow"), ("blue", "star", "white"), ("blue", "circle", "gray"),
    ("yellow", "square", "black"), ("yellow", "triangle", "blue"), ("orange", "circle", "black"),
    ("orange", "star", "gray"), ("purple", "square", "white"), ("purple", "triangle", "black"),
    ("white", "star", "blue"), ("white", "circle", "black"), ("black", "square", "yellow"),
    ("black", "triangle", "white"), ("red", "triangle", "blue"), ("green", "square", "black"),
    ("blue", "triangle", "yellow"), ("purple", "circle", "yellow"),
]


def caption(colour, shape, bg, count, with_bg=True):
    obj = f"a {colour} {shape}" if count == 1 else f"two {colour} {PLURAL[shape]}"
    return f"{obj} on a {bg} background" if with_bg else obj


def eval_prompts():
    """The 20 held-out prompts: every 4th asks for two shapes."""
    return [caption(c, s, b, 2 if i % 4 == 3 else 1) for i, (c, s, b) in enumerate(HELD_OUT)]


def training_triples():
    held = set(HELD_OUT)
    return [(c, s, b) for c in FOREGROUNDS for s in SHAPES for b in BACKGROUNDS
            if c != b and (c, s, b) not in held]


# ---------------------------------------------------------------- procedural images
SS = 4  # supersampling factor: shapes are drawn at 256x256 and box-filtered to 64x64


def shape_mask(shape, cx, cy, r, n):
    """Boolean mask (n x n, supersampled pixel centres) of one shape centred at (cx, cy) in
    64-pixel units with 'radius' r (half the bounding box size)."""
    ys, xs = np.mgrid[0:n, 0:n].astype(np.float32)
    x = (xs + 0.5) / SS - cx
    y = (ys + 0.5) / SS - cy
    if shape == "circle":
        return x * x + y * y <= r * r
    if shape == "square":
        return (np.abs(x) <= r) & (np.abs(y) <= r)
    if shape == "triangle":  # upright, base at y = +r, apex at y = -r
        h = 2 * r
        return (y <= r) & (y >= -r) & (np.abs(x) <= (y + r) / h * r * 1.0)
    if shape == "star":  # five points, inner radius 0.45 r, one point up
        pts = []
        for k in range(10):
            a = -math.pi / 2 + k * math.pi / 5
            rr = r if k % 2 == 0 else 0.45 * r
            pts.append((rr * math.cos(a), rr * math.sin(a)))
        inside = np.zeros_like(x, dtype=bool)
        # even-odd rule over the polygon edges
        for i in range(10):
            x1, y1 = pts[i]
            x2, y2 = pts[(i + 1) % 10]
            cond = ((y1 > y) != (y2 > y)) & (x < (x2 - x1) * (y - y1) / (y2 - y1 + 1e-12) + x1)
            inside ^= cond
        return inside
    raise ValueError(shape)


def draw(rng, colour, shape, bg, count):
    """One 64x64 uint8 RGB image (H, W, 3)."""
    n = SIZE * SS
    img = np.empty((n, n, 3), np.float32)
    img[:] = COLOURS[bg]
    placed = []
    for _ in range(count):
        for _attempt in range(100):
            r = rng.uniform(9, 18) if count == 1 else rng.uniform(6, 11)
            cx, cy = rng.uniform(r + 2, SIZE - r - 2, size=2)
            if all(math.hypot(cx - px, cy - py) > r + pr + 3 for px, py, pr in placed):
                break
        placed.append((cx, cy, r))
        img[shape_mask(shape, cx, cy, r, n)] = COLOURS[colour]
    img = img.reshape(SIZE, SS, SIZE, SS, 3).mean(axis=(1, 3))
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def make_dataset(n, seed):
    rng = np.random.default_rng(seed)
    triples = training_triples()
    images = np.empty((n, SIZE, SIZE, 3), np.uint8)
    captions = []
    for i in range(n):
        c, s, b = triples[rng.integers(len(triples))]
        count = 1 if rng.random() < 0.6 else 2
        with_bg = rng.random() < 0.75
        images[i] = draw(rng, c, s, b, count)
        captions.append(caption(c, s, b, count, with_bg))
    return images, captions


# ---------------------------------------------------------------- models
def make_vae():
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    # 16 channels at full resolution: the 8-channel VAE of the first model turned red into
    # orange and stars into blobs (held-out reconstructions judged 49% colour / 45% shape)
    return AutoencoderKL(
        in_channels=3, out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4,
        block_out_channels=[16, 32, 64, 64], layers_per_block=1, act_fn="silu",
        latent_channels=16, norm_num_groups=8, sample_size=SIZE, scaling_factor=1.0,
        shift_factor=0.0, force_upcast=True, use_quant_conv=False, use_post_quant_conv=False,
        mid_block_add_attention=True)


def make_transformer(heads=4, double=2, single=3):
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(1)
    return FluxTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=double, num_single_layers=single,
        attention_head_dim=32, num_attention_heads=heads, joint_attention_dim=64,
        pooled_projection_dim=64, guidance_embeds=True, axes_dims_rope=(8, 12, 12))


def make_models():
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    vae = make_vae()
    transformer = make_transformer()
    torch.manual_seed(2)
    clip = CLIPTextModel(CLIPTextConfig(
        vocab_size=49408, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=77, hidden_act="quick_gelu",
        projection_dim=64, bos_token_id=0, eos_token_id=2, pad_token_id=1))
    torch.manual_seed(3)
    t5 = T5EncoderModel(T5Config(
        vocab_size=1300, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
        feed_forward_proj="gated-gelu", dropout_rate=0.0, relative_attention_num_buckets=32,
        relative_attention_max_distance=128, is_encoder_decoder=False, use_cache=False,
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0))
    return vae, transformer, clip, t5


def load_models(folder):
    from diffusers import AutoencoderKL, FluxTransformer2DModel
    from transformers import CLIPTextModel, T5EncoderModel

    f = pathlib.Path(folder)
    return (AutoencoderKL.from_pretrained(f / "vae", torch_dtype=torch.float32),
            FluxTransformer2DModel.from_pretrained(f / "transformer", torch_dtype=torch.float32),
            CLIPTextModel.from_pretrained(f / "text_encoder", dtype=torch.float32),
            T5EncoderModel.from_pretrained(f / "text_encoder_2", dtype=torch.float32))


def images_to_tensor(u8):
    return torch.from_numpy(u8).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def train_vae(vae, images, steps, batch, gen, lr=1e-3, kl_weight=1e-6, fg_weight=4.0,
              decoder_only=False, edge_weight=0.0):
    """decoder_only: the encoder (so the latent space the transformer learned) stays fixed and
    only the decoder learns, e.g. to draw the star points and small triangles sharper."""
    params = list(vae.decoder.parameters()) if decoder_only else list(vae.parameters())
    if decoder_only:
        vae.encoder.requires_grad_(False)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, fused=True)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.05)
    vae.train()
    t0 = time.time()
    for step in range(steps):
        idx = torch.randint(0, len(images), (batch,), generator=gen)
        u8 = images[idx.numpy()]
        x = images_to_tensor(u8)
        # the shapes cover ~15% of the pixels: weighted up (pixels unlike the corner, which is
        # always background), the VAE learns their colour (unweighted: 18% held-out colour)
        fg = np.abs(u8.astype(np.int16) - u8[:, :1, :1].astype(np.int16)).sum(-1) > 24
        w = 1.0 + fg_weight * torch.from_numpy(fg).float().unsqueeze(1)
        if edge_weight:  # pixels within one of a colour change: the points and corners
            g = x.diff(dim=3).abs().sum(1, keepdim=True) > 0.2
            g = F.pad(g.float(), (0, 1, 0, 0)) + F.pad(
                (x.diff(dim=2).abs().sum(1, keepdim=True) > 0.2).float(), (0, 0, 0, 1))
            w = w + edge_weight * (F.max_pool2d(g, 3, 1, 1) > 0).float()
        if decoder_only:
            with torch.no_grad():
                post = vae.encode(x).latent_dist
        else:
            post = vae.encode(x).latent_dist
        z = post.mean + post.std * torch.randn(post.mean.shape, generator=gen)
        rec = vae.decode(z).sample
        kl = 0.5 * (post.mean.pow(2) + post.var - 1.0 - post.logvar).mean()
        d = rec - x
        loss = (w * (d.abs() + d * d)).mean() / w.mean() + kl_weight * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            log(f"vae step {step}/{steps} loss {loss.item():.4f} kl {kl.item():.3f} "
                f"({time.time() - t0:.0f}s)")
    vae.eval()


def tokenize(captions):
    from transformers import CLIPTokenizer, T5TokenizerFast

    tok = CLIPTokenizer.from_pretrained(TOKENIZERS / "tokenizer")
    tok2 = T5TokenizerFast.from_pretrained(TOKENIZERS / "tokenizer_2")
    uniq = sorted(set(captions) | {""})  # "": the unconditional caption (caption dropout, CFG)
    clip_ids = tok(uniq, padding="max_length", max_length=77, truncation=True,
                   return_tensors="pt").input_ids
    t5 = tok2(uniq, padding="max_length", max_length=MAX_SEQ, truncation=True,
              return_length=False, return_overflowing_tokens=False, return_tensors="pt")
    longest = max(len(tok2(u).input_ids) for u in uniq)
    assert longest <= MAX_SEQ, f"caption of {longest} T5 tokens > {MAX_SEQ}"
    index = {u: i for i, u in enumerate(uniq)}
    return (clip_ids, t5.input_ids, torch.tensor([index[c] for c in captions]), longest,
            index[""])


class Ema:
    """Exponential moving average of the weights (decay warmed up as (1 + n) / (10 + n)): the
    averaged weights are what is saved and sampled, the raw ones keep training."""

    def __init__(self, modules, decay):
        self.decay = decay
        self.params = [p for m in modules for p in m.parameters()]
        self.shadow = [p.detach().clone() for p in self.params]
        self.n = 0

    @torch.no_grad()
    def update(self):
        self.n += 1
        d = min(self.decay, (1 + self.n) / (10 + self.n))
        torch._foreach_lerp_(self.shadow, [p.detach() for p in self.params], 1.0 - d)

    @torch.no_grad()
    def copy_to_model(self):
        for p, s in zip(self.params, self.shadow):
            p.copy_(s)

    @torch.no_grad()
    def swap(self):
        """Exchanges the raw and averaged weights (twice: back as they were)."""
        for p, s in zip(self.params, self.shadow):
            tmp = p.detach().clone()
            p.copy_(s)
            s.copy_(tmp)


def train_dit(transformer, clip, t5, latents, cap_idx, clip_ids, t5_ids, steps, batch, gen,
              lr=1e-3, ema_decay=0.999, budget_s=None, snapshot=None, empty_idx=None,
              caption_dropout=0.0, teacher=None, guidance_range=(1.0, 6.0), t_shift=1.0,
              stop_at=None, guidance_gain=1.0):
    """teacher: guidance distillation (FLUX.1-dev's recipe). The text encoders are frozen (the
    teacher's), and the transformer learns to predict, for g ~ U[guidance_range] given through its
    guidance input, the teacher's classifier-free-guided velocity u + s (c - u) at the scale
    s = 1 + guidance_gain (g - 1) (c: the caption, u: the empty caption), so a stock
    FluxPipeline's guidance_scale gives guided samples (g = 1: unguided)."""
    from diffusers import FluxPipeline

    if teacher is not None:
        clip.requires_grad_(False); t5.requires_grad_(False); teacher.requires_grad_(False)
        params = list(transformer.parameters())
    else:
        params = (list(transformer.parameters()) + list(clip.parameters()) +
                  list(t5.parameters()))
    # fused: 5x faster than the default on one thread (the 3.2M-entry CLIP embedding dominates)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.99), fused=True)
    ema_modules = [transformer] if teacher is not None else [transformer, clip, t5]
    ema = Ema(ema_modules, ema_decay) if ema_decay > 0 else None
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.05)
    transformer.train()
    if teacher is None:
        clip.train(); t5.train()
    lh = latents.shape[2]
    img_ids = FluxPipeline._prepare_latent_image_ids(batch, lh // 2, lh // 2, "cpu", torch.float32)
    txt_ids = torch.zeros(MAX_SEQ, 3)
    t0 = time.time()
    avg = None
    done = steps
    for step in range(steps):
        if budget_s is not None and time.time() - t0 > budget_s:
            done = step  # a safety stop on a slower machine: the averaged weights are kept
            log(f"dit stopped by the time budget at step {step}/{steps}")
            break
        if stop_at is not None and step == stop_at:  # replays a run the time budget stopped
            done = step
            log(f"dit stopped at step {step}/{steps} (--dit-stop-at)")
            break
        idx = torch.randint(0, len(latents), (batch,), generator=gen)
        x0 = latents[idx]
        c = cap_idx[idx]
        if caption_dropout:  # the empty caption 10% of the time: an unconditional model for CFG
            drop = torch.rand(batch, generator=gen) < caption_dropout
            c = torch.where(drop, torch.full_like(c, empty_idx), c)
        if teacher is not None:
            with torch.no_grad():
                both = torch.cat([c, torch.full_like(c, empty_idx)])
                pooled2 = clip(clip_ids[both]).pooler_output
                text2 = t5(t5_ids[both]).last_hidden_state
            pooled, text = pooled2[:batch], text2[:batch]
        else:
            pooled = clip(clip_ids[c]).pooler_output
            text = t5(t5_ids[c]).last_hidden_state
        noise = torch.randn(x0.shape, generator=gen)
        # logit-normal t (as SD3/FLUX training), with 10% uniform so the ends are covered
        t = torch.sigmoid(torch.randn(batch, generator=gen))
        u = torch.rand(batch, generator=gen)
        t = torch.where(torch.rand(batch, generator=gen) < 0.1, u, t)
        if t_shift != 1.0:  # the sampler's shift of the sigmas (FLUX: exp(mu) from the tokens)
            t = t_shift * t / (1 + (t_shift - 1) * t)
        tt = t.view(-1, 1, 1, 1)
        xt = (1 - tt) * x0 + tt * noise
        packed = FluxPipeline._pack_latents(xt, batch, 16, lh, lh)
        target = FluxPipeline._pack_latents(noise - x0, batch, 16, lh, lh)
        guidance = torch.rand(batch, generator=gen) * 10.0  # ignored: any --guidance works
        if teacher is not None:
            lo, hi = guidance_range
            guidance = lo + (hi - lo) * torch.rand(batch, generator=gen)
            with torch.no_grad():  # conditional and unconditional teacher velocities, one batch
                v = teacher(hidden_states=torch.cat([packed, packed]), timestep=torch.cat([t, t]),
                            guidance=torch.cat([guidance, guidance]), pooled_projections=pooled2,
                            encoder_hidden_states=text2, txt_ids=txt_ids,
                            img_ids=img_ids, return_dict=False)[0]
                vc, vu = v[:batch], v[batch:]
                scale = 1.0 + guidance_gain * (guidance - 1.0)
                target = vu + scale.view(-1, 1, 1) * (vc - vu)
        pred = transformer(hidden_states=packed, timestep=t, guidance=guidance,
                           pooled_projections=pooled, encoder_hidden_states=text,
                           txt_ids=txt_ids, img_ids=img_ids, return_dict=False)[0]
        loss = F.mse_loss(pred, target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if ema is not None:
            ema.update()
        avg = loss.item() if avg is None else 0.98 * avg + 0.02 * loss.item()
        if step % 50 == 0 or step == steps - 1:
            log(f"dit step {step}/{steps} loss {loss.item():.4f} avg {avg:.4f} "
                f"({time.time() - t0:.0f}s)")
        if snapshot and step > 0 and step % snapshot[0] == 0:
            snapshot[1](ema)  # a folder of the averaged weights so far, to evaluate meanwhile
    if ema is not None:
        ema.copy_to_model()
    transformer.eval(); clip.eval(); t5.eval()
    clip.requires_grad_(True); t5.requires_grad_(True)
    return done, time.time() - t0


def copy_tokenizers(out):
    """The fixtures' tokenizer folders as they are (save_pretrained would rewrite them as
    tokenizer.json only), with tokenizer_2's model_max_length set to the trained T5 length:
    tessera's default for the bundled model."""
    for sub in ["tokenizer", "tokenizer_2"]:
        shutil.rmtree(out / sub, ignore_errors=True)
        shutil.copytree(TOKENIZERS / sub, out / sub, symlinks=False)
    cfg_path = out / "tokenizer_2" / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["model_max_length"] = MAX_SEQ
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")


def save_pipeline(out, vae, transformer, clip, t5, dtype):
    """The stock FluxPipeline folder (copies of the modules in `dtype`; the originals stay)."""
    import copy

    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline
    from transformers import CLIPTokenizer, T5TokenizerFast

    scheduler = FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
        max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096)
    pipe = FluxPipeline(
        scheduler=scheduler, vae=copy.deepcopy(vae).to(dtype),
        text_encoder=copy.deepcopy(clip).to(dtype),
        tokenizer=CLIPTokenizer.from_pretrained(TOKENIZERS / "tokenizer"),
        text_encoder_2=copy.deepcopy(t5).to(dtype),
        tokenizer_2=T5TokenizerFast.from_pretrained(TOKENIZERS / "tokenizer_2"),
        transformer=copy.deepcopy(transformer).to(dtype))
    out = pathlib.Path(out)
    if out.exists():
        for sub in ["scheduler", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2",
                    "transformer", "vae"]:
            shutil.rmtree(out / sub, ignore_errors=True)
    pipe.save_pretrained(out, safe_serialization=True)
    copy_tokenizers(out)


def replace_vae(out, folder, dtype):
    """Puts FOLDER/vae (same encoder, a fine-tuned decoder) into the saved pipeline OUT: the
    transformer trained on the same latents, so it is what --vae-from FOLDER would have made."""
    from diffusers import AutoencoderKL

    vae = AutoencoderKL.from_pretrained(folder / "vae", torch_dtype=torch.float32)
    old = AutoencoderKL.from_pretrained(out / "vae", torch_dtype=torch.float32)
    same = all(torch.equal(a.to(dtype), b.to(dtype)) for a, b in zip(vae.encoder.state_dict().values(),
                                                 old.encoder.state_dict().values()))
    assert same and vae.config.scaling_factor == old.config.scaling_factor, \
        f"[train_default] {folder}/vae has another encoder or scale than {out}/vae"
    shutil.rmtree(out / "vae")
    vae.to(dtype).save_pretrained(out / "vae", safe_serialization=True)
    recipe_path = out / "training_recipe.json"
    recipe = json.loads(recipe_path.read_text())
    recipe["vae_replaced_by"] = json.loads((folder / "vae_recipe.json").read_text())
    recipe_path.write_text(json.dumps(recipe, indent=2) + "\n")
    log(f"{out}/vae replaced by {folder}/vae")


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default=str(ROOT / "models" / "tessera-shapes"))
    p.add_argument("--images", type=int, default=10000)
    p.add_argument("--vae-steps", type=int, default=1500)
    p.add_argument("--vae-batch", type=int, default=16)
    p.add_argument("--dit-steps", type=int, default=2400)
    p.add_argument("--dit-batch", type=int, default=32)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dit-lr", type=float, default=1e-3)
    p.add_argument("--resume", help="continue the transformer and text encoders of a saved "
                   "folder (its VAE kept as it is); the data are drawn again from --seed")
    p.add_argument("--ema", type=float, default=0.999,
                   help="EMA decay of the transformer and text-encoder weights (0: raw weights)")
    p.add_argument("--dit-minutes", type=float,
                   help="stop the transformer stage after this many minutes (a safety limit)")
    p.add_argument("--dit-stop-at", type=int,
                   help="stop the transformer stage before step N of the --dit-steps schedule "
                   "(the step a --dit-minutes budget stopped a recorded run at)")
    p.add_argument("--snapshot-every", type=int, default=0,
                   help="every N transformer steps, save the averaged weights to OUT.snapshot")
    p.add_argument("--vae-lr", type=float, default=1e-3)
    p.add_argument("--replace-vae", help="put FOLDER/vae (from --vae-only --decoder-steps) "
                   "into the pipeline saved at --out, and stop")
    p.add_argument("--decoder-steps", type=int, default=0,
                   help="then fine-tune only the VAE decoder for N steps (encoder fixed)")
    p.add_argument("--vae-edge-weight", type=float, default=4.0,
                   help="extra loss weight near colour edges in the decoder fine-tuning")
    p.add_argument("--vae-fg-weight", type=float, default=4.0,
                   help="extra loss weight of the shapes' pixels in the VAE stage")
    p.add_argument("--vae-kl", type=float, default=1e-6, help="KL weight of the VAE loss")
    p.add_argument("--caption-dropout", type=float, default=0.0,
                   help="fraction of training captions replaced by the empty one (CFG's "
                   "unconditional branch; a teacher for --distill-guidance needs it)")
    p.add_argument("--distill-guidance", action="store_true",
                   help="guidance distillation: the --resume folder is the teacher (trained "
                   "with --caption-dropout) and the student's initialisation; the student "
                   "learns its classifier-free-guided velocity for g ~ U[--guidance-range] "
                   "through the guidance input; text encoders frozen")
    p.add_argument("--guidance-range", type=float, nargs=2, default=[1.0, 6.0])
    p.add_argument("--guidance-gain", type=float, default=1.0,
                   help="with --distill-guidance: guidance input g means the teacher's CFG scale "
                   "1 + GAIN (g - 1), so the pipeline's default g = 3.5 can stand for a stronger "
                   "teacher guidance (1.6: 3.5 -> 5)")
    p.add_argument("--student-from", help="with --distill-guidance: start the student from "
                   "FOLDER/transformer (an earlier distillation) instead of the teacher")
    p.add_argument("--t-shift", type=float, default=1.0,
                   help="shift the training t as the sampler shifts its sigmas (16 image "
                   "tokens: exp(mu) = 1.58)")
    p.add_argument("--new-transformer", type=int, nargs=3, metavar=("HEADS", "DOUBLE", "SINGLE"),
                   help="with --resume: a fresh transformer of HEADS x 32 width and DOUBLE + "
                   "SINGLE blocks; the VAE and text encoders come from the --resume folder")
    p.add_argument("--vae-only", action="store_true",
                   help="train only the VAE and save it to OUT/vae (stage 1 on its own)")
    p.add_argument("--vae-from", help="take the trained VAE (and its latent scale/shift) from "
                   "FOLDER/vae and train fresh transformer and text encoders on it")
    args = p.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    start = time.time()
    if args.replace_vae:
        replace_vae(pathlib.Path(args.out), pathlib.Path(args.replace_vae),
                    getattr(torch, args.dtype))
        return

    log(f"drawing {args.images} images")
    images, captions = make_dataset(args.images, args.seed)
    clip_ids, t5_ids, cap_idx, longest, empty_idx = tokenize(captions)
    log(f"{len(set(captions))} distinct captions, longest {longest} T5 tokens")
    vae, transformer, clip, t5 = make_models() if not args.resume else load_models(args.resume)
    if args.vae_from:
        from diffusers import AutoencoderKL

        vae = AutoencoderKL.from_pretrained(pathlib.Path(args.vae_from) / "vae",
                                            torch_dtype=torch.float32)
    if args.new_transformer:
        assert args.resume, "[train_default] --new-transformer needs --resume FOLDER"
        transformer = make_transformer(*args.new_transformer)
    keep_vae = bool(args.resume or args.vae_from)
    for name, m in [("vae", vae), ("transformer", transformer), ("clip", clip), ("t5", t5)]:
        log(f"{name}: {sum(x.numel() for x in m.parameters()) / 1e6:.2f}M parameters")

    teacher = None
    if args.distill_guidance:
        import copy

        assert args.resume, "[train_default] --distill-guidance needs --resume TEACHER_FOLDER"
        teacher = copy.deepcopy(transformer).eval()
        if args.student_from:  # continue an earlier distillation (same teacher)
            from diffusers import FluxTransformer2DModel

            transformer = FluxTransformer2DModel.from_pretrained(
                pathlib.Path(args.student_from) / "transformer", torch_dtype=torch.float32)
    gen = torch.Generator().manual_seed(args.seed)
    if not keep_vae:
        train_vae(vae, images, args.vae_steps, args.vae_batch, gen, args.vae_lr, args.vae_kl,
                  args.vae_fg_weight)
    if args.decoder_steps:
        train_vae(vae, images, args.decoder_steps, args.vae_batch, gen, args.vae_lr,
                  args.vae_kl, args.vae_fg_weight, decoder_only=True,
                  edge_weight=args.vae_edge_weight)
        vae.encoder.requires_grad_(True)
    with torch.no_grad():
        means, stds = [], []
        for i in range(0, len(images), 256):
            post = vae.encode(images_to_tensor(images[i:i + 256])).latent_dist
            means.append(post.mean); stds.append(post.std)
        mean, std = torch.cat(means), torch.cat(stds)
        x = images_to_tensor(images[:256])
        rec = vae.decode(mean[:256]).sample
        log(f"vae reconstruction max|err| {((rec - x).abs().amax()).item() * 127.5:.1f}/255 "
            f"mean {((rec - x).abs().mean()).item() * 127.5:.2f}/255")
        shift = mean.mean().item()
        scale = 1.0 / (mean.std().item())
    if not keep_vae:
        vae.register_to_config(scaling_factor=round(scale, 4), shift_factor=round(shift, 4))
    log(f"latent shift_factor {shift:.4f} scaling_factor {scale:.4f}")
    if args.vae_only:
        prev = pathlib.Path(args.vae_from or "/nonexistent") / "vae_recipe.json"
        vae.save_pretrained(pathlib.Path(args.out) / "vae", safe_serialization=True)
        (pathlib.Path(args.out) / "vae_recipe.json").write_text(json.dumps({
            "command": "/work/refvenv/bin/python reference/train_default.py " +
                       " ".join(sys.argv[1:]),
            "args": vars(args), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "seconds": round(time.time() - start, 1),
            "previous": json.loads(prev.read_text()) if prev.exists() else None}, indent=2) + "\n")
        log(f"saved {args.out}/vae in {(time.time() - start) / 60:.1f} min")
        return
    # FLUX latents: (z - shift) * scale, a fresh posterior sample per training step
    vae_t = time.time() - start
    mean = (mean - vae.config.shift_factor) * vae.config.scaling_factor
    std = std * vae.config.scaling_factor

    class Latents:
        shape = mean.shape

        def __len__(self):
            return len(mean)

        def __getitem__(self, idx):
            return mean[idx] + std[idx] * torch.randn(mean[idx].shape, generator=gen)

    def save_snapshot(ema):
        if ema is not None:
            ema.swap()
        save_pipeline(pathlib.Path(args.out + ".snapshot"), vae, transformer, clip, t5,
                      torch.float32)
        if ema is not None:
            ema.swap()
        log(f"snapshot saved to {args.out}.snapshot")

    dit_done, dit_t = train_dit(
        transformer, clip, t5, Latents(), cap_idx, clip_ids, t5_ids, args.dit_steps,
        args.dit_batch, gen, args.dit_lr, args.ema,
        args.dit_minutes * 60 if args.dit_minutes else None,
        (args.snapshot_every, save_snapshot) if args.snapshot_every else None,
        empty_idx, args.caption_dropout, teacher, tuple(args.guidance_range), args.t_shift,
        args.dit_stop_at, args.guidance_gain)

    out = pathlib.Path(args.out)
    save_pipeline(out, vae, transformer, clip, t5, getattr(torch, args.dtype))
    total = time.time() - start
    recipe = {
        "command": "/work/refvenv/bin/python reference/train_default.py " +
                   " ".join(sys.argv[1:]),
        "args": vars(args), "seed": args.seed, "torch": torch.__version__,
        "threads": torch.get_num_threads(), "vae_seconds": round(vae_t, 1),
        "total_seconds": round(total, 1), "dit_seconds": round(dit_t, 1),
        "dit_steps_done": dit_done, "distinct_captions": len(set(captions)),
        "held_out": [list(t) for t in HELD_OUT], "max_sequence_length": MAX_SEQ,
        "height": SIZE, "width": SIZE,
    }
    prev = pathlib.Path(args.resume or "/nonexistent") / "training_recipe.json"
    if prev.exists():  # a continued run: the recipe of the folder it started from
        recipe["previous"] = json.loads(prev.read_text())
    vae_recipe = pathlib.Path(args.vae_from or "/nonexistent") / "vae_recipe.json"
    if vae_recipe.exists():  # the two-stage run: how its VAE was trained
        recipe["vae_stage"] = json.loads(vae_recipe.read_text())
    (out / "training_recipe.json").write_text(json.dumps(recipe, indent=2) + "\n")
    log(f"saved {out} in {total / 60:.1f} min")


if __name__ == "__main__":
    main()
