// AVX-512 online-softmax row kernel shared by attention_avx512.cpp and
// attention_avx512bf16.cpp; include only from files compiled with AVX-512 flags.
#pragma once
// GCC 12 warns about its own _mm512_undefined_* inside the intrinsic headers; harmless.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cpu/attention/attention_kernels.h"

namespace tessera::cpu::avx512 {

// torch's exp_u20 (see attention_kernels.h) for x <= 0, with the power of two applied by scalef: p
// * 2^(n-1) * 2 == p * 2^n exactly (both are exact power-of-two scalings) except below 2^-125,
// where torch's product is a denormal or 0 and this one may differ in the last bits of a value that
// no sum can see. Inputs below ln(FLT_MIN) (including -inf) still give exactly 0.
inline __m512 exp_u20_nonpos_ps(__m512 x, __mmask16 keep) {
  const __m512 ln_min = _mm512_castsi512_ps(_mm512_set1_epi32(int(0xc2aeac50u)));
  keep &= _mm512_cmp_ps_mask(x, ln_min, _CMP_NLT_US);
  const __m512 src = _mm512_max_ps(x, ln_min);
  const __m512 log2e = _mm512_castsi512_ps(_mm512_set1_epi32(0x3fb8aa3b));
  const __m512 fx = _mm512_roundscale_ps(_mm512_fmadd_ps(src, log2e, _mm512_set1_ps(0.5f)),
                                         _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(fx, _mm512_castsi512_ps(_mm512_set1_epi32(0x3f317218)), src);
  __m512 p = _mm512_fmadd_ps(r, _mm512_set1_ps(0.00828929059f), _mm512_set1_ps(0.0418978221f));
  p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(0.166676521f));
  p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(0.499991506f));
  p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(0.999999701f));
  p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(1.f));
  return _mm512_maskz_scalef_ps(keep, p, fx);
}

// f32 -> bf16 round-to-nearest-even (inputs here are finite).
inline __m256i to_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
}

#ifdef __AVX512BF16__
// vcvtneps2bf16: round-to-nearest-even like to_bf16 (it flushes denormal inputs, ~1e-38, to 0).
inline __m256i to_bf16_native(__m512 x) {
  return (__m256i)_mm512_cvtneps_pbh(x);
}
#else
inline __m256i to_bf16_native(__m512 x) {
  return to_bf16(x);
}
#endif

struct NoPump {
  void operator()() const {}
};

// pump() is called once per 16-score vector of the exp pass: the AMX kernel issues tile products
// from it, so the TMUL unit works while this loop runs (NoPump elsewhere).
// The including files are built with FMA contraction (attention_avx2.cpp is not): s * scale - max
// and s * scale + add each round once where the scalar row rounds twice, so exp's argument d moves
// by up to ~2^-24 (|s * scale| + 2 |d|) and P by that, relative, against the scalar row's bits
// (docs/decisions/0018-isa-kernel-guarantees.md).
template <bool kBf16Native, typename Pump = NoPump>
float softmax_row(float* s, int64_t n, int64_t nvalid, float scale, const float* add, float* m,
                  float* l, void* p, bool p_bf16, Pump&& pump = Pump()) {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  const __m512 vscale = _mm512_set1_ps(scale);
  __m512 vmax = _mm512_set1_ps(ninf);
  // Without a mask, max(s * scale) == max(s) * scale exactly (scale > 0, rounding is monotonic),
  // so the first pass only reads; the scaled value is recomputed in the second.
  const bool prescaled = add != nullptr || !(scale > 0.f);
  if (prescaled) {
    for (int64_t j = 0; j < nvalid; j += 16) {
      const __mmask16 k = tail_mask(nvalid - j);
      __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, s + j), vscale);
      if (add) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(k, add + j));
      _mm512_mask_storeu_ps(s + j, k, x);
      vmax = _mm512_mask_max_ps(vmax, k, vmax, x);
    }
  } else {
    // Four running maxima: one would make this pass a chain of dependent max latencies.
    __m512 m1 = vmax, m2 = vmax, m3 = vmax;
    int64_t j = 0;
    for (; j + 64 <= nvalid; j += 64) {
      vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(s + j));
      m1 = _mm512_max_ps(m1, _mm512_loadu_ps(s + j + 16));
      m2 = _mm512_max_ps(m2, _mm512_loadu_ps(s + j + 32));
      m3 = _mm512_max_ps(m3, _mm512_loadu_ps(s + j + 48));
    }
    for (; j < nvalid; j += 16) {  // masked load: the row may end mid-vector (s has n floats)
      const __mmask16 k = tail_mask(nvalid - j);
      vmax = _mm512_mask_max_ps(vmax, k, vmax, _mm512_maskz_loadu_ps(k, s + j));
    }
    vmax = _mm512_max_ps(_mm512_max_ps(vmax, m1), _mm512_max_ps(m2, m3));
    vmax = _mm512_mul_ps(vmax, vscale);
  }
  const float mx = std::max(*m, _mm512_reduce_max_ps(vmax));
  if (mx == ninf) {  // nothing visible yet: contribute zeros, keep the accumulator
    std::memset(p, 0, size_t(n) * (p_bf16 ? 2 : 4));
    return 1.f;
  }
  const __m512 vm = _mm512_set1_ps(mx);
  const __m512 vs = prescaled ? _mm512_set1_ps(1.f) : vscale;
  __m512 vsum = _mm512_setzero_ps();
  const int64_t vec_end = n - n % 16;
  // One 16-score vector: scale, subtract the max, exp, add to the sum, store the probabilities.
  auto step = [&](int64_t j, __mmask16 kv, bool full) {
    pump();
    __m512 x = full ? _mm512_loadu_ps(s + j) : _mm512_maskz_loadu_ps(kv, s + j);
    if (!prescaled) x = _mm512_mul_ps(x, vs);
    const __m512 e = exp_u20_nonpos_ps(_mm512_sub_ps(x, vm), kv);
    vsum = _mm512_add_ps(vsum, e);
    if (!p_bf16)
      _mm512_storeu_ps(static_cast<float*>(p) + j, e);
    else if constexpr (kBf16Native)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(p) + j),
                          to_bf16_native(e));
    else
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(p) + j), to_bf16(e));
  };
  // Vectors wholly visible (the common case) without the per-vector mask; then the rest.
  const int64_t full_end = std::min(vec_end, nvalid / 16 * 16);
  int64_t j = 0;
#pragma GCC unroll 2
  for (; j < full_end; j += 16) step(j, __mmask16(0xffff), true);
  for (; j < vec_end; j += 16) step(j, j < nvalid ? tail_mask(nvalid - j) : __mmask16(0), false);
  const float sum_tail = softmax_row_tail(s, vec_end, n, nvalid, prescaled, scale, mx, p, p_bf16);
  const float sum = _mm512_reduce_add_ps(vsum) + sum_tail;
  // exp(-inf) = 0 on the first block and exp(0) == 1: both known without a libm call.
  const float alpha = mx == *m ? 1.f : *m == ninf ? 0.f : std::exp(*m - mx);
  *l = *l * alpha + sum;
  *m = mx;
  return alpha;
}

}  // namespace tessera::cpu::avx512
