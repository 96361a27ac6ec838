"""Goldens for attention, softmax and RoPE (tests/fixtures/ops/attention/).

SDPA cases come from torch.nn.functional.scaled_dot_product_attention on CPU; RoPE tables and
their application from diffusers' own FluxPosEmbed / Flux2PosEmbed / apply_rotary_emb and from
transformers' Mistral apply_rotary_pos_emb, so the fixtures follow the installed reference code.
"""
import pathlib

import torch
import torch.nn.functional as F

from ._common import save, seeded

OUT = "ops/attention"


def _randn(shape, gen, dtype=torch.float32, scale=1.0):
    return (torch.randn(shape, generator=gen) * scale).to(dtype)


def _sdpa_cases(d: pathlib.Path) -> None:
    # name: (B, H, Hkv, Lq, Lk, D, dtype, causal, extra)
    cases = {
        "f32_d64_l77": (2, 3, 3, 77, 77, 64, torch.float32, False, None),
        "f32_d128_l1": (1, 2, 2, 1, 1, 128, torch.float32, False, None),
        "f32_d128_q1_k50": (1, 2, 2, 1, 50, 128, torch.float32, False, None),
        "f32_d64_l1000": (1, 1, 1, 1000, 1000, 64, torch.float32, False, None),
        "f32_causal_l77": (1, 2, 2, 77, 77, 64, torch.float32, True, None),
        "f32_causal_q33_k77": (1, 2, 2, 33, 77, 64, torch.float32, True, None),
        "f32_gqa_causal": (1, 8, 2, 40, 40, 64, torch.float32, True, None),
        "f32_bias_scale1": (2, 4, 4, 35, 35, 64, torch.float32, False, "bias"),
        "f32_boolmask_causal": (2, 2, 2, 20, 20, 64, torch.float32, True, "bool"),
        "bf16_d128_l77": (1, 3, 3, 77, 77, 128, torch.bfloat16, False, None),
        "bf16_d64_l1": (1, 2, 2, 1, 1, 64, torch.bfloat16, False, None),
        "bf16_d128_l1000": (1, 1, 1, 1000, 1000, 128, torch.bfloat16, False, None),
        "bf16_causal_l77": (1, 2, 2, 77, 77, 64, torch.bfloat16, True, None),
        "bf16_gqa_causal": (1, 8, 2, 40, 40, 128, torch.bfloat16, True, None),
        "bf16_bias_scale1": (1, 4, 4, 35, 35, 64, torch.bfloat16, False, "bias"),
        "bf16_boolmask_causal": (2, 2, 2, 20, 20, 64, torch.bfloat16, True, "bool"),
    }
    for i, (name, (b, h, hkv, lq, lk, dim, dtype, causal, extra)) in enumerate(sorted(cases.items())):
        g = seeded(100 + i)
        q = _randn((b, h, lq, dim), g, dtype)
        k = _randn((b, hkv, lk, dim), g, dtype)
        v = _randn((b, hkv, lk, dim), g, dtype)
        t = {"q": q, "k": k, "v": v}
        kw = {"enable_gqa": hkv != h}
        if extra == "bias":
            # T5 style: a position bias (1, H, Lq, Lk) added to unscaled scores (scale 1.0).
            bias = _randn((1, h, lq, lk), g, torch.float32, 2.0).to(dtype)
            t["bias"] = bias
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0, **kw)
        elif extra == "bool":
            # CLIP style: causal plus key padding. torch refuses is_causal with a mask, so the
            # golden combines them; the test passes causal=True and the padding mask separately.
            valid = torch.tensor([lk - 6, lk])[:b]
            pad = torch.arange(lk)[None, :] < valid[:, None]  # (B, Lk)
            mask = pad[:, None, None, :]  # (B, 1, 1, Lk), True = attend
            t["mask"] = mask
            tri = torch.ones(lq, lk, dtype=torch.bool).tril()
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask & tri, **kw)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, **kw)
        t["out"] = out
        save(d / f"sdpa_{name}.safetensors", t)


