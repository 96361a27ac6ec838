// Small f32 GEMM on AVX2 + FMA (gemm_small.h) for CPUs without AVX-512: up to 6 rows x 2 vectors
// of 8 columns per block (12 accumulators, 2 B vectors and a broadcast in the 16 registers).
// oneDNN's AVX2 kernels split K above 256 into equal blocks (320 -> 2 x 160) and add the
// blocks' chains in order: so does this kernel, each block one k-ordered FMA chain from zero.
#include <immintrin.h>

#include <algorithm>

#include "backends/cpu/avx2_util.h"
#include "backends/cpu/gemm/gemm_small.h"

namespace tessera::cpu {
namespace {

inline __m256i first_lanes(int cols) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(cols), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Rows [m, m + R), columns [n, n + 8 * (V - 1) + tail), k in [k0, k1). first / last: this k
// block's place in the output's sum (C = C_old? + chain_0 + chain_1 ... + bias).
template <int R, int V>
inline void block(const SmallGemm& g, int64_t m, int64_t n, int tail, int64_t k0, int64_t k1,
                  bool first, bool last) {
  const int64_t lda = g.lda, ldb = g.ldb;
  const float* __restrict a = g.a + m * lda;
  const float* __restrict bp = g.b + n;
  const __m256i tail_mask = first_lanes(tail);
  __m256 acc[R][V];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) acc[r][v] = _mm256_setzero_ps();
#pragma GCC unroll 4
  for (int64_t k = k0; k < k1; ++k) {
    __m256 bv[V];
    const float* b = bp + k * ldb;
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v)
      bv[v] = v == V - 1 && tail < 8 ? _mm256_maskload_ps(b + 8 * v, tail_mask)
                                     : _mm256_loadu_ps(b + 8 * v);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r * lda + k);
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[r][v] = _mm256_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
  const float* bias = last ? g.bias : nullptr;
  const bool add_c = g.accumulate || !first;
  float* c0 = g.c + m * g.ldc + n;
  const int64_t ldc = g.ldc;
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    float* c = c0 + r * ldc;
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) {
      const bool part = v == V - 1 && tail < 8;
      auto load = [&](const float* p) {
        return part ? _mm256_maskload_ps(p, tail_mask) : _mm256_loadu_ps(p);
      };
      __m256 x = acc[r][v];
      if (bias) x = _mm256_add_ps(x, load(bias + n + 8 * v));
      if (add_c) x = _mm256_add_ps(x, load(c + 8 * v));
      if (part)
        _mm256_maskstore_ps(c + 8 * v, tail_mask, x);
      else
        _mm256_storeu_ps(c + 8 * v, x);
    }
  }
}

template <int R>
void rows(const SmallGemm& g, int64_t m, int64_t k0, int64_t k1, bool first, bool last) {
  for (int64_t n = 0; n < g.N; n += 16) {
    const int64_t cols = std::min<int64_t>(16, g.N - n);
    if (cols > 8)
      block<R, 2>(g, m, n, int(cols - 8), k0, k1, first, last);
    else
      block<R, 1>(g, m, n, int(cols), k0, k1, first, last);
  }
}

}  // namespace

void small_gemm_f32_avx2(const SmallGemm& g, int64_t m0, int64_t m1) {
  const int64_t parts = std::max<int64_t>(1, (g.K + 255) / 256);
  const int64_t kb = (g.K + parts - 1) / parts;
  for (int64_t k0 = 0; k0 < std::max<int64_t>(g.K, 1); k0 += kb) {
    const int64_t k1 = std::min(g.K, k0 + kb);
    const bool first = k0 == 0, last = k1 >= g.K;
    int64_t m = m0;
    for (; m + 6 <= m1; m += 6) rows<6>(g, m, k0, k1, first, last);
    switch (m1 - m) {
      case 5:
        rows<5>(g, m, k0, k1, first, last);
        break;
      case 4:
        rows<4>(g, m, k0, k1, first, last);
        break;
      case 3:
        rows<3>(g, m, k0, k1, first, last);
        break;
      case 2:
        rows<2>(g, m, k0, k1, first, last);
        break;
      case 1:
        rows<1>(g, m, k0, k1, first, last);
        break;
      default:
        break;
    }
    if (g.K == 0) break;
  }
}

namespace {

// An 8 x 8 block through registers.
void transpose_block8(const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m256 r[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
  cpu_avx2::transpose8x8_ps(r);
  for (int c = 0; c < 8; ++c) _mm256_storeu_ps(dst + c * ldd, r[c]);
}

}  // namespace

void transpose_f32_avx2(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
                        int64_t ldd) {
  const int64_t r8 = rows / 8 * 8, c8 = cols / 8 * 8;
  for (int64_t r = 0; r < r8; r += 8)
    for (int64_t c = 0; c < c8; c += 8)
      transpose_block8(src + r * lds + c, lds, dst + c * ldd + r, ldd);
  for (int64_t r = 0; r < rows; ++r)  // the edges
    for (int64_t c = r < r8 ? c8 : 0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c];
}

}  // namespace tessera::cpu
