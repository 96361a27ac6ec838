#include "runtime/dtype.h"

#include <cmath>

#include "runtime/error.h"

namespace tessera {
namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct DTypeInfo {
  DType t;
  size_t size;
  const char* name;
  const char* st_name;
};
constexpr DTypeInfo kInfo[] = {
    {DType::f32, 4, "f32", "F32"},           {DType::bf16, 2, "bf16", "BF16"},
    {DType::f16, 2, "f16", "F16"},           {DType::i64, 8, "i64", "I64"},
    {DType::i32, 4, "i32", "I32"},           {DType::boolean, 1, "bool", "BOOL"},
    {DType::f8e4m3, 1, "f8e4m3", "F8_E4M3"}, {DType::f8e5m2, 1, "f8e5m2", "F8_E5M2"},
};

// Decode an fp8 value with the given exponent/mantissa widths (IEEE-like, bias 2^(e-1)-1).
float fp8_decode(uint8_t v, int exp_bits, int man_bits, bool has_inf) {
  const int bias = (1 << (exp_bits - 1)) - 1;
  const bool neg = v & 0x80;
  const int e = (v >> man_bits) & ((1 << exp_bits) - 1);
  const int m = v & ((1 << man_bits) - 1);
  float r;
  if (has_inf && e == (1 << exp_bits) - 1) {
    r = m ? NAN : INFINITY;
  } else if (!has_inf && e == (1 << exp_bits) - 1 && m == (1 << man_bits) - 1) {
    r = NAN;
  } else if (e == 0) {
    r = std::ldexp(float(m), 1 - bias - man_bits);
  } else {
    r = std::ldexp(float(m + (1 << man_bits)), e - bias - man_bits);
  }
  return neg ? -r : r;
}

template <typename T>
double load_as_double(const void* p, DType t, size_t i) {
  (void)sizeof(T);
  switch (t) {
    case DType::i64: return double(static_cast<const int64_t*>(p)[i]);
    case DType::i32: return double(static_cast<const int32_t*>(p)[i]);
    case DType::boolean: return static_cast<const uint8_t*>(p)[i] ? 1.0 : 0.0;
    default: return 0.0;
  }
}

float load_float(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::f8e4m3: return f8e4m3_to_f32(static_cast<const uint8_t*>(p)[i]);
    case DType::f8e5m2: return f8e5m2_to_f32(static_cast<const uint8_t*>(p)[i]);
    case DType::i64: return float(static_cast<const int64_t*>(p)[i]);
    case DType::i32: return float(static_cast<const int32_t*>(p)[i]);
    case DType::boolean: return static_cast<const uint8_t*>(p)[i] ? 1.f : 0.f;
  }
  return 0.f;
}

void store_float(void* p, DType t, size_t i, float v) {
  switch (t) {
    case DType::f32: static_cast<float*>(p)[i] = v; break;
    case DType::bf16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); break;
    case DType::f16: static_cast<uint16_t*>(p)[i] = f32_to_f16(v); break;
    case DType::f8e4m3: static_cast<uint8_t*>(p)[i] = f32_to_f8e4m3(v); break;
    case DType::f8e5m2: static_cast<uint8_t*>(p)[i] = f32_to_f8e5m2(v); break;
    case DType::i64: static_cast<int64_t*>(p)[i] = int64_t(v); break;
    case DType::i32: static_cast<int32_t*>(p)[i] = int32_t(v); break;
    case DType::boolean: static_cast<uint8_t*>(p)[i] = v != 0.f; break;
  }
}

bool is_integral(DType t) { return t == DType::i64 || t == DType::i32 || t == DType::boolean; }

}  // namespace

size_t dtype_size(DType t) { return kInfo[int(t)].size; }
const char* dtype_name(DType t) { return kInfo[int(t)].name; }
const char* dtype_safetensors_name(DType t) { return kInfo[int(t)].st_name; }
bool is_floating(DType t) { return !is_integral(t); }

bool dtype_from_safetensors_name(std::string_view s, DType* out) {
  for (const auto& info : kInfo) {
    if (s == info.st_name) {
      *out = info.t;
      return true;
    }
  }
  return false;
}

DType dtype_from_name(std::string_view s) {
  if (s == "f32" || s == "float32" || s == "float") return DType::f32;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  if (s == "f16" || s == "float16" || s == "half") return DType::f16;
  if (s == "i64" || s == "int64") return DType::i64;
  if (s == "i32" || s == "int32") return DType::i32;
  if (s == "bool") return DType::boolean;
  if (s == "f8e4m3" || s == "float8_e4m3fn") return DType::f8e4m3;
  if (s == "f8e5m2" || s == "float8_e5m2") return DType::f8e5m2;
  TESSERA_FAIL("[dtype] unknown dtype '", s, "'; expected one of f32, bf16, f16, i64, i32, bool, ",
               "f8e4m3, f8e5m2");
}

