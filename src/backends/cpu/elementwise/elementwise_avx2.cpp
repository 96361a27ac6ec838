// The row kernels of elementwise_loops.h built for the avx2 path (flags from CMake by file name),
// plus norm rows of 16k floats in registers as in the AVX-512 file (each 16-lane partial sum of
// EW_LANE_SUM is two 8-lane halves here) and its explicit GELU-tanh loop (the plain loop divides).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "backends/cpu/avx2_util.h"

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

// Eight rows at a time: lane j of the result is lane_tree(lo_j, hi_j), given a[j] = lo_j + hi_j
// (the same adds, in the same order, with the rows in lanes).
inline __m256 lane_tree_x8(__m256 a[8]) {
  cpu_avx2::transpose8x8_ps(a);
  const __m256 a4_0 = _mm256_add_ps(a[0], a[4]), a4_1 = _mm256_add_ps(a[1], a[5]);
  const __m256 a4_2 = _mm256_add_ps(a[2], a[6]), a4_3 = _mm256_add_ps(a[3], a[7]);
  return _mm256_add_ps(_mm256_add_ps(a4_0, a4_2), _mm256_add_ps(a4_1, a4_3));
}

// float((0.0 + double(t)) / n) per lane: the single-row kernels' double total and division.
inline __m256 total_over_n(__m256 t, double n) {
  const __m256d zero = _mm256_setzero_pd(), dn = _mm256_set1_pd(n);
  const __m256d lo =
      _mm256_div_pd(_mm256_add_pd(zero, _mm256_cvtps_pd(_mm256_castps256_ps128(t))), dn);
  const __m256d hi =
      _mm256_div_pd(_mm256_add_pd(zero, _mm256_cvtps_pd(_mm256_extractf128_ps(t, 1))), dn);
  return _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo));
}

// a[j] = lo + hi for rows j < 8 of n floats (n a multiple of 16), each 16-float step folding
// its halves into lo and hi with step(acc, v, j): the row kernels' two 8-lane partial sums.
template <typename Step>
inline void row_partials_x8(const float* x, int64_t n, __m256 a[8], Step step) {
  for (int j = 0; j < 8; ++j) {
    __m256 lo = _mm256_setzero_ps(), hi = lo;
    for (int64_t i = 0; i < n; i += 16) {
      lo = step(lo, _mm256_loadu_ps(x + j * n + i), j);
      hi = step(hi, _mm256_loadu_ps(x + j * n + i + 8), j);
    }
    a[j] = _mm256_add_ps(lo, hi);
  }
}

// layer_norm_row_x16_avx2 on 8 rows at once, for as many whole groups of 8 as `rows` holds; the
// per-row statistics (transposed sums, division, square root) run as 8-lane vectors. Returns the
// rows done.
int64_t layer_norm_rows_x16_avx2(const float* x, int64_t rows, int64_t n, float eps, float* o) {
  if (n % 16 != 0 || n == 0) return 0;
  const int64_t done = rows / 8 * 8;
  for (int64_t r = 0; r < done; r += 8, x += 8 * n, o += 8 * n) {
    __m256 a[8];
    row_partials_x8(x, n, a, [](__m256 acc, __m256 v, int) { return _mm256_add_ps(acc, v); });
    alignas(32) float mean[8], rstd[8], shift[8];
    const __m256 vmean = total_over_n(lane_tree_x8(a), double(n));
    _mm256_store_ps(mean, vmean);
    row_partials_x8(x, n, a, [&](__m256 acc, __m256 v, int j) {
      const __m256 d = _mm256_sub_ps(v, _mm256_set1_ps(mean[j]));
      return _mm256_fmadd_ps(d, d, acc);
    });
    const __m256 var = total_over_n(lane_tree_x8(a), double(n));
    // 1 / sqrt(max(var, 0) + eps); max(0, NaN) keeps the NaN as the row kernel's compare does.
    const __m256 vr = _mm256_div_ps(
        _mm256_set1_ps(1.f), _mm256_sqrt_ps(_mm256_add_ps(_mm256_max_ps(_mm256_setzero_ps(), var),
                                                          _mm256_set1_ps(eps))));
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(int(0x80000000u)));
    _mm256_store_ps(rstd, vr);
    _mm256_store_ps(shift, _mm256_mul_ps(_mm256_xor_ps(vr, sign), vmean));  // -rstd * mean
    for (int j = 0; j < 8; ++j) {
      const __m256 va = _mm256_set1_ps(rstd[j]), vb = _mm256_set1_ps(shift[j]);
      for (int64_t i = 0; i < n; i += 8)
        _mm256_storeu_ps(o + j * n + i, _mm256_fmadd_ps(_mm256_loadu_ps(x + j * n + i), va, vb));
    }
  }
  return done;
}

// rms_norm_row_x16_avx2 on 8 rows at once, as above.
int64_t rms_norm_rows_x16_avx2(const float* x, int64_t rows, int64_t n, float eps, const float* w,
                               float* o) {
  if (n % 16 != 0 || n == 0) return 0;
  const int64_t done = rows / 8 * 8;
  for (int64_t r = 0; r < done; r += 8, x += 8 * n, o += 8 * n) {
    __m256 a[8];
    row_partials_x8(x, n, a, [](__m256 acc, __m256 v, int) { return _mm256_fmadd_ps(v, v, acc); });
    // 1 / sqrt(float(0.0 + ss) / float(n) + eps)
    const __m256 ss = total_over_n(lane_tree_x8(a), 1.0);
    alignas(32) float rr[8];
    _mm256_store_ps(
        rr, _mm256_div_ps(_mm256_set1_ps(1.f),
                          _mm256_sqrt_ps(_mm256_add_ps(_mm256_div_ps(ss, _mm256_set1_ps(float(n))),
                                                       _mm256_set1_ps(eps)))));
    for (int j = 0; j < 8; ++j) {
      const __m256 vr = _mm256_set1_ps(rr[j]);
      for (int64_t i = 0; i < n; i += 8) {
        __m256 t = _mm256_mul_ps(_mm256_loadu_ps(x + j * n + i), vr);
        if (w) t = _mm256_mul_ps(t, _mm256_loadu_ps(w + i));
        _mm256_storeu_ps(o + j * n + i, t);
      }
    }
  }
  return done;
}

