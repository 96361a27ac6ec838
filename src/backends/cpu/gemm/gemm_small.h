// Small f32 GEMMs for compiled programs (gemm_small_avx512.cpp, gemm_small_avx2.cpp): C[m, n] =
// sum over k of A(m, k) * B(k, n), each output a single fused multiply-add chain in k order from
// zero, then + bias[n] or + the old C (on AVX2, K above 256 in equal blocks whose chains are
// added in order). That is the order oneDNN's f32 matmul kernels use for these shapes (checked bit
// for bit by tests/prepared_kernel_test.cpp, and probed per shape by the callers), so prepared
// kernels may take this path without a library call per product.
#pragma once
#include <cstdint>

namespace tessera::cpu {

struct SmallGemm {
  const float* a = nullptr;  // A(m, k) = a[m * lda + k]
  int64_t lda = 0;
  const float* b = nullptr;  // B(k, n) = b[k * ldb + n] (rows of N)
  int64_t ldb = 0;
  const float* bias = nullptr;  // N floats, or null
  bool accumulate = false;      // C += product (after the chain), instead of C = product
  float* c = nullptr;           // C(m, n) = c[m * ldc + n]
  int64_t ldc = 0;
  int64_t M = 0, N = 0, K = 0;
};

// Rows [m0, m1) of the product, on the calling thread. _avx512 needs cpu_isa() >= avx512, _avx2
// avx2; small_gemm_f32 takes this CPU's (only call it where small_gemm_available()).
void small_gemm_f32_avx512(const SmallGemm& g, int64_t m0, int64_t m1);
void small_gemm_f32_avx2(const SmallGemm& g, int64_t m0, int64_t m1);
bool small_gemm_available();
void small_gemm_f32(const SmallGemm& g, int64_t m0, int64_t m1);

// dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols: a B operand made from rows (the
// keys of an attention tile), 16 x 16 blocks in registers.
void transpose_f32_avx512(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
                          int64_t ldd);
void transpose_f32_avx2(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
                        int64_t ldd);  // 8 x 8 blocks
// The same on any CPU (AVX-512 or AVX2 blocks where there are, else a plain loop).
void transpose_f32(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
                   int64_t ldd);

}  // namespace tessera::cpu
