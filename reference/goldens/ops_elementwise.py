"""Goldens for the elementwise, norm, reduction, shape, embedding and resample ops.

Writes tests/fixtures/ops/elementwise/*.safetensors. Inputs are stored next to outputs so the
C++ tests feed exactly the values PyTorch saw. Sizes are odd on purpose (SIMD tails).
"""
import pathlib

import torch
import torch.nn.functional as F

from goldens._common import save, seeded

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def _randn(shape, seed, scale=1.0):
    return torch.randn(*shape, generator=seeded(seed)) * scale


def _binary(out: pathlib.Path) -> None:
    t = {}
    a32 = _randn((3, 5, 37), 1, 2.0)
    cases = {
        "same": _randn((3, 5, 37), 2, 2.0),
        "row": _randn((37,), 3, 2.0),
        "col": _randn((3, 5, 1), 4, 2.0),
        "mid": _randn((3, 1, 37), 5, 2.0),
        "lead": _randn((5, 1), 6, 2.0),
    }
    ops = {
        "add": torch.add,
        "sub": torch.sub,
        "mul": torch.mul,
        "div": torch.div,
        "maximum": torch.maximum,
        "minimum": torch.minimum,
    }
    for dn, dt in DTYPES.items():
        a = a32.to(dt)
        t[f"a_{dn}"] = a
        for cn, b32 in cases.items():
            b = b32.to(dt)
            t[f"b_{cn}_{dn}"] = b
            for on, fn in ops.items():
                t[f"{on}_{cn}_{dn}"] = fn(a, b)
            base = a.abs() + 0.5
            t[f"pow_{cn}_{dn}"] = torch.pow(base, b * 0.5)
        # Scalar operands: a Python float does not promote a bf16 tensor.
        t[f"add_s_{dn}"] = a + 0.1
        t[f"sub_s_{dn}"] = a - 0.7
        t[f"mul_s_{dn}"] = a * 0.3
        t[f"div_s_{dn}"] = a / 3.0
        t[f"rsub_s_{dn}"] = 0.1 - a
        t[f"rdiv_s_{dn}"] = 2.0 / a
        t[f"pow2_s_{dn}"] = a**2.0
        t[f"powh_s_{dn}"] = (a.abs() + 0.5) ** 0.5
        t[f"pow17_s_{dn}"] = (a.abs() + 0.5) ** 1.7
        t[f"max_s_{dn}"] = torch.clamp_min(a, 0.25)
    # Mixed dtypes promote as torch: bf16 op f32 -> f32.
    a16 = a32.to(torch.bfloat16)
    t["mixed_add"] = a16 + cases["row"]
    t["mixed_mul"] = cases["mid"] * a16
    save(out / "binary.safetensors", t)


UNARY = {
    "neg": torch.neg,
    "abs": torch.abs,
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "sin": torch.sin,
    "cos": torch.cos,
    "square": torch.square,
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "relu": F.relu,
}
POSITIVE = {"log", "sqrt", "rsqrt"}


def _unary(out: pathlib.Path) -> None:
    t = {}
    x32 = _randn((7, 131), 10, 3.0)
    x32[0, :6] = torch.tensor([0.0, -0.0, 1e-3, -1e-3, 12.0, -12.0])
    xp32 = x32.abs() + 1e-2
    for dn, dt in DTYPES.items():
        x, xp = x32.to(dt), xp32.to(dt)
        t[f"x_{dn}"] = x
        t[f"xp_{dn}"] = xp
        for name, fn in UNARY.items():
            t[f"{name}_{dn}"] = fn(xp if name in POSITIVE else x)
        # GLU helpers: diffusers SwiGLU/GEGLU gate the first half with act(second half);
        # FLUX.2's Flux2SwiGLU computes silu(first) * second.
        h, g = x.chunk(2, dim=-1) if x.shape[-1] % 2 == 0 else x[:, :130].chunk(2, dim=-1)
        t[f"swiglu_{dn}"] = h * F.silu(g)
        t[f"swiglu_gate_first_{dn}"] = F.silu(h) * g
        t[f"geglu_{dn}"] = h * F.gelu(g)
        t[f"geglu_tanh_{dn}"] = h * F.gelu(g, approximate="tanh")
    # A long row so the vector body dominates.
    big = _randn((4099,), 11, 4.0)
    t["big_x"] = big
    for name in ("silu", "gelu", "gelu_tanh", "exp", "sigmoid"):
        t[f"big_{name}_f32"] = UNARY[name](big)
        t[f"big_{name}_bf16"] = UNARY[name](big.to(torch.bfloat16))
    save(out / "unary.safetensors", t)


def _rms_diffusers(x, w, eps):
    input_dtype = x.dtype
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    if w is not None:
        if w.dtype in (torch.float16, torch.bfloat16):
            x = x.to(w.dtype)
        return x * w
    return x.to(input_dtype)


def _rms_llama(x, w, eps):
    input_dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    return w * x.to(input_dtype)


