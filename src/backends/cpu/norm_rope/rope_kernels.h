// RoPE row kernels with per-ISA builds (rope_avx2.cpp, rope_avx512.cpp); callers check cpu_isa()
// first.
#pragma once
#include <cstdint>

namespace tessera::cpu {

// Interleaved pairs of `rows` rows of D floats (row i at x + i * D, y + i * D) that share one
// table row (the heads of a token): y = (x0 c0 - x1 s0, x1 c1 + x0 s1), the two products
// rounded, then one sum (built without FMA contraction), so the scalar loop's bits. D even.
void rope_rotate_pairs_f32_avx512(const float* x, const float* c, const float* s, float* y,
                                  int64_t D, int64_t rows);
void rope_rotate_pairs_f32_avx2(const float* x, const float* c, const float* s, float* y, int64_t D,
                                int64_t rows);

}  // namespace tessera::cpu
