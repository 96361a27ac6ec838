// Row kernels written as plain loops the compiler vectorises. Included once per ISA file
// (elementwise_scalar.cpp, elementwise_avx2.cpp, elementwise_avx512.cpp), each compiled with its
// own -m flags; everything here has internal linkage so no AVX code leaks into another file.
// Define EW_TABLE_NAME before including: the name of the table function this file exports;
// optionally EW_GELU_TANH_F32, a function (const float*, float*, int64_t) for f32 GELU-tanh rows,
// and EW_LAYER_NORM_ROW_X16 / EW_RMS_NORM_ROW_X16, row kernels returning false where they decline.
#pragma once
#include <cstdint>
#include <cstring>

#include "backends/cpu/elementwise/elementwise_kernels.h"

namespace tessera {
namespace {

inline uint32_t f_bits(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return u;
}
inline float bits_f(uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

// exp with Cephes' polynomial on [-ln2/2, ln2/2]; within 2 ulp of expf. Inputs past the float
// range saturate to inf / 0 (values below -87.3 flush to 0 instead of going subnormal).
inline float ew_exp(float x) {
  const float hi = 88.3762626647949f, lo = -87.3365478515625f;
  // NaN is clamped to 0 here (and returned as NaN below): float-to-int of NaN is undefined.
  const float xc = x > hi ? hi : (x < lo ? lo : (x == x ? x : 0.f));
  // Round to nearest with the 1.5*2^23 trick, which vectorises without SSE4.1.
  const float fn = (xc * 1.44269504088896341f + 12582912.f) - 12582912.f;
  float r = xc - fn * 0.693359375f;
  r = r - fn * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.f;
  // fn may reach 128 at the top of the range: apply 2^fn as 2^(fn-1) * 2.
  const int32_t n = int32_t(fn) - 1;
  const float scaled = e * bits_f(uint32_t(n + 127) << 23) * 2.f;
  const float inf = bits_f(0x7f800000u);
  float out = x > 88.72283935546875f ? inf : scaled;
  out = x < lo ? 0.f : out;
  return x != x ? x : out;
}

inline float ew_sigmoid(float x) { return 1.f / (1.f + ew_exp(-x)); }
inline float ew_silu(float x) { return x / (1.f + ew_exp(-x)); }

// tanh(u) as 1 - 2e/(1 + e) with e = exp(-2|u|): no overflow, and near +-1 (where GELU adds 1
// and torch's result is quantised by that sum) rounded like a correctly rounded tanh. Used only
// inside gelu_tanh; the tanh op uses libm.
inline float ew_tanh_gelu(float u) {
  const float a = u < 0.f ? -u : u;
  const float e = ew_exp(-2.f * a);
  const float t = 1.f - 2.f * e / (1.f + e);
  return u < 0.f ? -t : t;
}

// F.gelu(approximate="tanh"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), torch's form.
inline float ew_gelu_tanh(float x) {
  const float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.f + ew_tanh_gelu(inner));
}

// erf by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7): the approximation torch's vectorised
// CPU erf uses, so GELU's negative tail is quantised as the oracle's is.
inline float ew_erf_as(float z) {
  const float a = __builtin_fabsf(z);
  const float t = 1.f / (0.3275911f * a + 1.f);
  float r = 1.061405429f * t + -1.453152027f;
  r = r * t + 1.421413741f;
  r = r * t + -0.284496736f;
  r = r * t + 0.254829592f;
  const float e = ew_exp(-(z * z));
  const float v = (-e * t) * r + 1.f;
  return z < 0.f ? -v : v;
}

// Exact GELU in torch's form x * 0.5 * (1 + erf(x / sqrt 2)).
inline float ew_gelu(float x) { return x * 0.5f * (1.f + ew_erf_as(x * 0.70710678118654752f)); }

inline float ew_round_bf16(float f) {
  const uint32_t u = f_bits(f);
  const uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  return (u & 0x7fffffffu) > 0x7f800000u ? f : bits_f(r);
}

// Element loads/stores for the typed loops: fp32 as is, bf16 (uint16_t) widened / rounded.
inline float ld(float x) { return x; }
inline float ld(uint16_t h) { return bits_f(uint32_t(h) << 16); }
inline void put(float* o, float v) { *o = v; }
inline void put(uint16_t* o, float v) {
  const uint32_t u = f_bits(v);
  const uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  *o = uint16_t((u & 0x7fffffffu) > 0x7f800000u ? ((u >> 16) | 0x40u) : r);
}

inline float ew_max(float x, float y) { return (x != x || y != y) ? x + y : (x > y ? x : y); }
inline float ew_min(float x, float y) { return (x != x || y != y) ? x + y : (x < y ? x : y); }

// Expands `expr` (of x, y) for the four stride combinations so each loop is a plain stream.
#define EW_BINARY_LOOPS(expr)                                              \
  if (sa && sb) {                                                          \
    for (int64_t i = 0; i < n; ++i) {                                      \
      const float x = ld(a[i]), y = ld(b[i]);                              \
      put(o + i, (expr));                                                  \
    }                                                                      \
  } else if (sa) {                                                         \
    const float y = ld(b[0]);                                              \
    for (int64_t i = 0; i < n; ++i) {                                      \
      const float x = ld(a[i]);                                            \
      put(o + i, (expr));                                                  \
    }                                                                      \
  } else if (sb) {                                                         \
    const float x = ld(a[0]);                                              \
    for (int64_t i = 0; i < n; ++i) {                                      \
      const float y = ld(b[i]);                                            \
      put(o + i, (expr));                                                  \
    }                                                                      \
  } else {                                                                 \
    const float x = ld(a[0]), y = ld(b[0]);                                \
    const float v = (expr);                                                \
    for (int64_t i = 0; i < n; ++i) put(o + i, v);                         \
  }                                                                        \
  return

// T is float (fp32 rows) or uint16_t (bf16 rows, widened on load and rounded once on store).
template <typename T>
void k_binary(BinaryOp op, const T* a, int64_t sa, const T* b, int64_t sb, T* o, int64_t n) {
  switch (op) {
    case BinaryOp::add: EW_BINARY_LOOPS(x + y);
    case BinaryOp::sub: EW_BINARY_LOOPS(x - y);
    case BinaryOp::mul: EW_BINARY_LOOPS(x * y);
    case BinaryOp::div: EW_BINARY_LOOPS(x / y);
    case BinaryOp::maximum: EW_BINARY_LOOPS(ew_max(x, y));
    case BinaryOp::minimum: EW_BINARY_LOOPS(ew_min(x, y));
    case BinaryOp::pow: EW_BINARY_LOOPS(__builtin_powf(x, y));
  }
}
#undef EW_BINARY_LOOPS

#define EW_UNARY_LOOP(expr)                \
  for (int64_t i = 0; i < n; ++i) {        \
    const float v = ld(x[i]);              \
    put(o + i, (expr));                    \
  }                                        \
  return

template <typename T>
void k_unary(UnaryOp op, const T* x, T* o, int64_t n, bool bf16_steps) {
  switch (op) {
    case UnaryOp::neg: EW_UNARY_LOOP(-v);
    case UnaryOp::abs: EW_UNARY_LOOP(__builtin_fabsf(v));
    case UnaryOp::exp: EW_UNARY_LOOP(ew_exp(v));
    case UnaryOp::log: EW_UNARY_LOOP(__builtin_logf(v));
    case UnaryOp::sqrt: EW_UNARY_LOOP(__builtin_sqrtf(v));
    case UnaryOp::rsqrt: EW_UNARY_LOOP(1.f / __builtin_sqrtf(v));
    case UnaryOp::tanh: EW_UNARY_LOOP(__builtin_tanhf(v));
    case UnaryOp::sigmoid: EW_UNARY_LOOP(ew_sigmoid(v));
    case UnaryOp::sin: EW_UNARY_LOOP(__builtin_sinf(v));
    case UnaryOp::cos: EW_UNARY_LOOP(__builtin_cosf(v));
    case UnaryOp::square: EW_UNARY_LOOP(v * v);
    case UnaryOp::silu: EW_UNARY_LOOP(ew_silu(v));
    case UnaryOp::gelu: EW_UNARY_LOOP(ew_gelu(v));
    case UnaryOp::gelu_tanh:
#ifdef EW_GELU_TANH_F32  // an ISA file's own loop for f32 rows
      if constexpr (sizeof(T) == 4) {
        EW_GELU_TANH_F32(x, o, n);
        return;
      }
#endif
      EW_UNARY_LOOP(ew_gelu_tanh(v));
    case UnaryOp::relu: EW_UNARY_LOOP((v > 0.f || v != v) ? v : 0.f);
    case UnaryOp::quick_gelu:
      // transformers' QuickGELU is x * sigmoid(1.702 * x): three torch ops, each rounding.
      if (bf16_steps) {
        EW_UNARY_LOOP(v * ew_round_bf16(ew_sigmoid(ew_round_bf16(1.702f * v))));
      }
      EW_UNARY_LOOP(v * ew_sigmoid(1.702f * v));
  }
}
#undef EW_UNARY_LOOP

// Loops over runtime/dtype.h's inline conversions, which the compiler vectorises for each ISA.
void k_bf16_to_f32(const uint16_t* x, float* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = bf16_to_f32(x[i]);
}

void k_f32_to_bf16(const float* x, uint16_t* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = f32_to_bf16(x[i]);
}

void k_round_bf16(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = round_bf16(x[i]);
}

// 16 independent partial sums, combined pairwise: the same order on every ISA.
#define EW_LANE_SUM(term)                                    \
  float acc[16] = {};                                        \
  int64_t i = 0;                                             \
  for (; i + 16 <= n; i += 16)                               \
    for (int j = 0; j < 16; ++j) {                           \
      const float v = x[i + j];                              \
      acc[j] += (term);                                      \
    }                                                        \
  for (int j = 0; i < n; ++i, ++j) {                         \
    const float v = x[i];                                    \
    acc[j] += (term);                                        \
  }                                                          \
  for (int w = 8; w >= 1; w /= 2)                            \
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];        \
  return acc[0]

float k_sum(const float* x, int64_t n) { EW_LANE_SUM(v); }
float k_sum_sq(const float* x, int64_t n) { EW_LANE_SUM(v * v); }
float k_sum_sq_dev(const float* x, float mean, int64_t n) {
  EW_LANE_SUM((v - mean) * (v - mean));
}
#undef EW_LANE_SUM

void k_scale_shift(const float* x, float a, float b, float* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = x[i] * a + b;
}

// One f32 row (n <= kEwChunk) of LayerNorm without affine, or of RmsNorm: this table's sums and
// scale chained exactly as norm.cpp's drivers chain the table calls (same order, same roundings),
// in one call per row instead of three to five calls and a copy (FLUX's rows are 16-128 wide).
void k_layer_norm_row(const float* x, int64_t n, float eps, float* o) {
#ifdef EW_LAYER_NORM_ROW_X16  // an ISA file's own rows of 16k floats (the same steps)
  if (EW_LAYER_NORM_ROW_X16(x, n, eps, o)) return;
#endif
  double s = 0, q = 0;
  s += k_sum(x, n);
  const float mean = float(s / double(n));
  q += k_sum_sq_dev(x, mean, n);
  const float var = float(q / double(n));
  const float rstd = 1.f / __builtin_sqrtf((var < 0.f ? 0.f : var) + eps);
  float shift = -rstd * mean;
  __asm__("" : "+x"(shift));  // one rounded product, as the table call receives it (no fma)
  k_scale_shift(x, rstd, shift, o, n);
}

// x * r, then * w[i] when w is given: two roundings, as the driver's two binary multiplies.
void k_rms_norm_row(const float* x, int64_t n, float eps, const float* w, float* o) {
#ifdef EW_RMS_NORM_ROW_X16
  if (EW_RMS_NORM_ROW_X16(x, n, eps, w, o)) return;
#endif
  double ss = 0;
  ss += k_sum_sq(x, n);
  const float rr = 1.f / __builtin_sqrtf(float(ss) / float(n) + eps);
  if (w) {
    for (int64_t i = 0; i < n; ++i) {
      float t = x[i] * rr;
      o[i] = t * w[i];
    }
  } else {
    for (int64_t i = 0; i < n; ++i) o[i] = x[i] * rr;
  }
}

// Whole rows: an ISA file's several-rows path (it returns how many leading rows it did), then
// the single-row kernel for the rest.
void k_layer_norm_rows(const float* x, int64_t rows, int64_t n, float eps, float* o) {
  int64_t r = 0;
#ifdef EW_LAYER_NORM_ROWS_X16
  r = EW_LAYER_NORM_ROWS_X16(x, rows, n, eps, o);
#endif
  for (; r < rows; ++r) k_layer_norm_row(x + r * n, n, eps, o + r * n);
}

void k_rms_norm_rows(const float* x, int64_t rows, int64_t n, float eps, const float* w, float* o) {
  int64_t r = 0;
#ifdef EW_RMS_NORM_ROWS_X16
  r = EW_RMS_NORM_ROWS_X16(x, rows, n, eps, w, o);
#endif
  for (; r < rows; ++r) k_rms_norm_row(x + r * n, n, eps, w, o + r * n);
}

}  // namespace

const EwKernels& EW_TABLE_NAME() {
  static const EwKernels k{EW_TABLE_ISA,       k_binary<float>,   k_unary<float>,
                           k_bf16_to_f32,      k_f32_to_bf16,     k_sum,
                           k_sum_sq,           k_sum_sq_dev,      k_scale_shift,
                           k_binary<uint16_t>, k_unary<uint16_t>, k_round_bf16,
                           k_layer_norm_row,   k_rms_norm_row,    k_layer_norm_rows,
                           k_rms_norm_rows};
  return k;
}

}  // namespace tessera
