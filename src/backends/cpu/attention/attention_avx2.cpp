// AVX2 + FMA online-softmax row for the tiled SDPA on CPUs without AVX-512 (the scalar row with
// libm-call FMAs was 80% of a small FLUX step there). Torch's 16-lane layout is kept: exp_u20 on
// whole 16-score vectors (two 8-lane halves), libm expf on the rest; the running sum is kept as
// 16 lanes and reduced in _mm512_reduce_add_ps's order, as the AVX-512 row. Built with
// -ffp-contract=off: the scaled score is rounded before the max is subtracted, as in torch.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cpu/attention/attention_kernels.h"

namespace tessera::cpu {
namespace {

__m256 bits8(uint32_t u) {
  return _mm256_castsi256_ps(_mm256_set1_epi32(int(u)));
}

// exp_u20 for x <= 0 (attention_row_avx512.h) in two steps: p(r) * 2^n with 2^n built from
// exponent bits; n >= -126 there, so the power is normal and the product rounds once, as
// scalef's. `valid` lanes below ln(FLT_MIN) (and -inf) give 0, as do lanes outside `valid`: their
// power is zeroed, and p * +0 is +0 (p is positive and finite).
// The range reduction: r and the (possibly zeroed) power of two.
inline void exp_u20_reduce(__m256 x, __m256 valid, __m256* r, __m256* pow2) {
  const __m256 ln_min = bits8(0xc2aeac50u);
  const __m256 keep = _mm256_and_ps(valid, _mm256_cmp_ps(x, ln_min, _CMP_NLT_US));
  const __m256 src = _mm256_max_ps(x, ln_min);
  const __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(src, bits8(0x3fb8aa3bu), _mm256_set1_ps(0.5f)));
  *r = _mm256_fnmadd_ps(fx, bits8(0x3f317218u), src);
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  *pow2 = _mm256_and_ps(_mm256_castsi256_ps(e), keep);
}

// The polynomial in r, times the power.
inline __m256 exp_u20_poly(__m256 r, __m256 pow2) {
  __m256 p = _mm256_fmadd_ps(r, _mm256_set1_ps(0.00828929059f), _mm256_set1_ps(0.0418978221f));
  p = _mm256_fmadd_ps(r, p, _mm256_set1_ps(0.166676521f));
  p = _mm256_fmadd_ps(r, p, _mm256_set1_ps(0.499991506f));
  p = _mm256_fmadd_ps(r, p, _mm256_set1_ps(0.999999701f));
  p = _mm256_fmadd_ps(r, p, _mm256_set1_ps(1.f));
  return _mm256_mul_ps(p, pow2);
}

inline __m256 exp_u20_nonpos(__m256 x, __m256 valid) {
  __m256 r, pow2;
  exp_u20_reduce(x, valid, &r, &pow2);
  return exp_u20_poly(r, pow2);
}

// exp(x * scale - m) of s[0, end) (end a multiple of 8, every score visible) into p: the two
// steps of exp_u20_nonpos as two passes over blocks of 64 scores. The whole chain per vector
// (~40 cycles) left few vectors in flight on Zen 3 (11 cycles per vector); each half has half
// the latency. The values between the passes are stored exactly, so the bits are the same.
template <bool kScale>
void exp_scores_f32(const float* s, int64_t end, __m256 vs, __m256 vm, float* p) {
  constexpr int64_t kBlock = 64;
  alignas(32) float rb[kBlock], eb[kBlock];
  const __m256 all = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  for (int64_t j0 = 0; j0 < end; j0 += kBlock) {
    const int64_t m = std::min(kBlock, end - j0);
    for (int64_t j = 0; j < m; j += 8) {
      __m256 x = _mm256_loadu_ps(s + j0 + j);
      if (kScale) x = _mm256_mul_ps(x, vs);  // else the scale is 1: x * 1 is x
      __m256 r, pow2;
      exp_u20_reduce(_mm256_sub_ps(x, vm), all, &r, &pow2);
      _mm256_store_ps(rb + j, r);
      _mm256_store_ps(eb + j, pow2);
    }
    for (int64_t j = 0; j < m; j += 8)
      _mm256_storeu_ps(p + j0 + j, exp_u20_poly(_mm256_load_ps(rb + j), _mm256_load_ps(eb + j)));
  }
}

// Lanes [0, left) of 8 set.
inline __m256 lanes(int64_t left) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int64_t n = std::clamp<int64_t>(left, 0, 8);
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(int(n)), idx));
}

inline __m256 load(const float* p, __m256 mask) {
  return _mm256_maskload_ps(p, _mm256_castps_si256(mask));
}

// _mm512_reduce_add_ps of the 16 lanes {lo, hi}.
inline float reduce_add16(__m256 lo, __m256 hi) {
  const __m256 t3 = _mm256_add_ps(hi, lo);
  const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
  const __m128 t8 = _mm_add_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(t8) + _mm_cvtss_f32(_mm_shuffle_ps(t8, t8, _MM_SHUFFLE(1, 1, 1, 1)));
}

