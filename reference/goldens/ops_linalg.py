"""Goldens for matmul, linear (tests/fixtures/ops/linalg/) and conv2d (ops/conv/), f32 and bf16.

bf16 cases take bf16 inputs and keep torch's bf16 output (fp32 accumulation, one rounding).
Shapes are deliberately odd (not multiples of 16) to exercise the kernels' edge handling.
"""
import pathlib

import torch
import torch.nn.functional as F

from goldens._common import save, seeded

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def _randn(gen, *shape, dtype):
    return torch.randn(*shape, generator=gen, dtype=torch.float32).to(dtype)


def _linear(gen, dtype) -> dict:
    out = {}
    cases = {"l2d": (7, 37, 19), "l3d": ((2, 5), 33, 17), "lbig": (67, 300, 45)}
    for name, (m, k, n) in cases.items():
        lead = m if isinstance(m, tuple) else (m,)
        x = _randn(gen, *lead, k, dtype=dtype)
        w = _randn(gen, n, k, dtype=dtype) / k**0.5
        b = _randn(gen, n, dtype=dtype)
        out[f"{name}.x"], out[f"{name}.w"], out[f"{name}.b"] = x, w, b
        out[f"{name}.y"] = F.linear(x, w, b)
        out[f"{name}.y_nobias"] = F.linear(x, w)
    return out


def _matmul(gen, dtype) -> dict:
    out = {}
    cases = {
        "bcast": ((3, 1, 13, 21), (4, 21, 11)),  # batch broadcast on both sides
        "shared": ((2, 9, 12), (12, 5)),  # 2-D right operand folded into rows
        "batched": ((6, 17, 40), (6, 40, 23)),
        "vecmat": ((12,), (3, 12, 5)),  # 1-D left operand
        "matvec": ((4, 7, 12), (12,)),  # 1-D right operand
    }
    for name, (sa, sb) in cases.items():
        a = _randn(gen, *sa, dtype=dtype)
        b = _randn(gen, *sb, dtype=dtype)
        out[f"{name}.a"], out[f"{name}.b"] = a, b
        out[f"{name}.y"] = torch.matmul(a, b)
    # Transposed right operand (as attention's q @ k^T): stored untransposed, the test transposes.
    a = _randn(gen, 2, 3, 19, 32, dtype=dtype)
    kt = _randn(gen, 2, 3, 29, 32, dtype=dtype)
    out["qk.a"], out["qk.k"] = a, kt
    out["qk.y"] = torch.matmul(a, kt.transpose(-1, -2))
    return out


def _conv(gen, dtype) -> dict:
    out = {}
    x = _randn(gen, 2, 5, 11, 13, dtype=dtype)
    out["x"] = x
    cases = {
        "k3s1p1": (7, 3, 1, 1),
        "k3s2p1": (7, 3, 2, 1),
        "k1s1p0": (6, 1, 1, 0),
        "k3s2p0": (8, 3, 2, 0),
    }
    for name, (o, k, s, p) in cases.items():
        w = _randn(gen, o, 5, k, k, dtype=dtype) / (5 * k * k) ** 0.5
        b = _randn(gen, o, dtype=dtype)
        out[f"{name}.w"], out[f"{name}.b"] = w, b
        out[f"{name}.y"] = F.conv2d(x, w, b, stride=s, padding=p)
        out[f"{name}.y_nobias"] = F.conv2d(x, w, None, stride=s, padding=p)
    # VAE downsample: pad (left 0, right 1, top 0, bottom 1), then 3x3 stride 2, no padding.
    w = _randn(gen, 5, 5, 3, 3, dtype=dtype) / 45**0.5
    b = _randn(gen, 5, dtype=dtype)
    out["down.w"], out["down.b"] = w, b
    out["down.y"] = F.conv2d(F.pad(x, (0, 1, 0, 1)), w, b, stride=2)
    return out


def make(fixtures_dir: pathlib.Path) -> None:
    root = fixtures_dir / "ops" / "linalg"
    for tag, dtype in DTYPES.items():
        save(root / f"linear_{tag}.safetensors", _linear(seeded(1), dtype))
        save(root / f"matmul_{tag}.safetensors", _matmul(seeded(2), dtype))
        save(fixtures_dir / "ops" / "conv" / f"conv2d_{tag}.safetensors", _conv(seeded(3), dtype))
