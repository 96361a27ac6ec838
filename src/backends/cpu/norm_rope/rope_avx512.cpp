// rope_kernels.h for AVX-512. CMake builds this file with -ffp-contract=off: a product fused into
// the sum would round once instead of twice and change the bits against rope.cpp's scalar loop.
// GCC 12 warns about its own _mm512_undefined_* inside the intrinsic headers; harmless.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "backends/cpu/norm_rope/rope_kernels.h"

namespace tessera::cpu {

void rope_rotate_pairs_f32_avx512(const float* x, const float* c, const float* s, float* y,
                                  int64_t D, int64_t rows) {
  // Even lanes take -x1 s0 (a - b is a + (-b) exactly); odd lanes x0 s1.
  const __m512 neg_even = _mm512_castsi512_ps(_mm512_set1_epi64(int64_t(0x80000000u)));
  for (int64_t i = 0; i < rows; ++i, x += D, y += D)
    for (int64_t j = 0; j < D; j += 16) {
      const __mmask16 k = D - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (D - j)) - 1u);
      const __m512 v = _mm512_maskz_loadu_ps(k, x + j);
      const __m512 swapped = _mm512_permute_ps(v, 0xB1);
      const __m512 a = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(k, c + j));
      const __m512 b =
          _mm512_xor_ps(_mm512_mul_ps(swapped, _mm512_maskz_loadu_ps(k, s + j)), neg_even);
      _mm512_mask_storeu_ps(y + j, k, _mm512_add_ps(a, b));
    }
}

}  // namespace tessera::cpu