inline float reduce_max8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
  m = _mm_max_ps(m, _mm_shuffle_ps(m, m, _MM_SHUFFLE(1, 0, 3, 2)));
  m = _mm_max_ps(m, _mm_shuffle_ps(m, m, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtss_f32(m);
}

void store_p(void* p, int64_t j, __m256 e, bool p_bf16) {
  if (!p_bf16) return _mm256_storeu_ps(static_cast<float*>(p) + j, e);
  alignas(32) float t[8];
  _mm256_store_ps(t, e);
  for (int i = 0; i < 8; ++i) static_cast<uint16_t*>(p)[j + i] = f32_to_bf16(t[i]);
}

}  // namespace

float softmax_row_avx2(float* s, int64_t n, int64_t nvalid, float scale, const float* add, float* m,
                       float* l, void* p, bool p_bf16) {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  const __m256 vscale = _mm256_set1_ps(scale);
  __m256 vmax = _mm256_set1_ps(ninf), vmax2 = vmax;
  // Without a mask, max(s * scale) == max(s) * scale exactly (scale > 0, rounding is monotonic).
  const bool prescaled = add != nullptr || !(scale > 0.f);
  int64_t j0 = 0;
  if (!prescaled)  // whole vectors: plain loads, no blend (max is exact, so the order is free)
    for (; j0 + 16 <= nvalid; j0 += 16) {
      vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + j0));
      vmax2 = _mm256_max_ps(vmax2, _mm256_loadu_ps(s + j0 + 8));
    }
  for (int64_t j = j0; j < nvalid; j += 8) {
    const __m256 k = lanes(nvalid - j);
    __m256 x = load(s + j, k);
    if (prescaled) {
      x = _mm256_mul_ps(x, vscale);
      if (add) x = _mm256_add_ps(x, load(add + j, k));
      _mm256_maskstore_ps(s + j, _mm256_castps_si256(k), x);
    }
    vmax2 = _mm256_max_ps(vmax2, _mm256_blendv_ps(vmax2, x, k));
    std::swap(vmax, vmax2);  // two running maxima: max latencies overlap
  }
  float mx = reduce_max8(_mm256_max_ps(vmax, vmax2));
  if (!prescaled) mx *= scale;
  mx = std::max(*m, mx);
  if (mx == ninf) {  // nothing visible yet: contribute zeros, keep the accumulator
    std::memset(p, 0, size_t(n) * (p_bf16 ? 2 : 4));
    return 1.f;
  }
  const __m256 vm = _mm256_set1_ps(mx);
  const __m256 vs = prescaled ? _mm256_set1_ps(1.f) : vscale;
  const __m256 all = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  __m256 sum_lo = _mm256_setzero_ps(), sum_hi = sum_lo;
  const int64_t vec_end = n - n % 16;  // torch's 16-lane vectors; the rest uses libm
  const int64_t full_end = std::min(vec_end, nvalid / 16 * 16);
  // One 16-score vector as two halves: scale, subtract the max, exp, add to the sums, store P.
  auto step = [&](int64_t j, __m256 k0, __m256 k1, bool full) {
    const __m256 r0 = full ? _mm256_loadu_ps(s + j) : load(s + j, k0),
                 r1 = full ? _mm256_loadu_ps(s + j + 8) : load(s + j + 8, k1);
    const __m256 e0 = exp_u20_nonpos(_mm256_sub_ps(_mm256_mul_ps(r0, vs), vm), k0);
    const __m256 e1 = exp_u20_nonpos(_mm256_sub_ps(_mm256_mul_ps(r1, vs), vm), k1);
    sum_lo = _mm256_add_ps(sum_lo, e0);
    sum_hi = _mm256_add_ps(sum_hi, e1);
    store_p(p, j, e0, p_bf16);
    store_p(p, j + 8, e1, p_bf16);
  };
  int64_t j = 0;
  if (!p_bf16) {  // f32 P: exp of the wholly visible vectors into P, then their sums from P
    float* pf = static_cast<float*>(p);
    if (prescaled)
      exp_scores_f32<false>(s, full_end, vs, vm, pf);
    else
      exp_scores_f32<true>(s, full_end, vs, vm, pf);
    for (; j < full_end; j += 16) {  // the 16-lane sums, in the order step() adds them
      sum_lo = _mm256_add_ps(sum_lo, _mm256_loadu_ps(pf + j));
      sum_hi = _mm256_add_ps(sum_hi, _mm256_loadu_ps(pf + j + 8));
    }
  }
  for (; j < full_end; j += 16) step(j, all, all, true);  // wholly visible: no masks
  for (; j < vec_end; j += 16) step(j, lanes(nvalid - j), lanes(nvalid - j - 8), false);
  const float sum_tail = softmax_row_tail(s, vec_end, n, nvalid, prescaled, scale, mx, p, p_bf16);
  const float sum = reduce_add16(sum_lo, sum_hi) + sum_tail;
  const float alpha = mx == *m ? 1.f : *m == ninf ? 0.f : std::exp(*m - mx);
  *l = *l * alpha + sum;
  *m = mx;
  return alpha;
}

}  // namespace tessera::cpu
