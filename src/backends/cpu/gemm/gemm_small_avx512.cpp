// Small f32 GEMM on AVX-512 (gemm_small.h): 4 rows x up to 4 vectors (8 rows x up to 2 where N <=
// 32) of 16 columns per block, each accumulator one k-ordered FMA chain starting from zero (no k
// splitting, no reassociation).
// GCC 12 warns about its own _mm512_undefined_* inside the intrinsic headers; harmless.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>

#include "backends/cpu/gemm/gemm_small.h"

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

// Rows [m, m + R) over chunks of 16 * VMax columns; VMax (2 or 4) caps the vectors per block
// (R x V accumulators must fit the 32 registers with the B vectors).
template <int R, int VMax>
void rows(const SmallGemm& g, int64_t m) {
  for (int64_t n = 0; n < g.N; n += 16 * VMax) {
    const int64_t cols = std::min<int64_t>(16 * VMax, g.N - n);
    const int vecs = int((cols + 15) / 16);
    const int rem = int(cols - 16 * (vecs - 1));
    const __mmask16 tail = __mmask16((1u << rem) - 1u);
    if constexpr (VMax == 2) {
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

namespace {

// One 16 x 16 block: pairs of rows interleaved at 32, 64 and then 128 bits, then 256-bit halves.
void transpose_block16(const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m512 r[16], t[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * lds);
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]),
                  c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  // r[4i + j] now holds, in 128-bit lane L, column 4L + j of rows 4i .. 4i + 3.
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    t[j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);           // lanes 0, 2 of rows 0-7
    t[4 + j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xdd);       // lanes 1, 3
    t[8 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);  // rows 8-15
    t[12 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xdd);
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    _mm512_storeu_ps(dst + (j)*ldd, _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88));
    _mm512_storeu_ps(dst + (8 + j) * ldd, _mm512_shuffle_f32x4(t[j], t[8 + j], 0xdd));
    _mm512_storeu_ps(dst + (4 + j) * ldd, _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0x88));
    _mm512_storeu_ps(dst + (12 + j) * ldd, _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0xdd));
  }
}

}  // namespace

void transpose_f32_avx512(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
                          int64_t ldd) {
  const int64_t r16 = rows / 16 * 16, c16 = cols / 16 * 16;
  for (int64_t r = 0; r < r16; r += 16)
    for (int64_t c = 0; c < c16; c += 16)
      transpose_block16(src + r * lds + c, lds, dst + c * ldd + r, ldd);
  for (int64_t r = 0; r < rows; ++r)  // the edges
    for (int64_t c = r < r16 ? c16 : 0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c];
}

}  // namespace tessera::cpu
