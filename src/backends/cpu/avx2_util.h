// Register helpers shared by the *_avx2.cpp kernels (include only from files built with -mavx2).
#pragma once
#include <immintrin.h>

namespace tessera::cpu_avx2 {

// Transposes 8 x 8 floats in registers: afterwards lane j of r[i] is what lane i of r[j] was.
// Unpack pairs, then 64-bit pairs, then swap 128-bit halves.
inline void transpose8x8_ps(__m256 r[8]) {
  __m256 t[8], s[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  // s[4h + c] holds columns c | c + 4 of rows 4h..4h+3.
  for (int h = 0; h < 8; h += 4) {
    s[h + 0] = _mm256_shuffle_ps(t[h], t[h + 2], _MM_SHUFFLE(1, 0, 1, 0));
    s[h + 1] = _mm256_shuffle_ps(t[h], t[h + 2], _MM_SHUFFLE(3, 2, 3, 2));
    s[h + 2] = _mm256_shuffle_ps(t[h + 1], t[h + 3], _MM_SHUFFLE(1, 0, 1, 0));
    s[h + 3] = _mm256_shuffle_ps(t[h + 1], t[h + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm256_permute2f128_ps(s[c], s[c + 4], 0x20);
    r[c + 4] = _mm256_permute2f128_ps(s[c], s[c + 4], 0x31);
  }
}

}  // namespace tessera::cpu_avx2
