"""A safetensors file written by the Python safetensors library (the writer of every published
checkpoint), for tests/safetensors_test.cpp: every dtype tessera reads, with the exact f32 value
of each low-precision tensor stored beside it, and metadata."""
import pathlib

import torch

from ._common import save, seeded


def make(fixtures_dir: pathlib.Path) -> None:
    g = seeded(0)
    x = torch.randn(5, 7, generator=g) * 3
    t = {"f32": torch.randn(2, 3, 4, generator=g),
         "i64": torch.tensor([-(2 ** 40), -1, 0, 7, 2 ** 40], dtype=torch.int64),
         "i32": torch.tensor([[-5, 3], [2 ** 30, 0]], dtype=torch.int32),
         "bool": torch.tensor([True, False, True]),
         "empty": torch.zeros(0, 3)}
    t["i64_values"] = t["i64"].clone()
    for name, dtype in [("bf16", torch.bfloat16), ("f16", torch.float16),
                        ("f8e4m3", torch.float8_e4m3fn), ("f8e5m2", torch.float8_e5m2)]:
        low = x.to(dtype)
        t[name] = low
        t[name + "_as_f32"] = low.float()
    save(fixtures_dir / "io" / "python_written.safetensors", t, {"format": "pt"})
