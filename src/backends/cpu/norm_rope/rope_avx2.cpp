// rope_kernels.h's rotation on 8 lanes for CPUs with AVX2 but not AVX-512 (built with
// -ffp-contract=off: each product rounds before the sum, as the scalar loop).
#include <immintrin.h>

#include "backends/cpu/norm_rope/rope_kernels.h"

namespace tessera::cpu {

namespace {

// One vector of pairs. Even lanes take -x1 s0 (a - b is a + (-b) exactly); odd lanes x0 s1.
inline __m256 rotate8(__m256 v, __m256 c, __m256 s) {
  const __m256 neg_even = _mm256_castsi256_ps(_mm256_set1_epi64x(int64_t(0x80000000u)));
  const __m256 swapped = _mm256_permute_ps(v, 0xB1);
  return _mm256_add_ps(_mm256_mul_ps(v, c), _mm256_xor_ps(_mm256_mul_ps(swapped, s), neg_even));
}

void rotate_row(const float* x, const float* c, const float* s, float* y, int64_t D) {
  int64_t j = 0;
  for (; j + 8 <= D; j += 8)
    _mm256_storeu_ps(
        y + j, rotate8(_mm256_loadu_ps(x + j), _mm256_loadu_ps(c + j), _mm256_loadu_ps(s + j)));
  // The tail through a masked vector (a masked store is slow on AMD, so only here): GCC's SLP
  // turned a scalar tail into vfmaddsub (one rounding) despite -ffp-contract=off.
  if (j < D) {
    const __m256i k = _mm256_cmpgt_epi32(_mm256_set1_epi32(int(D - j)),
                                         _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    _mm256_maskstore_ps(y + j, k,
                        rotate8(_mm256_maskload_ps(x + j, k), _mm256_maskload_ps(c + j, k),
                                _mm256_maskload_ps(s + j, k)));
  }
}

}  // namespace

void rope_rotate_pairs_f32_avx2(const float* x, const float* c, const float* s, float* y, int64_t D,
                                int64_t rows) {
  for (int64_t i = 0; i < rows; ++i) rotate_row(x + i * D, c, s, y + i * D, D);
}

}  // namespace tessera::cpu
