// AVX-512 row kernels for the tiled SDPA (the online softmax between the two tile GEMMs).
#include "backends/cpu/attention/attention_row_avx512.h"

namespace tessera::cpu {
using avx512::tail_mask;
using avx512::to_bf16;

float softmax_row_avx512(float* s, int64_t n, int64_t nvalid, float scale, const float* add,
                         float* m, float* l, void* p, bool p_bf16) {
  return avx512::softmax_row<false>(s, n, nvalid, scale, add, m, l, p, p_bf16);
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
