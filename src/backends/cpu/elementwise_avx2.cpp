// The row kernels of elementwise_loops.h built for the avx2 path (flags from CMake by file name),
// plus norm rows of 16k floats in registers as in the AVX-512 file: each 16-lane partial sum of
// EW_LANE_SUM is two 8-lane halves here.
#include <immintrin.h>

#include <cstdint>

namespace tessera {
namespace {

// acc[j] += acc[j + w] for w = 8, 4, 2, 1, with lanes 0-7 in lo and 8-15 in hi.
inline float lane_tree(__m256 lo, __m256 hi) {
  const __m256 a8 = _mm256_add_ps(lo, hi);
  const __m128 a4 = _mm_add_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps(a8, 1));
  const __m128 a2 = _mm_add_ps(a4, _mm_movehl_ps(a4, a4));
  return _mm_cvtss_f32(_mm_add_ss(a2, _mm_shuffle_ps(a2, a2, 1)));
}

// k_layer_norm_row / k_rms_norm_row for lengths a multiple of 16 (the vectorised loops contract
// x * a + b and acc + d * d into FMAs; so does this). False for other lengths.
bool layer_norm_row_x16_avx2(const float* x, int64_t n, float eps, float* o) {
  if (n % 16 != 0 || n == 0) return false;
  __m256 lo = _mm256_setzero_ps(), hi = lo;
  for (int64_t i = 0; i < n; i += 16) {
    lo = _mm256_add_ps(lo, _mm256_loadu_ps(x + i));
    hi = _mm256_add_ps(hi, _mm256_loadu_ps(x + i + 8));
  }
  double s = 0;
  s += lane_tree(lo, hi);
  const float mean = float(s / double(n));
  const __m256 vm = _mm256_set1_ps(mean);
  lo = hi = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(x + i), vm);
    const __m256 d1 = _mm256_sub_ps(_mm256_loadu_ps(x + i + 8), vm);
    lo = _mm256_fmadd_ps(d0, d0, lo);
    hi = _mm256_fmadd_ps(d1, d1, hi);
  }
  double q = 0;
  q += lane_tree(lo, hi);
  const float var = float(q / double(n));
  const float rstd = 1.f / __builtin_sqrtf((var < 0.f ? 0.f : var) + eps);
  float shift = -rstd * mean;
  __asm__("" : "+x"(shift));  // one rounded product, as k_layer_norm_row
  const __m256 a = _mm256_set1_ps(rstd), b = _mm256_set1_ps(shift);
  for (int64_t i = 0; i < n; i += 8)
    _mm256_storeu_ps(o + i, _mm256_fmadd_ps(_mm256_loadu_ps(x + i), a, b));
  return true;
}

bool rms_norm_row_x16_avx2(const float* x, int64_t n, float eps, const float* w, float* o) {
  if (n % 16 != 0 || n == 0) return false;
  __m256 lo = _mm256_setzero_ps(), hi = lo;
  for (int64_t i = 0; i < n; i += 16) {
    const __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
    lo = _mm256_fmadd_ps(v0, v0, lo);
    hi = _mm256_fmadd_ps(v1, v1, hi);
  }
  double ss = 0;
  ss += lane_tree(lo, hi);
  const __m256 rr = _mm256_set1_ps(1.f / __builtin_sqrtf(float(ss) / float(n) + eps));
  for (int64_t i = 0; i < n; i += 8) {
    __m256 t = _mm256_mul_ps(_mm256_loadu_ps(x + i), rr);
    if (w) t = _mm256_mul_ps(t, _mm256_loadu_ps(w + i));
    _mm256_storeu_ps(o + i, t);
  }
  return true;
}

}  // namespace
}  // namespace tessera

#define EW_TABLE_NAME ew_kernels_avx2
#define EW_TABLE_ISA CpuIsa::avx2
#define EW_LAYER_NORM_ROW_X16 layer_norm_row_x16_avx2
#define EW_RMS_NORM_ROW_X16 rms_norm_row_x16_avx2
#include "backends/cpu/elementwise_loops.h"
