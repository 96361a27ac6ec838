// Small f32 GEMM on AVX-512 (gemm_small.h): 4 rows x up to 4 vectors (8 rows x up to 2 where N <=
// 32) of 16 columns per block, each accumulator one k-ordered FMA chain starting from zero (no k
// splitting, no reassociation).
#include <immintrin.h>

#include <algorithm>

#include "backends/cpu/gemm_small.h"

namespace tessera::cpu {
namespace {

template <int R, int V>
inline void block(const SmallGemm& g, int64_t m, int64_t n, __mmask16 tail) {
  // Locals, so the accumulators stay in registers (no aliasing with g's fields).
  const int64_t K = g.K, lda = g.lda, ldb = g.ldb;
  const float* __restrict a = g.a + m * lda;
  const float* __restrict bp = g.b + n;
  __mmask16 mk[V];
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v) mk[v] = v == V - 1 ? tail : __mmask16(0xffff);
  __m512 acc[R][V];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
#pragma GCC unroll 4
  for (int64_t k = 0; k < K; ++k) {
    __m512 bv[V];
    const float* b = bp + k * ldb;
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) bv[v] = _mm512_maskz_loadu_ps(mk[v], b + 16 * v);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * lda + k]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
  // Read g's fields once: a store through c could alias them as far as the compiler knows.
  const float* bias = g.bias;
  const bool accumulate = g.accumulate;
  float* c0 = g.c + m * g.ldc + n;
  const int64_t ldc = g.ldc;
  __m512 bias_v[V];
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v)
    bias_v[v] = bias ? _mm512_maskz_loadu_ps(mk[v], bias + n + 16 * v) : _mm512_setzero_ps();
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    float* c = c0 + r * ldc;
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      __m512 x = acc[r][v];
      if (bias) x = _mm512_add_ps(x, bias_v[v]);
      if (accumulate) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(mk[v], c + 16 * v));
      _mm512_mask_storeu_ps(c + 16 * v, mk[v], x);
    }
  }
}

// Rows [m, m + R) over every 64-column chunk; VMax caps the vectors per block (R x V accumulators
// must fit the 32 registers with the B vectors).
template <int R, int VMax>
void rows(const SmallGemm& g, int64_t m) {
  for (int64_t n = 0; n < g.N; n += 16 * VMax) {
    const int64_t cols = std::min<int64_t>(16 * VMax, g.N - n);
    const int vecs = int((cols + 15) / 16);
    const int rem = int(cols - 16 * (vecs - 1));
    const __mmask16 tail = __mmask16((1u << rem) - 1u);
    if constexpr (VMax == 1) {
      block<R, 1>(g, m, n, tail);
    } else if constexpr (VMax == 2) {
      if (vecs == 1)
        block<R, 1>(g, m, n, tail);
      else
        block<R, 2>(g, m, n, tail);
    } else {
      switch (vecs) {
        case 1:
          block<R, 1>(g, m, n, tail);
          break;
        case 2:
          block<R, 2>(g, m, n, tail);
          break;
        case 3:
          block<R, 3>(g, m, n, tail);
          break;
        default:
          block<R, 4>(g, m, n, tail);
          break;
      }
    }
  }
}

}  // namespace

void small_gemm_f32_avx512(const SmallGemm& g, int64_t m0, int64_t m1) {
  // 8 rows where N <= 32: up to 16 accumulators, whose independent FMA chains cover the FMA
  // latency of both ports (4 rows x 2 vectors left them idle part of the time: 10-25% slower). Each
  // output is one chain either way, so the row grouping does not change a bit.
  int64_t m = m0;
  if (g.N <= 32)
    for (; m + 8 <= m1; m += 8) rows<8, 2>(g, m);
  for (; m + 4 <= m1; m += 4) rows<4, 4>(g, m);
  for (; m < m1; ++m) rows<1, 4>(g, m);
}

}  // namespace tessera::cpu
