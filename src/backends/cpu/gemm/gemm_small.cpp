// The small GEMM and transpose for this CPU (gemm_small.h): AVX-512, else AVX2.
#include "backends/cpu/gemm/gemm_small.h"

#include "runtime/cpu_features.h"

namespace tessera::cpu {

bool small_gemm_available() {
  static const bool ok = cpu_isa() >= CpuIsa::avx2;
  return ok;
}

void small_gemm_f32(const SmallGemm& g, int64_t m0, int64_t m1) {
  static const bool avx512 = cpu_isa() >= CpuIsa::avx512;
  if (avx512) return small_gemm_f32_avx512(g, m0, m1);
  small_gemm_f32_avx2(g, m0, m1);
}

void transpose_f32(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
                   int64_t ldd) {
  static const CpuIsa isa = cpu_isa();
  if (isa >= CpuIsa::avx512) return transpose_f32_avx512(src, lds, rows, cols, dst, ldd);
  if (isa == CpuIsa::avx2) return transpose_f32_avx2(src, lds, rows, cols, dst, ldd);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c];
}

}  // namespace tessera::cpu