// elementwise_avx512.cpp's gelu_tanh_ps on 8 lanes, for a block of up to 64 floats (whole
// vectors), in four passes: u, exp's range reduction, exp's polynomial, the quotient and product.
// One vector's whole chain (~75 cycles, 30 operations) left few vectors in flight on Zen 3; in
// parts they overlap (1.5x; a fifth pass for the division measured slower). Each value is stored
// and reloaded exactly. Differences from the AVX-512 steps:
// * exp's argument is clamped at -80 instead of -87.34: below about -18 GELU's 1 - 2e / (1 + e)
//   is exactly 1 either way (checked on every float), and near -87.34 e is subnormal, which
//   Zen 3 computes 2.3x slower (GELU of |x| > 9). 2^fn (fn in [-115, 0]) is built from exponent
//   bits (AVX2 has no scalef).
// * The quotient is vdivps (on Zen 3 1.4x faster than rcp + Newton + residual, same bits).
void gelu_tanh_block_avx2(const float* x, float* o, int64_t n) {
  alignas(32) float rb[64], pb[64], sb[64];
  const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(int(0x80000000u)));
  for (int64_t i = 0; i < n; i += 8) {  // u
    const __m256 v = _mm256_loadu_ps(x + i);
    _mm256_store_ps(
        sb + i,
        _mm256_mul_ps(
            _mm256_set1_ps(0.7978845608028654f),
            _mm256_fmadd_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), v), v), v, v)));
  }
  for (int64_t i = 0; i < n; i += 8) {  // -2|u| and exp's range reduction
    const __m256 u = _mm256_load_ps(sb + i);
    const __m256 a = _mm256_andnot_ps(sign, u);
    const __m256 xc = _mm256_max_ps(_mm256_mul_ps(_mm256_set1_ps(-2.f), a), _mm256_set1_ps(-80.f));
    const __m256 big = _mm256_set1_ps(12582912.f);
    const __m256 fn =
        _mm256_sub_ps(_mm256_fmadd_ps(xc, _mm256_set1_ps(1.44269504088896341f), big), big);
    __m256 r = _mm256_fnmadd_ps(fn, _mm256_set1_ps(0.693359375f), xc);
    _mm256_store_ps(rb + i, _mm256_fnmadd_ps(fn, _mm256_set1_ps(-2.12194440e-4f), r));
    const __m256i pow2 =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fn), _mm256_set1_epi32(127)), 23);
    _mm256_store_ps(pb + i, _mm256_castsi256_ps(pow2));
    _mm256_store_ps(sb + i, _mm256_and_ps(sign, u));
  }
  for (int64_t i = 0; i < n; i += 8) {  // e = exp(-2|u|)
    const __m256 r = _mm256_load_ps(rb + i);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    const __m256 e = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.f));
    _mm256_store_ps(rb + i, _mm256_mul_ps(e, _mm256_load_ps(pb + i)));
  }
  const __m256 one = _mm256_set1_ps(1.f);
  for (int64_t i = 0; i < n; i += 8) {  // tanh = sign(u) (1 - 2e / (1 + e)), 0.5 v (1 + tanh)
    const __m256 e = _mm256_load_ps(rb + i);
    const __m256 q = _mm256_div_ps(_mm256_add_ps(e, e), _mm256_add_ps(one, e));
    const __m256 t = _mm256_or_ps(_mm256_sub_ps(one, q), _mm256_load_ps(sb + i));
    const __m256 v = _mm256_loadu_ps(x + i);
    _mm256_storeu_ps(o + i,
                     _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), v), _mm256_add_ps(one, t)));
  }
}

void gelu_tanh_f32_avx2(const float* x, float* o, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 64) {
    const int64_t m = std::min<int64_t>(64, (n - i) / 8 * 8);
    gelu_tanh_block_avx2(x + i, o + i, m);
    i += m - 64;
  }
  if (i < n) {  // the last n % 8 floats as one zero-padded vector
    alignas(32) float in[8] = {}, out[8];
    std::copy(x + i, x + n, in);
    gelu_tanh_block_avx2(in, out, 8);
    std::copy(out, out + (n - i), o + i);
  }
}

}  // namespace
}  // namespace tessera

#define EW_TABLE_NAME ew_kernels_avx2
#define EW_TABLE_ISA CpuIsa::avx2
#define EW_GELU_TANH_F32 gelu_tanh_f32_avx2
#define EW_LAYER_NORM_ROW_X16 layer_norm_row_x16_avx2
#define EW_RMS_NORM_ROW_X16 rms_norm_row_x16_avx2
#define EW_LAYER_NORM_ROWS_X16 layer_norm_rows_x16_avx2
#define EW_RMS_NORM_ROWS_X16 rms_norm_rows_x16_avx2
#include "backends/cpu/elementwise/elementwise_loops.h"