def _softmax_cases(d: pathlib.Path) -> None:
    g = seeded(7)
    x = _randn((4, 37, 129), g, torch.float32, 4.0)
    x[0, 0, :5] = 80.0  # large values: the max subtraction must happen
    xb = _randn((3, 5, 300), g, torch.bfloat16, 3.0)
    save(d / "softmax.safetensors", {
        "x": x,
        "out_last": torch.softmax(x, dim=-1),
        "out_dim1": torch.softmax(x, dim=1),
        "out_dim0": torch.softmax(x, dim=0),
        "xb": xb,
        "xb_out_last": torch.softmax(xb, dim=-1),
        "xb_out_dim1": torch.softmax(xb, dim=1),
    })


def _rope_cases(d: pathlib.Path) -> None:
    from diffusers.models.embeddings import apply_rotary_emb
    from diffusers.models.transformers.transformer_flux import FluxPosEmbed
    from diffusers.models.transformers.transformer_flux2 import Flux2PosEmbed
    from transformers.models.mistral.modeling_mistral import apply_rotary_pos_emb

    # FLUX.1: text ids zeros (L, 3), image ids [0, row, col] on a 12x20 packed grid.
    txt = torch.zeros(9, 3)
    hh, ww = 12, 20
    img = torch.zeros(hh, ww, 3)
    img[..., 1] = torch.arange(hh)[:, None]
    img[..., 2] = torch.arange(ww)[None, :]
    ids1 = torch.cat([txt, img.reshape(-1, 3)], dim=0)
    cos1, sin1 = FluxPosEmbed(theta=10000, axes_dim=[16, 56, 56])(ids1)
    # FLUX.2: 4-D ids, text (0, 0, 0, l), image (0, h, w, 0), theta 2000, axes 32 x 4.
    txt2 = torch.zeros(12, 4)
    txt2[:, 3] = torch.arange(12) * 41  # spread out: exercises large angles
    img2 = torch.zeros(8, 10, 4)
    img2[..., 1] = torch.arange(8)[:, None]
    img2[..., 2] = torch.arange(10)[None, :]
    ids2 = torch.cat([txt2, img2.reshape(-1, 4)], dim=0)
    cos2, sin2 = Flux2PosEmbed(theta=2000, axes_dim=[32, 32, 32, 32])(ids2)

    g = seeded(11)
    seq = ids1.shape[0]
    # diffusers' FLUX layout: x (B, S, H, D) with sequence_dim=1, interleaved pairs.
    x1 = _randn((1, seq, 2, 128), g)
    x1b = _randn((1, seq, 2, 128), g, torch.bfloat16)
    # split halves as diffusers' use_real_unbind_dim=-2 (fp32 math), x (B, H, S, D).
    x2 = _randn((2, 2, ids2.shape[0], 128), g)
    cos_cat = torch.cat([cos2[:, 0::2], cos2[:, 0::2]], dim=-1)
    sin_cat = torch.cat([sin2[:, 0::2], sin2[:, 0::2]], dim=-1)
    # Mistral (transformers): rotate_half with cos/sin cast to bf16 and bf16 math.
    xm = _randn((1, 4, ids2.shape[0], 128), g, torch.bfloat16)
    qm, _ = apply_rotary_pos_emb(xm, xm, cos_cat[None].to(torch.bfloat16),
                                 sin_cat[None].to(torch.bfloat16))
    save(d / "rope.safetensors", {
        "flux_ids": ids1, "flux_cos": cos1, "flux_sin": sin1,
        "flux2_ids": ids2, "flux2_cos": cos2, "flux2_sin": sin2,
        "x_interleaved": x1,
        "out_interleaved": apply_rotary_emb(x1, (cos1, sin1), sequence_dim=1),
        "xb_interleaved": x1b,
        "outb_interleaved": apply_rotary_emb(x1b, (cos1, sin1), sequence_dim=1),
        "cos_cat": cos_cat, "sin_cat": sin_cat,
        "x_split": x2,
        "out_split": apply_rotary_emb(x2, (cos_cat, sin_cat), use_real_unbind_dim=-2,
                                      sequence_dim=2),
        "x_mistral": xm, "out_mistral": qm,
    })


def make(fixtures_dir: pathlib.Path) -> None:
    d = fixtures_dir / OUT
    _sdpa_cases(d)
    _softmax_cases(d)
    _rope_cases(d)
