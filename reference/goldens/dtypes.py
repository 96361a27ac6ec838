"""dtype conversion goldens: torch's Tensor.to() between f32, bf16, f16, float8 and integers.

Writes tests/fixtures/dtypes/conversions.safetensors:
  src_f32                    tricky f32 values (signed zeros, subnormals of every format, ties
                             at every format's rounding boundary, max/overflow, inf, NaN) plus
                             seeded random bit patterns and random values in each format's range
  f32_to_<t>                 src_f32.to(t) for t in bf16, f16, f8e4m3, f8e5m2
  all_<t>_to_f32             every code of t (f16, f8e4m3, f8e5m2), in code order 0..2^bits-1,
                             as f32 (the codes themselves are not stored: tests enumerate them)
  all_bf16_to_f16 / all_f16_to_bf16 / all_f16_to_f8e4m3 / all_bf16_to_f8e5m2
                             narrow-to-narrow conversions over every code, same order
  int_src_f32, f32_to_i32, f32_to_i64, i64_src, i64_to_f32, i64_to_bf16, i64_to_f16
"""
import pathlib
import struct

import torch

from goldens._common import save

FP8 = {"f8e4m3": torch.float8_e4m3fn, "f8e5m2": torch.float8_e5m2}


def f32_bits(u: int) -> float:
    return struct.unpack("<f", struct.pack("<I", u & 0xFFFFFFFF))[0]


def tricky_values() -> list:
    v = [0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 3.0, 1.0 / 3.0, -7.25, 100.0, 1e-3, 65504.0, 65505.0,
         65519.0, 65519.99, 65520.0, 65536.0, 1e5, 448.0, 449.0, 464.0, 465.0, 480.0, 500.0,
         57344.0, 61439.0, 61440.0, 61441.0, 65536.0 * 2, 3.3895314e38, 3.4028235e38,
         float("inf"), float("-inf")]
    # NaNs with both signs and a few payloads; quiet and signalling.
    v += [f32_bits(b) for b in (0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF,
                                0x7FA00000, 0x7FC00001)]
    # f32 subnormals and the edges of the normal range.
    v += [f32_bits(b) for b in (0x00000001, 0x00000002, 0x007FFFFF, 0x00800000, 0x00400000,
                                0x80000001, 0x807FFFFF, 0x7F7FFFFF, 0xFF7FFFFF)]
    # bf16 ties and near-ties: low 16 bits 0x8000 with even/odd kept bit, and +-1 around.
    for hi in (0x3F80, 0x3F81, 0x4049, 0x7F7F, 0x0001, 0x0080, 0xBF80, 0xBF81, 0x7F7F):
        for lo in (0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x0001):
            v.append(f32_bits((hi << 16) | lo))
    # f16: ties between neighbours (13 dropped mantissa bits) at several exponents, the
    # subnormal range (2^-24 .. 2^-14) and underflow to zero.
    for e in (-25, -24, -23, -20, -15, -14, -13, 0, 1, 10, 15):
        for m in (0x000000, 0x001000, 0x000FFF, 0x001001, 0x003000, 0x7FF000, 0x7FFFFF):
            v.append(f32_bits(((e + 127) << 23) | m))
            v.append(-f32_bits(((e + 127) << 23) | m))
    # fp8: ties with 3 (e4m3) and 2 (e5m2) mantissa bits kept, subnormal ranges 2^-9 and 2^-16.
    for e in (-11, -10, -9, -8, -7, -6, -1, 0, 3, 8):
        for m in (0x080000, 0x100000, 0x180000, 0x07FFFF, 0x080001, 0x200000, 0x300000,
                  0x700000, 0x780000, 0x7FFFFF):
            v.append(f32_bits(((e + 127) << 23) | m))
    for e in (-18, -17, -16, -15, -14, -13, 14, 15, 16):
        for m in (0x100000, 0x200000, 0x0FFFFF, 0x100001, 0x300000, 0x600000, 0x700000):
            v.append(f32_bits(((e + 127) << 23) | m))
            v.append(-f32_bits(((e + 127) << 23) | m))
    return v


def make(fixtures_dir: pathlib.Path) -> None:
    g = torch.Generator("cpu").manual_seed(1234)
    tricky = torch.tensor(tricky_values(), dtype=torch.float32)
    # Random bit patterns cover every class; random values in [2^-20, 2^17) cover rounding.
    rand_bits = torch.randint(0, 1 << 32, (4096,), generator=g, dtype=torch.int64)
    rand_bits = rand_bits.to(torch.int32).view(torch.float32)
    mag = torch.exp2(torch.rand(8192, generator=g) * 37 - 20)
    sign = torch.where(torch.rand(8192, generator=g) < 0.5, -1.0, 1.0)
    src = torch.cat([tricky, rand_bits, mag * sign])

    out = {"src_f32": src}
    out["f32_to_bf16"] = src.to(torch.bfloat16)
    out["f32_to_f16"] = src.to(torch.float16)
    for name, t in FP8.items():
        out[f"f32_to_{name}"] = src.to(t)

    all16 = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16)
    all8 = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    all_f16 = all16.view(torch.float16)
    all_bf16 = all16.view(torch.bfloat16)
    out["all_f16_to_f32"] = all_f16.to(torch.float32)
    for name, t in FP8.items():
        codes = all8.view(t)
        out[f"all_{name}_to_f32"] = codes.to(torch.float32)
    out["all_bf16_to_f16"] = all_bf16.to(torch.float16)
    out["all_f16_to_bf16"] = all_f16.to(torch.bfloat16)
    out["all_f16_to_f8e4m3"] = all_f16.to(torch.float8_e4m3fn)
    out["all_bf16_to_f8e5m2"] = all_bf16.to(torch.float8_e5m2)

    # Float -> int truncates toward zero (values chosen inside the int32 range).
    ints = torch.tensor([0.0, -0.0, 0.4, 0.5, 0.99, 1.0, 1.5, -1.5, -2.7, 123456.9, -123456.9,
                         2147483520.0, -2147483648.0, 16777217.0, 1e-30, -1e-30])
    out["int_src_f32"] = ints
    out["f32_to_i32"] = ints.to(torch.int32)
    out["f32_to_i64"] = ints.to(torch.int64)
    i64 = torch.tensor([0, 1, -1, (1 << 24) + 1, (1 << 24) + 3, (1 << 53) + 1, -(1 << 62) - 1,
                        (1 << 63) - 1, -(1 << 63), 65519, 65520, 257, 259, 1 << 40],
                       dtype=torch.int64)
    out["i64_src"] = i64
    out["i64_to_f32"] = i64.to(torch.float32)
    out["i64_to_bf16"] = i64.to(torch.bfloat16)
    out["i64_to_f16"] = i64.to(torch.float16)
    save(fixtures_dir / "dtypes" / "conversions.safetensors", out,
         {"reference": f"torch {torch.__version__} "  # one key: several are written unordered
                       f"cpu_capability {torch.backends.cpu.get_cpu_capability()}"})
