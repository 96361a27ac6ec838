// The row kernels of elementwise_loops.h built for the avx512 path (flags from CMake by file name),
// plus an explicit GELU-tanh loop: the plain loop's one division per element bounds it (vdivps),
// here the quotient comes from a reciprocal estimate refined by Newton steps.
// GCC 12 warns about its own _mm512_undefined_* inside the intrinsic headers; harmless.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

namespace tessera {
namespace {

// ew_exp's steps (elementwise_loops.h) for GELU-tanh's argument -2|u|: Cephes' polynomial, the
// power of two applied by scalef. Differences from ew_exp are confined to results below 2^-125
// (scaled in one rounding instead of two; below -87.34 not flushed to 0), which leave 1 - 2e / (1 +
// e) at exactly 1; a NaN argument gives a finite value here, and GELU's final product with x the
// NaN.
inline __m512 exp_for_gelu_ps(__m512 x) {
  const __m512 xc = _mm512_max_ps(x, _mm512_set1_ps(-87.3365478515625f));
  const __m512 big = _mm512_set1_ps(12582912.f);
  const __m512 fn =
      _mm512_sub_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504088896341f), big), big);
  __m512 r = _mm512_fnmadd_ps(fn, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fnmadd_ps(fn, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 e = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(e, fn);
}

// 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), tanh(u) = sign(u) (1 - 2e / (1 + e)) with
// e = exp(-2|u|), as ew_gelu_tanh. The quotient: rcp14, one Newton step and one residual correction
// (Markstein), within an ulp of the division; 1 + e lies in [1, 2], so no special cases.
inline __m512 gelu_tanh_ps(__m512 v) {
  const __m512 one = _mm512_set1_ps(1.f);
  const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(int(0x80000000u)));
  const __m512 u = _mm512_mul_ps(
      _mm512_set1_ps(0.7978845608028654f),
      _mm512_fmadd_ps(_mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.044715f), v), v), v, v));
  const __m512 a = _mm512_andnot_ps(sign, u);
  const __m512 e = exp_for_gelu_ps(_mm512_mul_ps(_mm512_set1_ps(-2.f), a));
  const __m512 num = _mm512_add_ps(e, e), den = _mm512_add_ps(one, e);
  __m512 y = _mm512_rcp14_ps(den);
  y = _mm512_fmadd_ps(_mm512_fnmadd_ps(den, y, one), y, y);
  __m512 q = _mm512_mul_ps(num, y);
  q = _mm512_fmadd_ps(_mm512_fnmadd_ps(q, den, num), y, q);
  const __m512 t = _mm512_or_ps(_mm512_sub_ps(one, q), _mm512_and_ps(sign, u));
  return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), v), _mm512_add_ps(one, t));
}

void gelu_tanh_f32_avx512(const float* x, float* o, int64_t n) {
  int64_t i = 0;
  // Two vectors per iteration: each is one long dependent chain, and two give the scheduler
  // independent work to interleave.
  for (; i + 32 <= n; i += 32) {
    const __m512 r0 = gelu_tanh_ps(_mm512_loadu_ps(x + i));
    const __m512 r1 = gelu_tanh_ps(_mm512_loadu_ps(x + i + 16));
    _mm512_storeu_ps(o + i, r0);
    _mm512_storeu_ps(o + i + 16, r1);
  }
  for (; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(o + i, k, gelu_tanh_ps(_mm512_maskz_loadu_ps(k, x + i)));
  }
}

// Norm rows whose length is a multiple of 16 (FLUX's 16-128) in registers: the 16-lane partial
// sums and their pairwise combine of EW_LANE_SUM, then the scalar steps of k_layer_norm_row /
// k_rms_norm_row, operation for operation (the vectorised loops contract x * a + b and
// acc + d * d into FMAs; so does this). Returns false for other lengths (the generic loops run).
inline float lane_tree(__m512 acc) {  // acc[j] += acc[j + w] for w = 8, 4, 2, 1
  const __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
  const __m128 a4 = _mm_add_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps(a8, 1));
  const __m128 a2 = _mm_add_ps(a4, _mm_movehl_ps(a4, a4));
  return _mm_cvtss_f32(_mm_add_ss(a2, _mm_shuffle_ps(a2, a2, 1)));
}

bool layer_norm_row_x16_avx512(const float* x, int64_t n, float eps, float* o) {
  if (n % 16 != 0 || n == 0) return false;
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) acc = _mm512_add_ps(acc, _mm512_loadu_ps(x + i));
  double s = 0;
  s += lane_tree(acc);
  const float mean = float(s / double(n));
  const __m512 vm = _mm512_set1_ps(mean);
  acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(x + i), vm);
    acc = _mm512_fmadd_ps(d, d, acc);
  }
  double q = 0;
  q += lane_tree(acc);
  const float var = float(q / double(n));
  const float rstd = 1.f / __builtin_sqrtf((var < 0.f ? 0.f : var) + eps);
  float shift = -rstd * mean;
  __asm__("" : "+x"(shift));  // one rounded product, as k_layer_norm_row
  const __m512 a = _mm512_set1_ps(rstd), b = _mm512_set1_ps(shift);
  for (int64_t i = 0; i < n; i += 16)
    _mm512_storeu_ps(o + i, _mm512_fmadd_ps(_mm512_loadu_ps(x + i), a, b));
  return true;
}

bool rms_norm_row_x16_avx512(const float* x, int64_t n, float eps, const float* w, float* o) {
  if (n % 16 != 0 || n == 0) return false;
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  double ss = 0;
  ss += lane_tree(acc);
  const __m512 rr = _mm512_set1_ps(1.f / __builtin_sqrtf(float(ss) / float(n) + eps));
  for (int64_t i = 0; i < n; i += 16) {
    __m512 t = _mm512_mul_ps(_mm512_loadu_ps(x + i), rr);
    if (w) t = _mm512_mul_ps(t, _mm512_loadu_ps(w + i));
    _mm512_storeu_ps(o + i, t);
  }
  return true;
}

}  // namespace
}  // namespace tessera

#define EW_TABLE_NAME ew_kernels_avx512
#define EW_TABLE_ISA CpuIsa::avx512
#define EW_GELU_TANH_F32 gelu_tanh_f32_avx512
#define EW_LAYER_NORM_ROW_X16 layer_norm_row_x16_avx512
#define EW_RMS_NORM_ROW_X16 rms_norm_row_x16_avx512
#include "backends/cpu/elementwise/elementwise_loops.h"
