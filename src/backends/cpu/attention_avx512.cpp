// AVX-512 row kernels for the tiled SDPA (the online softmax between the two tile GEMMs).
// GCC 12 warns about its own _mm512_undefined_* inside the intrinsic headers; harmless.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cpu/attention_kernels.h"

namespace tessera::cpu {
namespace {

// The vector half of exp_u20_scalar (see attention_kernels.h): same operations, same rounding.
inline __m512 exp_u20_ps(__m512 x) {
  const __m512 ln_min = _mm512_castsi512_ps(_mm512_set1_epi32(int(0xc2aeac50u)));
  const __m512 ln_max = _mm512_castsi512_ps(_mm512_set1_epi32(0x42b17218));
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, ln_min, _CMP_LT_OS);
  const __m512 src = _mm512_max_ps(_mm512_min_ps(x, ln_max), ln_min);
  const __m512 log2e = _mm512_castsi512_ps(_mm512_set1_epi32(0x3fb8aa3b));
  const __m512 fx = _mm512_roundscale_ps(_mm512_fmadd_ps(src, log2e, _mm512_set1_ps(0.5f)),
                                         _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 r =
      _mm512_fnmadd_ps(fx, _mm512_castsi512_ps(_mm512_set1_epi32(0x3f317218)), src);
  __m512 p = _mm512_fmadd_ps(r, _mm512_set1_ps(0.00828929059f), _mm512_set1_ps(0.0418978221f));
  p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(0.166676521f));
  p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(0.499991506f));
  p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(0.999999701f));
  p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(1.f));
  const __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_sub_ps(fx, _mm512_set1_ps(1.f))),
                                     _mm512_set1_epi32(127));
  const __m512 scale = _mm512_maskz_mov_ps(~underflow, _mm512_castsi512_ps(_mm512_slli_epi32(e, 23)));
  return _mm512_mul_ps(_mm512_mul_ps(p, scale), _mm512_set1_ps(2.f));
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

}  // namespace

float softmax_row_avx512(float* s, int64_t n, int64_t nvalid, float scale, const float* add,
                         float* m, float* l, void* p, bool p_bf16) {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  const __m512 vscale = _mm512_set1_ps(scale);
  __m512 vmax = _mm512_set1_ps(ninf);
  for (int64_t j = 0; j < nvalid; j += 16) {
    const __mmask16 k = tail_mask(nvalid - j);
    __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, s + j), vscale);
    if (add) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(k, add + j));
    _mm512_mask_storeu_ps(s + j, k, x);
    vmax = _mm512_mask_max_ps(vmax, k, vmax, x);
  }
  const float mx = std::max(*m, _mm512_reduce_max_ps(vmax));
  if (mx == ninf) {  // nothing visible yet: contribute zeros, keep the accumulator
    std::memset(p, 0, size_t(n) * (p_bf16 ? 2 : 4));
    return 1.f;
  }
  const __m512 vm = _mm512_set1_ps(mx);
  __m512 vsum = _mm512_setzero_ps();
  const int64_t vec_end = n - n % 16;
  for (int64_t j = 0; j < vec_end; j += 16) {
    const __mmask16 kv = j < nvalid ? tail_mask(nvalid - j) : __mmask16(0);
    const __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(kv, s + j), vm);
    const __m512 e = _mm512_maskz_mov_ps(kv, exp_u20_ps(x));
    vsum = _mm512_add_ps(vsum, e);
    if (p_bf16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(p) + j), to_bf16(e));
    else
      _mm512_storeu_ps(static_cast<float*>(p) + j, e);
  }
  float sum_tail = 0.f;
  for (int64_t j = vec_end; j < n; ++j) {  // torch's scalar tail uses libm expf
    const float e = j < nvalid ? std::exp(s[j] - mx) : 0.f;
    sum_tail += e;
    if (p_bf16) static_cast<uint16_t*>(p)[j] = f32_to_bf16(e);
    else static_cast<float*>(p)[j] = e;
  }
  const float sum = _mm512_reduce_add_ps(vsum) + sum_tail;
  const float alpha = std::exp(*m - mx);  // exp(-inf) = 0 on the first block
  *l = *l * alpha + sum;
  *m = mx;
  return alpha;
}

void scale_row_avx512(float* acc, int64_t n, float a) {
  const __m512 va = _mm512_set1_ps(a);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = tail_mask(n - j);
    _mm512_mask_storeu_ps(acc + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, acc + j), va));
  }
}

void finish_row_avx512(const float* acc, int64_t n, float inv, void* out, bool out_bf16) {
  const __m512 vi = _mm512_set1_ps(inv);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = tail_mask(n - j);
    const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, acc + j), vi);
    if (out_bf16)
      _mm256_mask_storeu_epi16(static_cast<uint16_t*>(out) + j, k, to_bf16(x));
    else
      _mm512_mask_storeu_ps(static_cast<float*>(out) + j, k, x);
  }
}

}  // namespace tessera::cpu