def _norm(out: pathlib.Path) -> None:
    t = {}
    x32 = _randn((6, 200), 20, 2.0) + 0.5
    w32 = _randn((200,), 21) * 0.5 + 1.0
    b32 = _randn((200,), 22) * 0.2
    t["x_f32"], t["w_f32"], t["b_f32"] = x32, w32, b32
    x16, w16, b16 = x32.bfloat16(), w32.bfloat16(), b32.bfloat16()
    t["x_bf16"], t["w_bf16"], t["b_bf16"] = x16, w16, b16
    for dn, (x, w, b) in {"f32": (x32, w32, b32), "bf16": (x16, w16, b16)}.items():
        t[f"ln_affine_{dn}"] = F.layer_norm(x, (200,), w, b, 1e-5)
        t[f"ln_weight_{dn}"] = F.layer_norm(x, (200,), w, None, 1e-5)
        t[f"ln_plain_{dn}"] = F.layer_norm(x, (200,), None, None, 1e-6)
        t[f"rms_{dn}"] = _rms_diffusers(x, w, 1e-6)
        t[f"rms_noweight_{dn}"] = _rms_diffusers(x, None, 1e-6)
        t[f"rms_llama_{dn}"] = _rms_llama(x, w, 1e-5)
    # Mixed: f32 activations with bf16 weights (T5 in bf16 with an f32 residual stream).
    t["rms_x32_w16"] = _rms_diffusers(x32, w16, 1e-6)
    t["rms_x16_w32"] = _rms_diffusers(x16, w32, 1e-6)
    t["rms_llama_x32_w16"] = _rms_llama(x32, w16, 1e-5)
    # Group norm (VAE: 32 groups) on NCHW.
    g32 = _randn((2, 64, 5, 7), 23, 1.5) + 0.3
    gw, gb = _randn((64,), 24) * 0.5 + 1.0, _randn((64,), 25) * 0.2
    t["gx_f32"], t["gw_f32"], t["gb_f32"] = g32, gw, gb
    t["gx_bf16"], t["gw_bf16"], t["gb_bf16"] = g32.bfloat16(), gw.bfloat16(), gb.bfloat16()
    for dn in DTYPES:
        x, w, b = t[f"gx_{dn}"], t[f"gw_{dn}"], t[f"gb_{dn}"]
        t[f"gn32_{dn}"] = F.group_norm(x, 32, w, b, 1e-6)
        t[f"gn8_{dn}"] = F.group_norm(x, 8, w, b, 1e-5)
        t[f"gn8_plain_{dn}"] = F.group_norm(x, 8, None, None, 1e-5)
    save(out / "norm.safetensors", t)


def _reduce(out: pathlib.Path) -> None:
    t = {}
    x32 = _randn((4, 33, 19), 30, 2.0) + 0.25
    for dn, dt in DTYPES.items():
        x = x32.to(dt)
        t[f"x_{dn}"] = x
        for d in (0, 1, 2, -1):
            k = f"d{d % 3}"
            t[f"sum_{k}_{dn}"] = x.sum(d)
            t[f"mean_{k}_keep_{dn}"] = x.mean(d, keepdim=True)
            t[f"var_{k}_{dn}"] = x.var(d, unbiased=True)
            t[f"var_{k}_biased_{dn}"] = x.var(d, unbiased=False)
            t[f"max_{k}_{dn}"] = x.amax(d)
            t[f"argmax_{k}_{dn}"] = x.argmax(d)
    save(out / "reduce.safetensors", t)


def _shape(out: pathlib.Path) -> None:
    t = {}
    x = _randn((2, 3, 5, 7), 40)
    t["x"] = x
    t["pad_last"] = F.pad(x, (1, 2))
    t["pad_hw"] = F.pad(x, (0, 1, 0, 1), value=0.5)
    t["pad_neg"] = F.pad(x, (-1, 2, 1, -2))
    t["up2"] = F.interpolate(x, scale_factor=2.0, mode="nearest")
    t["up2_bf16"] = F.interpolate(x.bfloat16(), scale_factor=2.0, mode="nearest")
    w = _randn((11, 6), 41)
    ids = torch.tensor([[0, 10, 3], [3, 3, 7]], dtype=torch.int64)
    t["emb_w"] = w
    t["emb_ids"] = ids
    t["emb_out"] = F.embedding(ids, w)
    t["emb_out_bf16"] = F.embedding(ids, w.bfloat16())
    save(out / "shape.safetensors", t)


def _timestep(out: pathlib.Path) -> None:
    from diffusers.models.embeddings import get_timestep_embedding

    t = {}
    ts = torch.tensor([0.0, 1.0, 250.5, 999.0, 1000.0])
    t["timesteps"] = ts
    t["flux"] = get_timestep_embedding(ts, 256, flip_sin_to_cos=True, downscale_freq_shift=0)
    t["sd_shift1"] = get_timestep_embedding(ts, 320, flip_sin_to_cos=False, downscale_freq_shift=1)
    t["odd_scaled"] = get_timestep_embedding(
        ts, 33, flip_sin_to_cos=True, downscale_freq_shift=0.5, scale=2.0, max_period=5000
    )
    save(out / "timestep.safetensors", t)


def make(fixtures_dir: pathlib.Path) -> None:
    out = fixtures_dir / "ops" / "elementwise"
    _binary(out)
    _unary(out)
    _norm(out)
    _reduce(out)
    _shape(out)
    _timestep(out)
