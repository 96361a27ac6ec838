// AVX2 build of the avx_mathfun Box-Muller in random.cpp: same operations lane for lane, the
// FMAs in the same places, so it gives the same bits as the portable version (and as torch).
#include <immintrin.h>

#include <cstdint>
#include <initializer_list>

namespace tessera::detail {
namespace {

inline __m256 splat(float v) {
  return _mm256_set1_ps(v);
}
inline __m256i splat_i(int32_t v) {
  return _mm256_set1_epi32(v);
}

__m256 log_cephes8(__m256 x) {
  const __m256 one = splat(1.0f);
  const __m256 invalid = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LE_OS);
  x = _mm256_max_ps(x, _mm256_castsi256_ps(splat_i(0x00800000)));
  const __m256i exponent =
      _mm256_sub_epi32(_mm256_srli_epi32(_mm256_castps_si256(x), 23), splat_i(0x7f));
  x = _mm256_or_ps(_mm256_and_ps(x, _mm256_castsi256_ps(splat_i(~0x7f800000))), splat(0.5f));
  __m256 e = _mm256_add_ps(_mm256_cvtepi32_ps(exponent), one);
  const __m256 small = _mm256_cmp_ps(x, splat(0.707106781186547524f), _CMP_LT_OS);
  const __m256 tmp = _mm256_and_ps(x, small);
  x = _mm256_sub_ps(x, one);
  e = _mm256_sub_ps(e, _mm256_and_ps(one, small));
  x = _mm256_add_ps(x, tmp);
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 y = splat(7.0376836292E-2f);
  for (float c : {-1.1514610310E-1f, 1.1676998740E-1f, -1.2420140846E-1f, 1.4249322787E-1f,
                  -1.6668057665E-1f, 2.0000714765E-1f, -2.4999993993E-1f, 3.3333331174E-1f})
    y = _mm256_fmadd_ps(y, x, splat(c));
  y = _mm256_mul_ps(y, x);
  y = _mm256_fmadd_ps(y, z, _mm256_mul_ps(e, splat(-2.12194440e-4f)));
  y = _mm256_sub_ps(y, _mm256_mul_ps(z, splat(0.5f)));
  x = _mm256_fmadd_ps(e, splat(0.693359375f), _mm256_add_ps(x, y));
  return _mm256_or_ps(x, invalid);
}

void sincos_cephes8(__m256 x, __m256* s, __m256* c) {
  const __m256 sign_mask = _mm256_castsi256_ps(splat_i(int32_t(0x80000000u)));
  __m256 sign_sin = _mm256_and_ps(x, sign_mask);
  x = _mm256_andnot_ps(sign_mask, x);
  __m256i j = _mm256_cvttps_epi32(_mm256_mul_ps(x, splat(1.27323954473516f)));
  j = _mm256_and_si256(_mm256_add_epi32(j, splat_i(1)), splat_i(~1));
  const __m256 y0 = _mm256_cvtepi32_ps(j);
  const __m256 swap_sin =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(j, splat_i(4)), 29));
  const __m256 poly_cos = _mm256_castsi256_ps(
      _mm256_cmpeq_epi32(_mm256_and_si256(j, splat_i(2)), _mm256_setzero_si256()));
  x = _mm256_fmadd_ps(y0, splat(-0.78515625f), x);
  x = _mm256_fmadd_ps(y0, splat(-2.4187564849853515625e-4f), x);
  x = _mm256_fmadd_ps(y0, splat(-3.77489497744594108e-8f), x);
  const __m256 sign_cos = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_andnot_si256(_mm256_sub_epi32(j, splat_i(2)), splat_i(4)), 29));
  sign_sin = _mm256_xor_ps(sign_sin, swap_sin);

  const __m256 z = _mm256_mul_ps(x, x);
  __m256 y = _mm256_fmadd_ps(splat(2.443315711809948E-005f), z, splat(-1.388731625493765E-003f));
  y = _mm256_fmadd_ps(y, z, splat(4.166664568298827E-002f));
  y = _mm256_mul_ps(y, z);
  y = _mm256_fmsub_ps(y, z, _mm256_mul_ps(z, splat(0.5f)));
  y = _mm256_add_ps(y, splat(1.0f));

  __m256 y2 = _mm256_fmadd_ps(splat(-1.9515295891E-4f), z, splat(8.3321608736E-3f));
  y2 = _mm256_fmadd_ps(y2, z, splat(-1.6666654611E-1f));
  y2 = _mm256_mul_ps(y2, z);
  y2 = _mm256_fmadd_ps(y2, x, x);

  const __m256 ysin2 = _mm256_and_ps(poly_cos, y2);
  const __m256 ysin1 = _mm256_andnot_ps(poly_cos, y);
  y2 = _mm256_sub_ps(y2, ysin2);
  y = _mm256_sub_ps(y, ysin1);
  *s = _mm256_xor_ps(_mm256_add_ps(ysin1, ysin2), sign_sin);
  *c = _mm256_xor_ps(_mm256_add_ps(y, y2), sign_cos);
}

}  // namespace

// Box-Muller on `blocks` consecutive groups of 16 uniforms, in place.
void box_muller_mathfun_avx2(float* d, int64_t blocks, float mean, float std_) {
  const __m256 vmean = splat(mean), vstd = splat(std_);
  const __m256 two_pi = splat(float(2.0 * 3.14159265358979323846));
  for (int64_t b = 0; b < blocks; ++b, d += 16) {
    const __m256 u1 = _mm256_sub_ps(splat(1.0f), _mm256_loadu_ps(d));
    const __m256 u2 = _mm256_loadu_ps(d + 8);
    const __m256 radius = _mm256_sqrt_ps(_mm256_mul_ps(splat(-2.0f), log_cephes8(u1)));
    __m256 s, c;
    sincos_cephes8(_mm256_mul_ps(two_pi, u2), &s, &c);
    _mm256_storeu_ps(d, _mm256_fmadd_ps(_mm256_mul_ps(radius, c), vstd, vmean));
    _mm256_storeu_ps(d + 8, _mm256_fmadd_ps(_mm256_mul_ps(radius, s), vstd, vmean));
  }
}

}  // namespace tessera::detail
