// rope_kernels.h's rotation on 8 lanes for CPUs with AVX2 but not AVX-512 (built with
// -ffp-contract=off: each product rounds before the sum, as the scalar loop).
#include <immintrin.h>

#include "backends/cpu/rope_kernels.h"

namespace tessera::cpu {

namespace {

void rotate_row(const float* x, const float* c, const float* s, float* y, int64_t D) {
  // Even lanes take -x1 s0 (a - b is a + (-b) exactly); odd lanes x0 s1.
  const __m256 neg_even = _mm256_castsi256_ps(_mm256_set1_epi64x(int64_t(0x80000000u)));
  int64_t j = 0;
  for (; j + 8 <= D; j += 8) {
    const __m256 v = _mm256_loadu_ps(x + j);
    const __m256 swapped = _mm256_permute_ps(v, 0xB1);
    const __m256 a = _mm256_mul_ps(v, _mm256_loadu_ps(c + j));
    const __m256 b = _mm256_xor_ps(_mm256_mul_ps(swapped, _mm256_loadu_ps(s + j)), neg_even);
    _mm256_storeu_ps(y + j, _mm256_add_ps(a, b));
  }
  // The tail through a masked vector (a masked store is slow on AMD, so only here): GCC's SLP
  // turned a scalar tail into vfmaddsub (one rounding) despite -ffp-contract=off.
  if (j < D) {
    const __m256i k = _mm256_cmpgt_epi32(_mm256_set1_epi32(int(D - j)),
                                         _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256 v = _mm256_maskload_ps(x + j, k);
    const __m256 swapped = _mm256_permute_ps(v, 0xB1);
    const __m256 a = _mm256_mul_ps(v, _mm256_maskload_ps(c + j, k));
    const __m256 b = _mm256_xor_ps(_mm256_mul_ps(swapped, _mm256_maskload_ps(s + j, k)), neg_even);
    _mm256_maskstore_ps(y + j, k, _mm256_add_ps(a, b));
  }
}

}  // namespace

void rope_rotate_pairs_f32_avx2(const float* x, const float* c, const float* s, float* y, int64_t D,
                                int64_t rows) {
  for (int64_t i = 0; i < rows; ++i) rotate_row(x + i * D, c, s, y + i * D, D);
}

}  // namespace tessera::cpu
