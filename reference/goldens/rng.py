"""torch CPU generator goldens: randn / rand for torch.Generator("cpu").manual_seed(seed).

Writes tests/fixtures/rng/:
  randn.safetensors         small shapes in full; large shapes as head/tail/strided sample plus
                            an FNV-1a-64 hash of all bytes (the hash keeps the file small while
                            still checking every bit)
  randn_full.safetensors    seed 0, (1, 16, 128, 128) in full (f32, bf16)
  sequences.safetensors     successive draws from one generator (state must advance as torch's)
  rand.safetensors          torch.rand
  normal.safetensors        Tensor.normal_(mean=0.3, std=2.5)
  randn_scalar.safetensors  the same kernels under ATEN_CPU_CAPABILITY=default (scalar libm
                            Box-Muller), written by a subprocess since the capability is fixed at
                            the first dispatch
Key format: s<seed>_<d0>x<d1>..._<dtype>[__part].
"""
import os
import pathlib
import subprocess
import sys

import torch

try:
    from goldens._common import save
except ImportError:  # run as a script for the scalar-capability subprocess
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
    from goldens._common import save

SEEDS = (0, 1, 42)
LARGE = ((1, 16, 128, 128), (1, 4096, 64))
SMALL = ((3,), (17,), (1,), (15,), (16,), (31,), (100,))
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
STRIDE = 251  # strided sample step for large tensors
EDGE = 512  # head/tail elements kept for large tensors


def key(seed, shape, dt):
    return f"s{seed}_{'x'.join(str(d) for d in shape)}_{dt}"


def fnv1a64(t: torch.Tensor) -> torch.Tensor:
    """FNV-1a 64-bit over the raw little-endian bytes, stored as one int64 (two's complement)."""
    h = 0xCBF29CE484222325
    for b in t.contiguous().view(torch.uint8).flatten().tolist():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    if h >= 1 << 63:
        h -= 1 << 64
    return torch.tensor([h], dtype=torch.int64)


def add_sampled(out: dict, k: str, t: torch.Tensor) -> None:
    flat = t.flatten()
    out[k + "__head"] = flat[:EDGE]
    out[k + "__tail"] = flat[-EDGE:]
    out[k + "__stride"] = flat[::STRIDE]
    out[k + "__fnv"] = fnv1a64(t)


def randn(seed, shape, dtype):
    return torch.randn(shape, generator=torch.Generator("cpu").manual_seed(seed), dtype=dtype)


def make_vectorised(d: pathlib.Path) -> None:
    cap = torch.backends.cpu.get_cpu_capability()
    assert cap in ("AVX2", "AVX512"), f"expected torch's AVX2/AVX512 kernels, got {cap}"
    # One metadata key: safetensors writes several in hash order, which breaks byte-identity.
    meta = {"reference": f"torch {torch.__version__} cpu_capability {cap}"}

    out = {}
    for seed in SEEDS:
        for dt in ("f32", "bf16"):
            for shape in LARGE:
                add_sampled(out, key(seed, shape, dt), randn(seed, shape, DTYPES[dt]))
        for dt in DTYPES:
            for shape in SMALL:
                out[key(seed, shape, dt)] = randn(seed, shape, DTYPES[dt])
    save(d / "randn.safetensors", out, meta)

    full = {key(0, LARGE[0], dt): randn(0, LARGE[0], DTYPES[dt]) for dt in ("f32", "bf16")}
    save(d / "randn_full.safetensors", full, meta)

    # Successive draws: key seq<i>_<j>_<dtype> is the j-th draw of sequence i (seed 42).
    sequences = [
        [((5,), "f32"), ((33,), "f32")],
        [((5,), "bf16"), ((33,), "bf16")],
        [((3,), "f32"), ((3,), "f32"), ((20,), "f32"), ((1,), "f32"), ((7,), "f32")],
        [((5,), "f32"), ((17,), "bf16"), ((2,), "f32"), ((40,), "f16"), ((1,), "bf16")],
        [((16,), "bf16"), ((1, 4, 9), "f32"), ((2, 3, 5, 7), "bf16")],
    ]
    seq = {}
    for i, steps in enumerate(sequences):
        g = torch.Generator("cpu").manual_seed(42)
        for j, (shape, dt) in enumerate(steps):
            seq[f"seq{i}_{j}_{dt}"] = torch.randn(shape, generator=g, dtype=DTYPES[dt])
    save(d / "sequences.safetensors", seq, meta)

    # torch.rand, then randn from the same generator (shared mt19937 stream).
    rnd = {}
    for dt in ("f32", "bf16"):
        for n in (1, 17, 1000):
            g = torch.Generator("cpu").manual_seed(0)
            rnd[f"s0_{n}_{dt}"] = torch.rand((n,), generator=g, dtype=DTYPES[dt])
    g = torch.Generator("cpu").manual_seed(1)
    rnd["mix_0_f32"] = torch.rand((7,), generator=g)
    rnd["mix_1_f32"] = torch.randn((3,), generator=g)
    rnd["mix_2_f32"] = torch.rand((5,), generator=g)
    rnd["mix_3_f32"] = torch.randn((18,), generator=g)
    save(d / "rand.safetensors", rnd, meta)

    # Tensor.normal_(mean, std): the mean/std arithmetic of both paths (double and float).
    nrm = {}
    for dt in DTYPES:
        for n in (5, 16, 40):
            g = torch.Generator("cpu").manual_seed(3)
            t = torch.empty((n,), dtype=DTYPES[dt])
            nrm[f"s3_{n}_{dt}"] = t.normal_(mean=0.3, std=2.5, generator=g)
    save(d / "normal.safetensors", nrm, meta)


def make_scalar(d: pathlib.Path) -> None:
    cap = torch.backends.cpu.get_cpu_capability()
    assert cap == "DEFAULT", cap
    out = {}
    for seed in (0, 42):
        for dt in DTYPES:
            for shape in ((16,), (17,), (100,), (4099,)):
                out[key(seed, shape, dt)] = randn(seed, shape, DTYPES[dt])
    meta = {"reference": f"torch {torch.__version__} cpu_capability {cap}"}
    save(d / "randn_scalar.safetensors", out, meta)


def make(fixtures_dir: pathlib.Path) -> None:
    d = fixtures_dir / "rng"
    make_vectorised(d)
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default", OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, __file__, "--scalar", str(d)], check=True, env=env)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--scalar":
        torch.set_num_threads(1)
        make_scalar(pathlib.Path(sys.argv[2]))
    else:
        print("run through reference/make_fixtures.py --only rng", file=sys.stderr)
        sys.exit(2)