// IEEE half conversions without F16C (exact, round-to-nearest-even).
float f16_to_f32(uint16_t h) {
  const uint32_t w = uint32_t(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const float normalized = float_of((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float denormalized = float_of((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t r = sign | (two_w < (1u << 27) ? bits_of(denormalized) : bits_of(normalized));
  return float_of(r);
}

uint16_t f32_to_f16(float f) {
  float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = bits_of(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = float_of((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = bits_of(base);
  const uint32_t nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
  return uint16_t((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

float f8e4m3_to_f32(uint8_t v) { return fp8_decode(v, 4, 3, false); }
float f8e5m2_to_f32(uint8_t v) { return fp8_decode(v, 5, 2, true); }

// RNE as torch's Tensor.to(float8_e4m3fn); finite overflow and +-inf saturate to +-448 (0x7e),
// NaN -> 0x7f with its sign (checked against torch 2.15 in tests/dtype_test.cpp).
uint8_t f32_to_f8e4m3(float f) {
  uint32_t f_bits = bits_of(f);
  const uint32_t sign = f_bits & 0x80000000u;
  f_bits ^= sign;
  uint8_t result;
  if (f_bits > 0x7f800000u) {
    result = 0x7f;
  } else if (f_bits > 0x43e80000u) {  // above 464, the tie that still rounds down to 448
    result = 0x7e;
  } else if (f_bits < (121u << 23)) {
    const float denorm = float_of(141u << 23);
    result = uint8_t(bits_of(float_of(f_bits) + denorm) - (141u << 23));
  } else {
    const uint32_t mant_odd = (f_bits >> 20) & 1u;
    f_bits += (uint32_t(7 - 127) << 23) + 0x7FFFFu;
    f_bits += mant_odd;
    result = uint8_t(f_bits >> 20);
  }
  return result | uint8_t(sign >> 24);
}

uint8_t f32_to_f8e5m2(float f) {
  uint32_t f_bits = bits_of(f);
  const uint32_t sign = f_bits & 0x80000000u;
  f_bits ^= sign;
  uint8_t result;
  if (f_bits >= (143u << 23)) {
    result = f_bits > (255u << 23) ? 0x7f : 0x7c;
  } else if (f_bits < (113u << 23)) {
    const float denorm = float_of(134u << 23);
    result = uint8_t(bits_of(float_of(f_bits) + denorm) - (134u << 23));
  } else {
    const uint32_t mant_odd = (f_bits >> 21) & 1u;
    f_bits += (uint32_t(15 - 127) << 23) + 0xFFFFFu;
    f_bits += mant_odd;
    result = uint8_t(f_bits >> 21);
  }
  return result | uint8_t(sign >> 24);
}

void convert_elements(const void* src, DType st, void* dst, DType dt, size_t n) {
  if (n == 0) return;  // empty tensors may pass null buffers (memcpy(null, null, 0) is UB)
  if (st == dt) {
    std::memcpy(dst, src, n * dtype_size(st));
    return;
  }
  // Integer <-> integer conversions must not lose precision through float.
  if (is_integral(st) && is_integral(dt)) {
    for (size_t i = 0; i < n; ++i) {
      const int64_t v = int64_t(load_as_double<int64_t>(src, st, i));
      if (dt == DType::i64) static_cast<int64_t*>(dst)[i] = v;
      else if (dt == DType::i32) static_cast<int32_t*>(dst)[i] = int32_t(v);
      else static_cast<uint8_t*>(dst)[i] = v != 0;
    }
    return;
  }
  if (st == DType::i64 && dt == DType::f32) {
    for (size_t i = 0; i < n; ++i) static_cast<float*>(dst)[i] = float(static_cast<const int64_t*>(src)[i]);
    return;
  }
  // bf16 <-> f32 (casts, RoPE and norm rows in bf16 models): typed loops over the inline helpers,
  // which the compiler vectorises, instead of a dtype switch per element.
  if (st == DType::bf16 && dt == DType::f32) {
    const auto* s = static_cast<const uint16_t*>(src);
    auto* d = static_cast<float*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = bf16_to_f32(s[i]);
    return;
  }
  if (st == DType::f32 && dt == DType::bf16) {
    const auto* s = static_cast<const float*>(src);
    auto* d = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
    return;
  }
  for (size_t i = 0; i < n; ++i) store_float(dst, dt, i, load_float(src, st, i));
}

}  // namespace tessera
