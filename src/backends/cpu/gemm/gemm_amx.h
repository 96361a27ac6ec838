// Our own bf16 GEMM on AMX tiles (docs/decisions/0002-gemm-library.md): C[M, N] = A[M, K] @
// B[K, N] (+ bias[N]) with fp32 accumulation and one rounding of the output to bf16, as PyTorch.
// B is packed once into the tile layout (pack_b); A is read through its strides. Only call on
// CPUs where cpu_isa() >= CpuIsa::amx_bf16 (the kernels execute AMX instructions).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/tensor.h"

namespace tessera::amx_gemm {

// bf16 elements of B packed for the kernel: K and N padded to multiples of 32, laid out as
// [N/32][K/32][2 halves of 16 columns][16 k-pairs][16 columns][2].
size_t packed_b_elems(int64_t K, int64_t N);
// B(k, n) = b[k * sk + n * sn] (bf16 bits) into `out` (packed_b_elems(K, N) elements).
// Runs on the thread pool.
void pack_b(const uint16_t* b, int64_t sk, int64_t sn, int64_t K, int64_t N, uint16_t* out);

// One product: A(m, k) = a[m * sam + k * sak]; C(m, n) = c[m * ldc + n]; bias: N floats or null.
struct Problem {
  const uint16_t* a = nullptr;
  int64_t sam = 0, sak = 1;
  const uint16_t* b_packed = nullptr;
  const float* bias = nullptr;
  uint16_t* c = nullptr;
  int64_t ldc = 0;
  int64_t M = 0, K = 0, N = 0;
};
// Runs the products (a batch shares the thread pool: work is split across all of them).
void gemm(const std::vector<Problem>& problems);

// The packed form of a weight W[N, K] (linear's layout), packed once and kept in the bounded
// packed-weight cache (gemm_cache.cpp) next to oneDNN's layouts, keyed by the weight's storage,
// offset, shape, strides and dtype; freed with the storage or on eviction.
std::shared_ptr<const uint16_t> packed_weight(const Tensor& w);

// Whether bf16 linear/matmul take this kernel on an AMX CPU (default true). Tests switch it off
// to compare with the oneDNN path in one process; TESSERA_CPU_ISA=avx512_bf16 does the same.
bool enabled();
void set_enabled(bool on);

}  // namespace tessera::amx_gemm
